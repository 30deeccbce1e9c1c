"""Solvers as update ops in the train graph, with PyTorch's optimizer semantics.

Per-step host values enter as 0-d graph inputs (``@lr``, and Adam's bias corrections), so one
compiled plan serves every iteration. Solver state (momentum, moments) lives in non-trainable
weights named ``PARAM@SLOT`` that checkpoints carry and model files leave out. The updates are
plain elementwise graph ops, so the optimiser passes can fuse them like any other.

Semantics (PyTorch's, where Caffe differs): momentum buffers accumulate gradients, and the rate
multiplies at the update (``buf = m*buf + g; p -= lr*buf``), so a changing lr does not rescale
past momentum as Caffe's ``v = m*v + lr*g`` does (``momentum_convention: caffe`` gives Caffe's, the
buffer then holding rate-scaled steps). L2 weight decay is added to the gradient
(``g += wd*p``; ``regularization: l1``, Caffe's, adds ``wd*sign(p)``), except adamw which decays
the weight itself (``p *= 1 - lr*wd``). adadelta is PyTorch's Adadelta (Caffe's AdaDelta). Gradient
clipping scales all gradients by ``min(1, max_norm / (total_norm + 1e-6))`` before decay.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..ir.graph import Graph, TensorType, Value, Weight
from ..ops.base import Builder
from .loss_scaling import MixedPrecision, bias_corrections, guard_updates, taken_steps, unscale

LR = "@lr"
BIAS1 = "@bias1"          # 1 / (1 - beta1^t)
BIAS2 = "@bias2"          # 1 / sqrt(1 - beta2^t)

DEFAULT_EPS = {"adam": 1e-8, "adamw": 1e-8, "rmsprop": 1e-8, "adagrad": 1e-10, "adadelta": 1e-6}


@dataclass(frozen=True)
class SolverConfig:
    type: str = "sgd"
    momentum: float = 0.0
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    alpha: float = 0.99
    clip_gradients: float | None = None
    mixed_precision: MixedPrecision | None = None
    rho: float = 0.9
    regularization: str = "l2"
    momentum_convention: str = "pytorch"

    @classmethod
    def from_spec(cls, spec) -> "SolverConfig":
        wd = spec.weight_decay
        if wd is None:
            wd = 0.01 if spec.type == "adamw" else 0.0
        eps = spec.eps if spec.eps is not None else DEFAULT_EPS.get(spec.type, 1e-8)
        return cls(spec.type, spec.momentum, wd, tuple(spec.betas), eps, spec.alpha, spec.clip_gradients,
                   MixedPrecision.from_spec(spec.mixed_precision), spec.rho, spec.regularization,
                   spec.momentum_convention)


def slot_name(param: str, slot: str) -> str:
    return f"{param}@{slot}"


def is_slot(name: str) -> bool:
    return "@" in name


def host_input(graph: Graph, name: str, dtype: str) -> Value:
    if name not in graph.inputs:
        graph.inputs[name] = Value(TensorType((), dtype), name=name)
    return graph.inputs[name]


def _slot(graph: Graph, param: Weight, slot: str) -> Value:
    name = slot_name(param.name, slot)
    value = Value(TensorType(param.value.shape, param.value.dtype), name=name)
    graph.weights[name] = Weight(name, value, False, {"type": "constant", "value": 0.0}, 0.0, 0.0, param.layer)
    return value


def initial_state(w: Weight) -> np.ndarray:
    """The starting array of a state weight the model file does not hold (a solver slot, the
    loss scale): its constant filler's value."""
    start = w.init.get("value", 0.0) if w.init.get("type") == "constant" else 0.0
    return np.full(tuple(int(d) for d in w.value.shape), start, dtype=w.value.dtype)


def _clip(graph: Graph, grads: dict[str, Value], max_norm: float) -> dict[str, Value]:
    b = Builder(graph, "clip_gradients")
    squares = [b.reduce_sum(b.op("square", g), range(g.rank)) for g in grads.values()]
    dtype = squares[0].dtype
    total = b.op("sqrt", b.add_all(squares))
    limit = b.scalar(max_norm, dtype)
    # min(1, max_norm / (norm + 1e-6)) written as max_norm / max(norm + 1e-6, max_norm)
    coef = b.div(limit, b.op("maximum", b.add(total, b.scalar(1e-6, dtype)), limit))
    return {name: b.mul(g, coef) for name, g in grads.items()}


def add_solver(graph: Graph, grads: dict[str, Value], cfg: SolverConfig) -> None:
    """Append each parameter's update (and its slots' updates) to ``graph.updates``. Under mixed
    precision the gradients arrive loss-scaled: they are unscaled first, and every update is kept
    only when all of them are finite (loss_scaling.py)."""
    if not grads:
        return
    mp = cfg.mixed_precision
    ok = None
    if mp is not None:
        grads, ok = unscale(graph, grads)
    if cfg.clip_gradients:
        grads = _clip(graph, grads, cfg.clip_gradients)
    dtype = next(iter(grads.values())).dtype
    lr = host_input(graph, LR, dtype)
    adam_bias = None
    if cfg.type in ("adam", "adamw"):
        adam_bias = ((host_input(graph, BIAS1, dtype), host_input(graph, BIAS2, dtype)) if ok is None
                     else bias_corrections(graph, taken_steps(graph, ok), cfg.betas, dtype))
    for name, g in grads.items():
        w = graph.weights[name]
        b = Builder(graph, f"{w.layer}.{cfg.type}")
        p = w.value
        lr_p = b.scale(lr, w.lr_mult)
        wd = cfg.weight_decay * w.decay_mult
        if wd and cfg.type != "adamw":
            if cfg.regularization == "l1":
                g = b.add(g, b.scale(b.op("sign", p), wd))               # L1 (Caffe's): g += wd * sign(p)
            else:
                g = b.add(g, b.scale(p, wd))                             # L2: g += wd * p
        if cfg.type in ("sgd", "nesterov") and cfg.momentum and cfg.momentum_convention == "caffe":
            # Caffe's: v' = m*v + lr*g; sgd w -= v', nesterov w -= (1+m)*v' - m*v
            buf = _slot(graph, w, "momentum")
            new_buf = b.add(b.scale(buf, cfg.momentum), b.mul(g, lr_p))
            graph.updates[slot_name(name, "momentum")] = new_buf
            step = (b.sub(b.scale(new_buf, 1 + cfg.momentum), b.scale(buf, cfg.momentum))
                    if cfg.type == "nesterov" else new_buf)
            new_p = b.sub(p, step)
        elif cfg.type in ("sgd", "nesterov"):
            step = g
            if cfg.momentum:
                buf = _slot(graph, w, "momentum")
                new_buf = b.add(b.scale(buf, cfg.momentum), g)           # buf = m * buf + g
                graph.updates[slot_name(name, "momentum")] = new_buf
                step = b.add(g, b.scale(new_buf, cfg.momentum)) if cfg.type == "nesterov" else new_buf
            new_p = b.sub(p, b.mul(step, lr_p))
        elif cfg.type in ("adam", "adamw"):
            beta1, beta2 = cfg.betas
            m, v = _slot(graph, w, "exp_avg"), _slot(graph, w, "exp_avg_sq")
            new_m = b.add(b.scale(m, beta1), b.scale(g, 1 - beta1))
            new_v = b.add(b.scale(v, beta2), b.scale(b.op("square", g), 1 - beta2))
            graph.updates[slot_name(name, "exp_avg")] = new_m
            graph.updates[slot_name(name, "exp_avg_sq")] = new_v
            denom = b.add(b.mul(b.op("sqrt", new_v), adam_bias[1]), b.scalar(cfg.eps, dtype))
            step_size = b.mul(lr_p, adam_bias[0])
            base = p
            if cfg.type == "adamw" and wd:
                base = b.mul(p, b.sub(b.scalar(1.0, dtype), b.scale(lr_p, wd)))   # p *= 1 - lr * wd
            new_p = b.sub(base, b.mul(b.div(new_m, denom), step_size))
        elif cfg.type in ("rmsprop", "adagrad"):
            slot = "square_avg" if cfg.type == "rmsprop" else "sum"
            acc = _slot(graph, w, slot)
            if cfg.type == "rmsprop":
                new_acc = b.add(b.scale(acc, cfg.alpha), b.scale(b.op("square", g), 1 - cfg.alpha))
            else:
                new_acc = b.add(acc, b.op("square", g))
            graph.updates[slot_name(name, slot)] = new_acc
            denom = b.add(b.op("sqrt", new_acc), b.scalar(cfg.eps, dtype))
            step = b.div(g, denom)
            if cfg.type == "rmsprop" and cfg.momentum:                   # torch's RMSprop(momentum=m)
                buf = _slot(graph, w, "momentum")
                step = b.add(b.scale(buf, cfg.momentum), step)           # buf = m * buf + g / denom
                graph.updates[slot_name(name, "momentum")] = step
            new_p = b.sub(p, b.mul(step, lr_p))
        elif cfg.type == "adadelta":                                     # torch's Adadelta, Caffe's AdaDelta
            avg, delta_avg = _slot(graph, w, "square_avg"), _slot(graph, w, "acc_delta")
            rho, eps = cfg.rho, b.scalar(cfg.eps, dtype)
            new_avg = b.add(b.scale(avg, rho), b.scale(b.op("square", g), 1 - rho))
            delta = b.mul(b.div(b.op("sqrt", b.add(delta_avg, eps)), b.op("sqrt", b.add(new_avg, eps))), g)
            graph.updates[slot_name(name, "square_avg")] = new_avg
            graph.updates[slot_name(name, "acc_delta")] = b.add(b.scale(delta_avg, rho),
                                                                b.scale(b.op("square", delta), 1 - rho))
            new_p = b.sub(p, b.mul(delta, lr_p))
        else:
            raise ValueError(f"unknown solver {cfg.type}")
        graph.updates[name] = new_p
    if ok is not None:
        guard_updates(graph, ok, mp)


def host_values(cfg: SolverConfig, lr: float, step: int, dtype: str) -> dict[str, np.ndarray]:
    """The per-iteration scalar inputs; ``step`` counts updates from 1 (PyTorch's state['step'])."""
    values = {LR: np.asarray(lr, dtype=dtype)}
    if cfg.type in ("adam", "adamw") and cfg.mixed_precision is None:
        beta1, beta2 = cfg.betas
        values[BIAS1] = np.asarray(1.0 / (1.0 - beta1 ** step), dtype=dtype)
        values[BIAS2] = np.asarray(1.0 / math.sqrt(1.0 - beta2 ** step), dtype=dtype)
    return values
