"""Operator fusion: chains of ops replaced by one fused op where a fused kernel exists."""
from __future__ import annotations

from ..ir.graph import Graph, Node
from ..kernels.registry import KERNELS, KernelMissing
from ..ops.fused import POOL_PREFIX


def _has_kernel(op: str, device: str, dtype: str) -> bool:
    try:
        KERNELS.lookup(op, device, dtype)
        return True
    except KernelMissing:
        return False


def fuse_conv_max_pool(graph: Graph) -> Graph:
    """conv2d -> max_pool2d becomes conv2d_max_pool2d when the convolution's output is read by
    that pooling alone (so never in a train graph, whose pooling gradient reads it too), is not
    a graph output, and the pooling is unpadded and floor-mode (its windows stay inside)."""
    from ..kernels.registry import load_device
    device = graph.device
    load_device(device)
    readers = graph.consumers()
    kept_ids = {v.id for v in graph.outputs.values()} | {v.id for v in graph.updates.values()}
    new_nodes: list[Node] = []
    for node in graph.nodes:
        if node.op == "max_pool2d":
            conv = node.inputs[0].producer
            ok = (conv is not None and conv.op == "conv2d"
                  and len(readers.get(node.inputs[0].id, [])) == 1
                  and node.inputs[0].id not in kept_ids
                  and node.attrs["pad"] == (0, 0) and not node.attrs["ceil_mode"]
                  and _has_kernel("conv2d_max_pool2d", device, node.outputs[0].dtype))
            if ok:
                attrs = dict(conv.attrs)
                attrs.update({POOL_PREFIX + k: v for k, v in node.attrs.items()})
                fused = Node("conv2d_max_pool2d", conv.inputs, attrs, f"{conv.scope}+{node.scope}")
                fused.outputs = node.outputs
                for out in fused.outputs:
                    out.producer = fused
                new_nodes.remove(conv)
                new_nodes.append(fused)
                continue
        new_nodes.append(node)
    graph.nodes = new_nodes
    return graph
