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

``fused_reduce`` (ops/fused_reduce.py, made by passes/fuse_reductions.py) runs the same two
stages over an elementwise program's value instead of a stored array: ``tk_value`` is the
program's steps rendered by the fused groups' generator (native/elementwise.py's program_body,
codegen's CUDA dialect), each operand read at the element, at its channel or as its one value,
the result rounded to the storage type as the tensor it replaces would have been.

Other axes, other layouts and empty arrays keep the kernel this one specialises (dispatched.py's
CuPy reduction), as every reduction does with the ``channel_reductions`` setting off. Compiled
by NVRTC when a plan is built (``cuda.compiled_source``); written for warps of ``TK_WARP`` lanes
as rows.py's kernels are, so the tests compile them for the host.
"""
from __future__ import annotations

import numpy as np

from ...backend.devices import gpu_module
from ...backend.registry import KERNELS, SPECIALISED, register_kernel
from ...codegen.loops import Buf, Names, Var, lift
from ...codegen.render import CudaDialect
from ...ir.graph import TensorType
from ...ops import fused_reduce  # noqa: F401  (the op this module's fused kernel runs)
from ...ops.fused import program_types
from ...settings import current
from ..native.elementwise import COMPUTE_DTYPE, program_body
from .cuda import THREADS_PER_BLOCK, compiled_source

cp = gpu_module()

STORAGE = ("float32", "float64", "float16")
MAX_BLOCKS = 132 * 8

# About two waves of resident warps on an H100 (132 SMs x 64 warps) split among the channels...
TARGET_WARPS = 16384
# ...but no span shorter than this many elements (a lane's loop of 32 reads amortises its setup)
MIN_SPAN = 1024
MAX_CHUNKS = 1024


# where a fused reduction's operand is read: every element, its channel's entry, or its one value
FULL, CHANNEL, SCALAR = "full", "channel", "scalar"


def _value_function(dtype: str, kinds: tuple[str, ...], program=None, output: int = 0) -> str:
    """``A tk_value(i, c, x0, x1, ...)``: the value reduced at element i (of channel c). Plain:
    x0[i]. Fused: the program's step ``output`` rendered by the fused groups' generator, its
    result rounded to the storage type as the tensor it stands for would be."""
    params = ", ".join(f"const T *x{k}" for k in range(len(kinds)))
    head = f"__device__ inline A tk_value(long long tk_i, long long tk_c, {params}) {{"
    if program is None:
        return f"{head}\n    return LD(x0[tk_i]);\n}}\n"
    names = Names()
    operands = {("x", k): Buf(f"x{k}", dtype, 1) for k in range(len(kinds))}
    index = {FULL: Var("tk_i", "int64"), CHANNEL: Var("tk_c", "int64"), SCALAR: lift(0, "int64")}
    slot = Buf("tk_slot", dtype, 1, const=False)

    def index_of(key):
        return lift(0, "int64") if key[0] == "o" else index[kinds[key[1]]]
    body = program_body(program, (output,), operands, COMPUTE_DTYPE.get(dtype, dtype), index_of, [slot], names)
    if body is None:
        return None
    lines = CudaDialect().stmts(body, 1, None, True)
    return "\n".join([head, "    T tk_slot[1];", *lines, "    return LD(tk_slot[0]);", "}"]) + "\n"


def _unit(dtype: str, kinds: tuple[str, ...] = (FULL,), program=None, output: int = 0) -> str | None:
    # rows.py's warp helpers and types; imported here, as rows.py imports dispatched.py, which
    # imports this module
    from .rows import PRELUDE, _types
    t, a, ld, st = _types(dtype)
    types = f"""
typedef {t} T;
typedef {a} A;
#define LD(X) ((A){ld % "X"})
#define ST(X) ({st % "(X)"})
"""
    value = _value_function(dtype, kinds, program, output) if dtype in STORAGE else None
    if value is None:
        return None
    params = ", ".join(f"const T *x{k}" for k in range(len(kinds)))
    args = ", ".join(f"x{k}" for k in range(len(kinds)))
    # the generator's helpers (max/min with numpy's NaN rules, INFINITY, NAN) without a kernel
    return PRELUDE + CudaDialect().unit([]) + types + value + f"""
/* the sum of channel c's elements j in [j0, j1) of its n * hw (j = image * hw + position), by one warp */
__device__ inline A tk_span_sum({params}, long c, long channels, long hw, long j0, long j1, long lane) {{
    A s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    long j = j0;
    while (j < j1) {{
        long image = j / hw, first = j - image * hw;
        long count = (j1 - j < hw - first) ? j1 - j : hw - first;
        long long run = (image * channels + c) * hw + first;
        long k = lane;
        for (; k + 3 * TK_WARP < count; k += 4 * TK_WARP) {{
            s0 += tk_value(run + k, c, {args}); s1 += tk_value(run + k + TK_WARP, c, {args});
            s2 += tk_value(run + k + 2 * TK_WARP, c, {args}); s3 += tk_value(run + k + 3 * TK_WARP, c, {args});
        }}
        for (; k < count; k += TK_WARP) s0 += tk_value(run + k, c, {args});
        j += count;
    }}
    return tk_warp_sum((s0 + s1) + (s2 + s3));
}}

/* stage one: warp (c, p) sums span p of channel c into partial[c * chunks + p], or, with one
   span per channel, writes out[c] = sum * scale */
extern "C" __global__ void tk_channel_partials({params}, A *partial, T *out, long n, long channels, long hw,
                                               long chunks, A scale) {{
    long lane = threadIdx.x % TK_WARP;
    long warps = (long)gridDim.x * blockDim.x / TK_WARP;
    long per_channel = n * hw, span = (per_channel + chunks - 1) / chunks;
    for (long w = ((long)blockIdx.x * blockDim.x + threadIdx.x) / TK_WARP; w < channels * chunks; w += warps) {{
        long c = w / chunks, p = w % chunks;
        long j0 = p * span, j1 = j0 + span < per_channel ? j0 + span : per_channel;
        A s = tk_span_sum({args}, c, channels, hw, j0 < per_channel ? j0 : per_channel, j1, lane);
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


def operand_kinds(in_shapes, group_shape) -> tuple[str, ...] | None:
    """How a fused reduction reads each operand of a [N, C, ...] group: every element, one per
    channel ([C] broadcast as [1, C, 1, ...]), or one value; None for any other broadcast."""
    rank, kinds = len(group_shape), []
    for shape in in_shapes:
        shape = tuple(shape)
        padded = (1,) * (rank - len(shape)) + shape
        if padded == tuple(group_shape):
            kinds.append(FULL)
        elif int(np.prod(shape, dtype=np.int64)) == 1:
            kinds.append(SCALAR)
        elif len(shape) <= rank and padded[1] == group_shape[1] and \
                all(d == 1 for i, d in enumerate(padded) if i != 1):
            kinds.append(CHANNEL)
        else:
            return None
    return tuple(kinds)


def _launcher(ctx, group_shape, kinds, program=None, output=0, mean=None):
    """run(ins, outs) of the two stages over ``group_shape``, or None where they do not apply."""
    geometry = channel_geometry(group_shape, ctx.attrs["axes"])
    if ctx.dtype not in STORAGE or geometry is None or 0 in geometry or kinds is None:
        return None
    unit = _unit(ctx.dtype, kinds, program, output)
    if unit is None:
        return None
    n, channels, hw = geometry
    chunks = chunks_for(n, channels, hw)
    accumulator = np.float64 if ctx.dtype == "float64" else np.float32
    scale = accumulator(1.0 / (n * hw) if mean else 1.0)
    partials = compiled_source(unit, "tk_channel_partials")
    finish = compiled_source(unit, "tk_channel_finish") if chunks > 1 else None
    partial = cp.empty((channels * chunks if chunks > 1 else 1,), accumulator)   # scratch: fixed address
    sizes = (np.int64(n), np.int64(channels), np.int64(hw), np.int64(chunks), scale)
    grid_one, grid_two = _grid(channels * chunks), _grid(channels)

    def run(ins, outs):
        partials(grid_one, (THREADS_PER_BLOCK,), tuple(ins) + (partial, outs[0]) + sizes)
        if finish is not None:
            finish(grid_two, (THREADS_PER_BLOCK,), (partial, outs[0], np.int64(channels), np.int64(chunks), scale))
    return run


def _contiguous(arrays) -> bool:
    return all(a.flags.c_contiguous for a in arrays)


def _channel_factory(mean: bool, fallback):
    def factory(ctx):
        fast = _launcher(ctx, tuple(ctx.in_shapes[0]), (FULL,), mean=mean) if current().channel_reductions else None
        if fast is None:
            return fallback(ctx)
        slow = fallback(ctx)

        def run(ins, outs):
            if not _contiguous((ins[0], outs[0])):
                return slow(ins, outs)
            fast(ins, outs)
        return run
    return factory


def _fused_pays(node) -> bool:
    return bool(current().channel_reductions)


@register_kernel("fused_reduce", "gpu", fusion_pays=_fused_pays)
def fused_reduce_gpu(ctx):
    """The program evaluated inside the two stages: its result is never written. The pass makes
    this node only where the operands are whole, per channel or single (``operand_kinds``)."""
    program, (output,) = ctx.attrs["program"], ctx.attrs["outputs"]
    group_shape = tuple(program_shapes(ctx.attrs["program"], ctx.in_shapes, ctx.dtype)[output])
    kinds = operand_kinds(ctx.in_shapes, group_shape)
    fast = _launcher(ctx, group_shape, kinds, program, output, ctx.attrs["mean"])
    if fast is None:
        raise ValueError(f"fused_reduce cannot run {ctx.node.scope} on the GPU: operands {ctx.in_shapes}, "
                         f"axes {ctx.attrs['axes']}, dtype {ctx.dtype}")

    def run(ins, outs):
        if not _contiguous(list(ins) + [outs[0]]):
            raise ValueError(f"fused_reduce {ctx.node.scope}: an operand is not contiguous")
        fast(ins, outs)
    return run


# in place of dispatched.py's CuPy reductions, kept as the fallback for other axes and layouts
KERNELS.specialise("reduce_sum", "gpu", SPECIALISED)(lambda slow: _channel_factory(False, slow))
KERNELS.specialise("reduce_mean", "gpu", SPECIALISED)(lambda slow: _channel_factory(True, slow))


def program_shapes(program, in_shapes, dtype: str) -> list[tuple]:
    """Every step's shape for concrete operand shapes."""
    return [t.shape for t in program_types(program, [TensorType(tuple(sh), dtype) for sh in in_shapes])]
