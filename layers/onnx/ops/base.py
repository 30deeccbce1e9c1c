"""What the ONNX op converters share: ``converts`` (registers a converter for op types) and the
helpers several families use (a float input, a binary op's operands, an image input and its
per-axis attributes, an axes input, the largest value along axes)."""
from __future__ import annotations

from toolkit.ir.graph import FLOAT_DTYPES, QUANT_DTYPES, Value

from ..convert import CONVERTERS, Importer, NodeError, is_const


def converts(*ops: str):
    """Registers the decorated function as the converter of each of ``ops`` (ONNX op types)."""
    def register(fn):
        for op in ops:
            CONVERTERS[op] = fn
        return fn
    return register


def float_input(imp: Importer, name: str, quantized: bool = False) -> Value:
    """The input ``name`` as a Value; refused unless it holds floats (or uint8/int8 where the op
    takes ``quantized`` values too)."""
    x = imp.value(name)
    if x.dtype not in FLOAT_DTYPES and not (quantized and x.dtype in QUANT_DTYPES):
        imp.fail(f"input '{name}' is {x.dtype}; this op is computed for floats here")
    return x


def operand_pair(imp: Importer, node, a: Value, b_name: str) -> tuple[Value, Value]:
    """Both operands of a binary op as Values, a constant in the other's dtype."""
    b = imp.env[b_name]
    if is_const(b):
        return a, imp.materialize(b, a)
    if is_const(imp.env[node.input[0]]):
        return imp.materialize(imp.env[node.input[0]], b), b
    return a, b


def image_input(imp, node, name: str, quantized: bool = False) -> tuple[Value, bool]:
    """The input as [N, C, H, W]: a 1-d signal [N, C, L] gets H = 1 (returned True)."""
    x = float_input(imp, name, quantized)
    if x.rank == 3:
        return imp.b.reshape(x, (x.shape[0], x.shape[1], 1, x.shape[2])), True
    if x.rank != 4:
        imp.fail(f"only 1-d and 2-d images ([N, C, L] or [N, C, H, W]) are read here, got rank {x.rank}")
    return x, False


def two_axes(values, one_d: bool, fill: int) -> list[int]:
    """A per-axis attribute (strides, pads...) for the image's two axes: a 1-d signal's one value
    gets ``fill`` in front for the added axis."""
    values = [int(v) for v in values]
    if len(values) != 2 - one_d:
        raise NodeError(f"{len(values)} values {values[:8]} where the image's {2 - one_d} axes take one each")
    return [fill] + values if one_d else values


def axes_input(imp, node, index: int, rank: int, what: str = "the axes"):
    """The axes given as input ``index`` (newer opsets) or as the ``axes`` attribute, each taken
    modulo ``rank``; None where neither is given."""
    name = imp.optional(node, index)
    axes = list(imp.const(name, what).reshape(-1)) if name is not None else imp.attr(node, "axes")
    return None if axes is None else [int(a) % rank for a in axes]


def reduce_max(imp, x: Value, axes, keepdims: bool) -> Value:
    """The largest along ``axes``: one top-1 per axis."""
    y = x
    for axis in axes:
        y = imp.b.op("topk", y, axis=axis, k=1, values=True)
    if not keepdims:
        y = imp.b.reshape(y, tuple(d for i, d in enumerate(x.shape) if i not in axes))
    return y
