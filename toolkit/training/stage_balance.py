"""Where a train step is cut into pipeline stages (training/stages.py cuts it there): each
layer's cost, time (measured, training/stage_costs.py, or FLOPs) and memory (``LayerCosts``: its
weights, the solver's slots, the gradients and the activations of the micro-batches its schedule
holds), and the cut whose slowest stage is as fast as it can be under each rank's memory limit
(``partition``: exact, by dynamic programming over the cut points, PipeDream's partitioner)."""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np

from ..errors import UserError
from ..ir.dims import evaluate
from ..ir.graph import Graph
from ..ops.base import get_op


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
    - ``grads``: its trainable weights' bytes: where the gradients are summed as the backward
      passes make them (``sums_as_they_come``: GPipe under a memory limit that needs it,
      training/pipeline.py ``running_sums``), a stage holds the running sum and the gradients
      its backward pass is making, two of them at the peak; otherwise the sum waits for the last
      backward pass, and a gradient of each micro-batch done is live until then, M of them at
      the end;
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
