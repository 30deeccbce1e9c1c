"""Pipeline-parallel training: the train step over M micro-batches, cut into K stages, one per
rank of an MPI job (docs/spec.md section 8, pipeline).

The step is one graph before it is cut: the net's forward pass once per micro-batch (its inputs
``NAME@m``, the same weights), the objective the sum of each micro-batch's objective times its
share of the global batch (``@micro_weight{m}``: its rows over the batch's rows, as
data-parallel ranks weigh theirs), then one backward pass from that sum and one update. The
gradients reaching each weight are therefore summed over the micro-batches, and the update is
the update of one process at the whole batch (for losses that are means over the rows). Where a
rank's memory limit binds, GPipe's sum is a running one, added to in each micro-batch's backward
pass (``running_sums``), so that a stage never holds a gradient of every micro-batch at once;
elsewhere it is one fused sum after the last backward pass, the faster step.

The schedule is GPipe's: every micro-batch's forward pass, in order, then every backward pass,
in reverse order (the order autodiff emits them in), then the updates. Each rank runs its
stage's part of that order; a stage starts micro-batch m+1 as soon as it has sent m on, so the
stages work at once except at the ends of the step (the bubble, (K-1)/(M+K-1) of it with
stages of equal time).

With R data-parallel replicas of the pipeline (``stages x replicas`` ranks, grouped as
distributed/grid.py says) each replica takes its share of the global batch, as a data-parallel
rank does, and weighs its micro-batches by their rows over the global batch's; each stage's
gradients are then summed over the replicas of that stage, in buckets of that stage's weights
alone (``ReplicaSums``, optim/data_parallel.py's buckets), before its updates, and the logged
losses over the replicas of the last stage before they are sent to the other stages. Every
replica of a stage thus applies the same update to the same weights: they stay equal.

BatchNorm computes its batch statistics per micro-batch (a forward pass is a micro-batch's),
and its running statistics are updated once per micro-batch, in order, as M small batches
would update them: a net with BatchNorm trains as it would at the micro-batch size, not as one
process at the whole batch. With replicas, each replica moves its own running statistics (by
its own micro-batches); the model written holds replica 0's, as data parallelism's holds rank 0's.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from ..compile import add_gradients
from ..distributed.grid import replica_ranks, stage_ranks
from ..errors import UserError
from ..frontend import OBJECTIVE, Net
from ..ir.graph import Graph, Node, Value, copy_nodes
from ..ops.base import Builder
from ..optim.data_parallel import buckets as gradient_buckets
from ..optim.solvers import SolverConfig, add_solver, host_input
from .stage_balance import Stages, mib, partition, sums_as_they_come
from .stage_costs import MEASURED, measured_layer_seconds, stage_memory_limit
from .stages import GRADIENT_SUM, CutGraph, cut, phases, slots

MICRO_WEIGHT = "@micro_weight"
# a cut whose predicted memory comes within this share of the limit is planned to be sure
NEAR_LIMIT = 0.8
SCHEDULES = ("gpipe", "1f1b")


def micro_name(name: str, m: int) -> str:
    return f"{name}@{m}"


@dataclass
class ReplicaSums:
    """How the data-parallel replicas of a pipeline sum their gradients and losses (see the
    module's docstring). ``buckets``: the weights of each bucket, each bucket one stage's,
    numbered across the stages (so that one process can run every stage's); chosen by the
    first step built and kept by every other (a short batch's), so that the replicas of a
    stage, whatever their micro-batch count, sum the same buckets."""
    replicas: int
    bucket_mb: float = 25.0
    overlap: bool = True
    buckets: list[list[str]] = field(default_factory=list)

    def sum_gradients(self, step: Graph, grads: dict[str, Value], stages: Stages) -> dict[str, Value]:
        """The gradients summed over the replicas of their stage, bucket by bucket."""
        if not self.buckets:
            stage_of = stages.stage_of_layer()
            for s in range(stages.count):
                mine = {n: g for n, g in grads.items() if stage_of.get(step.weights[n].layer, 0) == s}
                self.buckets += gradient_buckets(step, mine, self.bucket_mb)
        b = Builder(step, "pipeline")
        summed: dict[str, Value] = {}
        for k, names in enumerate(self.buckets):
            values = [grads[n] for n in names]
            token = b.op("allreduce_start", *values, bucket=k)
            summed.update(zip(names, b.op_multi("allreduce_wait", token, *values, bucket=k, overlap=self.overlap)))
        return summed


def micro_batch_graph(net: Net, solver: SolverConfig, micro_batches: int, dtype: str | None = None,
                      replicas: ReplicaSums | None = None, stages: Stages | None = None,
                      schedule: str = "gpipe", running: bool = True) -> tuple[Graph, Graph, dict[int, int]]:
    """The train step over ``micro_batches`` micro-batches, uncut, before any pass; the forward
    graph of one micro-batch it repeats (whose inputs name what a batch feeds); and which
    micro-batch's forward pass each of its forward nodes is, by id(node). With ``running`` and
    GPipe, each weight's gradients are summed as the backward passes make them (``running_sums``);
    otherwise autodiff sums them after the last, in one fused sum.
    With ``replicas`` (and the ``stages`` they sum by) the gradients and the outputs are summed
    over them."""
    if solver.mixed_precision is not None:
        raise UserError("train.distributed.stages does not run mixed precision yet: leave out "
                        "train.solver.mixed_precision")
    forward = net.graph("train", dtype)
    step = Graph("train", weights=dict(forward.weights), losses=dict(forward.losses))
    step.precision = forward.precision
    b = Builder(step, "pipeline")
    current = {name: w.value for name, w in forward.weights.items()}   # a state's value after m
    terms: dict[str, list[Value]] = {name: [] for name in forward.outputs}
    micro_of: dict[int, int] = {}
    for m in range(micro_batches):
        values: dict[int, Value] = {}
        for name, v in forward.inputs.items():
            step.inputs[micro_name(name, m)] = values[v.id] = Value(v.type, name=micro_name(name, m))
        for name, w in forward.weights.items():
            values[w.value.id] = current[name]
        copied = copy_nodes(forward.nodes, values)
        micro_of.update((id(n), m) for n in copied)
        step.nodes += copied
        share = host_input(step, f"{MICRO_WEIGHT}{m}", forward.outputs[OBJECTIVE].dtype)
        for name, v in forward.outputs.items():
            terms[name].append(b.mul(values[v.id], share))
        for name, v in forward.updates.items():          # running statistics, micro-batch after micro-batch
            current[name] = values.get(v.id, v)
    step.outputs = {name: b.add_all(parts) for name, parts in terms.items()}
    step.updates = {name: current[name] for name in forward.updates}
    grads = add_gradients(step, None, step.outputs[OBJECTIVE])
    if sums_as_they_come(schedule, running):
        grads = running_sums(step, grads, micro_of, summation_order(micro_batches, schedule))
    if replicas is not None:
        grads = replicas.sum_gradients(step, grads, stages)
        # the logged losses: each replica's share of the global batch's, summed (after the
        # backward pass began from this replica's own share)
        step.outputs = {name: b.op("allreduce_sum", v) for name, v in step.outputs.items()}
    add_solver(step, grads, solver)
    return step, forward, micro_of


def summation_order(micro_batches: int, schedule: str) -> list[int]:
    """The order a weight's gradients are summed over the micro-batches in: GPipe's backward
    passes' (``slots``: the last micro-batch's first, autodiff's order too), so that each is
    added as it is made. 1F1B's backward passes run the other way, and summed in that order the
    float32 sums round otherwise: LeNet's 50 steps on the digits (numpy's kernels) then leave one
    process's weights by more than 1e-5 (from step 22 on; autodiff's order stays within 1e-6), so
    1F1B keeps autodiff's order, whose sum waits for its last backward pass."""
    order = [m for m, ph in slots(0, 1, micro_batches, schedule) if ph == "B"]
    return order if sums_as_they_come(schedule) else list(reversed(range(micro_batches)))


def running_sums(step: Graph, grads: dict[str, Value], micro_of: Mapping[int, int],
                 order: list[int]) -> dict[str, Value]:
    """``grads`` with each weight's sum over the micro-batches made again as a running sum in
    ``order``: ((g_a + g_b) + g_c) ... for a, b, c, ... in that order. In the backward passes'
    order each micro-batch's gradient is added, and can be freed, in its own backward pass (the
    cut runs each add where its newest part is made: stages.py ``GRADIENT_SUM``), and a stage
    holds one running sum of its weights' gradients rather than M. Autodiff makes the same sum
    at the end of the graph, where a stage's order ran it after every backward pass."""
    position = {m: i for i, m in enumerate(order)}
    phase = phases(step, micro_of)
    b = Builder(step, GRADIENT_SUM)
    dropped: set[int] = set()
    summed = {}
    for name, g in grads.items():
        parts, chain = _sum_parts(g)
        if not chain:
            summed[name] = g
            continue
        # a part of no one micro-batch's backward pass (none here: a weight's gradient is each
        # micro-batch's) keeps autodiff's place, after the micro-batches' parts
        parts.sort(key=lambda v: position.get((phase.get(id(v.producer)) or (None,))[0], len(order)))
        dropped.update(id(n) for n in chain)
        summed[name] = b.add_all(parts)
    step.nodes = [n for n in step.nodes if id(n) not in dropped]
    return summed


def _sum_parts(g: Value) -> tuple[list[Value], list[Node]]:
    """The parts autodiff's sum ``g`` adds (``Builder.add_all``'s chain of ``add`` nodes in its
    scope ``autodiff``) and the chain's nodes; ([g], []) where ``g`` is not such a sum."""
    chain = []
    parts: list[Value] = []
    v = g
    while v.producer is not None and v.producer.op == "add" and v.producer.scope == "autodiff":
        chain.append(v.producer)
        parts.append(v.producer.inputs[1])
        v = v.producer.inputs[0]
    parts.append(v)
    return parts[::-1], chain


@dataclass
class Pipeline:
    """A step cut into stages: the stages, the cut graph, the forward graph of one micro-batch."""
    stages: Stages
    cut: CutGraph
    forward: Graph
    micro_batches: int
    schedule: str = "gpipe"
    replicas: ReplicaSums | None = None

    @property
    def replica_count(self) -> int:
        return self.replicas.replicas if self.replicas else 1

    def bubble(self) -> float:
        """The idle share of a step with stages of equal time, GPipe's and 1F1B's: (K-1)/(M+K-1)."""
        k, m = self.stages.count, self.micro_batches
        return (k - 1) / (m + k - 1)


def build_pipeline(net: Net, solver: SolverConfig, stages: int, micro_batches: int, micro_batch_rows: int,
                   dtype: str | None = None, chosen: Stages | None = None, schedule: str = "gpipe",
                   replicas: ReplicaSums | None = None, memory_limit: int | None = None,
                   layer_seconds: Mapping[str, float] | None = None, device=None) -> Pipeline:
    """The step of ``net`` cut into ``stages`` stages balanced by ``layer_seconds`` (each layer's
    measured time a micro-batch) or else FLOPs at ``micro_batch_rows`` rows a micro-batch, each
    stage's memory under ``memory_limit`` bytes where given (or into the ``chosen`` stages),
    each stage's work in ``schedule``'s order; with ``replicas``, the step of one replica among
    them. Where a stage's predicted memory comes near the limit, the memory planner plans each
    stage on ``device`` (``planned_bytes``), and a cut it finds over the limit is chosen again
    with the prediction raised by what the planner held beyond it."""
    if schedule not in SCHEDULES:
        raise UserError(f"train.distributed.schedule is {schedule!r}; the schedules are {', '.join(SCHEDULES)}")
    running = chosen.running_sums if chosen is not None else False
    step, forward, micro_of = micro_batch_graph(net, solver, micro_batches, dtype, schedule=schedule,
                                                running=running)
    if chosen is None:
        bindings = {s: micro_batch_rows for s in step.symbols()}
        layers = [layer.name for layer in net.spec.layers]
        by = MEASURED if layer_seconds else "FLOPs"
        try:
            chosen = partition(step, layers, stages, bindings, micro_of, micro_batches, schedule, memory_limit,
                               layer_seconds, by, running=False)
        except UserError:
            if not sums_as_they_come(schedule):
                raise
            chosen = None
        if sums_as_they_come(schedule) and (chosen is None or chosen.unlimited is not None):
            # the limit binds: summed as the backward passes make them, a stage's weights'
            # gradients are held twice at most rather than once a micro-batch; where it does
            # not, the one fused sum after the last backward pass is the faster step (its M-1
            # two-input adds cost a GPipe step about 10% on benchmarks/pipeline.py's MLP)
            running = True
            step, forward, micro_of = micro_batch_graph(net, solver, micro_batches, dtype, schedule=schedule,
                                                        running=True)
            chosen = partition(step, layers, stages, bindings, micro_of, micro_batches, schedule, memory_limit,
                               layer_seconds, by, running=True)
        margin = 0
        for _ in range(3):         # the prediction errs by some per cent (docs/guides/distributed.md)
            if memory_limit is None or max(chosen.memory) + margin < NEAR_LIMIT * memory_limit:
                break
            planned = planned_bytes(net, solver, chosen, micro_batches, micro_batch_rows, dtype, schedule, device)
            if max(planned) <= memory_limit:
                break
            margin += max(a - p for a, p in zip(planned, chosen.memory) if a > memory_limit)
            chosen = partition(step, layers, stages, bindings, micro_of, micro_batches, schedule, memory_limit,
                               layer_seconds, by, margin, running=running)
    if replicas is not None:        # the sums go by stage: built again once the stages are known
        step, forward, micro_of = micro_batch_graph(net, solver, micro_batches, dtype, replicas, chosen, schedule,
                                                    running)
    return Pipeline(chosen, cut(step, chosen, micro_of, micro_batches, schedule), forward, micro_batches, schedule,
                    replicas)


def planned_bytes(net: Net, solver: SolverConfig, chosen: Stages, micro_batches: int, micro_batch_rows: int,
                  dtype: str | None, schedule: str, device) -> list[int]:
    """What each stage's rank holds as the memory planner plans it: its weights, its slots and
    its step's arena, with no replicas (their sums hold no more than the gradients)."""
    from ..compile import optimize
    from ..placement.model import value_bytes
    from ..runtime.plan import memory_figures
    step, _, micro_of = micro_batch_graph(net, solver, micro_batches, dtype, schedule=schedule,
                                          running=chosen.running_sums)
    bindings = {s: micro_batch_rows for s in step.symbols()}
    whole = cut(step, chosen, micro_of, micro_batches, schedule)
    device = device or "cpu"
    out = []
    for s in range(chosen.count):
        g = whole.stage_graph(s)
        held = sum(value_bytes(w.value, {}) for w in g.weights.values())
        out.append(held + memory_figures(optimize(g, device=device), bindings, device)["peak_bytes"])
    return out


def micro_batches_of(rows: int, micro_batches: int) -> int:
    """How many equal micro-batches a batch of ``rows`` runs as: ``micro_batches``, or for a
    batch they do not divide (an epoch's short last batch) the most, fewer, that divide it."""
    return next(m for m in range(min(micro_batches, rows), 0, -1) if rows % m == 0)


def check_micro_batches(batch_size: int, micro_batches: int) -> None:
    """The batch splits into ``micro_batches`` equal micro-batches (they share one compiled step)."""
    if batch_size % micro_batches:
        raise UserError(f"train.distributed.micro_batches is {micro_batches}, which does not divide "
                        f"train.data.batch_size ({batch_size}): the micro-batches are equal")


def micro_batch_feed(batch: dict[str, np.ndarray], forward: Graph, micro_batches: int,
                     dtype: str, share: float = 1.0) -> dict[str, np.ndarray]:
    """A batch's arrays (named as the forward graph's inputs) as the micro-batches' inputs, with
    each micro-batch's share of the objective (``share``: the batch's share of the global
    batch, which a replica's batch is a part of)."""
    feed = {}
    for name in forward.inputs:
        for m, part in enumerate(np.split(batch[name], micro_batches)):
            feed[micro_name(name, m)] = part
    for m in range(micro_batches):           # equal micro-batches: equal shares
        feed[f"{MICRO_WEIGHT}{m}"] = np.asarray(share / micro_batches, dtype=dtype)
    return feed


def pipeline_of(net: Net, solver: SolverConfig, spec, comm, device) -> Pipeline:
    """The pipeline a run of ``spec`` (its train section) trains by on this job's ranks, or the
    one line that says why it cannot."""
    d = spec.distributed
    k = d.stages
    size = comm.size if comm is not None else 1
    if size == 1:
        raise UserError(f"train.distributed.stages is {k}: a pipeline runs one stage a rank, under "
                        f"`mpiexec -n {k} toolkit train ...`")
    if size % k:
        raise UserError(f"train.distributed.stages is {k}, which does not divide the job's {size} ranks "
                        f"(the ranks are stages x replicas)")
    if not device.host_memory:
        raise UserError(f"a pipeline-parallel run trains on the CPU only, not on {device}")
    if d.sync_batchnorm:
        raise UserError("train.distributed.sync_batchnorm is for data-parallel ranks; a pipeline's BatchNorm "
                        "computes its statistics per micro-batch")
    batch = spec.data.batch_size
    check_micro_batches(batch, d.micro_batches)
    replicas = ReplicaSums(size // k, d.bucket_mb, d.overlap) if size > k else None
    rows = batch // d.micro_batches
    # rank 0 times the layers (measuring what this machine's cache lacks), so every rank cuts alike
    seconds = None
    if d.balance == "time":
        seconds = comm.share(measured_layer_seconds(net, solver, rows, device) if comm.rank == 0 else None)
    return build_pipeline(net, solver, k, d.micro_batches, rows, schedule=d.schedule, replicas=replicas,
                          memory_limit=stage_memory_limit(d, size), layer_seconds=seconds, device=device)


def describe(p: Pipeline) -> str:
    """The line a run starts with: each stage's layers and predicted share of the work."""
    st = p.stages
    work = st.time if st.time else st.flops
    total = sum(work) or 1
    what = "time" if st.by == MEASURED else "FLOPs"
    parts = [f"stage {s}: {names[0]}..{names[-1]} ({len(names)} layers, {100 * f / total:.0f}% of the {what}"
             + (f", {mib(st.memory[s])} MiB predicted" if st.memory else "") + ")"
             for s, (names, f) in enumerate(zip(st.layers, work))]
    line = (f"pipeline of {st.count} stages, {p.micro_batches} micro-batches ({p.schedule}, bubble "
            f"{p.bubble():.2f} of a step with equal stages), balanced by {st.by}"
            + (f" under {mib(st.limit)} MiB a rank" if st.limit is not None else "") + ": " + "; ".join(parts))
    if p.replicas:
        line += "\n" + describe_replicas(p.stages.count, p.replicas.replicas)
    return line


def describe_replicas(stages: int, replicas: int) -> str:
    """Which ranks are which replica, and which sum each stage's gradients (distributed/grid.py)."""
    pipes = "; ".join(f"replica {r}: ranks {', '.join(map(str, replica_ranks(r, stages)))}" for r in range(replicas))
    sums = "; ".join(f"stage {s}: ranks {', '.join(map(str, stage_ranks(s, stages, replicas)))}"
                     for s in range(stages))
    return (f"{replicas} data-parallel replicas of the pipeline ({pipes}), each taking its share of the global "
            f"batch; each stage's gradients summed over its replicas ({sums})")
