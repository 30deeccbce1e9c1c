"""``toolkit compile``: builds a phase's graph stage by stage and says what each stage did."""
from __future__ import annotations

import time

import numpy as np

from ..compile import add_gradients, solver_config
from ..frontend import Net
from ..passes.pipeline import PassRecord, run_pipeline
from ..report import format_count, graph_flops
from ..runtime.plan import Plan
from ..runtime.session import batch_symbol
from ..train.solvers import add_solver


def run_compile(args) -> int:
    net = Net.load(args.net)
    stages: list[tuple[str, int, str, float]] = []

    def record(name, graph, start):
        stages.append((name, len(graph.nodes), format_count(graph_flops(graph)), (time.perf_counter() - start) * 1e3))

    start = time.perf_counter()
    raw = net.lower(args.phase).graph
    record("lower", raw, start)
    start = time.perf_counter()
    graph = net.graph(args.phase)
    record("outputs chosen, unused inputs dropped", graph, start)
    if args.phase == "train":
        start = time.perf_counter()
        cfg = solver_config(net)
        add_solver(graph, add_gradients(graph), cfg)
        record(f"autodiff + {cfg.type} updates", graph, start)
    records: list[PassRecord] = []
    graph = run_pipeline(graph, check=True, records=records)
    for r in records:
        stages.append((f"pass {r.name}", r.nodes_after, format_count(r.flops_after), r.ms))
    symbol = batch_symbol(graph) or next(iter(graph.symbols()), None)
    bindings = {s: args.batch for s in graph.symbols()}
    weights = net.init_weights()
    for name, w in graph.weights.items():
        weights.setdefault(name, np.zeros(w.value.type.concrete({}), w.value.dtype))   # solver slots
    start = time.perf_counter()
    plan = Plan(graph, bindings, {k: weights[k] for k in graph.weights})
    plan_ms = (time.perf_counter() - start) * 1e3
    if args.explain or not args.dump:
        print(f"{'stage':40s} {'nodes':>6s} {'FLOPs':>18s} {'ms':>8s}")
        for name, nodes, flops, ms in stages:
            print(f"{name:40s} {nodes:6d} {flops:>18s} {ms:8.2f}")
        print(f"{'plan (constants folded, kernels bound)':40s} {len(plan.calls):6d} {'':>18s} {plan_ms:8.2f}")
        size = f"{symbol}={args.batch}" if symbol else "fixed shapes"
        print(f"memory plan at {size}: {plan.peak_bytes / 2**20:.2f} MiB in {len(plan.memory.storages)} buffers")
    if args.dump:
        print(graph.dump())
    return 0
