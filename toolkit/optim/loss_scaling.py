"""Mixed-precision training as graph ops: the forward pass autocast to float16 or bfloat16
(passes/precision.py), float32 master weights, and dynamic loss scaling with PyTorch's
``GradScaler`` semantics, all on the device with no host read per step.

One step, with the scale ``S`` and the growth tracker kept as state (``amp@scale``,
``amp@growth_tracker``, in checkpoints, never in model files):

1. the backward pass starts from ``S * objective`` instead of the objective, so that small
   half-precision gradients do not flush to zero;
2. the gradients are multiplied by ``1/S`` and checked: ``ok = all_finite(grads)``;
3. the solver computes its updates from the unscaled gradients as usual, and every update
   (weights, running statistics, solver slots) becomes ``select(ok, new, old)``: a step whose
   gradients overflowed changes nothing, as ``scaler.step(optimizer)`` skips it;
4. ``S`` halves (``backoff_factor``) on a skipped step; after ``growth_interval`` good steps in
   a row it doubles (``growth_factor``), unless that would overflow.

Adam's bias corrections count only the steps taken (PyTorch's ``state['step']`` does not move
on a skipped step), so under mixed precision they are computed in the graph from a step count
``amp@steps`` instead of coming from the host.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..ir.graph import Graph, TensorType, Value, Weight
from ..ops.base import Builder

SCALE = "amp@scale"
TRACKER = "amp@growth_tracker"
STEPS = "amp@steps"
SCALE_OUTPUT = "loss_scale"             # logged with the loss: the scale after this step's update


@dataclass(frozen=True)
class MixedPrecision:
    dtype: str = "float16"
    init_scale: float = 65536.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    dynamic: bool = True                # False: the scale stays init_scale (1 = no scaling)

    @classmethod
    def from_spec(cls, spec) -> "MixedPrecision | None":
        if spec is None:
            return None
        dynamic = spec.loss_scale == "dynamic"
        return cls(spec.dtype, spec.init_scale if dynamic else float(spec.loss_scale), spec.growth_factor,
                   spec.backoff_factor, spec.growth_interval, dynamic)


def _state(graph: Graph, name: str, value: float) -> Value:
    v = Value(TensorType((), "float32"), name=name)
    graph.weights[name] = Weight(name, v, False, {"type": "constant", "value": float(value)}, 0.0, 0.0, "amp")
    return v


def _as(b: Builder, v: Value, dtype: str) -> Value:
    """``v`` in ``dtype`` (the scaler's float32 scalars meeting a float64 net)."""
    return v if v.dtype == dtype else b.op("cast", v, dtype=dtype)


def scaled_objective(graph: Graph, objective: Value, mp: MixedPrecision) -> Value:
    """``S * objective``, the value the backward pass starts from."""
    scale = _state(graph, SCALE, mp.init_scale)
    b = Builder(graph, "amp")
    return b.mul(objective, _as(b, scale, objective.dtype))


def unscale(graph: Graph, grads: dict[str, Value]) -> tuple[dict[str, Value], Value]:
    """The gradients times ``1/S``, and the flag that all of them are finite."""
    b = Builder(graph, "amp")
    scale = graph.weights[SCALE].value
    inv = b.div(b.scalar(1.0, "float32"), scale)
    out = {}
    for name, g in grads.items():
        out[name] = b.mul(g, _as(b, inv, g.dtype))
    return out, b.op("all_finite", *out.values())


def taken_steps(graph: Graph, ok: Value) -> Value:
    """The count of steps taken including this one (state ``amp@steps``), for Adam."""
    b = Builder(graph, "amp")
    steps = _state(graph, STEPS, 0.0)
    new = b.add(steps, ok)
    graph.updates[STEPS] = new
    return new


def bias_corrections(graph: Graph, steps: Value, betas: tuple[float, float], dtype: str) -> tuple[Value, Value]:
    """Adam's ``1/(1 - beta1^t)`` and ``1/sqrt(1 - beta2^t)`` from the in-graph step count, in
    float64 as the host computes them: ``1 - 0.999^t`` cancels to few correct bits in float32."""
    b = Builder(graph, "amp")
    t = b.op("cast", steps, dtype="float64")
    one = b.scalar(1.0, "float64")

    def power(beta: float) -> Value:                   # beta^t = exp(t * ln beta)
        return b.op("exp", b.mul(t, b.scalar(math.log(beta), "float64")))
    bias1 = b.div(one, b.sub(one, power(betas[0])))
    bias2 = b.op("rsqrt", b.sub(one, power(betas[1])))
    return _as(b, bias1, dtype), _as(b, bias2, dtype)


def guard_updates(graph: Graph, ok: Value, mp: MixedPrecision) -> None:
    """Every update kept only when ``ok``; then the scale's own update (step 4 of the module doc)."""
    b = Builder(graph, "amp")
    for name, new in list(graph.updates.items()):
        old = graph.weights[name].value
        graph.updates[name] = b.op("select", _as(b, ok, new.dtype), new, old)
    scale = graph.weights[SCALE].value
    if mp.dynamic:
        tracker = _state(graph, TRACKER, 0.0)
        zero = b.scalar(0.0, "float32")
        counted = b.add(tracker, b.scalar(1.0, "float32"))
        grow = b.op("ge_mask", counted, b.scalar(float(mp.growth_interval), "float32"))
        grown = b.mul(scale, b.scalar(mp.growth_factor, "float32"))
        grown = b.op("select", b.op("all_finite", grown), grown, scale)      # never grow to inf
        kept_scale = b.op("select", grow, grown, scale)
        kept_tracker = b.op("select", grow, zero, counted)
        graph.updates[SCALE] = b.op("select", ok, kept_scale, b.mul(scale, b.scalar(mp.backoff_factor, "float32")))
        graph.updates[TRACKER] = b.op("select", ok, kept_tracker, zero)
        graph.outputs[SCALE_OUTPUT] = graph.updates[SCALE]
