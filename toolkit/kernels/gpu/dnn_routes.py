"""Which route each GPU convolution takes, and why: the float32 math policy in force, the
workspace bound, and the measurements behind the choices that are measured (a weight
gradient's cuDNN or im2col, a fused epilogue's one cuDNN call or two kernels).

Each measured choice is made once per (shapes, dtype, policy, ...) in a process, when the first
plan that needs it is built, so that every plan of the process (captured or kernel by kernel)
computes alike. ``seconds_on_device`` times on the device; the numpy stand-in for CuPy has no
clock to time by, and its tests replace the function. ``decisions()`` says what was chosen.
"""
from __future__ import annotations

import statistics
from collections import Counter

import numpy as np

from ...backend.devices import gpu_module
from ...settings import current, precision_policy
from .dnn_bfloat16 import IN_BFLOAT16


def policy(ctx=None) -> str:
    """The float32 math policy in force for a kernel built from ``ctx``: the ``precision`` setting
    (``TOOLKIT_PRECISION``, ``--precision``) where given, else the net file's ``precision`` key
    (``ctx.precision``), else strict."""
    return precision_policy(getattr(ctx, "precision", None))


def workspace_limit() -> int:
    """The most bytes of workspace one convolution may use (the ``cudnn_workspace_mb`` setting)."""
    return current().cudnn_workspace_mb << 20


WEIGHT_GRADIENT_REASON = "im2col + cuBLAS measured faster than cuDNN's deterministic algorithms"
UNTIMED_REASON = "no device clock to measure the weight gradient's two routes by: im2col + cuBLAS"
TIMING_RUNS = 5

# what each convolution kernel built so far ran on: ("cudnn", op) or ("im2col", why), for
# benchmarks and tests to read
CHOSEN: Counter = Counter()
# each fused epilogue built as one cuDNN call, by its form (dnn_epilogue.py)
FUSED: Counter = Counter()
# each weight gradient's route, decided once in the process: key -> ("cudnn" or "im2col", why)
WEIGHT_GRADIENT_ROUTES: dict[tuple, tuple[str, str]] = {}
# the median seconds each route measured where both were timed: key -> {"cudnn": s, "im2col": s}
WEIGHT_GRADIENT_TIMES: dict[tuple, dict[str, float]] = {}


def column_bytes(x_shape, w_shape, g_shape, dtype) -> int:
    """The bytes of im2col's column buffer for a weight gradient (kernels/cpu/conv.py's ``cols``:
    every kernel tap of every input channel at every output position of every image)."""
    n, c = x_shape[:2]
    _o, _cg, kh, kw = w_shape
    oh, ow = g_shape[2:]
    return int(c) * int(kh) * int(kw) * int(n) * int(oh) * int(ow) * np.dtype(dtype).itemsize


def seconds_on_device(run, shapes: list, out_shape, dtype) -> float | None:
    """The median time of ``run`` over ``TIMING_RUNS`` runs after one untimed, on random inputs
    of ``shapes``, by CUDA events on the current stream; None where the array module has no
    events to time by (the numpy stand-in for CuPy: its tests replace this function)."""
    cp = gpu_module()
    events = getattr(cp.cuda, "Event", None)
    if events is None:
        return None
    # drawn on the device: a batch-256 activation is hundreds of MB, slow to draw on the host
    ins = [cp.random.standard_normal(tuple(shape)).astype(dtype) for shape in shapes]
    outs = [cp.empty(tuple(out_shape), dtype)]
    run(ins, outs)
    samples = []
    for _ in range(TIMING_RUNS):
        start, end = events(), events()
        start.record()
        run(ins, outs)
        end.record()
        end.synchronize()
        samples.append(cp.cuda.get_elapsed_time(start, end) / 1e3)
    del ins, outs
    # the inputs' blocks back to the device, not kept in CuPy's pool beside the plan's memory
    pool = getattr(cp, "get_default_memory_pool", None)
    if pool is not None:
        pool().free_all_blocks()
    return statistics.median(samples)


def weight_gradient_route(ctx, cudnn_run, im2col_factory) -> tuple[str, str, object]:
    """(route, why, run) for a weight gradient whose cuDNN kernel is ``cudnn_run``: cuDNN where
    im2col's column buffer would be over the workspace bound; else whichever measures faster,
    each timed once (``seconds_on_device``; im2col where nothing can be timed). The choice is
    kept per (shapes, attributes, dtype, policy, bound) for the process, so that two plans of one
    net (captured and kernel by kernel) compute the gradient alike."""
    g_shape, x_shape = (tuple(int(v) for v in s) for s in ctx.in_shapes)
    w_shape = tuple(int(v) for v in ctx.out_shapes[0])
    key = (g_shape, x_shape, w_shape, tuple(sorted((k, repr(v)) for k, v in ctx.attrs.items())),
           getattr(cudnn_run, "operands", str(np.dtype(ctx.dtype))), policy(ctx), workspace_limit())
    known = WEIGHT_GRADIENT_ROUTES.get(key)
    if known is not None:
        route, why = known
        return route, why, cudnn_run if route == "cudnn" else im2col_factory(ctx)
    columns, limit = column_bytes(x_shape, w_shape, g_shape, ctx.dtype), workspace_limit()
    if columns > limit:
        route, why, run = "cudnn", (f"im2col's column buffer would take {columns / 2**20:,.0f} MiB, over the "
                                    f"{limit >> 20} MiB workspace bound"), cudnn_run
    else:
        im2col_run = im2col_factory(ctx)
        times = {name: seconds_on_device(candidate, [g_shape, x_shape], w_shape, ctx.dtype)
                 for name, candidate in (("cudnn", cudnn_run), ("im2col", im2col_run))}
        WEIGHT_GRADIENT_TIMES[key] = times
        if None in times.values():
            route, why, run = "im2col", UNTIMED_REASON, im2col_run
        elif times["cudnn"] < times["im2col"]:
            route, why, run = "cudnn", "cuDNN measured faster than im2col + cuBLAS", cudnn_run
        else:
            route, why, run = "im2col", WEIGHT_GRADIENT_REASON, im2col_run
    WEIGHT_GRADIENT_ROUTES[key] = (route, why)
    return route, why, run


def decisions() -> dict:
    """What this process's GPU convolutions were built as, for benchmarks to print: the kernels
    by route, the ops run in bfloat16, the fused epilogues, and each weight gradient's route with
    the two times it measured (microseconds; absent where it was not timed)."""
    def shapes(key):
        return f"g{list(key[0])} x{list(key[1])} w{list(key[2])} {key[4]} {key[5]}"
    return {
        "kernels": {f"{how}: {what}": n for (how, what), n in sorted(CHOSEN.items())},
        "bfloat16": dict(IN_BFLOAT16),
        "fused_epilogues": dict(FUSED),
        "weight_gradients": [
            {"shapes": shapes(key), "route": route, "why": why,
             **{f"{name}_us": round(t * 1e6, 1) for name, t in WEIGHT_GRADIENT_TIMES.get(key, {}).items()
                if t is not None}}
            for key, (route, why) in WEIGHT_GRADIENT_ROUTES.items()],
    }
