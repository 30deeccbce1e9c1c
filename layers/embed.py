"""Embed: a lookup table of rows picked by integer indices (PyTorch's nn.Embedding, weight
[input_dim, num_output]), lowered to the embedding op."""
from __future__ import annotations

from typing import Literal

from schemas.base import Bool, ParamLayerBase, PositiveInt
from toolkit.ir.graph import INT_DTYPES

from .registry import LayerError, layer


class EmbedParams(ParamLayerBase):
    type: Literal["Embed"]
    input_dim: PositiveInt
    num_output: PositiveInt
    # a learned [num_output] added to every row looked up (Caffe's default is true; here false,
    # as PyTorch's nn.Embedding, so nets written before it keep their weights)
    bias_term: Bool = False


@layer(EmbedParams)
def lower_embed(p: EmbedParams, ctx, bottoms):
    """Integer indices [N, ...] to rows of the table: [N, ..., num_output]. An index outside
    [0, input_dim) stops the run with an error naming this layer."""
    index, = bottoms
    if index.dtype not in INT_DTYPES:
        raise LayerError(f"Embed needs integer indices ({', '.join(INT_DTYPES)}), got {index.dtype}", "bottom")
    # Caffe's fans of a [input_dim, num_output] blob, for a xavier or msra filler
    table = ctx.param("weight", (p.input_dim, p.num_output), fan_in=p.num_output, fan_out=p.input_dim)
    rows = ctx.b.op("embedding", table, index, layer=ctx.layer.name)
    if p.bias_term:
        bias = ctx.param("bias", (p.num_output,), default_filler={"type": "constant", "value": 0.0})
        rows = ctx.b.add(rows, bias)
    return [rows]
