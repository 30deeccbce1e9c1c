"""bfloat16 convolutions on a device without bfloat16 arrays: CuPy has none, so mixed precision
in bfloat16 stores each bfloat16 value as float32 (passes/precision.py). A convolution whose
operands are such values runs in bfloat16 all the same: its operands converted into uint16
arrays holding bfloat16 bits, cuDNN's bfloat16 convolution (float32 sums on tensor cores) on
them, its result widened back to float32.
"""
from __future__ import annotations

from collections import Counter

import numpy as np

BFLOAT16 = "bfloat16"


def operand_type(ctx) -> str:
    """The type a float32 convolution's operands are summed in: bfloat16 where one of them is a
    value rounded to bfloat16 (mixed precision in bfloat16 on a device without bfloat16 arrays:
    passes/precision.py stores each bfloat16 value as float32, each cast to it a
    ``round_precision``, and rounds the result of every convolution whose operands are bfloat16),
    else the kernel's dtype. A convolution reached only through other ops (a gradient after a
    ReLU's) stays float32, its result rounded all the same."""
    if np.dtype(ctx.dtype) == np.float32:
        for v in getattr(getattr(ctx, "node", None), "inputs", ()):
            producer = getattr(v, "producer", None)
            if producer is not None and producer.op == "round_precision" and producer.attrs.get("dtype") == BFLOAT16:
                return BFLOAT16
    return str(np.dtype(ctx.dtype))


# float32 <-> bfloat16 bits, rounding to nearest even (a NaN stays a NaN), one thread per element
# in a grid-stride loop
BFLOAT16_SOURCE = r"""
union tk_bits { float f; unsigned int u; };
extern "C" __global__ void tk_to_bfloat16(const float *x, unsigned short *y, long n) {
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)blockDim.x * gridDim.x) {
        union tk_bits b;
        b.f = x[i];
        if ((b.u & 0x7f800000u) == 0x7f800000u && (b.u & 0x7fffffu)) y[i] = (unsigned short)((b.u >> 16) | 0x40u);
        else y[i] = (unsigned short)((b.u + 0x7fffu + ((b.u >> 16) & 1u)) >> 16);
    }
}
extern "C" __global__ void tk_from_bfloat16(const unsigned short *x, float *y, long n) {
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)blockDim.x * gridDim.x) {
        union tk_bits b;
        b.u = (unsigned int)x[i] << 16;
        y[i] = b.f;
    }
}
"""


class InBfloat16:
    """A bfloat16 convolution on float32 arrays: both operands converted into bfloat16 buffers,
    the convolution on them, its bfloat16 result widened into the float32 output (which the
    graph then rounds to bfloat16 again: a no-op). The buffers are parts of the stream's own
    scratch (``scratch``: dnn.py's ``Handle.scratch``), shared by every convolution run on that stream one after
    another, so a net's bfloat16 copies take the largest convolution's room, not the sum."""

    ALIGN = 128                  # elements (256 bytes) between the parts, as cuDNN's kernels like

    def __init__(self, conv, a_shape, b_shape, out_shape, scratch):
        from .cuda import MAX_BLOCKS, THREADS_PER_BLOCK, compiled_source
        self.conv, self.scratch = conv, scratch
        self.parts, start = [], 0
        for shape in (a_shape, b_shape, out_shape):
            size = int(np.prod(shape, dtype=np.int64))
            self.parts.append((start, size, tuple(int(v) for v in shape)))
            start += -(-size // self.ALIGN) * self.ALIGN
        self.elements = start
        self.to_bits = compiled_source(BFLOAT16_SOURCE, "tk_to_bfloat16")
        self.from_bits = compiled_source(BFLOAT16_SOURCE, "tk_from_bfloat16")
        self.grid = lambda n: ((max(1, min(MAX_BLOCKS, -(-n // THREADS_PER_BLOCK))),), (THREADS_PER_BLOCK,))

    def __call__(self, a, b, out) -> None:
        scratch = self.scratch(self.elements)
        a_bits, b_bits, out_bits = (scratch[o:o + n].reshape(shape) for o, n, shape in self.parts)
        for src, bits in ((a, a_bits), (b, b_bits)):
            self.to_bits(*self.grid(bits.size), (src, bits, np.int64(bits.size)))
        self.conv(a_bits, b_bits, out_bits)
        self.from_bits(*self.grid(out_bits.size), (out_bits, out, np.int64(out_bits.size)))


# each op the bfloat16 convolutions ran, for benchmarks and tests to read
IN_BFLOAT16: Counter = Counter()
