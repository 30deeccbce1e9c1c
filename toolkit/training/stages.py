"""A train graph cut into pipeline stages, one per rank (docs/spec.md section 8, pipeline).

The stages are runs of consecutive layers in the net's order, chosen by
training/stage_balance.py (balanced by measured time or FLOPs under each rank's memory). Every
node of the graph then belongs to a stage (``assign``): a layer's nodes, its gradient's (scope
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
from typing import Mapping

from ..errors import UserError
from ..ir.graph import Graph, Node, TensorType, Value, copy_graph
from ..ir.live import keep_live
from ..ops.base import get_op
from ..ops.p2p import sent_bytes
from .stage_balance import Stages, layer_of

# the output that keeps a stage's last send alive (dead-code elimination keeps only what an
# output or an update needs)
STAGE_DONE = "@stage_done"
# the scope of the adds that sum a weight's gradients over the micro-batches as they come
GRADIENT_SUM = "pipeline.gradient_sum"


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
