"""A GEMM with its bias, or its bias and ReLU, in one cuBLASLt call: the epilogue of a fused
GEMM (``fused_epilogue`` headed by ``matmul``) when its program is exactly ``h + b`` or
``relu(h + b)`` with ``b`` one value per output column. Backward, ``matmul_bias_gradient`` (g^T x
and the sum of g's rows, made by the fuse_bias_gradient pass) is one call with the BGRADB
epilogue, which sums g's rows while the GEMM reads them.

Row-major Y = X W + b is column-major Y^T = W^T X^T + b, so, as in blas.py, cuBLASLt's A is the
second operand's storage and its B the first's, and the bias runs along D's rows (the output's
columns), which is what CUBLASLT_EPILOGUE_BIAS broadcasts. The descriptors and the algorithm
(cuBLASLt's first heuristic choice for the shapes, within the handle's workspace) are made once
when the plan is built; a shape, dtype or transpose that cuBLASLt offers no algorithm for keeps
the GEMM and its separate epilogue kernel. Calls go on the current stream with the handle's
workspace for that stream (blas.Handle), so a CUDA graph captures them.

The library is libcublasLt of the same CUDA release as libcublas; ``TOOLKIT_CUBLASLT_LIBRARY``
names another file.
"""
from __future__ import annotations

import ctypes
import threading
import weakref

import numpy as np

from ...backend.devices import gpu_module
from ...backend.registry import register_kernel
from . import blas

cp = gpu_module()

# cublasLtMatmulDescAttributes_t, cublasLtEpilogue_t, cublasLtMatmulPreferenceAttributes_t (cublasLt.h)
DESC_TRANSA, DESC_TRANSB, DESC_EPILOGUE, DESC_BIAS_POINTER = 3, 4, 7, 8
EPILOGUE_BIAS, EPILOGUE_RELU_BIAS, EPILOGUE_BGRADB = 4, 6, 512
PREF_MAX_WORKSPACE_BYTES = 1
HEURISTIC_BYTES = 96      # sizeof(cublasLtMatmulHeuristicResult_t): algo[64], size_t, status, float, int[4]
HEURISTIC_STATE_OFFSET = 72

def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    p, i, sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
    signatures = {
        "cublasLtCreate": [ctypes.POINTER(p)],
        "cublasLtMatmulDescCreate": [ctypes.POINTER(p), i, i],
        "cublasLtMatmulDescDestroy": [p],
        "cublasLtMatmulDescSetAttribute": [p, i, p, sz],
        "cublasLtMatrixLayoutCreate": [ctypes.POINTER(p), i, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int64],
        "cublasLtMatrixLayoutDestroy": [p],
        "cublasLtMatmulPreferenceCreate": [ctypes.POINTER(p)],
        "cublasLtMatmulPreferenceDestroy": [p],
        "cublasLtMatmulPreferenceSetAttribute": [p, i, p, sz],
        "cublasLtMatmulAlgoGetHeuristic": [p, p, p, p, p, p, p, i, p, ctypes.POINTER(i)],
        "cublasLtMatmul": [p, p, p, p, p, p, p, p, p, p, p, p, p, p, sz, p],
    }
    for name, args in signatures.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, ctypes.c_int
    return lib


_state = {"lib": None, "handle": None}
_lock = threading.Lock()


def _handle():
    """The process's cuBLASLt library and handle (a handle carries no stream: each call names one)."""
    with _lock:
        if _state["handle"] is None:
            lib = _declare(blas.load_library("cublasLt", "cublaslt_library"))
            raw = ctypes.c_void_p()
            blas.check(lib.cublasLtCreate(ctypes.byref(raw)), "cublasLtCreate")
            _state["lib"], _state["handle"] = lib, raw
    return _state["lib"], _state["handle"]


def bias_epilogue(program, outputs, views, n_inputs: int) -> tuple[int, int] | None:
    """(cuBLASLt epilogue, position of the bias input) when a GEMM's epilogue program is exactly
    ``h + b`` (BIAS) or ``relu(h + b)`` with only the ReLU leaving the group (RELU_BIAS)."""
    if any(views or ()):
        return None
    first = program[0] if program else None
    if first is None or first[0] != "add" or first[2]:
        return None
    args = first[1]
    refs = [a for a in args if a[0] == "x"]
    if len(args) != 2 or ("h",) not in args or len(refs) != 1:
        return None
    bias = refs[0][1]
    if len(program) == 1 and tuple(outputs) == (0,):
        return EPILOGUE_BIAS, bias
    if (len(program) == 2 and program[1][0] == "relu" and program[1][1] == (("t", 0),) and not program[1][2]
            and tuple(outputs) == (1,)):
        return EPILOGUE_RELU_BIAS, bias
    return None


class LtGemm:
    """Y (m x n, row-major) = epilogue(op(X) op(W) + b) for fixed shapes, transposes and dtype."""

    def __init__(self, a_shape, b_shape, trans_a: bool, trans_b: bool, dtype, epilogue: int):
        lib, self.handle = _handle()
        self.lib = lib
        dtype = np.dtype(dtype)
        if dtype not in blas.TYPES:
            raise blas.CublasError(f"no cuBLASLt GEMM for {dtype}")
        data_type, compute, scalar = blas.TYPES[dtype]
        scale_type = blas.CUDA_R_64F if dtype == np.float64 else blas.CUDA_R_32F
        m, k = (a_shape[1], a_shape[0]) if trans_a else (a_shape[0], a_shape[1])
        n = b_shape[0] if trans_b else b_shape[1]
        self.m, self.n = m, n
        self.epilogue = epilogue
        self.alpha, self.beta = scalar(1.0), scalar(0.0)
        made: list[tuple[str, ctypes.c_void_p]] = []
        self._finalizer = weakref.finalize(self, _destroy, lib, made)

        def new(kind: str, create, *args) -> ctypes.c_void_p:
            raw = ctypes.c_void_p()
            blas.check(create(ctypes.byref(raw), *args), create.__name__)
            made.append((kind, raw))
            return raw
        self.desc = new("desc", lib.cublasLtMatmulDescCreate, compute, scale_type)
        # column-major: cuBLASLt's A is W's storage (op T when W is given transposed), its B is X's
        op_w, op_x = int(trans_b), int(trans_a)
        self._set(DESC_TRANSA, ctypes.c_int32(op_w))
        self._set(DESC_TRANSB, ctypes.c_int32(op_x))
        self._set(DESC_EPILOGUE, ctypes.c_uint32(epilogue))
        # stored shapes, column-major: W stored row-major [k, n] reads as n x k (ld n), or as
        # k x n (ld k) when it is W^T stored as [n, k]; likewise X
        w_rows, w_cols, w_ld = (k, n, k) if trans_b else (n, k, n)
        x_rows, x_cols, x_ld = (m, k, m) if trans_a else (k, m, k)
        self.w_layout = new("layout", lib.cublasLtMatrixLayoutCreate, data_type, w_rows, w_cols, w_ld)
        self.x_layout = new("layout", lib.cublasLtMatrixLayoutCreate, data_type, x_rows, x_cols, x_ld)
        self.y_layout = new("layout", lib.cublasLtMatrixLayoutCreate, data_type, n, m, n)
        pref = new("pref", lib.cublasLtMatmulPreferenceCreate)
        limit = ctypes.c_uint64(blas.WORKSPACE_BYTES)
        blas.check(lib.cublasLtMatmulPreferenceSetAttribute(pref, PREF_MAX_WORKSPACE_BYTES, ctypes.byref(limit),
                                                            ctypes.sizeof(limit)),
                   "cublasLtMatmulPreferenceSetAttribute")
        self.heuristic = (ctypes.c_ubyte * HEURISTIC_BYTES)()
        found = ctypes.c_int(0)
        status = lib.cublasLtMatmulAlgoGetHeuristic(self.handle, self.desc, self.w_layout, self.x_layout,
                                                    self.y_layout, self.y_layout, pref, 1,
                                                    ctypes.byref(self.heuristic), ctypes.byref(found))
        state = ctypes.c_int.from_buffer(self.heuristic, HEURISTIC_STATE_OFFSET).value
        if status != 0 or found.value < 1 or state != 0:
            raise blas.CublasError(f"cuBLASLt offers no algorithm for this GEMM and epilogue (status {status}, "
                                   f"{found.value} found)")
        self.bias_ptr: int | None = None

    def _set(self, attr: int, value) -> None:
        blas.check(self.lib.cublasLtMatmulDescSetAttribute(self.desc, attr, ctypes.byref(value), ctypes.sizeof(value)),
                   "cublasLtMatmulDescSetAttribute")

    def __call__(self, x, w, bias, out) -> None:
        ptr = blas.pointer(bias)
        if ptr != self.bias_ptr:                  # a plan's buffers never move: set once
            self._set(DESC_BIAS_POINTER, ctypes.c_void_p(ptr))
            self.bias_ptr = ptr
        handle = blas.handle()
        stream = blas.stream_pointer()
        status = self.lib.cublasLtMatmul(
            self.handle, self.desc, ctypes.byref(self.alpha), ctypes.c_void_p(blas.pointer(w)), self.w_layout,
            ctypes.c_void_p(blas.pointer(x)), self.x_layout, ctypes.byref(self.beta),
            ctypes.c_void_p(blas.pointer(out)), self.y_layout, ctypes.c_void_p(blas.pointer(out)), self.y_layout,
            ctypes.byref(self.heuristic), ctypes.c_void_p(handle.workspace_of(stream)),
            ctypes.c_size_t(blas.WORKSPACE_BYTES), ctypes.c_void_p(stream))
        blas.check(status, "cublasLtMatmul")


def _destroy(lib, made) -> None:
    destroyers = {"desc": lib.cublasLtMatmulDescDestroy, "layout": lib.cublasLtMatrixLayoutDestroy,
                  "pref": lib.cublasLtMatmulPreferenceDestroy}
    for kind, raw in reversed(made):
        destroyers[kind](raw)


def epilogue_gemm(ctx, head_attrs, k: int):
    """run(ins, outs) doing the node's GEMM and epilogue in one cuBLASLt call, or None where
    the program, the shapes or cuBLASLt do not allow it (the caller keeps its two kernels)."""
    found = bias_epilogue(ctx.attrs["program"], ctx.attrs["outputs"], ctx.attrs.get("views"), len(ctx.in_shapes))
    if found is None or k != 2:
        return None
    epilogue, bias_at = found
    a_shape, b_shape = ctx.in_shapes[0], ctx.in_shapes[1]
    out_shape = tuple(ctx.out_shapes[0])
    if len(a_shape) != 2 or len(b_shape) != 2 or len(out_shape) != 2:
        return None
    if tuple(ctx.in_shapes[bias_at]) != (out_shape[1],) or ctx.node.inputs[bias_at].dtype != ctx.dtype:
        return None
    if min(out_shape) == 0 or (a_shape[0] if head_attrs["trans_a"] else a_shape[1]) == 0:
        return None
    try:
        gemm = LtGemm(a_shape, b_shape, head_attrs["trans_a"], head_attrs["trans_b"], ctx.dtype, epilogue)
    except (blas.CublasError, OSError, AttributeError):
        return None                   # no cuBLASLt here, or no algorithm for these shapes

    def run(ins, outs) -> bool:
        """The GEMM and epilogue done; False (nothing done) where an operand is not contiguous."""
        x, w, bias, out = ins[0], ins[1], ins[bias_at], outs[0]
        if not (x.flags.c_contiguous and w.flags.c_contiguous and bias.flags.c_contiguous and out.flags.c_contiguous):
            return False
        gemm(x, w, bias, out)
        return True
    return run


@register_kernel("matmul_bias_gradient", "gpu")
def matmul_bias_gradient_gpu(ctx):
    """One cuBLASLt call where it offers an algorithm; else a cuBLAS GEMM and a CuPy sum."""
    g_shape, x_shape = ctx.in_shapes
    keepdims = ctx.attrs["keepdims"]
    one_call = None
    if min(g_shape) > 0 and min(x_shape) > 0:
        try:
            one_call = LtGemm(g_shape, x_shape, True, False, ctx.dtype, EPILOGUE_BGRADB)
        except (blas.CublasError, OSError, AttributeError):
            one_call = None

    def run(ins, outs):
        g, x = ins
        weight, bias = outs
        if one_call is not None and all(a.flags.c_contiguous for a in (g, x, weight, bias)):
            one_call(g, x, bias, weight)          # cuBLASLt writes the bias gradient where its bias would be read
            return
        blas.matmul(g.swapaxes(-1, -2), x, weight)
        cp.sum(g, axis=0, keepdims=keepdims, out=bias)
    return run

