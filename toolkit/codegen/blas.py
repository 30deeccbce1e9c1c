"""The BLAS library numpy already uses, reached from generated C: its sgemm/dgemm addresses.

Generated kernels call GEMM through function pointers handed over once per loaded library
(``tk_set_blas``), so they use the same BLAS as numpy's matmul with no link-time dependency.
numpy's wheels ship OpenBLAS with 64-bit integers and prefixed symbols (``scipy_cblas_sgemm64_``);
other builds export plain ``cblas_sgemm``. The integer width follows the symbol found.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from functools import lru_cache

# (symbol prefix, suffix, integer type) in the order tried
_NAMINGS = (("scipy_cblas_", "64_", "int64_t"), ("cblas_", "64_", "int64_t"), ("cblas_", "", "int"))


@dataclass(frozen=True)
class BlasSymbols:
    sgemm: int                  # addresses
    dgemm: int
    int_type: str               # the C type of the library's integers
    path: str


@lru_cache(maxsize=1)
def numpy_blas() -> BlasSymbols | None:
    """numpy's BLAS, found through threadpoolctl's list of loaded libraries; None if absent."""
    import numpy  # noqa: F401  (loads the library)
    try:
        from threadpoolctl import ThreadpoolController
        paths = [c.filepath for c in ThreadpoolController().lib_controllers if c.user_api == "blas"]
    except Exception:
        paths = []
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix, suffix, int_type in _NAMINGS:
            try:
                s = getattr(lib, f"{prefix}sgemm{suffix}")
                d = getattr(lib, f"{prefix}dgemm{suffix}")
            except AttributeError:
                continue
            return BlasSymbols(ctypes.cast(s, ctypes.c_void_p).value, ctypes.cast(d, ctypes.c_void_p).value,
                               int_type, path)
    return None
