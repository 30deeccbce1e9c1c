"""What ``toolkit compile --phase train --stages K`` says of a pipeline: each stage's layers, its
FLOPs, its predicted time per step, the weights and the peak memory its rank holds, the bytes
the stages send each other per step, and the bubble (GPipe's and 1F1B's alike); with ``--ranks``
a multiple of the stages, the data-parallel replicas of the pipeline: which ranks are which
replica, each replica's batch, and each stage's gradient all-reduce over its replicas.

The stages are cut by the layers' measured time, else their FLOPs, under each rank's memory
limit (training/stage_balance.py, stage_costs.py); where the limit moved the cut, the report says from
where and what the stage would have held. A stage's predicted time is the one-process step's
time, measured here (the median of a few runs of its plan), times the stage's share of the
measured time (or of the FLOPs); the pipeline's step is then (M+K-1) micro-batch slots of the slowest stage's
micro-batch time, of which (K-1)/(M+K-1) is the bubble. Sending is left out of the prediction
(its bytes are shown).
"""
from __future__ import annotations

import json
import statistics
import time

import numpy as np

from ..compile import optimize, solver_config, train_graph
from ..distributed.grid import replica_ranks, stage_ranks
from ..errors import UserError
from ..ir.dims import evaluate
from ..optim.data_parallel import bucket_summary
from ..optim.solvers import host_values, is_slot
from ..placement.model import value_bytes
from ..runtime.plan import Plan, memory_figures
from .feeding import train_spec
from .pipeline import ReplicaSums, build_pipeline, check_micro_batches
from .stage_balance import Stages, mib
from .stage_costs import measured_layer_seconds, stage_memory_limit


def pipeline_report(net, stages: int, batch: int, device, disable: tuple[str, ...] = (), ranks: int = 0) -> dict:
    """The figures above for ``net`` at a step of ``batch`` rows a replica (the micro-batches'
    count from the net's train.distributed.micro_batches), on ``ranks`` ranks (the stages when 0)."""
    distributed = train_spec(net).distributed
    micro = distributed.micro_batches
    check_micro_batches(batch, micro)
    rows = batch // micro
    replicas = max(ranks, stages) // stages
    sums = ReplicaSums(replicas, distributed.bucket_mb, distributed.overlap) if replicas > 1 else None
    cfg = solver_config(net)
    limit = stage_memory_limit(distributed, max(ranks, stages))
    seconds = measured_layer_seconds(net, cfg, rows, device) if distributed.balance == "time" else None
    p = build_pipeline(net, cfg, stages, micro, rows, schedule=distributed.schedule, replicas=sums,
                       memory_limit=limit, layer_seconds=seconds, device=device)
    bindings = {s: rows for s in p.cut.graph.symbols()}
    one_ms = measured_step_ms(net, batch, device, disable)
    total_flops = sum(p.stages.flops) or 1
    total_time = sum(p.stages.time) or 1
    rows_out = []
    for s in range(stages):
        g = p.cut.stage_graph(s)
        weights = sum(value_bytes(w.value, {}) for k, w in g.weights.items() if not is_slot(k))
        slots = sum(value_bytes(w.value, {}) for k, w in g.weights.items() if is_slot(k))
        memory = memory_figures(optimize(g, disable, device=device), bindings, device)
        share = p.stages.time[s] / total_time          # of the measured time, or of the FLOPs
        rows_out.append({"stage": s, "layers": p.stages.layers[s], "flops": int(p.stages.flops[s]),
                         "flops_share": round(p.stages.flops[s] / total_flops, 4), "time_share": round(share, 4),
                         "predicted_ms": round(one_ms * share, 4),
                         "weight_bytes": weights, "slot_bytes": slots, "peak_bytes": memory["peak_bytes"],
                         # what the rank holds, as the memory planner plans it, and as the cut predicted it
                         "rank_bytes": weights + slots + memory["peak_bytes"],
                         "predicted_bytes": p.stages.memory[s]})
        if sums is not None:              # this stage's sum over its replicas, once a step
            buckets = bucket_summary(g)
            rows_out[-1]["allreduce"] = {"ranks": stage_ranks(s, stages, replicas), "buckets": len(buckets),
                                         "bytes": sum(b["bytes"] for b in buckets)}
    sent = p.cut.sent()
    down = sum(int(evaluate(r["bytes"], bindings)) for r in sent if r["from"] < r["to"])
    up = sum(int(evaluate(r["bytes"], bindings)) for r in sent if r["from"] > r["to"])
    report = {"stages": stages, "micro_batches": micro, "schedule": p.schedule, "batch": batch,
              "micro_batch_rows": rows, "per_stage": rows_out, "balanced_by": p.stages.by,
              "memory_limit_bytes": limit, "limit_moved": limit_moved(p.stages),
              "gradient_sums": "running" if p.stages.running_sums else "after the backward passes",
              "one_process_ms": round(one_ms, 4), "bubble": round(p.bubble(), 4),
              "messages": len(sent), "bytes_down": down, "bytes_up": up}
    if sums is not None:
        report["replicas"] = {"count": replicas, "ranks": replicas * stages, "batch_per_replica": batch,
                              "global_batch": batch * replicas, "bucket_mb": distributed.bucket_mb,
                              "by_replica": [replica_ranks(r, stages) for r in range(replicas)]}
    slowest = max(r["predicted_ms"] for r in rows_out)
    report["predicted_step_ms"] = round(slowest * (micro + stages - 1) / micro, 4)
    return report


def limit_moved(stages: Stages) -> dict | None:
    """Where the memory limit moved the cut: the last layer before each cut without it and with
    it, and the stage that would have held the most, at its predicted bytes."""
    if stages.unlimited is None:
        return None
    over = max(range(stages.count), key=lambda s: stages.unlimited_memory[s])
    return {"from": [names[-1] for names in stages.unlimited[:-1]], "to": [names[-1] for names in stages.layers[:-1]],
            "stage": over, "would_peak_bytes": stages.unlimited_memory[over]}


def measured_step_ms(net, batch: int, device, disable: tuple[str, ...] = (), runs: int = 5) -> float:
    """The one-process train step's time at ``batch`` rows on this machine: the median of
    ``runs`` runs of its plan (after one that warms it), on arrays of the inputs' shapes."""
    cfg = solver_config(net)
    one = optimize(train_graph(net, cfg), disable, device=device)
    bindings = {s: batch for s in one.symbols()}
    arrays = net.init_weights()
    for name, w in one.weights.items():
        arrays.setdefault(name, np.zeros(w.value.type.concrete({}), w.value.dtype))
    plan = Plan(one, bindings, {k: arrays[k] for k in one.weights}, device)
    rng = np.random.default_rng(0)
    scalars = host_values(cfg, 0.0, 1, "float32")       # a learning rate of 0: the weights stay
    feed = {}
    for name, v in one.inputs.items():
        shape = v.type.concrete(bindings)
        feed[name] = scalars[name] if name in scalars else (
            rng.standard_normal(shape).astype(v.dtype) if v.dtype.startswith("float") else np.zeros(shape, v.dtype))
    plan.run(feed)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        plan.run(feed)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def print_pipeline_report(report: dict, net_name: str, as_json: bool) -> None:
    if as_json:
        print(json.dumps(report))
        return
    k, m = report["stages"], report["micro_batches"]
    limit = report["memory_limit_bytes"]
    under = "no memory limit" if limit is None else f"each rank's memory under {mib(limit)} MiB"
    print(f"train step of {net_name} in {k} pipeline stages, {m} micro-batches of {report['micro_batch_rows']} "
          f"rows (batch {report['batch']}, {report['schedule']}), balanced by {report['balanced_by']}, {under}")
    print(f"{'stage':>5s}  {'layers':32s} {'FLOPs':>12s} {'share':>6s} {'pred. ms':>9s} {'weights MiB':>11s} "
          f"{'slots MiB':>9s} {'peak MiB':>9s} {'rank MiB':>9s} {'pred. MiB':>9s}")
    for r in report["per_stage"]:
        names = r["layers"]
        span = f"{names[0]}..{names[-1]} ({len(names)})"
        ms = "-" if r["predicted_ms"] is None else f"{r['predicted_ms']:.3f}"
        print(f"{r['stage']:>5d}  {span:32s} {r['flops']:>12,d} {r['time_share']:>6.1%} {ms:>9s} "
              f"{r['weight_bytes'] / 2**20:>11.3f} {r['slot_bytes'] / 2**20:>9.3f} {r['peak_bytes'] / 2**20:>9.3f} "
              f"{r['rank_bytes'] / 2**20:>9.3f} {r['predicted_bytes'] / 2**20:>9.3f}")
    print("(share: of the measured time or of the FLOPs, as balanced; rank MiB: weights, slots and the planner's "
          "peak; pred. MiB: the cut's prediction of it)")
    moved = report["limit_moved"]
    if moved:
        print(f"the memory limit moved the cut from after {', '.join(moved['from'])} to after "
              f"{', '.join(moved['to'])}: without it stage {moved['stage']} would peak at "
              f"{mib(moved['would_peak_bytes'])} MiB")
    if report["gradient_sums"] == "running":
        print("each weight's gradients summed as the backward passes make them, the memory limit needing it "
              "(two held at most, not one a micro-batch; the step is slower than with one sum at its end)")
    print(f"sent per step: {report['messages']} messages, {report['bytes_down']:,d} bytes of activations down the "
          f"stages, {report['bytes_up']:,d} bytes of gradients and losses up")
    print(f"bubble (equal stages): (K-1)/(M+K-1) = {k - 1}/{m + k - 1} = {report['bubble']:.3f} of a step")
    print(f"predicted step time: {report['predicted_step_ms']:.3f} ms ((M+K-1)/M x the slowest stage, each stage "
          f"its share of one process's step, {report['one_process_ms']:.3f} ms as measured here; "
          f"sending not counted)")
    replicas = report.get("replicas")
    if replicas:
        groups = "; ".join(f"replica {r}: ranks {', '.join(map(str, ranks))}"
                           for r, ranks in enumerate(replicas["by_replica"]))
        print(f"{replicas['count']} data-parallel replicas of the pipeline on {replicas['ranks']} ranks ({groups}): "
              f"batch {replicas['batch_per_replica']} a replica, global batch {replicas['global_batch']}")
        for r in report["per_stage"]:
            a = r["allreduce"]
            print(f"stage {r['stage']}'s gradients summed over ranks {', '.join(map(str, a['ranks']))}: "
                  f"{a['buckets']} bucket(s) of about {replicas['bucket_mb']:g} MB, {a['bytes']:,d} bytes per step")


def check_stages_option(args) -> None:
    if args.phase != "train":
        raise UserError("--stages is for --phase train (the pipeline-parallel train step)")
    if args.ranks > 1 and args.ranks % args.stages:
        raise UserError(f"--stages {args.stages} does not divide --ranks {args.ranks} (the ranks are stages x "
                        f"replicas)")
