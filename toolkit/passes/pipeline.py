"""The graph pass pipeline: a visible, named list of passes, each switchable by name.

``run_pipeline`` runs them in order, verifies the graph after each (``verify=True`` in tests and
``toolkit compile``), and records what each did for ``toolkit compile --explain``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from ..ir.graph import Graph
from ..ir.verify import VerifyError, verify
from .fuse import fuse_conv_max_pool
from .prune import eliminate_dead_code

PIPELINE: list[tuple[str, Callable[[Graph], Graph]]] = [
    ("eliminate_dead_code", eliminate_dead_code),
    ("fuse_conv_max_pool", fuse_conv_max_pool),
]


@dataclass
class PassRecord:
    name: str
    nodes_before: int
    nodes_after: int
    ms: float
    flops_after: object = None     # a Dim: FLOPs of the graph after the pass


def pass_names() -> list[str]:
    return [name for name, _ in PIPELINE]


def run_pipeline(graph: Graph, disable: tuple[str, ...] | list[str] = (), check: bool = False,
                 records: list[PassRecord] | None = None) -> Graph:
    unknown = set(disable) - set(pass_names())
    if unknown:
        raise ValueError(f"unknown pass(es) {', '.join(sorted(unknown))}; passes: {', '.join(pass_names())}")
    for name, run in PIPELINE:
        if name in disable:
            continue
        before = len(graph.nodes)
        start = time.perf_counter()
        graph = run(graph)
        if check:
            try:
                verify(graph)
            except VerifyError as e:
                raise VerifyError(f"after pass {name}: {e}") from None
        if records is not None:
            from ..report import graph_flops
            ms = (time.perf_counter() - start) * 1e3
            records.append(PassRecord(name, before, len(graph.nodes), ms, graph_flops(graph)))
    return graph
