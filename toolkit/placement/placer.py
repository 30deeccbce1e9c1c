"""Choosing a device for each layer: a list-scheduling placer with memory limits, and the schedule
simulation that predicts a placement's step time by a ``CostModel``.

The simulation (``simulate``): each executor runs its nodes in the order given, as many at once
as it has lanes; an executor is a device of its own, or the host's cores that its devices share
(``Sharing``). In this toolkit's plans ``cpu`` and ``cpu:1`` are core groups
(runtime/device_groups.py): each runs its own nodes, one at a time, beside the other, each
kernel on its share of the cores (the cost model of a placed graph times its kernels so).
With ``TOOLKIT_DEVICE_GROUPS=0`` they take turns, one node at a time, or as many as there are
threads under ``TOOLKIT_CONCURRENT=1``, a lane free as soon as its node ends where the plan's
waves wait for the whole wave. A node starts when a lane of its executor
is free and every input has arrived; a value read on another device
than its own arrives ``transfer_seconds`` after it was made (once per value and destination, as
place_devices moves it), the link running beside the devices' work. Constants are everywhere
at no cost; graph inputs start on the default device, weights with their layer. The predicted
step time is when the last node finishes. Memory per device is counted as a concurrent plan
allocates it (one buffer per value, runtime/concurrency.py): the weights and constants it holds,
every value its nodes make, every value moved onto it. A serial plan reuses buffers and needs
less, so the limit is checked on the safe side.

The placer (``place``) is HEFT's list scheduling with Baechi's memory rule:

- **HEFT** (Topcuoglu et al. 2002) orders the nodes by *upward rank*, the longest path from a
  node to the end with each op at its mean time over the devices and each edge at its mean
  transfer time, so the critical path is placed first; each node goes to the device where it
  finishes earliest. It knows no memory.
- **m-ETF** (Baechi, 2020) repeatedly takes the ready (node, device) pair that can start
  earliest, skipping devices whose memory the node would overflow; **m-SCT** adds a "favourite
  child" from a linear-program relaxation, to keep a node's heaviest successor on its device.

Placement here is by layer (backend/placement.py): a layer's nodes all run on its device, and the
layers that the one-device compile joins into one node (a fused epilogue's ``conv1+relu1``,
GEMMs batched across branches) are one group, since splitting them would lose the fusion. So a
decision is made once per group, at its first node, and the question is which device lets it
*finish* first: HEFT's earliest finish time weighs a device's own speed (a GPU beside the host),
where ETF's earliest start does not. Upward rank places a long chain before the side branches
that could wait. m-SCT's linear program buys little at layer granularity, where a group already
keeps its chain of fused ops together. The memory rule is m-ETF's: a device is a candidate for a
group only while the group's weights and the values it makes fit in the room left.

Guards follow the list schedule. The same list schedule in the graph's order (the slides'
greedy schedule) and every one-device placement that fits are simulated too, each in the order
a plan runs the nodes (the graph's), and a one-layer-group move that lowers the prediction is
taken, a few rounds at most; the best placement found wins. So the placer is never worse by the
model than every layer on one device.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping

from ..backend.devices import Device, parse_device
from ..backend.placement import Placement, layer_of_scope
from ..errors import UserError
from ..ir.graph import Graph, Node, Value
from ..passes.rewrite import CONSTANT_OPS
from ..runtime.device_groups import overlapping_devices
from ..settings import current
from .model import CostModel, value_bytes

IMPROVEMENT_ROUNDS = 3


@dataclass(frozen=True)
class Sharing:
    """Which devices share the cores that run them: ``executor`` {device name: executor name}
    (devices not named have an executor of their own) and ``lanes`` {executor name: how many
    nodes it runs at once} (default 1). The slides' model, every device its own processor, is
    ``Sharing()``; this toolkit's host runtime is ``host_sharing``: ``cpu`` and ``cpu:1`` are two
    core groups, each its own executor (or, with core groups off, two memory arenas on the same
    cores, whose nodes take turns)."""
    executor: Mapping[str, str] = field(default_factory=dict)
    lanes: Mapping[str, int] = field(default_factory=dict)
    # the host's devices draw on one memory: their bytes count together against its limit
    host_memory_shared: bool = False
    # the host's devices run as core groups, each beside the others
    groups: bool = False

    def describe(self) -> str:
        """How the host's devices run, in words (``toolkit compile --place auto`` prints it)."""
        if self.groups:
            return "each host device runs its own nodes on its share of the cores, one node at a time each"
        lanes = self.lanes.get("host", 1)
        return ("the host's devices take turns on its cores, one node at a time" if lanes == 1 else
                f"the host's devices share its {lanes} threads, {lanes} independent nodes at a time")

    def of(self, device: Device) -> tuple[str, int]:
        name = self.executor.get(str(device), str(device))
        return name, self.lanes.get(name, 1)

    def pool(self, device: Device | str) -> str:
        """The memory ``device`` allocates from: the host's for every ``cpu:N`` where shared."""
        device = parse_device(device)
        return "host" if self.host_memory_shared and device.host_memory else str(device)


def host_sharing(devices: Iterable[Device | str], concurrent: bool = False, threads: int = 1,
                 groups: bool | None = None) -> Sharing:
    """How a plan of this toolkit runs ``devices``: with ``groups`` (the ``device_groups``
    setting, on by default; with more than one thread) every host device (``cpu:N``) is an
    executor of its own, one node at a time (``threads`` at a time under ``concurrent``: right
    for a placement on one device, whose plan runs waves, optimistic for one over several,
    whose plan runs groups); without, the host's devices share its cores, one node at a time
    (each op splitting its batch over the threads), or with ``concurrent``
    (``TOOLKIT_CONCURRENT=1``) ``threads`` nodes at a time whatever their device. A GPU is a
    processor of its own."""
    groups = current().device_groups if groups is None else groups
    host = [parse_device(d) for d in devices if parse_device(d).host_memory]
    if groups and threads > 1:
        return Sharing({}, {str(d): threads if concurrent else 1 for d in host}, host_memory_shared=True, groups=True)
    return Sharing({str(d): "host" for d in host}, {"host": threads if concurrent else 1}, host_memory_shared=True)


@dataclass
class Schedule:
    """A placement's predicted run: ``layers`` {layer: device name}, ``seconds`` the step time,
    ``busy`` and ``memory`` per device name (seconds of work, bytes held), ``order`` the nodes in
    the order they were scheduled, ``how`` a few words on where the placement came from."""
    layers: dict[str, str]
    seconds: float
    busy: dict[str, float] = field(default_factory=dict)
    memory: dict[str, int] = field(default_factory=dict)
    how: str = ""

    def fits(self, model: CostModel, sharing: Sharing | None = None) -> bool:
        """Whether every device (every memory ``sharing`` pools) holds what the placement puts on it."""
        sharing = sharing or Sharing()
        used: dict[str, int] = {}
        limits: dict[str, int | None] = {}
        for name, nbytes in self.memory.items():
            pool = sharing.pool(name)
            used[pool] = used.get(pool, 0) + nbytes
            limits[pool] = model.memory_limit(parse_device(name))
        return all(limits[p] is None or used[p] <= limits[p] for p in used)


def layer_groups(graph: Graph) -> dict[str, str]:
    """{layer: its group's first layer}: layers that share a node (``a+b`` scopes) are one group."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for node in graph.nodes:
        if node.op in CONSTANT_OPS or node.op == "transfer":
            continue
        # a fusion of many scopes is named "first+3 more": only the first layer is known
        names = [layer_of_scope(part) for part in node.scope.split("+") if " " not in part]
        first = find(names[0])
        for other in names[1:]:
            root = find(other)
            if root != first:
                parent[root] = first
    return {layer: find(layer) for layer in list(parent)}


def _runs(node: Node) -> bool:
    """Whether the node is work on a device (constants are everywhere; transfers are links)."""
    return node.op not in CONSTANT_OPS and node.op != "transfer"


class _Simulation:
    """The list-scheduling state: when each device is next free, where and when each value is.
    ``layer_device(layer)``: where a layer runs (asked again each time: the placer decides as it
    goes)."""

    def __init__(self, graph: Graph, model: CostModel, bindings: Mapping[str, int], default: Device,
                 layer_device: Callable[[str], Device], sharing: Sharing | None = None):
        self.graph, self.model, self.bindings, self.default = graph, model, bindings, default
        self.layer_device = layer_device
        self.sharing = sharing or Sharing()
        self.weight_layer = {w.value.id: w.layer for w in graph.weights.values()}
        self.free: dict[str, list[float]] = {}      # executor -> when each of its lanes is next free
        self.busy: dict[Device, float] = {}
        self.memory: dict[Device, int] = {}
        self.ready: dict[int, float] = {}           # value id -> when it is made
        self.home: dict[int, Device | None] = {}    # value id -> where it lives (None: everywhere)
        self.arrived: dict[tuple[int, Device], float] = {}
        self.held: set[tuple[int, Device]] = set()

    def _where(self, v: Value) -> tuple[Device | None, float]:
        """Where ``v`` lives and when it is there: a weight with its layer, a graph input on the
        default device, a constant everywhere (None), a node's output where the node ran."""
        if v.id in self.home:
            return self.home[v.id], self.ready[v.id]
        if v.producer is not None and v.producer.op in CONSTANT_OPS:
            return None, 0.0
        layer = self.weight_layer.get(v.id)
        return (self.layer_device(layer) if layer is not None else self.default), 0.0

    def _hold(self, v: Value, device: Device) -> None:
        if (v.id, device) not in self.held:
            self.held.add((v.id, device))
            self.memory[device] = self.memory.get(device, 0) + value_bytes(v, self.bindings)

    def arrival(self, v: Value, device: Device) -> float:
        """When ``v`` can be read on ``device``."""
        home, ready = self._where(v)
        if home is None or home == device:
            return ready
        return self.arrived.get((v.id, device), ready + self.model.transfer_seconds(v, home, device))

    def _lanes(self, device: Device) -> list[float]:
        name, lanes = self.sharing.of(device)
        return self.free.setdefault(name, [0.0] * lanes)

    def finish_on(self, node: Node, device: Device) -> tuple[float, float]:
        """(start, finish) of ``node`` were it run on ``device`` next (on its executor's lane that
        is free first)."""
        start = max([min(self._lanes(device))] + [self.arrival(v, device) for v in node.inputs])
        return start, start + self.model.op_seconds(node, device)

    def run(self, node: Node, device: Device) -> None:
        """Put ``node`` on ``device`` after what that device already runs."""
        start, finish = self.finish_on(node, device)
        for v in node.inputs:
            home, _ready = self._where(v)
            if home is not None and home != device:
                self.arrived.setdefault((v.id, device), self.arrival(v, device))
                self._hold(v, home)
            self._hold(v, device)
        lanes = self._lanes(device)
        lanes[lanes.index(min(lanes))] = finish
        self.busy[device] = self.busy.get(device, 0.0) + (finish - start)
        for v in node.outputs:
            self.home[v.id], self.ready[v.id] = device, finish
            self._hold(v, device)

    def constant_or_link(self, node: Node) -> None:
        """A constant (everywhere at once) or a transfer already in the graph (a link's time)."""
        if node.op in CONSTANT_OPS:
            return
        (v,) = node.inputs
        dst = parse_device(node.attrs["dst"])
        src, ready = self._where(v)
        src = src or dst
        self._hold(v, src)
        (out,) = node.outputs
        self.home[out.id], self.ready[out.id] = dst, ready + self.model.transfer_seconds(v, src, dst)
        self._hold(out, dst)

    def finished(self) -> float:
        return max(list(self.ready.values()) + [t for lanes in self.free.values() for t in lanes] + [0.0])


def _schedule(sim: _Simulation, layers: Mapping[str, Device], how: str) -> Schedule:
    every = set(sim.busy) | set(sim.memory)
    return Schedule({k: str(d) for k, d in layers.items()}, sim.finished(),
                    {str(d): sim.busy.get(d, 0.0) for d in every}, {str(d): sim.memory.get(d, 0) for d in every},
                    how)


def simulate(graph: Graph, model: CostModel, bindings: Mapping[str, int], default: Device | str,
             layers: Mapping[str, Device | str] | None = None, order: Iterable[Node] | None = None,
             how: str = "", sharing: Sharing | None = None) -> Schedule:
    """The predicted run of ``graph`` with each layer on ``layers``' device (else the graph's own
    ``device:`` keys, else ``default``), its nodes taken in ``order`` (default: the graph's, the
    order a plan runs them). A ``transfer`` already in the graph is a link's time. ``sharing``:
    which devices take turns on the same cores (default: none, each device its own)."""
    default = parse_device(default)
    chosen = {k: parse_device(d) for k, d in (layers if layers is not None else graph.layer_devices).items()}

    def layer_device(layer: str) -> Device:
        return chosen.get(layer, default)

    sharing = sharing or Sharing()
    if sharing.groups and len(overlapping_devices(graph, Placement(default, chosen), bindings)) < 2:
        # the plan will not run its devices as core groups (one device, a chain, too little
        # work on the second): they take turns, one node at a time
        sharing = Sharing({d: "host" for d in sharing.lanes}, {"host": 1}, host_memory_shared=True)
    sim = _Simulation(graph, model, bindings, default, layer_device, sharing)
    for node in (graph.nodes if order is None else order):
        if _runs(node):
            sim.run(node, layer_device(layer_of_scope(node.scope)))
        else:
            sim.constant_or_link(node)
    # every layer a node came from runs where the node does (``conv1+relu1``: both on conv1's)
    placed = {layer_of_scope(part): layer_device(layer_of_scope(n.scope))
              for n in graph.nodes if _runs(n) for part in n.scope.split("+") if " " not in part}
    schedule = _schedule(sim, dict(sorted(placed.items())), how)
    schedule.seconds += _group_cost(graph, model, Placement(default, chosen), sim.sharing, bindings)
    return schedule


def _group_cost(graph: Graph, model: CostModel, where: Placement, sharing: Sharing, bindings) -> float:
    """What running the host's devices as core groups costs beyond the nodes (the helpers' start,
    a wait per value crossing devices; ``MeasuredModel.group_seconds``), where the plan will run
    them so: core groups on, and two devices that may run at once (runtime/device_groups.py)."""
    cost = getattr(model, "group_seconds", None)
    if cost is None or not sharing.groups:
        return 0.0
    running = overlapping_devices(graph, where, bindings)
    if len(running) < 2 or not all(d.host_threads for d in running):
        return 0.0
    crossing = {(v.id, where.node(n)) for n in graph.nodes if n.op not in CONSTANT_OPS for v in n.inputs
                if v.producer is not None and v.producer.op not in CONSTANT_OPS
                and where.node(v.producer) != where.node(n)}
    return cost(len(crossing))


def _group_needs(graph: Graph, groups: Mapping[str, str], bindings) -> dict[str, int]:
    """Bytes each group holds wherever it goes: its layers' weights and the values its nodes make."""
    needs: dict[str, int] = {}
    for w in graph.weights.values():
        group = groups.get(w.layer, w.layer)
        needs[group] = needs.get(group, 0) + value_bytes(w.value, bindings)
    for node in graph.nodes:
        if _runs(node):
            group = groups[layer_of_scope(node.scope)]
            needs[group] = needs.get(group, 0) + sum(value_bytes(v, bindings) for v in node.outputs)
    return needs


def _upward_ranks(graph: Graph, model: CostModel, devices: list[Device], bindings) -> dict[int, float]:
    """HEFT's upward rank of each node (by id): its mean time over the devices plus the longest
    path after it, each edge at its mean transfer time over the device pairs."""
    readers: dict[int, list[Node]] = {}
    for node in graph.nodes:
        for v in node.inputs:
            readers.setdefault(v.id, []).append(node)
    pairs = [(a, b) for a in devices for b in devices]
    rank: dict[int, float] = {}
    for node in reversed(graph.nodes):
        own = (sum(model.op_seconds(node, d) for d in devices) / len(devices)) if _runs(node) else 0.0
        after = 0.0
        for v in node.outputs:
            edge = sum(model.transfer_seconds(v, a, b) for a, b in pairs) / len(pairs)
            for reader in readers.get(v.id, []):
                after = max(after, edge + rank[id(reader)])
        rank[id(node)] = own + after
    return rank


def _list_schedule(graph: Graph, model: CostModel, bindings, devices: list[Device], default: Device,
                   groups: Mapping[str, str], needs: Mapping[str, int], ranked: bool, how: str,
                   sharing: Sharing | None = None) -> Schedule:
    """Nodes by upward rank (``ranked``) or in the graph's order, each group's device chosen at its
    first node: where that node finishes earliest among the devices with room for the group."""
    chosen: dict[str, Device] = {}
    pool = (sharing or Sharing()).pool
    room = {pool(d): model.memory_limit(d) for d in devices}

    def layer_device(layer: str) -> Device:
        return chosen.get(groups.get(layer, layer), default)

    sim = _Simulation(graph, model, bindings, default, layer_device, sharing)
    order = _ranked_order(graph, _upward_ranks(graph, model, devices, bindings)) if ranked else list(graph.nodes)
    for node in order:
        if not _runs(node):
            sim.constant_or_link(node)
            continue
        group = groups[layer_of_scope(node.scope)]
        if group not in chosen:
            fits = [d for d in devices if room[pool(d)] is None or needs.get(group, 0) <= room[pool(d)]]
            if not fits:
                left = ", ".join(f"{p} {r}" for p, r in room.items())
                raise UserError(f"layer '{group}' needs {needs.get(group, 0)} bytes and no device has room left "
                                f"(bytes left: {left}): give more devices or a smaller --batch")
            finishes = {}
            for d in fits:
                chosen[group] = d           # its weights live where it would run
                finishes[d] = sim.finish_on(node, d)[1]
            best = min(fits, key=lambda d: (finishes[d], devices.index(d)))
            chosen[group] = best
            if room[pool(best)] is not None:
                room[pool(best)] -= needs.get(group, 0)
        sim.run(node, chosen[group])
    layers = {layer: chosen[group] for layer, group in groups.items() if group in chosen}
    return _schedule(sim, layers, how)


def _ranked_order(graph: Graph, rank: Mapping[int, float]) -> list[Node]:
    """The nodes in decreasing upward rank, each after its producers (ties: the graph's order)."""
    index = {id(n): i for i, n in enumerate(graph.nodes)}
    producers = {id(n): {id(v.producer) for v in n.inputs if v.producer is not None} for n in graph.nodes}
    done: set[int] = set()
    order: list[Node] = []
    waiting = list(graph.nodes)
    while waiting:
        ready = [n for n in waiting if producers[id(n)] <= done]
        pick = max(ready, key=lambda n: (rank[id(n)], -index[id(n)]))
        order.append(pick)
        done.add(id(pick))
        waiting.remove(pick)
    return order


def place(graph: Graph, model: CostModel, bindings: Mapping[str, int], devices: Iterable[Device | str],
          default: Device | str | None = None, sharing: Sharing | None = None) -> Schedule:
    """A device for each layer of ``graph`` among ``devices`` (the first is the default: where
    graph inputs arrive), by HEFT with memory limits, then the guards of the module's docstring;
    ``sharing``: which devices take turns on the same cores. A UserError when no placement fits
    the devices' memory."""
    devices = list(dict.fromkeys(parse_device(d) for d in devices))
    if not devices:
        raise UserError("placement needs at least one device")
    default = parse_device(default) if default is not None else devices[0]
    groups = layer_groups(graph)
    needs = _group_needs(graph, groups, bindings)
    candidates: list[Schedule] = []
    for d in devices:
        one = simulate(graph, model, bindings, default, {layer: d for layer in groups}, how=f"every layer on {d}",
                       sharing=sharing)
        if one.fits(model, sharing):
            candidates.append(one)
    for ranked, how in ((True, "HEFT list schedule"), (False, "earliest finish in graph order")):
        try:
            listed = _list_schedule(graph, model, bindings, devices, default, groups, needs, ranked, how, sharing)
        except UserError:
            if candidates:
                continue
            raise
        # a plan runs its nodes in the graph's order: predict that, not the list's own order
        again = simulate(graph, model, bindings, default, listed.layers, how=how, sharing=sharing)
        if again.fits(model, sharing):
            candidates.append(again)
    if not candidates:
        raise UserError("no placement over " + ", ".join(map(str, devices)) + " fits their memory")
    best = min(candidates, key=lambda s: s.seconds)
    return _improve(graph, model, bindings, devices, default, groups, best, sharing)


def _improve(graph, model, bindings, devices, default, groups, best: Schedule, sharing) -> Schedule:
    """Move one group at a time to another device while that lowers the prediction and fits."""
    members: dict[str, list[str]] = {}
    for layer, group in groups.items():
        members.setdefault(group, []).append(layer)
    for _ in range(IMPROVEMENT_ROUNDS):
        moved = False
        for group, layers in members.items():
            for d in devices:
                if best.layers.get(group) == str(d):
                    continue
                trial = {**best.layers, **{layer: str(d) for layer in layers}}
                s = simulate(graph, model, bindings, default, trial, how=best.how + ", improved by moves",
                             sharing=sharing)
                if s.seconds < best.seconds * (1 - 1e-9) and s.fits(model, sharing):
                    best, moved = s, True
        if not moved:
            break
    return best
