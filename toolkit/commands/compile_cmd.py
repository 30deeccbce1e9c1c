"""``toolkit compile``: builds a phase's graph stage by stage and says what each stage did."""
from __future__ import annotations

import time

from ..compile import add_gradients, add_sgd_updates
from ..frontend import Net
from ..frontend.lower import lower_phase
from ..passes.prune import eliminate_dead_code
from ..report import format_count, graph_flops
from ..runtime.plan import Plan
from ..runtime.session import batch_symbol


def run_compile(args) -> int:
    net = Net.load(args.net)
    stages = []

    def record(name, graph, start):
        stages.append((name, len(graph.nodes), format_count(graph_flops(graph)), (time.perf_counter() - start) * 1e3))

    start = time.perf_counter()
    raw, _ = lower_phase(net.spec, net.positions, args.phase, None, {}, net._loss_layers())
    record("lower", raw, start)
    start = time.perf_counter()
    graph = net.graph(args.phase)
    record("prune (dead code, unused inputs)", graph, start)
    if args.phase == "train":
        start = time.perf_counter()
        add_sgd_updates(graph, add_gradients(graph), 0.01)
        record("autodiff + sgd updates", graph, start)
        start = time.perf_counter()
        graph = eliminate_dead_code(graph)
        record("prune", graph, start)
    symbol = batch_symbol(graph)
    bindings = {symbol: args.batch} if symbol else {}
    weights = net.init_weights()
    start = time.perf_counter()
    plan = Plan(graph, bindings, {k: weights[k] for k in graph.weights})
    plan_ms = (time.perf_counter() - start) * 1e3
    if args.explain or not args.dump:
        print(f"{'stage':34s} {'nodes':>6s} {'FLOPs':>14s} {'ms':>8s}")
        for name, nodes, flops, ms in stages:
            print(f"{name:34s} {nodes:6d} {flops:>14s} {ms:8.2f}")
        print(f"{'plan (fold constants, memory)':34s} {len(plan.calls):6d} {'':>14s} {plan_ms:8.2f}")
        print(f"memory plan at batch {args.batch}: {plan.peak_bytes / 2**20:.2f} MiB in "
              f"{len(plan.memory.arena)} buffers")
    if args.dump:
        print(graph.dump())
    return 0
