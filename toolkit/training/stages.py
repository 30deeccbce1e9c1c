"""A train graph cut into pipeline stages, one per rank (docs/spec.md section 8, pipeline).

The stages are runs of consecutive layers in the net's order, balanced by predicted time: each
layer's time a micro-batch as this machine's cost model measured it (placement/cost.py), else
its FLOPs (its OpDefs' counts, ops/flops.py) over all its work in the train step (forward,
gradient, update), split so that the slowest stage is as fast as it can be under each rank's
memory limit (``partition``: exact, by dynamic programming over the cut points, PipeDream's
partitioner; a stage's memory as ``LayerCosts`` predicts it from its weights, the solver's
slots, the gradients and the activations of the micro-batches its schedule holds). Every node
of the graph then belongs to a stage (``assign``): a layer's nodes, its gradient's (scope
``LAYER.grad``) and its weights' updates (``LAYER.sgd``, ...) to the layer's stage; a node of no
layer (the objective, autodiff's seed) to the last stage among what it reads, or, reading only
inputs, to the stage that reads it.

``cut`` makes the graph of every stage: each value one stage computes and another reads becomes
a ``send`` on the one and a ``recv`` on the other (ops/p2p.py): the forward activations go down
the pipeline, their gradients come back up, and the logged losses go from the last stage to
every other, so that every rank logs and checks the same numbers. A constant (a node that reads
nothing) is copied to each stage that reads it instead.

Each stage's nodes are then put in its schedule's order (``slots``: GPipe's or 1F1B's order of
the micro-batches' forward and backward passes; ``phases`` tells which pass a node is of), and
its sends and receives chained in that order, so that no pass moves a receive ahead of a send
the other rank waits for. The stages' orders are merged into one (``_interleave``), which
shows that the schedule cannot hang (with sends that never block, each receive waits only for
a send earlier in that one order) and runs in one process (``CutGraph.one_process``: the
receives take from a mailbox).
"""
from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np

from ..errors import UserError
from ..ir.dims import evaluate
from ..ir.graph import Graph, Node, TensorType, Value, copy_graph
from ..ir.live import keep_live
from ..ops.base import get_op
from ..ops.p2p import sent_bytes

# the output that keeps a stage's last send alive (dead-code elimination keeps only what an
# output or an update needs)
STAGE_DONE = "@stage_done"
# the scope of the adds that sum a weight's gradients over the micro-batches as they come
GRADIENT_SUM = "pipeline.gradient_sum"


def mib(nbytes: float) -> str:
    """Bytes as MiB, to three decimals below 10 MiB (a small net's stages differ there)."""
    v = nbytes / 2**20
    return f"{v:,.1f}" if v >= 10 else f"{v:.3f}"


def layer_of(scope: str, layers: set[str]) -> str | None:
    """The layer a node's scope names: the layer itself, or LAYER.grad, LAYER.sgd, ..."""
    if scope in layers:
        return scope
    head = scope
    while "." in head:
        head = head.rsplit(".", 1)[0]
        if head in layers:
            return head
    return None


def layer_order(graph: Graph, net_layers: list[str]) -> list[str]:
    """The layers the train graph holds work of, in the net's order."""
    layers = set(net_layers)
    present = {layer_of(n.scope, layers) for n in graph.nodes}
    return [name for name in net_layers if name in present]


def layer_flops(graph: Graph, order: list[str], bindings: Mapping[str, int]) -> dict[str, int]:
    """Each layer's FLOPs in the train step: its forward, gradient and update nodes."""
    layers = set(order)
    flops = dict.fromkeys(order, 0)
    for node in graph.nodes:
        layer = layer_of(node.scope, layers)
        count = get_op(node.op).flops
        if layer is not None and count is not None:
            types_in, types_out = [v.type for v in node.inputs], [v.type for v in node.outputs]
            flops[layer] += evaluate(count(types_in, types_out, node.attrs), bindings)
    return flops


def balance(costs: list[float], k: int, fits: Callable[[int, int, int], bool] | None = None) -> list[int] | None:
    """Where K contiguous non-empty parts of ``costs`` start (the first at 0), chosen so that the
    largest part's sum is the smallest it can be (exact: dynamic programming over the cuts);
    with ``fits(part, start, end)``, among the cuts whose every part fits (None when none does)."""
    n = len(costs)
    prefix = [0.0, *itertools.accumulate(costs)]
    return _min_max_cut(n, k, lambda j, s, i: prefix[i] - prefix[s], fits)


def _min_max_cut(n: int, k: int, cost: Callable[[int, int, int], float],
                 fits: Callable[[int, int, int], bool] | None = None) -> list[int] | None:
    """Where K contiguous non-empty parts of n items start, minimising the largest
    ``cost(part, start, end)`` over the parts that ``fits`` (None: every part fits); None when
    no cut fits."""
    if not 1 <= k <= n:
        raise ValueError(f"{k} parts of {n} items")
    inf = float("inf")
    # best[j][i]: the smallest largest part of the first i items in j parts; start[j][i]: where
    # its last part starts
    best = [[inf] * (n + 1) for _ in range(k + 1)]
    start = [[0] * (n + 1) for _ in range(k + 1)]
    best[0][0] = 0.0
    for j in range(1, k + 1):
        for i in range(j, n - (k - j) + 1):
            for s in range(j - 1, i):
                if best[j - 1][s] == inf or (fits is not None and not fits(j - 1, s, i)):
                    continue
                worst = max(best[j - 1][s], cost(j - 1, s, i))
                if worst < best[j][i]:
                    best[j][i], start[j][i] = worst, s
    if best[k][n] == inf:
        return None
    cuts, i = [], n
    for j in range(k, 0, -1):
        i = start[j][i]
        cuts.append(i)
    return cuts[::-1]


def sums_as_they_come(schedule: str, running: bool = True) -> bool:
    """Whether ``schedule``'s stages sum each weight's gradients as the backward passes make them
    (GPipe's, where ``running``: training/pipeline.py ``build_pipeline`` asks for it where the
    memory limit needs it) or after the last (1F1B's: training/pipeline.py ``summation_order``)."""
    return running and schedule == "gpipe"


def in_flight(stage: int, stages: int, micro_batches: int, schedule: str) -> int:
    """How many micro-batches' activations a stage holds at once: GPipe's every one, 1F1B's
    the stages from this one to the last (``slots``)."""
    return micro_batches if schedule == "gpipe" else min(stages - stage, micro_batches)


@dataclass
class LayerCosts:
    """What the partitioner weighs of each layer (in the net's order), and how a run of them
    holds memory as a stage (``stage_bytes``), bytes at the micro-batch's rows:

    - ``time``: its work per micro-batch, measured seconds or FLOPs (``by`` says which);
    - ``held``: its weights and the solver's slots, held all along;
    - ``grads``: its trainable weights' bytes: with GPipe each weight's gradients are summed as
      the backward passes make them (training/pipeline.py ``running_sums``), so a stage holds
      the running sum and the gradients its backward pass is making, two of them at the peak;
      with 1F1B the sum waits for the last backward pass (``summation_order`` says why), and a
      gradient of each micro-batch done is live until then, M of them at the end;
    - ``kept``: ``kept[lo, hi]``, the bytes of one micro-batch's forward values read by the
      backward pass of layers lo..hi (first and last): a stage holding any of those layers keeps
      them (a value it receives, too) for every micro-batch in flight;
    - ``work``: the largest value one micro-batch's forward pass of the layer makes: twice it
      (the value and its gradient) is the working space beside what is kept.

    A stage's memory is then held + the most of (in flight) x kept + the gradients live as the
    backward passes free the one and make the other + twice the largest work: what the
    memory planner's peak (the arena) plus the weights and slots come to, within the error
    docs/guides/distributed.md measures."""
    order: list[str]
    time: list[float]
    held: list[int]
    grads: list[int]
    kept: np.ndarray
    work: list[int]
    by: str = "FLOPs"

    def __post_init__(self):
        n = len(self.order)
        self._held = [0, *itertools.accumulate(self.held)]
        self._grads = [0, *itertools.accumulate(self.grads)]
        # crossing[i, j]: kept bytes of the values whose readers span a range that meets i..j-1:
        # those with lo < j and hi >= i (a 2-D running sum over lo ascending, hi descending)
        table = np.zeros((n + 1, n + 1))
        table[1:, :n] = np.cumsum(np.cumsum(self.kept, axis=0)[:, ::-1], axis=1)[:, ::-1]
        self._crossing = table

    def kept_bytes(self, start: int, end: int) -> int:
        """One micro-batch's forward values that layers start..end-1's backward passes read."""
        return int(self._crossing[end, start])

    def stage_bytes(self, start: int, end: int, in_flight: int, micro_batches: int, running: bool = True) -> int:
        """What a rank holding layers start..end-1 holds at its peak (see the class's docstring);
        ``running``: whether its gradients are summed as they come (``sums_as_they_come``)."""
        kept, grads = self.kept_bytes(start, end), self._grads[end] - self._grads[start]
        if not running:
            # b micro-batches' backward passes done: min(in flight, M - b) of them keep their
            # activations and b have their gradients live; the most is at b = M - in flight or M
            live = max(in_flight * kept + (micro_batches - in_flight) * grads, micro_batches * grads)
            return self._held[end] - self._held[start] + live + 2 * max(self.work[start:end])
        # a backward pass after b others starts with min(in flight, M - b) micro-batches'
        # activations kept and, for b >= 1, the running sum of the gradients; it ends with one
        # micro-batch's activations fewer and its own gradients made beside the sum, which it
        # then adds (the adds run last in the pass). The most is at the first pass's start or
        # end or the second's end
        m = micro_batches
        live = max(min(in_flight, m) * kept, min(in_flight, m - 1) * kept + grads,
                   max(min(in_flight, m - 2), 0) * kept + min(m, 2) * grads)
        # the working space: a layer's largest value and its gradient, live together in its backward pass
        return self._held[end] - self._held[start] + live + 2 * max(self.work[start:end])

    def stage_time(self, start: int, end: int) -> float:
        return float(sum(self.time[start:end]))


@dataclass
class Stages:
    """The layers of each stage, and each stage's predicted FLOPs per step; where the cut weighed
    memory, each stage's predicted bytes (``memory``), the limit and the cut without it."""
    layers: list[list[str]]
    flops: list[int]
    time: list[float] = field(default_factory=list)
    memory: list[int] = field(default_factory=list)
    limit: int | None = None
    by: str = "FLOPs"
    unlimited: list[list[str]] | None = None      # the cut with no limit, where the limit moved it
    unlimited_memory: list[int] = field(default_factory=list)
    running_sums: bool = True     # whether its gradients are summed as they come (``sums_as_they_come``)

    @property
    def count(self) -> int:
        return len(self.layers)

    def stage_of_layer(self) -> dict[str, int]:
        return {name: s for s, names in enumerate(self.layers) for name in names}


def layer_costs(graph: Graph, order: list[str], bindings: Mapping[str, int], micro_of: Mapping[int, int],
                time: Mapping[str, float] | None = None, by: str = "FLOPs") -> LayerCosts:
    """``LayerCosts`` of the uncut step ``graph`` over micro-batches (``micro_of``: its forward
    nodes' micro-batch), at ``bindings`` (a micro-batch's rows); ``time``: each layer's measured
    seconds where known (else its FLOPs)."""
    from ..optim.solvers import is_slot
    from ..placement.model import value_bytes
    layers = set(order)
    index = {name: i for i, name in enumerate(order)}
    n = len(order)
    if time is None:
        time, by = layer_flops(graph, order, bindings), "FLOPs"
    held, grads, work = [0] * n, [0] * n, [0] * n
    for name, w in graph.weights.items():
        if w.layer in index:
            size = value_bytes(w.value, {})
            held[index[w.layer]] += size
            if w.trainable and not is_slot(name):
                grads[index[w.layer]] += size
    kept = np.zeros((n, n))
    readers = graph.consumers()
    made = [(v, None) for name, v in graph.inputs.items() if name.endswith("@0")]
    made += [(o, n_) for n_ in graph.nodes if micro_of.get(id(n_)) == 0 for o in n_.outputs]
    for v, producer in made:
        size = value_bytes(v, bindings)
        if producer is not None and (layer := layer_of(producer.scope, layers)) is not None:
            work[index[layer]] = max(work[index[layer]], size)
        backward = sorted({index[r_layer] for r in readers.get(v.id, ()) if id(r) not in micro_of
                           and (r_layer := layer_of(r.scope, layers)) is not None})
        if backward:
            kept[backward[0], backward[-1]] += size
    return LayerCosts(order, [float(time.get(name, 0.0)) for name in order], held, grads, kept, work, by)


def stage_memory(costs: LayerCosts, starts: list[int], micro_batches: int, schedule: str,
                 running: bool = True) -> list[int]:
    """Each stage's predicted bytes for the cut whose stages begin at ``starts``."""
    k, bounds = len(starts), starts + [len(costs.order)]
    return [costs.stage_bytes(bounds[s], bounds[s + 1], in_flight(s, k, micro_batches, schedule), micro_batches,
                              sums_as_they_come(schedule, running)) for s in range(k)]


def choose_cut(costs: LayerCosts, k: int, micro_batches: int, schedule: str, limit: int | None,
               margin: int = 0, running: bool = True) -> tuple[list[int], list[int]]:
    """Where the ``k`` stages begin: the slowest stage as fast as it can be with each stage's
    predicted memory (its activations of the micro-batches ``schedule`` holds) plus ``margin``
    (what the memory planner was seen to hold beyond the prediction) at most ``limit`` bytes;
    and where they begin with no limit. A one-line error where no cut fits, saying the smallest
    peak a cut achieves."""
    n = len(costs.order)

    def memory(j: int, s: int, i: int) -> int:
        return costs.stage_bytes(s, i, in_flight(j, k, micro_batches, schedule), micro_batches,
                                 sums_as_they_come(schedule, running)) + margin

    free = balance(costs.time, k)
    if limit is None or max(stage_memory(costs, free, micro_batches, schedule, running)) + margin <= limit:
        return free, free
    starts = balance(costs.time, k, lambda j, s, i: memory(j, s, i) <= limit)
    if starts is None:
        smallest = max(stage_memory(costs, _min_max_cut(n, k, memory), micro_batches, schedule, running)) + margin
        raise UserError(f"no cut of the train step into {k} stages fits train.distributed.stage_memory_mb "
                        f"({mib(limit)} MiB a rank): the smallest peak any cut achieves is {mib(smallest)} MiB")
    return starts, free


def partition(graph: Graph, net_layers: list[str], k: int, bindings: Mapping[str, int],
              micro_of: Mapping[int, int] | None = None, micro_batches: int = 1, schedule: str = "gpipe",
              limit: int | None = None, time: Mapping[str, float] | None = None, by: str = "FLOPs",
              margin: int = 0, running: bool = True) -> Stages:
    """The layers of ``graph`` in ``k`` stages whose slowest is as fast as it can be (``time``:
    each layer's measured seconds a micro-batch, else its FLOPs at ``bindings``, a micro-batch),
    each stage's predicted memory (plus ``margin``) under ``limit`` bytes where one is given
    (``choose_cut``)."""
    order = layer_order(graph, net_layers)
    if k > len(order):
        raise UserError(f"train.distributed.stages is {k} but the train step has {len(order)} layers: "
                        f"at most {len(order)} stages")
    flops = layer_flops(graph, order, bindings)
    costs = layer_costs(graph, order, bindings, micro_of or {}, time, by)
    starts, free = choose_cut(costs, k, micro_batches, schedule, limit, margin, running)

    def layers_of(begins: list[int]) -> list[list[str]]:
        bounds = begins + [len(order)]
        return [order[bounds[s]: bounds[s + 1]] for s in range(k)]

    layers, bounds = layers_of(starts), starts + [len(order)]
    chosen = Stages(layers, [sum(flops[name] for name in names) for names in layers],
                    [costs.stage_time(bounds[s], bounds[s + 1]) for s in range(k)],
                    stage_memory(costs, starts, micro_batches, schedule, running), limit, costs.by,
                    running_sums=sums_as_they_come(schedule, running))
    if starts != free:        # what it would hold, as the planner was seen to hold it (``margin``)
        chosen.unlimited = layers_of(free)
        chosen.unlimited_memory = [b + margin for b in stage_memory(costs, free, micro_batches, schedule, running)]
    return chosen


def assign(graph: Graph, stages: Stages) -> dict[int, int]:
    """Each node's stage, by id(node)."""
    by_layer = stages.stage_of_layer()
    layers = set(by_layer)
    where: dict[int, int | None] = {}
    made_at: dict[int, int] = {}
    for w in graph.weights.values():
        if w.layer in by_layer:
            made_at[w.value.id] = by_layer[w.layer]
    for node in graph.nodes:
        layer = layer_of(node.scope, layers)
        if layer is not None:
            s = by_layer[layer]
        else:
            known = [made_at[v.id] for v in node.inputs if v.id in made_at]
            s = max(known) if known else None
        where[id(node)] = s
        if s is not None:
            made_at.update((o.id, s) for o in node.outputs)
    # what reads only inputs and constants goes where it is read
    readers: dict[int, list[Node]] = graph.consumers()
    for node in reversed(graph.nodes):
        if where[id(node)] is None:
            read_at = [where[id(r)] for o in node.outputs for r in readers.get(o.id, ()) if where[id(r)] is not None]
            where[id(node)] = min(read_at) if read_at else stages.count - 1
    return where


@dataclass
class CutGraph:
    """The whole train graph with its sends and receives, and what each stage's graph is made of."""
    graph: Graph                                 # every stage's nodes, in one order; runs in one process
    stage_of: dict[int, int]                     # id(node) -> stage
    weight_stage: dict[str, int]
    outputs: list[dict[str, Value]] = field(default_factory=list)     # each stage's outputs

    @property
    def count(self) -> int:
        return len(self.outputs)

    def stage_graph(self, s: int) -> Graph:
        """Stage ``s``'s graph: its nodes, its weights and their updates, the inputs it reads."""
        g = self.graph
        mine = Graph(g.phase, dict(g.inputs), {k: w for k, w in g.weights.items() if self.weight_stage[k] == s},
                     [n for n in g.nodes if self.stage_of[id(n)] == s], dict(self.outputs[s]),
                     {k: v for k, v in g.updates.items() if self.weight_stage[k] == s}, dict(g.losses))
        mine.precision = g.precision
        keep_live(mine)
        return mine

    def one_process(self) -> Graph:
        """A copy of the whole graph for one process, each receive also reading its send's token:
        passes that move nodes then keep every receive after its send (across stages, nothing
        else orders them)."""
        values: dict[int, Value] = {}
        whole = copy_graph(self.graph, values)
        tokens = {n.attrs["tag"]: n.outputs[0] for n in whole.nodes if n.op == "send"}
        for n in whole.nodes:
            if n.op == "recv":
                n.inputs.append(tokens[n.attrs["tag"]])
        return whole

    def sent(self) -> list[dict]:
        """Every send: from, to, what (its value's type), its bytes (symbolic in the batch)."""
        return [{"from": self.stage_of[id(n)], "to": n.attrs["peer"], "tag": n.attrs["tag"],
                 "type": str(n.inputs[0].type), "bytes": sent_bytes(n), "scope": n.scope}
                for n in self.graph.nodes if n.op == "send"]


def _constant(node: Node) -> bool:
    return not node.inputs and get_op(node.op).pure


def slots(stage: int, stages: int, micro_batches: int, schedule: str) -> list[tuple[int, str]]:
    """The order a stage runs its micro-batches' forward ("F") and backward ("B") passes in.
    GPipe: every forward pass, then every backward pass (the last micro-batch's first, as
    autodiff emits them). 1F1B: as many forward passes as stages after this one, then one
    forward and one backward in turn, then the backward passes left: a stage holds the
    activations of at most K micro-batches at once instead of M."""
    m = micro_batches
    if schedule == "gpipe":
        return [(i, "F") for i in range(m)] + [(i, "B") for i in reversed(range(m))]
    warm = min(stages - stage - 1, m)
    order = [(i, "F") for i in range(warm)]
    f = warm
    for b in range(m):
        if f < m:
            order.append((f, "F"))
            f += 1
        order.append((b, "B"))
    return order


def phases(graph: Graph, micro_of: Mapping[int, int]) -> dict[int, tuple[int, str] | None]:
    """Each node's (micro-batch, "F" or "B"), by id(node): a node of micro-batch m's forward pass
    (``micro_of``) is (m, "F"); a node that reads values of one micro-batch alone is (m, "B");
    one that reads several (a weight's gradients summed, the updates, the objective) is None,
    and so is one that reads none (constants), each then run where its inputs are ready."""
    of_value: dict[int, frozenset[int]] = {}
    phase: dict[int, tuple[int, str] | None] = {}
    for node in graph.nodes:
        if id(node) in micro_of:
            ms = frozenset([micro_of[id(node)]])
            phase[id(node)] = (micro_of[id(node)], "F")
        else:
            ms = frozenset().union(*(of_value.get(v.id, frozenset()) for v in node.inputs))
            phase[id(node)] = (next(iter(ms)), "B") if len(ms) == 1 else None
        of_value.update((o.id, ms) for o in node.outputs)
    return phase


def _stage_order(nodes: list[Node], rank: dict[int, int]) -> list[Node]:
    """``nodes`` (one stage's, in the uncut order) sorted by ``rank`` (a schedule slot) as far as
    their dependences allow: a node runs once its inputs are made, the lowest slot first, and
    in the uncut order within a slot."""
    made_here = {o.id for n in nodes for o in n.outputs}
    waiting = {id(n): sum(1 for v in n.inputs if v.id in made_here) for n in nodes}
    readers: dict[int, list[Node]] = {}
    for n in nodes:
        for v in n.inputs:
            if v.id in made_here:
                readers.setdefault(v.id, []).append(n)
    position = {id(n): i for i, n in enumerate(nodes)}
    ready = [(rank[id(n)], position[id(n)], n) for n in nodes if waiting[id(n)] == 0]
    heapq.heapify(ready)
    out = []
    while ready:
        _, _, n = heapq.heappop(ready)
        out.append(n)
        for o in n.outputs:
            for r in readers.get(o.id, ()):
                waiting[id(r)] -= 1
                if waiting[id(r)] == 0:
                    heapq.heappush(ready, (rank[id(r)], position[id(r)], r))
    assert len(out) == len(nodes), "a stage's nodes read each other in a circle"
    return out


def _interleave(orders: list[list[Node]]) -> list[Node]:
    """The stages' orders merged into one that runs in one process: a receive after its send.
    Each stage's sends never wait, so if no stage can go on the schedule would hang a job."""
    sent: set[int] = set()
    at = [0] * len(orders)
    out: list[Node] = []
    while any(at[s] < len(o) for s, o in enumerate(orders)):
        moved = False
        for s, order in enumerate(orders):
            while at[s] < len(order):
                n = order[at[s]]
                if n.op == "recv" and n.attrs["tag"] not in sent:
                    break
                if n.op == "send":
                    sent.add(n.attrs["tag"])
                out.append(n)
                at[s] += 1
                moved = True
        if not moved:
            raise RuntimeError("the stages' schedule would hang: every stage waits for a receive")
    return out


def cut(graph: Graph, stages: Stages, micro_of: Mapping[int, int] | None = None, micro_batches: int = 1,
        schedule: str = "gpipe") -> CutGraph:
    """``graph`` with a send and a receive for every value that crosses stages (see the module's
    docstring), each stage's nodes ordered by ``schedule`` over the micro-batches that
    ``micro_of`` (id(node) -> micro-batch, for the forward passes' nodes) tells apart; ``graph``
    itself is consumed."""
    k = stages.count
    where = assign(graph, stages)
    phase = phases(graph, micro_of or {})
    by_layer = stages.stage_of_layer()
    weight_stage = {}
    for name, w in graph.weights.items():
        if w.layer not in by_layer:
            raise UserError(f"weight '{name}' belongs to no layer of the train step; it cannot be given a stage")
        weight_stage[name] = by_layer[w.layer]
    owner = {w.value.id: (name, weight_stage[name]) for name, w in graph.weights.items()}
    readers = graph.consumers()
    output_ids = {v.id for v in graph.outputs.values()}
    tags = itertools.count()
    received: dict[tuple[int, int], Value] = {}          # (value id, stage) -> its receive there
    copies: dict[tuple[int, int], Value] = {}            # (constant's value id, stage) -> its copy
    constant_of = {o.id: n for n in graph.nodes if _constant(n) for o in n.outputs}
    per_stage_nodes: list[list[Node]] = [[] for _ in range(k)]
    stage_of: dict[int, int] = {}
    slot_of: dict[int, tuple[int, str] | None] = {}

    def emit(node: Node, s: int, slot: tuple[int, str] | None) -> None:
        per_stage_nodes[s].append(node)
        stage_of[id(node)] = s
        slot_of[id(node)] = slot

    for node in graph.nodes:
        s = where[id(node)]
        if _constant(node) and all(where[id(r)] != s for o in node.outputs for r in readers.get(o.id, ())):
            if node.outputs[0].id not in output_ids:
                continue                          # only copies of it are read (made below)
        inputs = []
        for v in node.inputs:
            if v.id in owner and owner[v.id][1] != s:
                layer = graph.weights[owner[v.id][0]].layer
                raise UserError(f"weight '{owner[v.id][0]}' of layer '{layer}' (stage {owner[v.id][1]}) is read by "
                                f"layer '{node.scope}' in stage {s}: layers that share a weight must be in one stage")
            if v.id in constant_of and where[id(constant_of[v.id])] != s:
                if (v.id, s) not in copies:
                    original = constant_of[v.id]
                    copy = Node(original.op, [], dict(original.attrs), original.scope)
                    copy.outputs = [Value(o.type, copy, o.name) for o in original.outputs]
                    emit(copy, s, None)
                    copies[(v.id, s)] = copy.outputs[0]
                v = copies[(v.id, s)]
            inputs.append(received.get((v.id, s), v))
        node.inputs = inputs
        emit(node, s, phase[id(node)])
        for o in node.outputs:
            # a constant's other readers have copies of it
            to = set() if _constant(node) else {where[id(r)] for r in readers.get(o.id, ())} - {s}
            if o.id in output_ids:
                to |= set(range(k)) - {s}
            for t in sorted(to):
                tag = next(tags)
                send = Node("send", [o], {"peer": t, "tag": tag}, f"{node.scope}.send")
                send.outputs = [Value(TensorType((), "int64"), send)]
                emit(send, s, phase[id(node)])
                recv = Node("recv", [], {"peer": s, "tag": tag, "shape": tuple(o.shape), "dtype": o.dtype},
                            f"{node.scope}.recv")
                recv.outputs = [Value(o.type, recv, o.name)]
                emit(recv, t, phase[id(node)])
                received[(o.id, t)] = recv.outputs[0]
    for name, v in graph.updates.items():
        if v.producer is not None and stage_of[id(v.producer)] != weight_stage[name]:
            raise UserError(f"the update of '{name}' is computed outside its layer's stage")
    orders = []
    last: list[Value | None] = [None] * k                # each stage's last send or receive
    for s in range(k):
        # what belongs to no one micro-batch runs in the earliest slot of what reads it (the
        # gradient's seed times a micro-batch's share), a constant first, and the sums over the
        # micro-batches and the updates last
        rank = {(m, ph): i for i, (m, ph) in enumerate(slots(s, k, micro_batches, schedule))}
        ranks: dict[int, int] = {}
        read_by: dict[int, list[Node]] = {}
        for n in per_stage_nodes[s]:
            for v in n.inputs:
                read_by.setdefault(v.id, []).append(n)
        # an add of a weight's running sum over the micro-batches runs in the backward pass of
        # the newest part it adds, freeing that part there (training/pipeline.py running_sums)
        made_in: dict[int, int] = {}
        for n in per_stage_nodes[s]:
            if slot_of[id(n)] in rank:
                made_in.update((o.id, rank[slot_of[id(n)]]) for o in n.outputs)
            elif n.scope == GRADIENT_SUM and any(v.id in made_in for v in n.inputs):
                ranks[id(n)] = max(made_in[v.id] for v in n.inputs if v.id in made_in)
                made_in.update((o.id, ranks[id(n)]) for o in n.outputs)
        for n in reversed(per_stage_nodes[s]):
            if id(n) in ranks:
                continue
            if slot_of[id(n)] in rank:
                ranks[id(n)] = rank[slot_of[id(n)]]
            elif not n.inputs and n.op != "recv":       # a receive of a sum: last, as its send
                ranks[id(n)] = -1
            else:
                ranks[id(n)] = min((ranks[id(r)] for o in n.outputs for r in read_by.get(o.id, ())),
                                   default=len(rank))
        order = _stage_order(per_stage_nodes[s], ranks)
        for n in order:                   # the sends and receives chained in the stage's order
            if n.op in ("send", "recv"):
                if last[s] is not None:
                    n.inputs.append(last[s])
                last[s] = n.outputs[0]
        orders.append(order)
    nodes = _interleave(orders)
    per_stage = []
    for s in range(k):
        outs = {name: received.get((v.id, s), v) for name, v in graph.outputs.items()}
        if last[s] is not None and last[s].producer.op == "send":
            outs[STAGE_DONE] = last[s]
        per_stage.append(outs)
    whole = Graph(graph.phase, graph.inputs, graph.weights, nodes, dict(graph.outputs), dict(graph.updates),
                  dict(graph.losses))
    whole.precision = graph.precision
    for s in range(k):
        if STAGE_DONE in per_stage[s]:
            whole.outputs[f"{STAGE_DONE}{s}"] = per_stage[s][STAGE_DONE]
    return CutGraph(whole, stage_of, weight_stage, per_stage)
