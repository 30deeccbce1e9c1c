"""MultiHeadAttention: PyTorch's nn.MultiheadAttention(E, num_heads, dropout, bias=bias_term,
batch_first=True) called with need_weights=False, lowered to matmul, slice, reshape, transpose,
select, softmax and dropout_mask (so its gradients come from those ops' rules).

Bottoms: [x] (self-attention) or [q, k, v], batch-first [N, T, E] / [N, S, E], and optionally a
last bool bottom key_padding_mask [N, S] (true: that key is ignored). ``causal: true`` adds the
mask of torch.nn.Transformer.generate_square_subsequent_mask (query i sees keys j <= i), made
from positions (``iota``), so the length may be symbolic: a GPT-style decoder over any T.
Weights by PyTorch's state_dict names: in_proj_weight [3E, E], in_proj_bias [3E],
out_proj.weight [E, E], out_proj.bias [E].
"""
from __future__ import annotations

import math
from typing import Annotated, ClassVar, Literal

from pydantic import Field

from schemas.base import Bool, ParamLayerBase, PositiveInt
from toolkit.ir.dims import format_dim, product

from .registry import LayerError, layer, need_float_input, static_dim


class MultiHeadAttentionParams(ParamLayerBase):
    type: Literal["MultiHeadAttention"]
    num_heads: PositiveInt
    causal: Bool = False
    dropout: Annotated[float, Field(ge=0, lt=1)] = 0.0     # on the attention weights, phase train only
    bias_term: Bool = True
    BOTTOMS: ClassVar = (1, 4)


def _split_bottoms(bottoms, ctx):
    """(q, k, v, key_padding_mask or None, self-attention?) from [x], [x, mask], [q, k, v] or
    [q, k, v, mask]: a bool last bottom is the mask."""
    *data, last = bottoms
    mask = last if last.dtype == "bool" else None
    if mask is None:
        data.append(last)
    if len(data) == 1:
        x, = data
        return x, x, x, mask, True
    if len(data) == 3:
        q, k, v = data
        return q, k, v, mask, False
    got = ", ".join(f"{v.dtype} {ctx.fmt(v)}" for v in bottoms)
    raise LayerError("MultiHeadAttention takes [x], [x, key_padding_mask], [q, k, v] or "
                     f"[q, k, v, key_padding_mask] (the mask bool [N, S]); got {got}", "bottom")


def _same(a, b) -> bool:
    """Two dimensions known to be equal (the same number or the same symbol expression)."""
    return a == b


@layer(MultiHeadAttentionParams)
def lower_multi_head_attention(p: MultiHeadAttentionParams, ctx, bottoms):
    q, k, v, mask, self_attention = _split_bottoms(bottoms, ctx)
    names = ("x",) if self_attention else ("q", "k", "v")
    for name, t in zip(names, (q, k, v)):
        need_float_input(t, "MultiHeadAttention")
        if t.rank != 3:
            raise LayerError(f"MultiHeadAttention needs batch-first inputs [N, T, E]; {name} is {ctx.fmt(t)}",
                             "bottom")
    if not self_attention:
        if len({q.dtype, k.dtype, v.dtype}) != 1:
            raise LayerError(f"q, k and v are {q.dtype}, {k.dtype} and {v.dtype}: they must be the same type",
                             "bottom")
        for name, t in (("k", k), ("v", v)):
            if not _same(t.shape[0], q.shape[0]) or not _same(t.shape[2], q.shape[2]):
                raise LayerError(f"{name} {ctx.fmt(t)} must have the batch size and embedding size of q "
                                 f"{ctx.fmt(q)} (only the sequence length may differ)", "bottom")
        if not _same(k.shape[1], v.shape[1]):
            raise LayerError(f"k {ctx.fmt(k)} and v {ctx.fmt(v)} must have the same sequence length", "bottom")
    embed = static_dim(q.shape[2], f"the embedding size (last axis) of the input {ctx.fmt(q)}", "bottom")
    heads = p.num_heads
    if embed % heads:
        raise LayerError(f"the embedding size {embed} is not divisible by num_heads {heads}", "num_heads")
    head_dim = embed // heads
    batch, tq, ts = q.shape[0], q.shape[1], k.shape[1]
    if mask is not None and (mask.rank != 2 or not _same(mask.shape[0], batch) or not _same(mask.shape[1], ts)):
        raise LayerError(f"key_padding_mask {ctx.fmt(mask)} must be [N, S] = [{format_dim(batch)}, "
                         f"{format_dim(ts)}]: one entry per key of each example", "bottom")
    if p.causal and not _same(tq, ts):
        raise LayerError(f"causal needs as many queries as keys: the query length of {ctx.fmt(q)} is "
                         f"{format_dim(tq)}, the key length of {ctx.fmt(k)} {format_dim(ts)}", "causal")

    b = ctx.b
    dtype = q.dtype
    zero = {"type": "constant", "value": 0.0}
    bound = 1.0 / math.sqrt(embed)            # nn.Linear's default: kaiming_uniform(a=sqrt(5))
    # declared in PyTorch's state_dict order (lr_mult / decay_mult lists follow it)
    w_in = ctx.param("in_proj_weight", (3 * embed, embed), fan_in=embed, fan_out=3 * embed,
                     default_filler={"type": "xavier", "variance_norm": "average"},   # xavier_uniform_
                     filler_key="weight_filler")
    b_in = (ctx.param("in_proj_bias", (3 * embed,), default_filler=zero, filler_key="bias_filler")
            if p.bias_term else None)
    w_out = ctx.param("out_proj.weight", (embed, embed), fan_in=embed, fan_out=embed,
                      default_filler={"type": "uniform", "min": -bound, "max": bound}, filler_key="weight_filler")
    b_out = (ctx.param("out_proj.bias", (embed,), default_filler=zero, filler_key="bias_filler")
             if p.bias_term else None)

    def rows(t):                                  # [N, L, E] -> [N*L, E]
        return b.reshape(t, (product(t.shape[:2]), embed))

    def piece(t, i):                              # rows i*E .. (i+1)*E (q, k or v) of in_proj's [3E, ...]
        return b.op("slice", t, axis=0, start=i * embed, stop=(i + 1) * embed)

    if self_attention:                            # one GEMM for Q, K and V together
        qkv = b.op("matmul", rows(q), w_in, trans_a=False, trans_b=True)            # [N*T, 3E]
        if b_in is not None:
            qkv = b.add(qkv, b_in)
        projected = [b.op("slice", qkv, axis=1, start=i * embed, stop=(i + 1) * embed) for i in range(3)]
    else:
        projected = []
        for i, t in enumerate((q, k, v)):
            y = b.op("matmul", rows(t), piece(w_in, i), trans_a=False, trans_b=True)
            if b_in is not None:
                y = b.add(y, piece(b_in, i))
            projected.append(y)

    def split_heads(t, length):                   # [N*L, E] -> [N, H, L, D]
        return b.op("transpose", b.reshape(t, (batch, length, heads, head_dim)), perm=(0, 2, 1, 3))

    qh = split_heads(b.scale(projected[0], 1.0 / math.sqrt(head_dim)), tq)
    kh = split_heads(projected[1], ts)
    vh = split_heads(projected[2], ts)
    scores = b.op("matmul", qh, kh, trans_a=False, trans_b=True)                      # [N, H, T, S]

    # masked scores are -inf (exp gives exactly 0), chosen by select so no 0 * inf appears
    cond = None
    if mask is not None:
        cond = b.reshape(b.op("cast", mask, dtype=dtype), (batch, 1, 1, ts))
    key_symbol = ctx.bucketed_symbol(ts)
    if key_symbol is not None:                      # keys past each example's length are padding
        padded = b.op("sub", b.scalar(1.0, dtype), ctx.valid_positions(key_symbol, 4, 3, 0))   # [N, 1, 1, S]
        cond = padded if cond is None else b.op("maximum", cond, padded)
    if p.causal:
        # 1 where key j > query i, from the positions themselves: T may be a symbol, bound when a
        # plan is built (the mask is then computed once, or folded now where T is a number)
        query = b.op("iota", shape=(tq, 1), axis=0, dtype=dtype)
        key = b.op("iota", shape=(1, ts), axis=1, dtype=dtype)
        upper = b.op("ge_mask", key, b.add(query, b.scalar(1.0, dtype)))
        cond = upper if cond is None else b.op("maximum", cond, upper)
    if cond is not None:
        scores = b.op("select", cond, b.scalar(float("-inf"), dtype), scores)
    weights = b.op("softmax", scores, axis=3)
    if ctx.phase == "train" and p.dropout > 0:
        weights = b.mul(weights, b.op("dropout_mask", weights, ratio=float(p.dropout)))
    heads_out = b.op("matmul", weights, vh, trans_a=False, trans_b=False)              # [N, H, T, D]
    merged = b.reshape(b.op("transpose", heads_out, perm=(0, 2, 1, 3)), (product((batch, tq)), embed))
    y = b.op("matmul", merged, w_out, trans_a=False, trans_b=True)
    if b_out is not None:
        y = b.add(y, b_out)
    return [b.reshape(y, (batch, tq, embed))]
