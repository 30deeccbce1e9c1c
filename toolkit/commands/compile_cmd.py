"""``toolkit compile``: runs a phase's graph through the pass pipeline and says what each pass did
(nodes, FLOPs, peak memory, before and after); ``--json`` prints docs/spec.md section 4's object."""
from __future__ import annotations

import json
import time
from collections import Counter

import numpy as np

from ..backend.options import check_device
from ..compile import disabled_passes, optimize, train_graph
from ..errors import UserError
from ..frontend.spec import parse_overrides
from ..ir.dims import Dim, evaluate, format_count
from ..ops.flops import graph_flops
from ..optim.data_parallel import DataParallel, bucket_summary
from ..passes.pipeline import PassRecord, memory_reuse
from ..passes.pipeline import contracts as pass_contracts
from ..placement.predict import predicted_line, predicted_step
from ..runtime.plan import Plan, memory_figures
from ..runtime.session import batch_symbol
from ..settings import precision_policy
from ..training.feeding import train_spec
from ..zoo.resolve import load_net
from .placing import place_net, placement_report, print_placement


def _figure(d: Dim, bindings) -> int:
    return int(evaluate(d, bindings))


def fused_members(graph) -> dict[str, dict[str, int]]:
    """What the fused ops of a graph contain, by primitive: GEMMs inside epilogues count here."""
    out: dict[str, Counter] = {}
    for node in graph.nodes:
        if node.op in ("fused_elementwise", "fused_epilogue"):
            members = out.setdefault(node.op, Counter())
            if node.op == "fused_epilogue":
                members[node.attrs["head"]] += 1
            for step in node.attrs["program"]:
                members[step[0]] += 1
        elif node.op == "conv2d_max_pool2d":
            members = out.setdefault(node.op, Counter())
            members.update(["conv2d", "max_pool2d"])
    return {k: dict(sorted(v.items())) for k, v in out.items()}


def run_compile(args) -> int:
    args.device = check_device(args.device)
    net = load_net(args.net, parse_overrides(args.overrides))
    placed = place_net(args, net)          # --place auto: the net with its layers' chosen devices
    if placed is not None:
        net = placed.net
    disable = disabled_passes(net, args.disable, args.no_optimize)
    if args.stages > 1:                    # the pipeline's stages (training/pipeline_report.py)
        from ..training.pipeline_report import check_stages_option, pipeline_report, print_pipeline_report
        check_stages_option(args)
        print_pipeline_report(pipeline_report(net, args.stages, args.batch, args.device, disable, args.ranks),
                              args.net, args.json)
        return 0
    start = time.perf_counter()
    if args.ranks > 1 and args.phase != "train":
        raise UserError("--ranks is for --phase train (the data-parallel train step)")
    data_parallel = None
    if args.ranks > 1:
        d = train_spec(net).distributed
        data_parallel = DataParallel(d.bucket_mb, d.overlap, d.sync_batchnorm)
    graph = train_graph(net, data_parallel=data_parallel) if args.phase == "train" else net.graph(args.phase)
    build_ms = (time.perf_counter() - start) * 1e3
    reuse = memory_reuse(disable)
    bindings = {s: args.batch for s in graph.symbols()}
    symbol = batch_symbol(graph)
    weights_file = net.weights_or_published(args.weights)
    arrays = net.load_weights(weights_file) if weights_file else net.init_weights()
    # infer and test as `toolkit infer` and `toolkit test` run them: the weights frozen in
    weights = arrays if args.phase != "train" else None
    lowered = {"nodes": len(graph.nodes), "flops": _figure(graph_flops(graph), bindings),
               "flops_symbolic": format_count(graph_flops(graph)), "ms": round(build_ms, 3),
               "memory": memory_figures(graph, bindings, args.device, reuse)}

    def observe(record: PassRecord, g) -> None:
        record.memory = memory_figures(g, bindings, args.device, reuse)

    records: list[PassRecord] = []
    graph = optimize(graph, disable, weights, args.device, check=True, records=records, observe=observe,
                     consume_weights=True)
    for name, w in graph.weights.items():       # solver slots start at zero
        arrays.setdefault(name, np.zeros(w.value.type.concrete({}), w.value.dtype))
    start = time.perf_counter()
    plan = Plan(graph, bindings, {k: arrays[k] for k in graph.weights}, args.device, reuse_memory=reuse)
    plan_ms = (time.perf_counter() - start) * 1e3
    final_flops = graph_flops(graph)
    report = {
        "phase": args.phase,
        "passes": [{"name": r.name, "nodes_before": r.nodes_before, "nodes_after": r.nodes_after,
                    "ms": round(r.ms, 3), "changes": r.notes, "peak_bytes": r.memory["peak_bytes"]}
                   for r in records],
        "ops": dict(sorted(Counter(n.op for n in graph.nodes).items())),
        "fused": fused_members(graph),
        "flops": _figure(final_flops, bindings),
        "flops_symbolic": format_count(final_flops),
        "memory": {"batch": args.batch if symbol else None, **plan.memory.summary()},
        "kernel_calls": len(plan.calls),
        "lowered": lowered,
        "disabled": list(disable),
        "weights": "frozen" if weights is not None else "trained (updated every step)",
        "plan_ms": round(plan_ms, 3),
    }
    if any(d.graphs for d in plan.build.devices):     # runtime/capture.py
        report["cuda_graph"] = {"captured": plan.graph_run is not None, "why_not": plan.capture_blocker}
        # the float32 math policy of the GPU's convolutions (docs/spec.md, "float32 math on the GPU")
        report["precision"] = precision_policy(graph.precision)
    if args.explain and data_parallel is None:   # by name only: the first measurement takes seconds
        report["predicted"] = predicted_step(plan)
    if placed is not None:
        report["placement"] = placement_report(placed)
    if data_parallel is not None:
        buckets = bucket_summary(graph)
        report["allreduce"] = {"ranks": args.ranks, "bucket_mb": data_parallel.bucket_mb, "buckets": len(buckets),
                               "bytes": sum(b["bytes"] for b in buckets), "per_bucket": buckets,
                               "overlap": data_parallel.overlap, "sync_batchnorm": data_parallel.sync_batchnorm}
    if args.json:
        print(json.dumps(report))
        return 0
    if args.dump:
        print(graph.dump())
        return 0
    _print_explain(report, args, symbol, disable)
    return 0


def _mib(n: int) -> str:
    return f"{n / 2**20:.3f}"


def _print_explain(report: dict, args, symbol: str | None, disable) -> None:
    size = f"{symbol}={args.batch}" if symbol else "fixed shapes"
    low = report["lowered"]
    print(f"{report['phase']} graph of {args.net}; memory at {size}; FLOPs per call")
    print(f"{'stage':24s} {'nodes':>12s} {'FLOPs':>14s} {'peak MiB':>9s} {'ms':>8s}")
    print(f"{'lowered':24s} {low['nodes']:>12d} {low['flops_symbolic']:>14s} {_mib(low['memory']['peak_bytes']):>9s} "
          f"{low['ms']:8.2f}")
    contracts = pass_contracts()
    for p in report["passes"]:
        if p["nodes_before"] == p["nodes_after"] and not p["changes"]:
            continue                              # a canonicalising run that found nothing
        nodes = f"{p['nodes_before']} -> {p['nodes_after']}"
        print(f"{p['name']:24s} {nodes:>12s} {'':>14s} {_mib(p['peak_bytes']):>9s} {p['ms']:8.2f}")
        for change in p["changes"]:
            print(f"    {change}")
    print(f"{'plan':24s} {report['kernel_calls']:>12d} {report['flops_symbolic']:>14s} "
          f"{_mib(report['memory']['peak_bytes']):>9s} {report['plan_ms']:8.2f}   (kernel calls)")
    mem = report["memory"]
    print(f"memory at {size}: planned {_mib(mem['peak_bytes'])} MiB, naive {_mib(mem['naive_bytes'])} MiB "
          f"(one buffer per value), lower bound {_mib(mem['lower_bound_bytes'])} MiB (most bytes live at one step)"
          + (f"; {mem['gathered_concats']} concatenation(s) gathered in place (their parts written into the output)"
             if mem.get("gathered_concats") else ""))
    print("ops: " + ", ".join(f"{k} {v}" for k, v in report["ops"].items()))
    predicted = report.get("predicted")
    if predicted is not None:
        print(predicted_line(predicted, size))
    if "placement" in report:
        print_placement(report)
    graph_run = report.get("cuda_graph")
    if graph_run is not None:
        print("CUDA graph: " + ("captured after the first run, then one launch per run" if graph_run["captured"]
                                else f"not captured, the run is kernel by kernel: {graph_run['why_not']}"))
        print(f"float32 convolutions: {report['precision']} ("
              + ("cuDNN's FMA math" if report["precision"] == "strict" else "TF32 tensor cores allowed") + ")")
    if "allreduce" in report:
        a = report["allreduce"]
        print(f"gradient all-reduce over {a['ranks']} ranks: {a['buckets']} bucket(s) of about {a['bucket_mb']:g} MB, "
              f"{a['bytes']} bytes per step: "
              + ", ".join(f"{b['tensors']} tensors {b['bytes']} B" for b in a["per_bucket"]))
    for op, members in report["fused"].items():
        print(f"  inside {op}: " + ", ".join(f"{k} {v}" for k, v in members.items()))
    print("passes (switch one off with --disable NAME):")
    for name, contract in contracts.items():
        print(f"  {name:22s} {'(disabled) ' if name in disable else ''}{contract}")
