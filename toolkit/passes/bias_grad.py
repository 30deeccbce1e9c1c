"""fuse_bias_gradient: an InnerProduct's weight gradient (g^T x) and bias gradient (the sum of
g's rows) as one ``matmul_bias_gradient``, where the device has a kernel that pays for it (on a GPU,
one cuBLASLt call whose BGRADB epilogue sums g while the GEMM reads it; the CPU's generated
kernels run the two ops as they are, and the pass leaves them there).

The fused node takes the earlier of the two positions, which its inputs allow (g is read by
both; x must be produced before it); every reader of either output comes after its own
original, so after the earlier one too.
"""
from __future__ import annotations

from ..backend.registry import KERNELS
from ..ir.graph import Graph, Node
from .context import PassContext


def _row_sum(node: Node) -> bool:
    return (node.op == "reduce_sum" and tuple(node.attrs["axes"]) == (0,) and node.inputs[0].rank == 2)


def _weight_gradient(node: Node) -> bool:
    return (node.op == "matmul" and node.attrs["trans_a"] and not node.attrs["trans_b"]
            and node.inputs[0].rank == 2 and node.inputs[1].rank == 2)


def fuse_bias_gradient(graph: Graph, ctx: PassContext) -> bool:
    """reduce_sum(g, axes=0) and matmul(g, x, trans_a) on one device become matmul_bias_gradient."""
    where = ctx.placement(graph)
    position = {id(n): i for i, n in enumerate(graph.nodes)}
    produced_at = {v.id: position[id(n)] for n in graph.nodes for v in n.outputs}
    sums: dict[int, Node] = {}
    for node in graph.nodes:
        if _row_sum(node):
            sums.setdefault(node.inputs[0].id, node)
    replaced: dict[int, Node | None] = {}         # id(original) -> the fused node at its place, or None
    for node in graph.nodes:
        if not _weight_gradient(node):
            continue
        g, x = node.inputs
        row_sum = sums.get(g.id)
        if row_sum is None or id(row_sum) in replaced:
            continue
        device = where.node(node)
        dtype = node.outputs[0].dtype
        first = min(position[id(node)], position[id(row_sum)])
        if (where.node(row_sum) != device or row_sum.outputs[0].dtype != dtype
                or produced_at.get(x.id, -1) >= first
                or not KERNELS.fusion_pays("matmul_bias_gradient", device, dtype)):
            continue
        fused = Node("matmul_bias_gradient", [g, x], {"keepdims": row_sum.attrs["keepdims"]}, node.scope)
        fused.outputs = [node.outputs[0], row_sum.outputs[0]]
        for out in fused.outputs:
            out.producer = fused
        earlier, later = sorted((node, row_sum), key=lambda n: position[id(n)])
        replaced[id(earlier)], replaced[id(later)] = fused, None
        ctx.note(f"fuse_bias_gradient: {node.scope}")
    if not replaced:
        return False
    nodes = []
    for node in graph.nodes:
        if id(node) not in replaced:
            nodes.append(node)
        elif replaced[id(node)] is not None:
            nodes.append(replaced[id(node)])
    graph.nodes = nodes
    return True
