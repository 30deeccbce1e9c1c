"""Sums and means per channel: ``reduce_sum`` / ``reduce_mean`` over every axis but axis 1 of an
[N, C, ...] array (BatchNorm's batch statistics over NCHW's (0, 2, 3) or [N, C]'s (0,), and their
gradients, the bias gradient of a convolution), in two CUDA launches where CuPy's generic
reduction spends one block per channel walking the array with an index division per element.

The per-channel elements are N runs of HW contiguous values (HW = the product of the axes after
C). Stage one splits each channel's N * HW elements into ``chunks`` equal spans and gives each
(channel, span) a warp: the lanes stride over each contiguous run (coalesced reads), each lane
keeps four sums (loads in flight, shorter float chains), and the warp adds its lanes by a fixed
shuffle tree into one partial per (channel, span). Stage two gives each channel a warp that adds
its spans' partials the same way and scales (1 / count for a mean). No atomics: every sum is
taken in an order fixed by the shape alone, so a captured plan equals the kernel-by-kernel one
bit for bit and runs repeat exactly. Sums are float32 for float16 and float32, float64 for
float64 (as the fallback's are). Where a channel fits one span stage one writes the result.

Other axes, other layouts and empty arrays keep the kernel this one specialises (dispatched.py's
CuPy reduction), as every reduction does with the ``channel_reductions`` setting off. Compiled
by NVRTC when a plan is built (``cuda.compiled_source``); written for warps of ``TK_WARP`` lanes
as rows.py's kernels are, so the tests compile them for the host.
"""
from __future__ import annotations

import numpy as np

from ...backend.devices import gpu_module
from ...backend.registry import KERNELS, SPECIALISED
from ...settings import current
from .cuda import THREADS_PER_BLOCK, compiled_source

cp = gpu_module()

STORAGE = ("float32", "float64", "float16")
MAX_BLOCKS = 132 * 8

# About two waves of resident warps on an H100 (132 SMs x 64 warps) split among the channels...
TARGET_WARPS = 16384
# ...but no span shorter than this many elements (a lane's loop of 32 reads amortises its setup)
MIN_SPAN = 1024
MAX_CHUNKS = 1024


def _unit(dtype: str) -> str:
    # rows.py's warp helpers and types; imported here, as rows.py imports dispatched.py, which
    # imports this module
    from .rows import PRELUDE, _types
    t, a, ld, st = _types(dtype)
    return PRELUDE + f"""
typedef {t} T;
typedef {a} A;
#define LD(X) ((A){ld % "X"})
#define ST(X) ({st % "(X)"})

/* the sum of channel c's elements j in [j0, j1) of its n * hw (j = image * hw + position), by one warp */
__device__ inline A tk_span_sum(const T *x, long c, long channels, long hw, long j0, long j1, long lane) {{
    A s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    long j = j0;
    while (j < j1) {{
        long image = j / hw, first = j - image * hw;
        long count = (j1 - j < hw - first) ? j1 - j : hw - first;
        const T *run = x + (image * channels + c) * hw + first;
        long k = lane;
        for (; k + 3 * TK_WARP < count; k += 4 * TK_WARP) {{
            s0 += LD(run[k]); s1 += LD(run[k + TK_WARP]);
            s2 += LD(run[k + 2 * TK_WARP]); s3 += LD(run[k + 3 * TK_WARP]);
        }}
        for (; k < count; k += TK_WARP) s0 += LD(run[k]);
        j += count;
    }}
    return tk_warp_sum((s0 + s1) + (s2 + s3));
}}

/* stage one: warp (c, p) sums span p of channel c into partial[c * chunks + p], or, with one
   span per channel, writes out[c] = sum * scale */
extern "C" __global__ void tk_channel_partials(const T *x, A *partial, T *out, long n, long channels, long hw,
                                               long chunks, A scale) {{
    long lane = threadIdx.x % TK_WARP;
    long warps = (long)gridDim.x * blockDim.x / TK_WARP;
    long per_channel = n * hw, span = (per_channel + chunks - 1) / chunks;
    for (long w = ((long)blockIdx.x * blockDim.x + threadIdx.x) / TK_WARP; w < channels * chunks; w += warps) {{
        long c = w / chunks, p = w % chunks;
        long j0 = p * span, j1 = j0 + span < per_channel ? j0 + span : per_channel;
        A s = tk_span_sum(x, c, channels, hw, j0 < per_channel ? j0 : per_channel, j1, lane);
        if (lane == 0) {{
            if (chunks == 1) out[c] = ST(s * scale);
            else partial[w] = s;
        }}
    }}
}}

/* stage two: out[c] = (the sum of channel c's partials) * scale, one warp per channel */
extern "C" __global__ void tk_channel_finish(const A *partial, T *out, long channels, long chunks, A scale) {{
    long lane = threadIdx.x % TK_WARP;
    long warps = (long)gridDim.x * blockDim.x / TK_WARP;
    for (long c = ((long)blockIdx.x * blockDim.x + threadIdx.x) / TK_WARP; c < channels; c += warps) {{
        A s = 0;
        for (long p = lane; p < chunks; p += TK_WARP) s += partial[c * chunks + p];
        s = tk_warp_sum(s);
        if (lane == 0) out[c] = ST(s * scale);
    }}
}}
"""


def channel_geometry(shape, axes) -> tuple[int, int, int] | None:
    """(n, channels, hw) where ``axes`` are every axis of ``shape`` but axis 1, else None."""
    rank = len(shape)
    if rank < 2 or tuple(sorted(a % rank for a in axes)) != tuple(i for i in range(rank) if i != 1):
        return None
    hw = int(np.prod(shape[2:], dtype=np.int64))
    return int(shape[0]), int(shape[1]), hw


def chunks_for(n: int, channels: int, hw: int) -> int:
    """How many spans each channel is split into: enough warps to fill the device, spans long
    enough to pay for themselves."""
    by_device = -(-TARGET_WARPS // channels)
    by_length = -(-(n * hw) // MIN_SPAN)
    return max(1, min(by_device, by_length, MAX_CHUNKS))


def _grid(warps: int) -> tuple[int]:
    return (max(1, min(MAX_BLOCKS, -(-warps * 32 // THREADS_PER_BLOCK))),)


def _channel_factory(mean: bool, fallback):
    def factory(ctx):
        geometry = channel_geometry(ctx.in_shapes[0], ctx.attrs["axes"])
        off = not current().channel_reductions
        if off or ctx.dtype not in STORAGE or geometry is None or 0 in geometry:
            return fallback(ctx)
        n, channels, hw = geometry
        chunks = chunks_for(n, channels, hw)
        accumulator = np.float64 if ctx.dtype == "float64" else np.float32
        scale = accumulator(1.0 / (n * hw) if mean else 1.0)
        unit = _unit(ctx.dtype)
        partials = compiled_source(unit, "tk_channel_partials")
        finish = compiled_source(unit, "tk_channel_finish") if chunks > 1 else None
        partial = cp.empty((channels * chunks if chunks > 1 else 1,), accumulator)   # scratch: fixed address
        sizes = (np.int64(n), np.int64(channels), np.int64(hw), np.int64(chunks), scale)
        grid_one, grid_two = _grid(channels * chunks), _grid(channels)
        slow = fallback(ctx)

        def run(ins, outs):
            if not (ins[0].flags.c_contiguous and outs[0].flags.c_contiguous):
                return slow(ins, outs)
            partials(grid_one, (THREADS_PER_BLOCK,), (ins[0], partial, outs[0]) + sizes)
            if finish is not None:
                finish(grid_two, (THREADS_PER_BLOCK,), (partial, outs[0], np.int64(channels), np.int64(chunks), scale))
        return run
    return factory


# in place of dispatched.py's CuPy reductions, kept as the fallback for other axes and layouts
KERNELS.specialise("reduce_sum", "gpu", SPECIALISED)(lambda slow: _channel_factory(False, slow))
KERNELS.specialise("reduce_mean", "gpu", SPECIALISED)(lambda slow: _channel_factory(True, slow))
