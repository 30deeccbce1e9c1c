/* A stand-in for libcudnn on the host, for the GPU back end's tests without a GPU: the entry
 * points toolkit/kernels/gpu/dnn.py calls, with cuDNN's semantics (NCHW tensors with explicit
 * strides, KCRS or KRSC (NHWC) filters, groups, padding, stride, dilation, alpha and beta), computed by direct
 * loops on host memory (the numpy stand-in for CuPy keeps "device" arrays there).
 *
 * It checks what dnn.py must get right: every descriptor's dimensions against the others (a
 * binding that passes descriptors in the wrong order fails), the output size cuDNN computes, and
 * the algorithm choice: its heuristics rank a non-deterministic algorithm (0) first, which the
 * toolkit must pass over, then algorithm 1, which needs a workspace of WORKSPACE bytes that the
 * call must be given. It records the math and data types each direction ran with
 * (fake_cudnn_math, fake_cudnn_type: float, double, half or bfloat16) and,
 * for float32 with any math but FMA, reads the operands as TF32, as tensor cores do; it counts
 * the fused forward calls (fake_cudnn_fused_calls). The marker
 * below is the CUDA dialect's float16 conversions, pasted in by the test. */
#include <stdlib.h>
#include <string.h>
#include <math.h>

TK_HALF_HELPERS

enum { OK = 0, BAD_PARAM = 2000, NOT_SUPPORTED = 3000 };
enum { FLOAT = 0, DOUBLE = 1, HALF = 2, BFLOAT16 = 9 };
enum { WORKSPACE = 256, GOOD_ALGO = 1 };

typedef struct { int type, n, c, h, w, ns, cs, hs, ws; } tensor;
typedef struct { int type, format, k, c, h, w; } filter;
typedef struct { int ph, pw, sh, sw, dh, dw, mode, compute, groups, math; } convolution;
typedef struct { void *stream; } handle;
typedef struct { int algo, status; float time; size_t memory; int determinism, math_type, reserved[3]; } perf;

int cudnnCreate(void **h) { *h = calloc(1, sizeof(handle)); return OK; }
int cudnnSetStream(void *h, void *stream) { ((handle *)h)->stream = stream; return OK; }
const char *cudnnGetErrorString(int status) { return status == OK ? "OK" : "FAKE_CUDNN_STATUS_ERROR"; }

int cudnnCreateTensorDescriptor(void **d) { *d = calloc(1, sizeof(tensor)); return OK; }
int cudnnSetTensor4dDescriptorEx(void *d, int type, int n, int c, int h, int w, int ns, int cs, int hs, int ws) {
    if (n <= 0 || c <= 0 || h <= 0 || w <= 0) return BAD_PARAM;
    *(tensor *)d = (tensor){type, n, c, h, w, ns, cs, hs, ws};
    return OK;
}
int cudnnCreateFilterDescriptor(void **d) { *d = calloc(1, sizeof(filter)); return OK; }
int cudnnSetFilter4dDescriptor(void *d, int type, int format, int k, int c, int h, int w) {
    if (format != 0 && format != 1) return NOT_SUPPORTED;     /* NCHW (KCRS) or NHWC (KRSC) */
    *(filter *)d = (filter){type, format, k, c, h, w};
    return OK;
}
int cudnnCreateConvolutionDescriptor(void **d) { *d = calloc(1, sizeof(convolution)); return OK; }
int cudnnSetConvolution2dDescriptor(void *d, int ph, int pw, int sh, int sw, int dh, int dw, int mode, int compute) {
    if (sh <= 0 || sw <= 0 || dh <= 0 || dw <= 0 || ph < 0 || pw < 0) return BAD_PARAM;
    *(convolution *)d = (convolution){ph, pw, sh, sw, dh, dw, mode, compute, 1, 0};
    return OK;
}
int cudnnSetConvolutionGroupCount(void *d, int groups) { ((convolution *)d)->groups = groups; return groups > 0 ? OK : BAD_PARAM; }
int cudnnSetConvolutionMathType(void *d, int math) { ((convolution *)d)->math = math; return OK; }

/* the descriptors agree: channels, groups, dtype and cuDNN's output size */
static int consistent(const tensor *x, const filter *w, const convolution *cv, const tensor *y) {
    if (x->type != w->type || y->type != w->type || cv->mode != 1) return BAD_PARAM;
    if ((w->type == DOUBLE) != (cv->compute == DOUBLE)) return BAD_PARAM;
    if ((w->type == HALF || w->type == BFLOAT16) && cv->compute != FLOAT) return BAD_PARAM;
    if (x->c != w->c * cv->groups || w->k % cv->groups || y->c != w->k || y->n != x->n) return BAD_PARAM;
    int oh = (x->h + 2 * cv->ph - cv->dh * (w->h - 1) - 1) / cv->sh + 1;
    int ow = (x->w + 2 * cv->pw - cv->dw * (w->w - 1) - 1) / cv->sw + 1;
    return (oh == y->h && ow == y->w) ? OK : BAD_PARAM;
}

/* The math type each direction's last call ran with (forward, data, filter; -1 before any), for
 * the tests to read: the precision policy must reach every direction's descriptor. */
int fake_cudnn_math[3] = {-1, -1, -1};
int fake_cudnn_type[3] = {-1, -1, -1};             /* and the data type of its tensors */
enum { FMA_MATH = 3 };
/* Set for the duration of a float32 call whose math is not FMA: its operands are read as TF32
 * (10 bits of mantissa, rounded to nearest even), as tensor cores read them. */
static int tf32_operands;

static int heuristics(int status, const convolution *cv, int requested, int *returned, perf *out) {
    if (status != OK) return status;
    if (requested < 2) return BAD_PARAM;
    memset(out, 0, 2 * sizeof(perf));
    /* ranked with the descriptor's math type, as cuDNN ranks algorithms per math type */
    out[0] = (perf){0, OK, 0.1f, 0, 0, cv->math, {0}};            /* faster, but non-deterministic */
    out[1] = (perf){GOOD_ALGO, OK, 0.2f, WORKSPACE, 1, cv->math, {0}};
    *returned = 2;
    return OK;
}

int cudnnGetConvolutionForwardAlgorithm_v7(void *h, void *x, void *w, void *cv, void *y, int req, int *ret, perf *p) {
    return heuristics(consistent(x, w, cv, y), cv, req, ret, p);
}
int cudnnGetConvolutionBackwardDataAlgorithm_v7(void *h, void *w, void *dy, void *cv, void *dx, int req, int *ret, perf *p) {
    return heuristics(consistent(dx, w, cv, dy), cv, req, ret, p);
}
int cudnnGetConvolutionBackwardFilterAlgorithm_v7(void *h, void *x, void *dy, void *cv, void *dw, int req, int *ret, perf *p) {
    return heuristics(consistent(x, dw, cv, dy), cv, req, ret, p);
}

static int size_of(int status, int algo, size_t *bytes) {
    if (status != OK) return status;
    *bytes = algo == GOOD_ALGO ? WORKSPACE : 0;
    return OK;
}
int cudnnGetConvolutionForwardWorkspaceSize(void *h, void *x, void *w, void *cv, void *y, int algo, size_t *b) {
    return size_of(consistent(x, w, cv, y), algo, b);
}
int cudnnGetConvolutionBackwardDataWorkspaceSize(void *h, void *w, void *dy, void *cv, void *dx, int algo, size_t *b) {
    return size_of(consistent(dx, w, cv, dy), algo, b);
}
int cudnnGetConvolutionBackwardFilterWorkspaceSize(void *h, void *x, void *dy, void *cv, void *dw, int algo, size_t *b) {
    return size_of(consistent(x, dw, cv, dy), algo, b);
}

static float to_tf32(float v) {
    unsigned int bits;
    memcpy(&bits, &v, 4);
    if ((bits & 0x7f800000u) != 0x7f800000u)                      /* inf and nan stay */
        bits = (bits + 0xfffu + ((bits >> 13) & 1u)) & ~0x1fffu;
    memcpy(&v, &bits, 4);
    return v;
}
/* bfloat16: the top 16 bits of a float32, rounded to nearest even (a NaN stays a NaN) */
static float bf16_load(unsigned short h) {
    unsigned int bits = (unsigned int)h << 16;
    float v;
    memcpy(&v, &bits, 4);
    return v;
}
static unsigned short bf16_store(float v) {
    unsigned int bits;
    memcpy(&bits, &v, 4);
    if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x7fffffu)) return (unsigned short)((bits >> 16) | 0x40u);
    return (unsigned short)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}
static double load(const void *p, int type, long i) {
    if (type == FLOAT) return tf32_operands ? to_tf32(((const float *)p)[i]) : ((const float *)p)[i];
    if (type == DOUBLE) return ((const double *)p)[i];
    if (type == BFLOAT16) return bf16_load(((const unsigned short *)p)[i]);
    return tk_h2f(((const unsigned short *)p)[i]);
}
static void store(void *p, int type, long i, double v) {
    if (type == FLOAT) ((float *)p)[i] = (float)v;
    else if (type == DOUBLE) ((double *)p)[i] = v;
    else if (type == BFLOAT16) ((unsigned short *)p)[i] = bf16_store((float)v);
    else ((unsigned short *)p)[i] = tk_f2h((float)v);
}
static double scalar(const void *p, int type) { return type == DOUBLE ? *(const double *)p : *(const float *)p; }
static long at(const tensor *t, int n, int c, int h, int w) { return (long)n * t->ns + (long)c * t->cs + (long)h * t->hs + (long)w * t->ws; }
static long at_filter(const filter *f, int k, int c, int h, int w) {
    if (f->format == 1) return (((long)k * f->h + h) * f->w + w) * f->c + c;        /* KRSC */
    return (((long)k * f->c + c) * f->h + h) * f->w + w;
}

/* every (image, output channel, output position, input channel, kernel offset) with the input
 * element inside the image: visit(x index, w index, y index) */
#define EACH_TAP(X_, W_, CV_, Y_, visit)                                                                   \
    for (int n_ = 0; n_ < (Y_)->n; n_++)                                                                \
        for (int o_ = 0; o_ < (Y_)->c; o_++) {                                                          \
            int g_ = o_ / ((W_)->k / (CV_)->groups);                                                     \
            for (int i_ = 0; i_ < (Y_)->h; i_++)                                                        \
                for (int j_ = 0; j_ < (Y_)->w; j_++)                                                    \
                    for (int c_ = 0; c_ < (W_)->c; c_++)                                                \
                        for (int p_ = 0; p_ < (W_)->h; p_++)                                            \
                            for (int q_ = 0; q_ < (W_)->w; q_++) {                                      \
                                int r_ = i_ * (CV_)->sh - (CV_)->ph + p_ * (CV_)->dh;                     \
                                int s_ = j_ * (CV_)->sw - (CV_)->pw + q_ * (CV_)->dw;                     \
                                if (r_ < 0 || r_ >= (X_)->h || s_ < 0 || s_ >= (X_)->w) continue;        \
                                visit(at((X_), n_, g_ * (W_)->c + c_, r_, s_), at_filter((W_), o_, c_, p_, q_), \
                                      at((Y_), n_, o_, i_, j_));                                        \
                            }                                                                          \
        }

static int usable(int status, int algo, void *workspace, size_t bytes) {
    if (status != OK) return status;
    if (algo != GOOD_ALGO) return NOT_SUPPORTED;
    return (workspace != 0 && bytes >= WORKSPACE) ? OK : BAD_PARAM;
}

int cudnnConvolutionForward(void *h, const void *alpha, const tensor *xd, const void *x, const filter *wd, const void *w,
                            const convolution *cv, int algo, void *ws, size_t bytes, const void *beta,
                            const tensor *yd, void *y) {
    int status = usable(consistent(xd, wd, cv, yd), algo, ws, bytes);
    if (status != OK) return status;
    fake_cudnn_math[0] = cv->math;
    fake_cudnn_type[0] = wd->type;
    tf32_operands = wd->type == FLOAT && cv->math != FMA_MATH;
    long count = (long)yd->n * yd->c * yd->h * yd->w;
    double *sum = calloc(count, sizeof(double));
#define FWD(xi, wi, yi) sum[(((long)n_ * yd->c + o_) * yd->h + i_) * yd->w + j_] += load(x, xd->type, xi) * load(w, wd->type, wi)
    EACH_TAP(xd, wd, cv, yd, FWD)
    tf32_operands = 0;
    double a = scalar(alpha, cv->compute), b = scalar(beta, cv->compute);
    for (int n = 0; n < yd->n; n++) for (int c = 0; c < yd->c; c++) for (int i = 0; i < yd->h; i++) for (int j = 0; j < yd->w; j++) {
        long yi = at(yd, n, c, i, j);
        store(y, yd->type, yi, a * sum[(((long)n * yd->c + c) * yd->h + i) * yd->w + j] + (b != 0 ? b * load(y, yd->type, yi) : 0));
    }
    free(sum);
    return OK;
}

int cudnnConvolutionBackwardData(void *h, const void *alpha, const filter *wd, const void *w, const tensor *dyd,
                                 const void *dy, const convolution *cv, int algo, void *ws, size_t bytes,
                                 const void *beta, const tensor *dxd, void *dx) {
    int status = usable(consistent(dxd, wd, cv, dyd), algo, ws, bytes);
    if (status != OK) return status;
    fake_cudnn_math[1] = cv->math;
    fake_cudnn_type[1] = wd->type;
    tf32_operands = wd->type == FLOAT && cv->math != FMA_MATH;
    long count = (long)dxd->n * dxd->c * dxd->h * dxd->w;
    double *sum = calloc(count, sizeof(double));
    /* packed index of the input element from its strided one: recomputed from the loop's own values */
#define BWD_DATA(xi, wi, yi) sum[(((long)n_ * dxd->c + g_ * wd->c + c_) * dxd->h + (i_ * cv->sh - cv->ph + p_ * cv->dh)) * dxd->w \
                                 + (j_ * cv->sw - cv->pw + q_ * cv->dw)] += load(dy, dyd->type, yi) * load(w, wd->type, wi)
    EACH_TAP(dxd, wd, cv, dyd, BWD_DATA)
    tf32_operands = 0;
    double a = scalar(alpha, cv->compute), b = scalar(beta, cv->compute);
    for (int n = 0; n < dxd->n; n++) for (int c = 0; c < dxd->c; c++) for (int i = 0; i < dxd->h; i++) for (int j = 0; j < dxd->w; j++) {
        long xi = at(dxd, n, c, i, j);
        store(dx, dxd->type, xi, a * sum[(((long)n * dxd->c + c) * dxd->h + i) * dxd->w + j] + (b != 0 ? b * load(dx, dxd->type, xi) : 0));
    }
    free(sum);
    return OK;
}

int cudnnConvolutionBackwardFilter(void *h, const void *alpha, const tensor *xd, const void *x, const tensor *dyd,
                                   const void *dy, const convolution *cv, int algo, void *ws, size_t bytes,
                                   const void *beta, const filter *dwd, void *dw) {
    int status = usable(consistent(xd, dwd, cv, dyd), algo, ws, bytes);
    if (status != OK) return status;
    fake_cudnn_math[2] = cv->math;
    fake_cudnn_type[2] = dwd->type;
    tf32_operands = dwd->type == FLOAT && cv->math != FMA_MATH;
    long count = (long)dwd->k * dwd->c * dwd->h * dwd->w;
    double *sum = calloc(count, sizeof(double));
#define BWD_FILTER(xi, wi, yi) sum[wi] += load(x, xd->type, xi) * load(dy, dyd->type, yi)
    EACH_TAP(xd, dwd, cv, dyd, BWD_FILTER)
    tf32_operands = 0;
    double a = scalar(alpha, cv->compute), b = scalar(beta, cv->compute);
    for (long i = 0; i < count; i++)
        store(dw, dwd->type, i, a * sum[i] + (b != 0 ? b * load(dw, dwd->type, i) : 0));
    free(sum);
    return OK;
}

/* C = alpha A + beta C, A broadcast along its dimensions of extent 1 */
int cudnnAddTensor(void *h, const void *alpha, const tensor *ad, const void *a, const void *beta, const tensor *cd, void *c) {
    if (ad->type != cd->type) return BAD_PARAM;
    if ((ad->n != 1 && ad->n != cd->n) || (ad->c != 1 && ad->c != cd->c) || (ad->h != 1 && ad->h != cd->h)
        || (ad->w != 1 && ad->w != cd->w)) return BAD_PARAM;
    int type = cd->type == DOUBLE ? DOUBLE : FLOAT;
    double al = scalar(alpha, type), be = scalar(beta, type);
    for (int n = 0; n < cd->n; n++) for (int k = 0; k < cd->c; k++) for (int i = 0; i < cd->h; i++) for (int j = 0; j < cd->w; j++) {
        long ci = at(cd, n, k, i, j);
        double av = load(a, ad->type, at(ad, ad->n == 1 ? 0 : n, ad->c == 1 ? 0 : k, ad->h == 1 ? 0 : i, ad->w == 1 ? 0 : j));
        store(c, cd->type, ci, al * av + be * load(c, cd->type, ci));
    }
    return OK;
}

/* y = act(alpha1 conv(x, w) + alpha2 z + bias), act a ReLU (which only the implicit precomputed
 * GEMM, algorithm 1, may run) or the identity; z is read before y is written, element by element */
typedef struct { int mode, nan; double coef; } activation;
enum { ACTIVATION_RELU = 1, ACTIVATION_IDENTITY = 5, IMPLICIT_PRECOMP_GEMM = 1 };
int fake_cudnn_fused_calls = 0;

int cudnnCreateActivationDescriptor(void **d) { *d = calloc(1, sizeof(activation)); return OK; }
int cudnnSetActivationDescriptor(void *d, int mode, int nan, double coef) {
    if (mode != ACTIVATION_RELU && mode != ACTIVATION_IDENTITY) return NOT_SUPPORTED;
    *(activation *)d = (activation){mode, nan, coef};
    return OK;
}

int cudnnConvolutionBiasActivationForward(void *h, const void *alpha1, const tensor *xd, const void *x, const filter *wd,
                                          const void *w, const convolution *cv, int algo, void *ws, size_t bytes,
                                          const void *alpha2, const tensor *zd, const void *z, const tensor *bd,
                                          const void *bias, const activation *act, const tensor *yd, void *y) {
    int status = usable(consistent(xd, wd, cv, yd), algo, ws, bytes);
    if (status != OK) return status;
    if (act->mode == ACTIVATION_RELU && algo != IMPLICIT_PRECOMP_GEMM) return NOT_SUPPORTED;
    if (zd->n != yd->n || zd->c != yd->c || zd->h != yd->h || zd->w != yd->w || zd->type != yd->type) return BAD_PARAM;
    if (bd->n != 1 || bd->c != yd->c || bd->h != 1 || bd->w != 1 || bd->type != yd->type) return BAD_PARAM;
    fake_cudnn_math[0] = cv->math;
    fake_cudnn_type[0] = wd->type;
    tf32_operands = wd->type == FLOAT && cv->math != FMA_MATH;
    long count = (long)yd->n * yd->c * yd->h * yd->w;
    double *sum = calloc(count, sizeof(double));
    EACH_TAP(xd, wd, cv, yd, FWD)
    tf32_operands = 0;
    double a1 = scalar(alpha1, cv->compute), a2 = scalar(alpha2, cv->compute);
    for (int n = 0; n < yd->n; n++) for (int c = 0; c < yd->c; c++) for (int i = 0; i < yd->h; i++) for (int j = 0; j < yd->w; j++) {
        long yi = at(yd, n, c, i, j);
        double v = a1 * sum[(((long)n * yd->c + c) * yd->h + i) * yd->w + j] + load(bias, bd->type, at(bd, 0, c, 0, 0));
        if (a2 != 0) v += a2 * load(z, zd->type, at(zd, n, c, i, j));
        if (act->mode == ACTIVATION_RELU) v = (v != v) ? v : (v > 0 ? v : 0);       /* NaN propagates */
        store(y, yd->type, yi, v);
    }
    free(sum);
    fake_cudnn_fused_calls++;
    return OK;
}
