"""Per-channel affine folding: a BatchNorm on running statistics, a Scale with learned weights, or
any chain of static per-channel multiplies, adds and subtracts after a convolution or an
InnerProduct's GEMM is folded into that layer's weights and bias.

    conv(x, W, b) * s + t  ==  conv(x, W * s[:, None, None, None], b * s + t)
    (x @ W^T + b) * s + t  ==  x @ (W * s[:, None])^T + (b * s + t)

"Static" means computed from constants and weights that no update writes, never from a graph
input: in an infer graph whose weights are frozen the new weights fold to constants, and
nothing of the normalisation runs per call. The fold never fires in a train graph's forward
pass: its backward pass reads the convolution's output, so the chain is not the only reader.
"""
from __future__ import annotations

from ..ir.graph import FLOAT_DTYPES, Graph, Node, Value
from ..ops.base import get_op
from .context import PassContext
from .rewrite import Emitter, Substitution, kept_ids

AFFINE_OPS = ("mul", "add", "sub")


def static_values(graph: Graph) -> set[int]:
    """Ids of values computed only from constants and weights that no update writes."""
    static = {w.value.id for name, w in graph.weights.items() if name not in graph.updates}
    for node in graph.nodes:
        if get_op(node.op).pure and all(v.id in static for v in node.inputs):
            static.update(o.id for o in node.outputs)
    return static


def _channel_axis(head: Node) -> int | None:
    """The output axis whose entries each have their own weights (None: not a foldable head)."""
    if head.op == "conv2d":
        return 1
    if (head.op == "matmul" and not head.attrs["trans_a"] and head.inputs[0].rank == 2
            and head.inputs[1].rank == 2):
        return 1
    return None


def _per_channel(v: Value, out: Value, axis: int) -> bool:
    """``v`` broadcast against ``out`` varies along ``axis`` at most (a per-channel vector or a
    scalar), and does not enlarge ``out``."""
    if v.rank > out.rank:
        return False
    shift = out.rank - v.rank
    for j, d in enumerate(v.shape):
        k = j + shift
        if d != 1 and (k != axis or d != out.shape[axis]):
            return False
    return True


def _as_vector(b: Emitter, v: Value, channels: int) -> Value:
    """A per-channel value (or scalar) as a [C] vector."""
    if v.type.numel == 1:
        return b.op("broadcast_to", b.reshape(v, (1,)), shape=(channels,))
    return b.reshape(v, (channels,))


def fold_batch_norm(graph: Graph, ctx: PassContext) -> bool:
    """Static per-channel scale and shift chains (BatchNorm with running statistics, Scale)
    after conv2d or an InnerProduct's matmul become that op's weights and bias."""
    static = static_values(graph)
    readers = graph.consumers()
    kept = kept_ids(graph)
    subst = Substitution()
    inserts: dict[int, list[Node]] = {}            # id(node) -> new nodes to run just after it
    folded = []
    for head in graph.nodes:
        axis = _channel_axis(head)
        if axis is None or head.outputs[0].dtype not in FLOAT_DTYPES:
            continue
        weight = head.inputs[1]
        if weight.id not in static or (len(head.inputs) == 3 and head.inputs[2].id not in static):
            continue
        chain: list[tuple[str, Value]] = []
        value = head.outputs[0]
        last = head
        while True:
            uses = readers.get(value.id, [])
            if value.id in kept or len(uses) != 1 or uses[0].op not in AFFINE_OPS:
                break
            node = uses[0]
            other = node.inputs[1] if node.inputs[0] is value else node.inputs[0]
            if (other.id not in static or not _per_channel(other, value, axis) or node.outputs[0].type != value.type
                    or (node.op == "sub" and node.inputs[0] is not value)):
                break
            chain.append((node.op, other))
            value, last = node.outputs[0], node
        if not chain or (head.op == "matmul" and len(chain) == 1 and chain[0][0] == "add"):
            continue             # a GEMM's own bias add alone: already one op, nothing to fold
        channels = head.outputs[0].shape[axis]
        b = Emitter(f"{head.scope}+folded")
        scale = shift = None
        for op, other in chain:
            vec = _as_vector(b, other, channels)
            if op == "mul":
                scale = vec if scale is None else b.mul(scale, vec)
                shift = None if shift is None else b.mul(shift, vec)
            elif op == "add":
                shift = vec if shift is None else b.add(shift, vec)
            else:
                shift = b.op("neg", vec) if shift is None else b.sub(shift, vec)
        new_weight = weight
        if scale is not None:
            if head.op == "conv2d":
                shape = (channels,) + (1,) * (weight.rank - 1)
            else:                     # matmul: W [O, I] read transposed, or [I, O]
                shape = (channels, 1) if head.attrs["trans_b"] else (1, channels)
            new_weight = b.mul(weight, b.reshape(scale, shape))
        bias = head.inputs[2] if head.op == "conv2d" and len(head.inputs) == 3 else None
        if bias is not None and scale is not None:
            bias = b.mul(bias, scale)
        if shift is not None:
            bias = shift if bias is None else b.add(bias, shift)
        if head.op == "conv2d":
            result = b.op("conv2d", head.inputs[0], new_weight, *([bias] if bias is not None else []), **head.attrs)
        else:
            result = b.op("matmul", head.inputs[0], new_weight, **head.attrs)
            if bias is not None:
                result = b.add(result, bias)
        subst.replace(value, result)
        inserts[id(last)] = b.take()
        folded.append(f"{last.scope} into {head.scope}")
    if not folded:
        return False
    nodes: list[Node] = []
    for node in graph.nodes:
        nodes.append(node)
        nodes.extend(inserts.get(id(node), ()))   # after the chain's last node: all it reads exists
    graph.nodes = nodes
    subst.apply(graph)
    for item in folded:
        ctx.note(f"fold_batch_norm: {item}")
    return True
