"""Dialects: loop programs (loops.py) rendered to source text.

``CDialect`` writes C99 for the system compiler: one function per kernel taking an array of
pointers, extents as literals, the outermost ``parallel`` loop as an OpenMP ``parallel for``,
``Gemm`` as a call through a BLAS function pointer that the loader sets once.
``CudaDialect`` writes the same programs as CUDA ``__global__`` functions: the outermost
parallel loop becomes a grid-stride loop over threads. It is the seam the GPU back end renders
through (``Gemm`` is a host-side cuBLAS call there, so a CUDA kernel may not contain one).

Both keep numpy's semantics where C differs: max/min propagate NaN as np.maximum does, and no
fast-math reassociation is asked for, so results equal the numpy kernels' to rounding.
"""
from __future__ import annotations

import math

from . import microkernel
from .loops import (
    SIZES_PARAM,
    Bin,
    Buf,
    Call,
    Cast,
    Cmp,
    Const,
    Extern,
    For,
    Gemm,
    If,
    Kernel,
    Let,
    Load,
    PackedGemm,
    Select,
    Set,
    Size,
    SizeInt,
    Store,
    ThreadIndex,
    Un,
    Var,
    sizes_used,
    walk,
)

C_TYPES = {"float32": "float", "float64": "double", "int64": "int64_t", "int32": "int32_t", "int16": "int16_t",
           "int8": "int8_t", "uint8": "uint8_t", "bool": "int"}
FLOAT_SUFFIX = {"float32": "f", "float64": ""}

PRELUDE = r"""
#include <math.h>
#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#define TK_THREAD() omp_get_thread_num()
#else
#define TK_THREAD() 0
#endif
/* numpy's maximum/minimum: a NaN in either argument is the result (the sum carries it), and of
   two equal values (0 and -0) the second. Written
   as a select and a NaN test joined by | rather than as `a >= b || a != a`, whose short circuit
   gcc compiles to a branch per element: measured on a 3x3 stride-2 max pooling of 64x111x111,
   0.30 ms against 0.54 ms scalar, 0.12 ms against 0.36 ms vectorised. */
static inline float tk_maxf(float a, float b) { float m = a > b ? a : b; return ((a != a) | (b != b)) ? a + b : m; }
static inline float tk_minf(float a, float b) { float m = a < b ? a : b; return ((a != a) | (b != b)) ? a + b : m; }
static inline double tk_max(double a, double b) { double m = a > b ? a : b; return ((a != a) | (b != b)) ? a + b : m; }
static inline double tk_min(double a, double b) { double m = a < b ? a : b; return ((a != a) | (b != b)) ? a + b : m; }
typedef void (*tk_sgemm_t)(int, int, int, TK_BLAS_INT, TK_BLAS_INT, TK_BLAS_INT, float, const float *,
                           TK_BLAS_INT, const float *, TK_BLAS_INT, float, float *, TK_BLAS_INT);
typedef void (*tk_dgemm_t)(int, int, int, TK_BLAS_INT, TK_BLAS_INT, TK_BLAS_INT, double, const double *,
                           TK_BLAS_INT, const double *, TK_BLAS_INT, double, double *, TK_BLAS_INT);
/* the team a parallel loop runs on: its compiled thread count, or fewer while other work wants
   the cores (runtime/team.py sets it before a run); every loop covers all its iterations
   whatever the team, so a smaller team changes the speed, never the result */
static int tk_team = 1 << 30;
void tk_set_team(int n) { tk_team = n > 0 ? n : 1; }
#define TK_TEAM(k) (tk_team < (k) ? tk_team : (k))
static tk_sgemm_t tk_sgemm;
static tk_dgemm_t tk_dgemm;
void tk_set_blas(void *sgemm, void *dgemm) { tk_sgemm = (tk_sgemm_t)sgemm; tk_dgemm = (tk_dgemm_t)dgemm; }
"""

# float16 <-> float32 for the CUDA dialect: the device's conversion instructions (round to
# nearest even), and the same conversions in portable C where the source is compiled for a host
# (the emulation the tests run without a GPU)
HALF_HELPERS = r"""
#ifdef __CUDA_ARCH__
__device__ inline float tk_h2f(unsigned short h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ inline unsigned short tk_f2h(float f) {
    unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h;
}
#else
union tk_bits { float f; unsigned int u; };
static inline float tk_h2f(unsigned short h) {
    unsigned int sign = (unsigned int)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    union tk_bits v;
    if (e == 0) { float f = (float)m * 5.9604644775390625e-08f; return sign ? -f : f; }   /* m * 2^-24 */
    v.u = sign | (e == 31 ? 0x7f800000u | (m << 13) : ((e + 112u) << 23) | (m << 13));
    return v.f;
}
static inline unsigned short tk_f2h(float f) {
    union tk_bits v; v.f = f;
    unsigned int sign = (v.u >> 16) & 0x8000u, a = v.u & 0x7fffffffu, r;
    if (a > 0x7f800000u) return (unsigned short)(sign | 0x7e00u);                /* nan */
    if (a >= 0x477ff000u) return (unsigned short)(sign | 0x7c00u);               /* >= 65520: inf */
    if (a < 0x38800000u) {                                                       /* below 2^-14 */
        v.u = a;
        return (unsigned short)(sign | (unsigned int)rintf(v.f * 16777216.0f));  /* whole 2^-24s, ties even */
    }
    r = a - 0x38000000u;                                                         /* rebias 127 -> 15 */
    r += 0xfffu + ((r >> 13) & 1u);                                              /* round to nearest even */
    return (unsigned short)(sign | (r >> 13));
}
#endif
"""

MATH_C = {"exp": "exp", "log": "log", "tanh": "tanh", "sqrt": "sqrt", "abs": "fabs", "expm1": "expm1",
          "log1p": "log1p", "erf": "erf", "floor": "floor", "pow": "pow"}


class CDialect:
    name = "c"
    types = C_TYPES

    def __init__(self, blas_int: str = "int64_t"):
        self.blas_int = blas_int

    # -- expressions -------------------------------------------------------------------------
    def const(self, c: Const) -> str:
        if isinstance(c.value, SizeInt):           # a number that is a run-time size's expression
            text = self.expr(c.value.expr)
            return text if c.dtype == "int64" else f"(({self.types[c.dtype]}){text})"
        if c.dtype in ("float32", "float64"):
            v = float(c.value)
            if math.isnan(v):
                return "NAN"
            if math.isinf(v):
                return "INFINITY" if v > 0 else "(-INFINITY)"
            text = repr(v)
            return f"{text}{FLOAT_SUFFIX[c.dtype]}"
        return f"{int(c.value)}L" if c.dtype == "int64" else str(int(c.value))

    def call(self, e: Call) -> str:
        args = [self.expr(a) for a in e.args]
        single = e.dtype == "float32"
        if e.fn in ("max", "min"):
            fn = f"tk_{e.fn}{'f' if single else ''}"
            return f"{fn}({args[0]}, {args[1]})"
        return f"{MATH_C[e.fn]}{'f' if single else ''}({', '.join(args)})"

    def expr(self, e) -> str:
        if isinstance(e, Const):
            return self.const(e)
        if isinstance(e, Var):
            return e.name
        if isinstance(e, Load):
            return f"{e.buf.name}[{self.expr(e.index)}]"
        if isinstance(e, (Bin, Cmp)):
            return f"({self.expr(e.a)} {e.op} {self.expr(e.b)})"
        if isinstance(e, Un):
            return f"({e.op}{self.expr(e.a)})"
        if isinstance(e, Call):
            return self.call(e)
        if isinstance(e, Select):
            return f"({self.expr(e.cond)} ? {self.expr(e.a)} : {self.expr(e.b)})"
        if isinstance(e, Cast):
            return f"(({self.types[e.dtype]}){self.expr(e.a)})"
        if isinstance(e, ThreadIndex):
            return "((int64_t)TK_THREAD())"
        if isinstance(e, Size):
            return size_variable(e.name)
        raise TypeError(f"cannot render {e!r}")

    # -- statements --------------------------------------------------------------------------
    def stmts(self, body, depth: int, kernel: Kernel, in_parallel: bool) -> list[str]:
        lines = []
        pad = "    " * depth
        for s in body:
            if isinstance(s, For):
                parallel = s.parallel and not in_parallel and kernel.threads > 1
                simd = " simd" if s.vector else ""
                if parallel:
                    lines.append(f"{pad}#pragma omp parallel for{simd} schedule(static) "
                                 f"num_threads(TK_TEAM({kernel.threads}))")
                elif s.reduction is not None:
                    lines.append(f"{pad}#pragma omp simd reduction(+:{s.reduction.name})")
                elif s.vector:
                    lines.append(f"{pad}#pragma omp simd")
                v = s.var.name
                lines.append(f"{pad}for ({self.types['int64']} {v} = {self.expr(s.start)}; {v} < {self.expr(s.stop)}; "
                             f"{v} += {s.step}) {{")
                lines += self.stmts(s.body, depth + 1, kernel, in_parallel or parallel)
                lines.append(f"{pad}}}")
            elif isinstance(s, Let):
                lines.append(f"{pad}{self.types[s.var.dtype]} {s.var.name} = {self.expr(s.value)};")
            elif isinstance(s, Set):
                lines.append(f"{pad}{s.var.name} = {self.expr(s.value)};")
            elif isinstance(s, Store):
                lines.append(self.store(s, pad))
            elif isinstance(s, If):
                lines.append(f"{pad}if ({self.expr(s.cond)}) {{")
                lines += self.stmts(s.then, depth + 1, kernel, in_parallel)
                if s.orelse:
                    lines.append(f"{pad}}} else {{")
                    lines += self.stmts(s.orelse, depth + 1, kernel, in_parallel)
                lines.append(f"{pad}}}")
            elif isinstance(s, Gemm):
                fn = "tk_sgemm" if s.c.dtype == "float32" else "tk_dgemm"
                ta, tb = (112 if s.trans_a else 111), (112 if s.trans_b else 111)
                lines.append(f"{pad}{fn}(101, {ta}, {tb}, {self.expr(s.m)}, {self.expr(s.n)}, {self.expr(s.k)}, "
                             f"{s.alpha!r}, {s.a.name} + {self.expr(s.a_off)}, {s.lda}, "
                             f"{s.b.name} + {self.expr(s.b_off)}, {s.ldb}, {self.scalar(s.beta)}, "
                             f"{s.c.name} + {self.expr(s.c_off)}, {s.ldc});")
            elif isinstance(s, PackedGemm):
                bias = f"{s.bias.name} + {self.expr(s.bias_off)}" if s.bias is not None else "NULL"
                res = f"{s.res.name} + {self.expr(s.res_off)}" if s.res is not None else "NULL"
                lines.append(f"{pad}tk_pgemm_ep({self.expr(s.m)}, {self.expr(s.n)}, {self.expr(s.k)}, "
                             f"{s.a.name} + {self.expr(s.a_off)}, {s.b.name} + {self.expr(s.b_off)}, {s.ldb}, "
                             f"{self.scalar(s.beta)}, {s.c.name} + {self.expr(s.c_off)}, {s.ldc}, {bias}, {res}, "
                             f"{s.ldr}, {int(s.relu)});")
            elif isinstance(s, Extern):
                lines.append(f"{pad}{s.fn}({', '.join(self.extern_arg(a) for a in s.args)});")
            else:
                raise TypeError(f"cannot render statement {s!r}")
        return lines

    def extern_arg(self, a) -> str:
        if a is None:
            return "NULL"
        if isinstance(a, tuple):
            buf, offset = a
            return f"{buf.name} + {self.expr(offset)}"
        return self.expr(a)

    def store(self, s: Store, pad: str) -> str:
        op = "+=" if s.accumulate else "="
        return f"{pad}{s.buf.name}[{self.expr(s.index)}] {op} {self.expr(s.value)};"

    def scalar(self, value) -> str:
        return repr(float(value)) if isinstance(value, (int, float)) else self.expr(value)

    def kernel(self, k: Kernel, name: str | None = None) -> str:
        """The C function of ``k``, called ``name`` (default: the kernel's own). A plan renders
        each kernel twice (to size its unit, then in it): the body is kept on the kernel, whose
        statements do not change once it is built."""
        body = k.__dict__.get("_c_body")
        if body is None:
            body = k._c_body = self._kernel_body(k)
        return f"void {name or k.name}(void *const *args) {{\n{body}\n}}"

    def _kernel_body(self, k: Kernel) -> str:
        lines = []
        for i, p in enumerate(k.params):
            assert isinstance(p, Buf)
            const = "const " if p.const else ""
            ctype = C_TYPES[p.dtype]
            lines.append(f"    {const}{ctype} *{p.name} = ({const}{ctype} *)args[{i}];")
        if any(p.name == SIZES_PARAM for p in k.params):
            # read once: a loop bound read through a pointer each iteration would be reloaded
            # after every store the compiler cannot prove apart from it
            for j, name in enumerate(sizes_used(k)):
                lines.append(f"    const int64_t {size_variable(name)} = {SIZES_PARAM}[{j}];")
        lines += self.stmts(k.body, 1, k, False)
        return "\n".join(lines)

    def unit(self, kernels: list[Kernel], extra: str = "", names: list[str] | None = None) -> str:
        """One translation unit: the prelude, every kernel (called ``names``, default their own),
        then ``extra`` (a plan function)."""
        head = f"#define TK_BLAS_INT {self.blas_int}\n" + PRELUDE
        if any(_uses_packed_gemm(k.body) for k in kernels):
            head += microkernel.C_SOURCE
        for source in dict.fromkeys(s.source for k in kernels for s in walk(k.body) if isinstance(s, Extern)):
            head += source
        names = names or [k.name for k in kernels]
        return (head + "\n\n" + "\n\n".join(self.kernel(k, n) for k, n in zip(kernels, names))
                + ("\n\n" + extra if extra else "") + "\n")


def size_variable(name: str) -> str:
    """The C variable holding a run-time size (a symbol's name made an identifier)."""
    return "tk_size_" + "".join(ch if ch.isalnum() and ch.isascii() or ch == "_" else f"_{ord(ch):x}_" for ch in name)


def _uses_packed_gemm(body) -> bool:
    for s in body:
        if isinstance(s, PackedGemm):
            return True
        if isinstance(s, For) and _uses_packed_gemm(s.body):
            return True
        if isinstance(s, If) and (_uses_packed_gemm(s.then) or _uses_packed_gemm(s.orelse or [])):
            return True
    return False


class CudaDialect(CDialect):
    """The same programs as CUDA kernels: one thread per iteration of the outermost parallel loop
    (grid-stride), everything inside it sequential per thread."""

    name = "cuda"
    # float16 buffers hold IEEE half bits, read into and written from float32 arithmetic
    types = {**C_TYPES, "int64": "long long", "int32": "int", "float16": "unsigned short"}

    def stmts(self, body, depth, kernel, in_parallel):
        lines = []
        pad = "    " * depth
        for s in body:
            if isinstance(s, For) and s.parallel and not in_parallel:
                v = s.var.name
                lines.append(f"{pad}for (long long {v} = {self.expr(s.start)} + (long long)blockIdx.x * blockDim.x "
                             f"+ threadIdx.x; {v} < {self.expr(s.stop)}; {v} += (long long)gridDim.x * blockDim.x) {{")
                lines += super().stmts(s.body, depth + 1, kernel, True)
                lines.append(f"{pad}}}")
            elif isinstance(s, Extern):
                raise TypeError(f"a CUDA kernel cannot call the host function {s.fn}")
            elif isinstance(s, (Gemm, PackedGemm)):
                raise TypeError("a CUDA kernel cannot call the BLAS library: split the program at its Gemm "
                                "and run that as a cuBLAS call")
            elif isinstance(s, For) and not in_parallel:
                raise TypeError("a CUDA kernel's outermost loops must be parallel")
            else:                      # OpenMP's pragmas mean nothing inside a GPU thread
                lines += [line for line in super().stmts([s], depth, kernel, in_parallel)
                          if not line.lstrip().startswith("#pragma omp")]
        return lines

    def expr(self, e) -> str:
        if isinstance(e, ThreadIndex):
            return "((long long)(blockIdx.x * blockDim.x + threadIdx.x))"
        if isinstance(e, Size) or isinstance(e, Const) and isinstance(e.value, SizeInt):
            raise TypeError("a CUDA kernel takes its sizes as numbers: run-time sizes are the C dialect's")
        if isinstance(e, Load) and e.buf.dtype == "float16":
            return f"tk_h2f({e.buf.name}[{self.expr(e.index)}])"
        return super().expr(e)

    def store(self, s: Store, pad: str) -> str:
        if s.buf.dtype != "float16":
            return super().store(s, pad)
        if s.accumulate:
            raise TypeError("a float16 buffer cannot be accumulated into")
        return f"{pad}{s.buf.name}[{self.expr(s.index)}] = tk_f2h({self.expr(s.value)});"

    def kernel(self, k: Kernel) -> str:
        params = []
        for p in k.params:
            # no __restrict__: a planned buffer may be an input and an output of one kernel (an
            # update in place), and restrict would let the compiler read it through a cache
            # that does not see the kernel's own writes
            const = "const " if p.const else ""
            params.append(f"{const}{self.types[p.dtype]} *{p.name}")
        body = "\n".join(self.stmts(k.body, 1, k, False))
        return f'extern "C" __global__ void {k.name}({", ".join(params)}) {{\n{body}\n}}'

    def unit(self, kernels, extra: str = "") -> str:
        helpers = ("#ifndef INFINITY\n#define INFINITY __int_as_float(0x7f800000)\n#endif\n"
                   "#ifndef NAN\n#define NAN __int_as_float(0x7fffffff)\n#endif\n"
                   # the C dialect's max/min (numpy's NaN and tie rules), as device functions
                   "__device__ inline float tk_maxf(float a, float b) {\n"
                   "    float m = a > b ? a : b; return ((a != a) | (b != b)) ? a + b : m; }\n"
                   "__device__ inline float tk_minf(float a, float b) {\n"
                   "    float m = a < b ? a : b; return ((a != a) | (b != b)) ? a + b : m; }\n"
                   "__device__ inline double tk_max(double a, double b) {\n"
                   "    double m = a > b ? a : b; return ((a != a) | (b != b)) ? a + b : m; }\n"
                   "__device__ inline double tk_min(double a, double b) {\n"
                   "    double m = a < b ? a : b; return ((a != a) | (b != b)) ? a + b : m; }\n")
        if any(p.dtype == "float16" for k in kernels for p in k.params):
            helpers += HALF_HELPERS
        return helpers + "\n".join(self.kernel(k) for k in kernels) + "\n"
