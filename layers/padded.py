"""Which layers may read a padded dimension: buckets over a sequence length T (docs/spec.md
section 5) pad each input along T up to its bucket and tell the graph each example's real length,
so a layer's output at the real positions must not depend on what lies in the padding.

- Per-position layers compute each position from that position alone (activations, Eltwise,
  InnerProduct and Embed over the last axis, Scale, Dropout, Permute; Softmax, Concat, Slice,
  LayerNorm and ArgMax where their axes are not T; BatchNorm outside training, where it is an
  affine map per channel). Their padded positions hold values no real position reads.
- Length-aware layers keep the padding out themselves, from the lengths (``ctx.lengths``):
  MultiHeadAttention masks padded keys, RNN/LSTM/GRU stop each example's recurrence at its
  length (PyTorch's packed sequences), Reduction sums and averages over real positions only, and
  SoftmaxWithLoss counts real positions only.
- Every other layer that reads T (a convolution or pooling along it, a Reshape or Flatten that
  merges it, BatchNorm's batch statistics in training) is refused, with the reason: its result at
  a real position would change with the padding.
"""
from __future__ import annotations

from toolkit.ir.dims import Sym

POSITION_WISE = frozenset({
    "AbsVal", "Bias", "Clip", "Dropout", "ELU", "Eltwise", "Embed", "Exp", "GELU", "InnerProduct", "Log",
    "PReLU", "Permute", "Power", "ReLU", "Scale", "Sigmoid", "Softplus", "Swish", "TanH", "Threshold"})
LENGTH_AWARE = frozenset({"MultiHeadAttention", "RNN", "LSTM", "GRU", "Reduction", "SoftmaxWithLoss"})
ALONG_AN_AXIS = {"Softmax": 1, "LogSoftmax": 1, "Concat": 1, "Slice": 1, "ArgMax": 1}   # (their default axis)


def bucketed_symbol(dim, bucketed) -> str | None:
    """The bucketed symbol ``dim`` is exactly (T, not 2*T or N*T), or None."""
    if isinstance(dim, Sym) and len(dim.terms) == 1:
        (mono, coeff), = dim.terms.items()
        if coeff == 1 and len(mono) == 1 and mono[0] in bucketed:
            return mono[0]
    return None


def _merged(dim, bucketed) -> bool:
    return isinstance(dim, Sym) and bool(dim.symbols & set(bucketed)) and bucketed_symbol(dim, bucketed) is None


def padding_problem(layer, bottoms, bucketed, phase: str) -> str | None:
    """Why ``layer`` cannot read its bottoms padded along the bucketed dimensions, or None."""
    names = sorted({bucketed_symbol(d, bucketed) for v in bottoms for d in v.shape} - {None})
    if any(_merged(d, bucketed) for v in bottoms for d in v.shape):
        return (f"a bottom's shape merges the bucketed dimension {', '.join(sorted(bucketed))} with another, so its "
                "padded positions can no longer be told apart")
    if not names:
        return None
    kind = layer.type
    if kind in POSITION_WISE or kind in LENGTH_AWARE:
        return None
    if kind == "BatchNorm" and phase != "train":
        return None
    reads = ", ".join(names)
    if kind in ALONG_AN_AXIS or kind == "LayerNorm":
        x = bottoms[0]
        axis = getattr(layer, "axis", None)
        axis = (ALONG_AN_AXIS.get(kind, -1) if axis is None else axis) % max(x.rank, 1)
        touched = range(axis, x.rank) if kind == "LayerNorm" else (axis,)
        if not any(bucketed_symbol(v.shape[a], bucketed) for v in bottoms for a in touched if a < v.rank):
            return None
        return (f"it works along the bucketed dimension {reads} (axis {axis}), where the padding lies; "
                f"buckets over {reads} need it along another axis")
    why = "its batch statistics would count the padding" if kind == "BatchNorm" else \
        f"its result at a real position would depend on the padding along {reads}"
    return (f"buckets over {reads} pad it, and {why}; the layers that can read a padded {reads}: "
            "MultiHeadAttention, RNN, LSTM, GRU, Reduction, SoftmaxWithLoss and per-position layers "
            "(activations, Eltwise, InnerProduct and Embed, Scale, Dropout, Permute, Softmax / Concat / "
            "Slice / LayerNorm along another axis)")
