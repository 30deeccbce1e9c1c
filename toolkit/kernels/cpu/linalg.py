"""CPU matmul: BLAS through numpy, transposes passed as strided views (no copies)."""
from __future__ import annotations

import numpy as np

from ...backend.registry import register_kernel


@register_kernel("matmul", "cpu")
def matmul_cpu(ctx):
    ta, tb = ctx.attrs["trans_a"], ctx.attrs["trans_b"]

    def run(ins, outs):
        a, b = ins
        np.matmul(a.swapaxes(-1, -2) if ta else a, b.swapaxes(-1, -2) if tb else b, out=outs[0])
    return run
