"""Which route each GPU convolution takes, and why: the float32 math policy in force, the
workspace bound, and the measurements behind the choices that are measured (a weight
gradient's cuDNN or im2col, a fused epilogue's one cuDNN call or two kernels).

Each measured choice is made once per (shapes, dtype, policy, ...) in a process, when the first
plan that needs it is built, so that every plan of the process (captured or kernel by kernel)
computes alike. ``seconds_on_device`` times on the device; the numpy stand-in for CuPy has no
clock to time by, and its tests replace the function. ``decisions()`` says what was chosen.

The measured choices are recorded with a training run's checkpoints (``export_routes``) and a
resumed run takes them again before it builds a plan (``adopt_routes``, through
backend/measured.py): measured anew, they could differ, and the two routes sum in different
orders, which would break the exact resume the contract promises.
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
# each fused epilogue's choice (dnn_epilogue.py): (shapes, attributes, dtype, policy, residual or
# not) -> whether the one cuDNN call measured faster (False also where cuDNN refused it)
FUSED_ROUTES: dict[tuple, bool] = {}


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


# -- recording the measured choices with a run, and taking them again on resume ---------------------

def export_routes(cudnn_unavailable: str | None) -> dict:
    """The measured choices of this process as JSON data: the weight gradients' routes and the
    fused epilogues' choices by their keys, and why cuDNN could not run (dnn.unavailable(): None
    where it could)."""
    return {"cudnn_unavailable": cudnn_unavailable,
            "weight_gradients": [[_listed(key), route, why] for key, (route, why) in WEIGHT_GRADIENT_ROUTES.items()],
            "fused_epilogues": [[_listed(key), fused] for key, fused in FUSED_ROUTES.items()]}


def adopt_routes(data, cudnn_unavailable: str | None) -> list[str]:
    """Installs ``export_routes``' data read back from a run, checked whole first (a ValueError
    saying what is wrong); returns the line to say where the routes cannot all be taken now
    (``cudnn_unavailable``: dnn.unavailable() in this process)."""
    if not isinstance(data, dict) or set(data) != {"cudnn_unavailable", "weight_gradients", "fused_epilogues"}:
        raise ValueError("not a mapping of cudnn_unavailable, weight_gradients and fused_epilogues")
    then = data["cudnn_unavailable"]
    if then is not None and not isinstance(then, str):
        raise ValueError("cudnn_unavailable is neither null nor a reason")
    gradients, epilogues = data["weight_gradients"], data["fused_epilogues"]
    if not isinstance(gradients, list) or not isinstance(epilogues, list):
        raise ValueError("weight_gradients or fused_epilogues is not a list")
    routes = {}
    for entry in gradients:
        if not (isinstance(entry, list) and len(entry) == 3 and entry[1] in ("cudnn", "im2col")
                and isinstance(entry[2], str)):
            raise ValueError("a weight gradient's entry is not [key, 'cudnn' or 'im2col', why]")
        routes[_gradient_key(entry[0])] = (entry[1], entry[2])
    fused = {}
    for entry in epilogues:
        if not (isinstance(entry, list) and len(entry) == 2 and type(entry[1]) is bool):
            raise ValueError("a fused epilogue's entry is not [key, true or false]")
        fused[_epilogue_key(entry[0])] = entry[1]
    now = cudnn_unavailable
    WEIGHT_GRADIENT_ROUTES.update(routes)
    FUSED_ROUTES.update(fused)
    if now is not None and (routes or fused):
        return [f"the run measured its convolutions' routes with cuDNN, which cannot run now ({now}): they run as "
                "im2col + cuBLAS, so the resumed run is not exact to the last bit"]
    if now is None and then is not None:
        return [f"the run trained without cuDNN ({then}), which runs now: its convolutions take cuDNN, so the "
                "resumed run is not exact to the last bit"]
    return []


def _listed(value):
    return [_listed(v) for v in value] if isinstance(value, tuple) else value


def _shape(value) -> tuple:
    if not (isinstance(value, list) and len(value) == 4 and all(type(v) is int and 0 <= v < 1 << 40 for v in value)):
        raise ValueError("a key's shape is not four sizes")
    return tuple(value)


def _attrs(value) -> tuple:
    if not (isinstance(value, list) and all(isinstance(p, list) and len(p) == 2 and all(isinstance(s, str) for s in p)
                                            for p in value)):
        raise ValueError("a key's attributes are not [name, value] pairs of text")
    return tuple(tuple(p) for p in value)


def _gradient_key(value) -> tuple:
    """weight_gradient_route's key: (g, x, w shapes, attributes, operands, policy, bound)."""
    if not (isinstance(value, list) and len(value) == 7):
        raise ValueError("a weight gradient's key is not of seven parts")
    g, x, w, attrs, operands, chosen_policy, bound = value
    if not (isinstance(operands, str) and chosen_policy in ("strict", "tf32") and type(bound) is int and bound >= 0):
        raise ValueError("a weight gradient's key names no dtype, policy or workspace bound")
    return _shape(g), _shape(x), _shape(w), _attrs(attrs), operands, chosen_policy, bound


def _epilogue_key(value) -> tuple:
    """epilogue_convolution's key: (x, w, y shapes, attributes, dtype, policy, residual or not)."""
    if not (isinstance(value, list) and len(value) == 7):
        raise ValueError("a fused epilogue's key is not of seven parts")
    x, w, y, attrs, dtype, chosen_policy, residual = value
    if not (isinstance(dtype, str) and chosen_policy in ("strict", "tf32") and type(residual) is bool):
        raise ValueError("a fused epilogue's key names no dtype, policy or residual")
    return _shape(x), _shape(w), _shape(y), _attrs(attrs), dtype, chosen_policy, residual

