"""GEMMs on the GPU through our own cuBLAS handle, called through ctypes, so that a plan's GEMMs
can be captured in a CUDA graph (runtime/capture.py).

CuPy's cuBLAS wrapper refuses to run while a stream is being captured (it cannot know that the
handle has a workspace of its own); cuBLAS itself captures fine when the handle's workspace was
set after its stream, since it then never allocates. So each (device, thread) gets a handle and a
workspace of its own, and before a call on a stream other than the last one the handle is given
the stream, then the workspace, in that order (cublasSetStream drops the workspace).

``matmul(a, b, out)`` has numpy's semantics for the arrays the kernels pass: the last two axes
are the matrix, any leading axes a batch (broadcast from 1 or absent), and operands may be
transposed views (``swapaxes``), which become cuBLAS's transpose flags instead of copies.
Row-major C = A B is column-major C^T = B^T A^T, so cuBLAS gets B first.

The library is the one CuPy loaded (found by the NVIDIA wheels' locator, as CuPy 14 finds it, or
by the loader's search); the ``cublas_library`` setting (``TOOLKIT_CUBLAS_LIBRARY``) names another
file.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
import threading
from pathlib import Path

import numpy as np

from ...backend.devices import gpu_module
from ...backend.registry import register_kernel
from ...settings import current

# cublasOperation_t, cudaDataType, cublasComputeType_t, cublasGemmAlgo_t (cublas_api.h, library_types.h)
OP_N, OP_T = 0, 1
CUDA_R_32F, CUDA_R_64F, CUDA_R_16F = 0, 1, 2
COMPUTE_32F, COMPUTE_64F = 68, 70
GEMM_DEFAULT = -1

# dtype -> (data type, compute type, ctypes type of alpha and beta)
TYPES = {
    np.dtype(np.float32): (CUDA_R_32F, COMPUTE_32F, ctypes.c_float),
    np.dtype(np.float64): (CUDA_R_64F, COMPUTE_64F, ctypes.c_double),
    np.dtype(np.float16): (CUDA_R_16F, COMPUTE_32F, ctypes.c_float),   # float32 accumulation
}

# The workspace cuBLAS may use per call: large enough for its split-K and Hopper kernels
# (PyTorch gives a Hopper handle 32 MiB).
WORKSPACE_BYTES = 32 << 20

class CublasError(RuntimeError):
    """A cuBLAS call returned a status other than CUBLAS_STATUS_SUCCESS."""


def load_library(name: str, setting: str, majors: tuple[int, ...] = (13, 12, 11)) -> ctypes.CDLL:
    """The NVIDIA library ``name`` ("cublas", "cublasLt", "cudnn"): the file the setting
    ``setting`` names, else the one the NVIDIA wheels' locator finds (as CuPy 14 finds it, so the
    copy CuPy loaded), else one in an NVIDIA wheel's lib folder on the import path, else the
    loader's search by soname (``majors`` are the library's own major versions, newest first)."""
    named = getattr(current(), setting)
    if named is not None:
        return ctypes.CDLL(str(named))
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib
        found = load_nvidia_dynamic_lib(name).abs_path
        if found:
            return ctypes.CDLL(found)
    except Exception:                     # not installed, or it found none: look further
        pass
    errors = []
    sonames = tuple(f"lib{name}.so.{major}" for major in majors) + (f"lib{name}.so",)
    wheel_copies = [str(path) for entry in sys.path if entry and os.path.isdir(os.path.join(entry, "nvidia"))
                    for soname in sonames for path in sorted(Path(entry, "nvidia").glob(f"*/lib/{soname}"))]
    for candidate in wheel_copies + list(sonames) + list(filter(None, [ctypes.util.find_library(name)])):
        try:
            return ctypes.CDLL(candidate)
        except OSError as e:
            errors.append(str(e))
    raise CublasError(f"cannot load lib{name}: " + "; ".join(errors))


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    p, i, ll = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
    signatures = {
        "cublasCreate_v2": [ctypes.POINTER(p)],
        "cublasDestroy_v2": [p],
        "cublasSetStream_v2": [p, p],
        "cublasSetWorkspace_v2": [p, p, ctypes.c_size_t],
        "cublasGemmEx": [p, i, i, i, i, i, p, p, i, i, p, i, i, p, p, i, i, i, i],
        "cublasGemmStridedBatchedEx": [p, i, i, i, i, i, p, p, i, i, ll, p, i, i, ll, p, p, i, i, ll, i, i, i],
    }
    for name, args in signatures.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, ctypes.c_int
    return lib


_library: ctypes.CDLL | None = None
_library_lock = threading.Lock()


def library() -> ctypes.CDLL:
    global _library
    with _library_lock:
        if _library is None:
            _library = _declare(load_library("cublas", "cublas_library"))
    return _library


def check(status: int, call: str) -> None:
    if status != 0:
        raise CublasError(f"{call} failed with cuBLAS status {status}")


def pointer(array) -> int:
    """The device address of a CuPy array (a numpy array's own address in a stand-in for CuPy)."""
    data = array.data
    ptr = getattr(data, "ptr", None)
    return ptr if ptr is not None else array.ctypes.data


def stream_pointer() -> int:
    return gpu_module().cuda.get_current_stream().ptr


class Handle:
    """One cuBLAS handle with its own workspace, for one device and one thread."""

    def __init__(self):
        cp = gpu_module()
        self.lib = library()
        raw = ctypes.c_void_p()
        check(self.lib.cublasCreate_v2(ctypes.byref(raw)), "cublasCreate")
        self.raw = raw
        self.cp = cp
        # per stream, a workspace of its own (GEMMs on two streams may run at once), straight
        # from the device rather than a pool: a handle outlives any one plan's private pool
        self.workspaces: dict[int, object] = {}
        self.stream: int | None = None

    def workspace_of(self, stream: int) -> int:
        """The address of this handle's workspace for ``stream`` (made on first use)."""
        space = self.workspaces.get(stream)
        if space is None:
            memory = getattr(getattr(self.cp.cuda, "memory", None), "Memory", None)
            space = self.workspaces[stream] = (memory(WORKSPACE_BYTES) if memory is not None
                                               else self.cp.empty(WORKSPACE_BYTES, np.uint8))
        return space.ptr if hasattr(space, "ptr") else pointer(space)

    def on_current_stream(self) -> ctypes.c_void_p:
        stream = stream_pointer()
        if stream != self.stream:
            check(self.lib.cublasSetStream_v2(self.raw, ctypes.c_void_p(stream)), "cublasSetStream")
            check(self.lib.cublasSetWorkspace_v2(self.raw, ctypes.c_void_p(self.workspace_of(stream)),
                                                 WORKSPACE_BYTES), "cublasSetWorkspace")
            self.stream = stream
        return self.raw


_handles = threading.local()


def per_device(cache: threading.local, make):
    """This thread's ``make()`` for the current device (a library handle), made on first use."""
    device = getattr(gpu_module().cuda.Device(), "id", 0)
    made = getattr(cache, "by_device", None)
    if made is None:
        made = cache.by_device = {}
    if device not in made:
        made[device] = make()
    return made[device]


def handle() -> Handle:
    """This thread's handle on the current device."""
    return per_device(_handles, Handle)


class Operand:
    """A matrix operand in cuBLAS's terms: its address, transpose flag, leading dimension and
    batch stride (0 when one matrix serves every batch entry), or None where its strides do not
    fit (the caller copies it first)."""

    __slots__ = ("ptr", "transposed", "ld", "batch_stride", "rows", "cols")

    @classmethod
    def of(cls, array, batch: int):
        item = array.itemsize
        rows, cols = array.shape[-2], array.shape[-1]
        s_rows, s_cols = array.strides[-2], array.strides[-1]
        op = cls()
        op.rows, op.cols = rows, cols
        # row-major (unit column stride) or a transposed view (unit row stride); a single row or
        # column is either, with the leading dimension at least the other extent
        if s_cols == item or cols == 1:
            op.transposed, ld = False, (s_rows // item if rows > 1 else cols)
            if ld < cols or s_rows % item:
                return None
        elif s_rows == item or rows == 1:
            op.transposed, ld = True, (s_cols // item if cols > 1 else rows)
            if ld < rows or s_cols % item:
                return None
        else:
            return None
        op.ld = max(ld, 1)
        op.batch_stride = _batch_stride(array, batch)
        if op.batch_stride is None:
            return None
        op.ptr = pointer(array)
        return op


def _batch_stride(array, batch: int) -> int | None:
    """Elements between consecutive batch entries of the flattened leading axes (0 when
    broadcast), or None where the leading axes do not flatten to one stride."""
    lead = array.shape[:-2]
    strides = array.strides[:-2]
    if batch == 1:
        return 0
    size = int(np.prod(lead, dtype=np.int64)) if lead else 1
    if size == 1:
        return 0                               # one matrix for every entry
    if size != batch:
        return None
    stride = None
    expect = None
    for extent, s in zip(reversed(lead), reversed(strides)):
        if extent == 1:
            continue
        if stride is None:
            stride, expect = s, s * extent
        elif s != expect:
            return None
        else:
            expect = s * extent
    if stride % array.itemsize:
        return None
    return stride // array.itemsize


def _batch_count(out) -> int:
    """How many matrices ``out`` holds (its leading axes flattened)."""
    lead = out.shape[:-2]
    return int(np.prod(lead, dtype=np.int64)) if lead else 1


def matmul(a, b, out) -> None:
    """``out[...] = a @ b`` (numpy's matmul on the last two axes, leading axes a batch) by one
    cuBLAS call on the current stream; operands whose strides cuBLAS cannot take are copied."""
    cp = gpu_module()
    dtype = np.dtype(out.dtype)
    if dtype not in TYPES or a.dtype != dtype or b.dtype != dtype:
        raise CublasError(f"no cuBLAS GEMM for {a.dtype} x {b.dtype} -> {out.dtype}")
    m, n = out.shape[-2], out.shape[-1]
    k = a.shape[-1]
    batch = _batch_count(out)
    if m == 0 or n == 0 or batch == 0:
        return
    if k == 0:
        out.fill(0)
        return
    lead = out.shape[:-2]
    # operands' batch axes broadcast to the output's: a missing or size-1 batch is stride 0
    if a.ndim > 2 and a.shape[:-2] != lead and int(np.prod(a.shape[:-2], dtype=np.int64)) != 1:
        a = cp.ascontiguousarray(cp.broadcast_to(a, lead + a.shape[-2:]))
    if b.ndim > 2 and b.shape[:-2] != lead and int(np.prod(b.shape[:-2], dtype=np.int64)) != 1:
        b = cp.ascontiguousarray(cp.broadcast_to(b, lead + b.shape[-2:]))
    oa, ob = Operand.of(a, batch), Operand.of(b, batch)
    if oa is None:
        oa = Operand.of(cp.ascontiguousarray(a), batch)
    if ob is None:
        ob = Operand.of(cp.ascontiguousarray(b), batch)
    target = out
    oc = Operand.of(out, batch)
    if oc is None or oc.transposed or oc.batch_stride == 0 and batch > 1:
        target = cp.empty(out.shape, out.dtype)
        oc = Operand.of(target, batch)
    gemm(oa, ob, oc, m, n, k, batch, dtype)
    if target is not out:
        cp.copyto(out, target)


def gemm(oa: Operand, ob: Operand, oc: Operand, m: int, n: int, k: int, batch: int, dtype,
         alpha: float = 1.0, beta: float = 0.0) -> None:
    """C (m x n, row-major) = alpha op(A) op(B) + beta C, as column-major C^T = op(B)^T op(A)^T."""
    h = handle()
    raw = h.on_current_stream()
    data_type, compute, scalar = TYPES[np.dtype(dtype)]
    al, be = scalar(alpha), scalar(beta)
    # column-major, B's storage comes first: op N reads a row-major matrix as its transpose
    op_b = OP_T if ob.transposed else OP_N
    op_a = OP_T if oa.transposed else OP_N
    lib = h.lib
    if batch == 1:
        status = lib.cublasGemmEx(raw, op_b, op_a, n, m, k, ctypes.byref(al),
                                  ctypes.c_void_p(ob.ptr), data_type, ob.ld,
                                  ctypes.c_void_p(oa.ptr), data_type, oa.ld, ctypes.byref(be),
                                  ctypes.c_void_p(oc.ptr), data_type, oc.ld, compute, GEMM_DEFAULT)
        check(status, "cublasGemmEx")
        return
    status = lib.cublasGemmStridedBatchedEx(raw, op_b, op_a, n, m, k, ctypes.byref(al),
                                            ctypes.c_void_p(ob.ptr), data_type, ob.ld, ob.batch_stride,
                                            ctypes.c_void_p(oa.ptr), data_type, oa.ld, oa.batch_stride,
                                            ctypes.byref(be), ctypes.c_void_p(oc.ptr), data_type, oc.ld,
                                            oc.batch_stride, batch, compute, GEMM_DEFAULT)
    check(status, "cublasGemmStridedBatchedEx")


@register_kernel("matmul", "gpu")
def matmul_gpu(ctx):
    """The transpose flags become views, which ``matmul`` turns into cuBLAS's own flags."""
    ta, tb = ctx.attrs["trans_a"], ctx.attrs["trans_b"]

    def run(ins, outs):
        a, b = ins
        matmul(a.swapaxes(-1, -2) if ta else a, b.swapaxes(-1, -2) if tb else b, outs[0])
    return run
