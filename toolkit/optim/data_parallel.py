"""The data-parallel train step as graph ops (docs/spec.md section 8).

Each rank differentiates its own share of the global objective: its batch's objective times
``@dist_weight``, its rows over the global batch's rows. Summed over the ranks these shares are
the objective of one process at K x batch size, so the gradients, summed over the ranks by
all-reduce, are that process's gradients, whatever the split (an uneven last batch included, a
rank with no rows at all contributing zero). The logged losses are those sums too.

The gradients are summed in buckets of about ``bucket_mb`` megabytes, filled in the order the
backward pass computes them (the last layers' first), each bucket one allreduce_start and one
allreduce_wait op; passes/collectives.py places them so the sum runs during the rest of the
backward pass, and each update waits only for its own bucket.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ir.graph import Graph, Value
from ..ops.base import Builder
from ..ops.collective import ROW_MASK  # noqa: F401  (the trainer feeds it)
from .solvers import host_input

DIST_WEIGHT = "@dist_weight"


@dataclass(frozen=True)
class DataParallel:
    bucket_mb: float = 25.0
    overlap: bool = True               # False: every bucket's sum waits at once (for measuring)
    sync_batchnorm: bool = False


def weight_input(graph: Graph, dtype: str) -> Value:
    return host_input(graph, DIST_WEIGHT, dtype)


def local_share(graph: Graph, objective: Value) -> Value:
    """This rank's share of the global objective, the value its backward pass starts from."""
    b = Builder(graph, "data_parallel")
    return b.mul(objective, weight_input(graph, objective.dtype))


def sum_logged_losses(graph: Graph, names: list[str]) -> None:
    """Outputs ``names`` (scalar losses) become the global batch's: the weighted sum over ranks."""
    b = Builder(graph, "data_parallel")
    for name in names:
        out = graph.outputs[name]
        graph.outputs[name] = b.op("allreduce_sum", b.mul(out, weight_input(graph, out.dtype)))


def _ready_position(graph: Graph) -> dict[int, int]:
    return {o.id: i for i, node in enumerate(graph.nodes) for o in node.outputs}


def buckets(graph: Graph, grads: dict[str, Value], bucket_mb: float) -> list[list[str]]:
    """Weight names in buckets: in the order their gradients are computed, one dtype per
    bucket, a bucket closed once it holds ``bucket_mb`` megabytes (a bigger gradient alone)."""
    ready = _ready_position(graph)
    order = sorted(grads, key=lambda n: ready.get(grads[n].id, -1))
    limit = bucket_mb * 2 ** 20
    out: list[list[str]] = []
    open_by_dtype: dict[str, tuple[list[str], list[int]]] = {}
    for name in order:
        g = grads[name]
        nbytes = int(np.prod(g.shape, dtype=np.int64)) * np.dtype(g.dtype).itemsize
        names, size = open_by_dtype.setdefault(g.dtype, ([], [0]))
        names.append(name)
        size[0] += nbytes
        if size[0] >= limit:
            out.append(names)
            del open_by_dtype[g.dtype]
    out.extend(names for names, _ in open_by_dtype.values())
    return out


def allreduce_gradients(graph: Graph, grads: dict[str, Value], cfg: DataParallel) -> dict[str, Value]:
    """The gradients summed over the ranks, bucket by bucket."""
    b = Builder(graph, "data_parallel")
    summed: dict[str, Value] = {}
    for k, names in enumerate(buckets(graph, grads, cfg.bucket_mb)):
        values = [grads[n] for n in names]
        token = b.op("allreduce_start", *values, bucket=k)
        outs = b.op_multi("allreduce_wait", token, *values, bucket=k, overlap=cfg.overlap)
        summed.update(zip(names, outs))
    return summed


def bucket_summary(graph: Graph) -> list[dict]:
    """What ``toolkit compile --explain`` reports: each bucket's tensors and bytes."""
    rows = []
    for node in graph.nodes:
        if node.op == "allreduce_start":
            nbytes = sum(int(np.prod(v.shape, dtype=np.int64)) * np.dtype(v.dtype).itemsize for v in node.inputs)
            rows.append({"bucket": node.attrs["bucket"], "tensors": len(node.inputs), "bytes": nbytes,
                         "dtype": node.inputs[0].dtype})
    return rows
