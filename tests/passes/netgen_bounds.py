"""Intervals that bound a generated blob's values: an activation's output bounds from its
input's, a scaled interval, a product's; ``bounded_exp`` is exp without overflow (and of -inf, 0)."""
from __future__ import annotations

import math

INF = math.inf


def _sigmoid(x: float) -> float:
    return 0.0 if x < -700 else 1.0 / (1.0 + math.exp(-min(x, 700)))


def _softplus(x: float) -> float:
    if x > 20:                 # linear above 20, as the layer
        return x
    return math.log1p(math.exp(x)) if x > -700 else 0.0


def bounded_exp(x: float) -> float:
    return 0.0 if x == -INF else math.exp(min(x, 700))


def activation_bounds(kind: str, params: dict, lo: float, hi: float) -> tuple[float, float]:
    """Bounds of an elementwise activation's output from its input's."""
    if kind == "ReLU":
        slope = params.get("negative_slope", 0.0)

        def f(v):
            return v if v >= 0 else (0.0 if slope == 0 else slope * v)
        return f(lo), f(hi)
    if kind == "Sigmoid":
        return _sigmoid(lo), _sigmoid(hi)
    if kind == "TanH":
        return math.tanh(lo), math.tanh(hi)
    if kind == "ELU":
        alpha = params.get("alpha", 1.0)

        def f(v):
            return v if v >= 0 else alpha * (bounded_exp(v) - 1.0)
        return f(lo), f(hi)
    if kind == "Softplus":
        return _softplus(lo), _softplus(hi)
    if kind == "AbsVal":
        low = 0.0 if lo <= 0 <= hi else min(abs(lo), abs(hi))
        return low, max(abs(lo), abs(hi))
    if kind == "Exp":
        return bounded_exp(lo), bounded_exp(hi)
    if kind == "Log":
        return math.log(lo), (math.log(hi) if hi < INF else INF)
    if kind == "GELU":          # its minimum is about -0.17, at x ~ -0.75
        return (-0.2 if lo < 0 else 0.0), max(hi, 0.0)
    raise ValueError(kind)


def scaled_bounds(c: float, lo: float, hi: float) -> tuple[float, float]:
    if c == 0:
        return 0.0, 0.0
    return (c * lo, c * hi) if c > 0 else (c * hi, c * lo)


def product_bounds(bounds: list[tuple[float, float]]) -> tuple[float, float]:
    lo, hi = bounds[0]
    for b_lo, b_hi in bounds[1:]:
        if all(math.isfinite(v) for v in (lo, hi, b_lo, b_hi)):
            corners = [lo * b_lo, lo * b_hi, hi * b_lo, hi * b_hi]
            lo, hi = min(corners), max(corners)
        elif lo >= 0 and b_lo >= 0:
            lo, hi = lo * b_lo, INF
        else:
            lo, hi = -INF, INF
    return lo, hi
