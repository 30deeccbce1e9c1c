/* A stand-in for libcublas on the host, for the GPU back end's tests without a GPU: the few
 * entry points toolkit/kernels/gpu/blas.py calls, with cuBLAS's column-major semantics, on host
 * memory (the numpy stand-in for CuPy keeps "device" arrays there). It checks what capture
 * needs: a GEMM on a handle whose workspace was not set after its stream fails, as cuBLAS would
 * then allocate its own workspace inside a captured graph. The marker below is the CUDA
 * dialect's portable float16 conversions, pasted in by the test. */
#include <stdlib.h>
#include <string.h>
#include <math.h>

TK_HALF_HELPERS

typedef struct { void *stream; void *workspace; size_t workspace_bytes; int workspace_after_stream; } fake_handle;

enum { OK = 0, NOT_INITIALIZED = 1, INVALID_VALUE = 7, NOT_SUPPORTED = 15 };
enum { R_32F = 0, R_64F = 1, R_16F = 2 };
enum { COMPUTE_32F = 68, COMPUTE_64F = 70 };

int cublasCreate_v2(void **handle) {
    fake_handle *h = calloc(1, sizeof(fake_handle));
    *handle = h;
    return h ? OK : NOT_INITIALIZED;
}

int cublasDestroy_v2(void *handle) { free(handle); return OK; }

int cublasSetStream_v2(void *handle, void *stream) {
    fake_handle *h = handle;
    h->stream = stream;
    h->workspace_after_stream = 0;     /* cuBLAS resets the workspace with the stream */
    return OK;
}

int cublasSetWorkspace_v2(void *handle, void *workspace, size_t bytes) {
    fake_handle *h = handle;
    h->workspace = workspace;
    h->workspace_bytes = bytes;
    h->workspace_after_stream = workspace != 0 && bytes > 0;
    return OK;
}

static double load(const void *p, int type, long i) {
    if (type == R_32F) return ((const float *)p)[i];
    if (type == R_64F) return ((const double *)p)[i];
    return tk_h2f(((const unsigned short *)p)[i]);
}

static void store(void *p, int type, long i, double v) {
    if (type == R_32F) ((float *)p)[i] = (float)v;
    else if (type == R_64F) ((double *)p)[i] = v;
    else ((unsigned short *)p)[i] = tk_f2h((float)v);
}

/* element (i, j) of op(X), X column-major with leading dimension ld */
static long at(int op, long i, long j, long ld) { return op ? j + i * ld : i + j * ld; }

static int gemm(fake_handle *h, int opa, int opb, int m, int n, int k, const void *alpha, const void *a,
                int atype, int lda, long long stride_a, const void *b, int btype, int ldb, long long stride_b,
                const void *beta, void *c, int ctype, int ldc, long long stride_c, int batch, int compute) {
    if (!h->workspace_after_stream) return NOT_SUPPORTED;
    if (atype != btype || btype != ctype || (ctype == R_64F) != (compute == COMPUTE_64F)) return NOT_SUPPORTED;
    if (m < 0 || n < 0 || k < 0 || ldc < (m > 1 ? m : 1)) return INVALID_VALUE;
    if (lda < ((opa ? k : m) > 1 ? (opa ? k : m) : 1) || ldb < ((opb ? n : k) > 1 ? (opb ? n : k) : 1)) return INVALID_VALUE;
    double al = compute == COMPUTE_64F ? *(const double *)alpha : *(const float *)alpha;
    double be = compute == COMPUTE_64F ? *(const double *)beta : *(const float *)beta;
    for (int e = 0; e < batch; e++)
        for (long i = 0; i < m; i++)
            for (long j = 0; j < n; j++) {
                double sum = 0;
                for (long l = 0; l < k; l++)
                    sum += load(a, atype, e * stride_a + at(opa, i, l, lda)) * load(b, btype, e * stride_b + at(opb, l, j, ldb));
                long ci = e * stride_c + i + j * (long)ldc;
                store(c, ctype, ci, al * sum + (be != 0 ? be * load(c, ctype, ci) : 0));
            }
    return OK;
}

int cublasGemmEx(void *handle, int opa, int opb, int m, int n, int k, const void *alpha, const void *a, int atype,
                 int lda, const void *b, int btype, int ldb, const void *beta, void *c, int ctype, int ldc,
                 int compute, int algo) {
    (void)algo;
    return gemm(handle, opa, opb, m, n, k, alpha, a, atype, lda, 0, b, btype, ldb, 0, beta, c, ctype, ldc, 0, 1, compute);
}

int cublasGemmStridedBatchedEx(void *handle, int opa, int opb, int m, int n, int k, const void *alpha,
                               const void *a, int atype, int lda, long long stride_a, const void *b, int btype,
                               int ldb, long long stride_b, const void *beta, void *c, int ctype, int ldc,
                               long long stride_c, int batch, int compute, int algo) {
    (void)algo;
    return gemm(handle, opa, opb, m, n, k, alpha, a, atype, lda, stride_a, b, btype, ldb, stride_b, beta, c, ctype,
                ldc, stride_c, batch, compute);
}

/* cuBLASLt: descriptors as plain structs; one "algorithm" for the supported epilogues (default,
 * ReLU, bias, ReLU + bias); D = epilogue(alpha op(A) op(B) + beta C), the bias indexed by D's row */
typedef struct { int compute, scale, transa, transb; unsigned epilogue; const void *bias; } fake_desc;
typedef struct { int type; unsigned long long rows, cols; long long ld; } fake_layout;
typedef struct { unsigned long long max_workspace; } fake_pref;

enum { EPI_DEFAULT = 1, EPI_RELU = 2, EPI_BIAS = 4, EPI_RELU_BIAS = 6, EPI_BGRADB = 512 };

int cublasLtCreate(void **handle) { *handle = calloc(1, 16); return *handle ? OK : NOT_INITIALIZED; }
int cublasLtDestroy(void *handle) { free(handle); return OK; }

int cublasLtMatmulDescCreate(void **desc, int compute, int scale) {
    fake_desc *d = calloc(1, sizeof(fake_desc));
    d->compute = compute; d->scale = scale; d->epilogue = EPI_DEFAULT;
    *desc = d;
    return OK;
}
int cublasLtMatmulDescDestroy(void *desc) { free(desc); return OK; }

int cublasLtMatmulDescSetAttribute(void *desc, int attr, const void *buf, size_t size) {
    fake_desc *d = desc;
    if (attr == 3 && size == 4) d->transa = *(const int *)buf;
    else if (attr == 4 && size == 4) d->transb = *(const int *)buf;
    else if (attr == 7 && size == 4) d->epilogue = *(const unsigned *)buf;
    else if (attr == 8 && size == sizeof(void *)) d->bias = *(const void *const *)buf;
    else return INVALID_VALUE;
    return OK;
}

int cublasLtMatrixLayoutCreate(void **layout, int type, unsigned long long rows, unsigned long long cols, long long ld) {
    fake_layout *l = calloc(1, sizeof(fake_layout));
    l->type = type; l->rows = rows; l->cols = cols; l->ld = ld;
    *layout = l;
    return (long long)rows > ld && cols > 1 ? INVALID_VALUE : OK;
}
int cublasLtMatrixLayoutDestroy(void *layout) { free(layout); return OK; }

int cublasLtMatmulPreferenceCreate(void **pref) { *pref = calloc(1, sizeof(fake_pref)); return OK; }
int cublasLtMatmulPreferenceDestroy(void *pref) { free(pref); return OK; }
int cublasLtMatmulPreferenceSetAttribute(void *pref, int attr, const void *buf, size_t size) {
    if (attr != 1 || size != 8) return INVALID_VALUE;
    ((fake_pref *)pref)->max_workspace = *(const unsigned long long *)buf;
    return OK;
}

static int shapes_agree(const fake_desc *d, const fake_layout *a, const fake_layout *b, const fake_layout *c) {
    unsigned long long m = d->transa ? a->cols : a->rows, k = d->transa ? a->rows : a->cols;
    unsigned long long kb = d->transb ? b->cols : b->rows, n = d->transb ? b->rows : b->cols;
    return k == kb && c->rows == m && c->cols == n && a->type == b->type && b->type == c->type;
}

int cublasLtMatmulAlgoGetHeuristic(void *handle, void *desc, void *a, void *b, void *c, void *dd, void *pref,
                                   int requested, void *results, int *found) {
    fake_desc *d = desc;
    (void)handle; (void)pref;
    *found = 0;
    if (requested < 1 || !shapes_agree(d, a, b, c) || !shapes_agree(d, a, b, dd)) return INVALID_VALUE;
    if (d->epilogue != EPI_DEFAULT && d->epilogue != EPI_RELU && d->epilogue != EPI_BIAS && d->epilogue != EPI_RELU_BIAS
        && !(d->epilogue == EPI_BGRADB && d->transb))
        return OK;                     /* no algorithm for that epilogue (BGRADB wants B transposed) */
    memset(results, 0, 96);
    *found = 1;
    return OK;
}

int cublasLtMatmul(void *handle, void *desc, const void *alpha, const void *a, void *adesc, const void *b,
                   void *bdesc, const void *beta, const void *c, void *cdesc, void *dmat, void *ddesc,
                   const void *algo, void *workspace, size_t workspace_bytes, void *stream) {
    fake_desc *d = desc;
    fake_layout *la = adesc, *lb = bdesc, *lc = cdesc, *ld = ddesc;
    (void)handle; (void)algo; (void)stream;
    if (!workspace || !workspace_bytes || !shapes_agree(d, la, lb, ld) || !shapes_agree(d, la, lb, lc)) return INVALID_VALUE;
    if ((d->epilogue & (EPI_BIAS | EPI_BGRADB)) && !d->bias) return INVALID_VALUE;
    int type = ld->type;
    double al = type == R_64F ? *(const double *)alpha : *(const float *)alpha;
    double be = type == R_64F ? *(const double *)beta : *(const float *)beta;
    long m = ld->rows, n = ld->cols, k = d->transa ? la->rows : la->cols;
    for (long i = 0; i < m; i++)
        for (long j = 0; j < n; j++) {
            double sum = 0;
            for (long l = 0; l < k; l++)
                sum += load(a, type, at(d->transa, i, l, la->ld)) * load(b, type, at(d->transb, l, j, lb->ld));
            double v = al * sum + (be != 0 ? be * load(c, type, i + j * lc->ld) : 0);
            if (d->epilogue & EPI_BIAS) v += load(d->bias, type, i);
            if ((d->epilogue & EPI_RELU) && v < 0) v = 0;
            store(dmat, type, i + j * ld->ld, v);
        }
    if (d->epilogue == EPI_BGRADB)     /* the bias gradient: op(B)'s sum over k, one per column of D */
        for (long j = 0; j < n; j++) {
            double sum = 0;
            for (long l = 0; l < k; l++) sum += load(b, type, at(d->transb, l, j, lb->ld));
            store((void *)d->bias, type, j, sum);
        }
    return OK;
}
