"""The three schedules of an Inception block on several devices (TensorFlow's slides: serial,
parallel, greedy) and the placer's choice, as placements of a net that one simulation predicts.

- **serial**: every layer on one device, run in the graph's order;
- **parallel**: each branch of a block on its own device, in turn over the devices given (four
  towers over two devices: the first and third on the first device, the others on the second);
  what is outside the blocks stays on the first device;
- **greedy**: each layer, in the graph's order, to the device where its first node finishes
  first (earliest finish time, no look-ahead);
- **auto** (``auto``): the placer (placer.py, HEFT with memory limits) on the one-device
  graph and on that graph with the branches' GEMMs left unbatched, the parallel placement and
  every layer on the default device as more candidates; the fastest prediction that fits wins,
  a placement over several core groups only where it is ``GROUPS_MARGIN`` faster.
  Where the host's devices run as core groups, the placer weighs each node at its time on a
  group's share of the cores (``share_model``), and each candidate is judged by the model of the
  graph it compiles to, measured as its plan runs (a one-device plan's kernels on every core).

Each placement is predicted on the graph the compiler makes of it (``placed_graph``: the net's
layers given those devices, then the whole pass pipeline, transfers included), so fusions a
placement prevents or allows are counted as they run. A block's branches are found on the
lowered graph, where each layer is still its own: a layer (or a graph input) read by several
layers opens a block, and each of those readers starts a branch that goes on while each layer
has one reader and the next has one producer.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

from ..backend.devices import Device, parse_device
from ..backend.placement import layer_of_scope
from ..compile import optimize, train_graph
from ..errors import UserError
from ..frontend import Net
from ..ir.graph import Graph
from ..passes.rewrite import CONSTANT_OPS
from ..runtime.device_groups import group_threads
from ..runtime.parallel import default_threads
from .cost import MeasuredModel, measured_model
from .model import CostModel
from .placer import Schedule, Sharing, layer_groups, place, simulate


def net_graph(net: Net, phase: str, weights: Mapping | None = None) -> Graph:
    """The lowered graph of ``phase`` (the train step with its backward pass and updates)."""
    return train_graph(net) if phase == "train" else net.graph(phase)


def placed_graph(net: Net, phase: str, layers: Mapping[str, Device | str], device: Device | str,
                 weights: Mapping | None = None, disable: tuple[str, ...] = ()) -> Graph:
    """The optimised graph of ``phase`` with each layer on ``layers``' device (replacing the net
    file's ``device:`` keys), the others on ``device``; ``weights`` frozen in (infer and test);
    the passes ``disable`` names switched off."""
    graph = net_graph(net, phase)
    graph.layer_devices = {k: str(parse_device(d)) for k, d in layers.items()}
    frozen = dict(weights) if weights is not None and phase != "train" else None
    return optimize(graph, disable, weights=frozen, device=device, consume_weights=frozen is not None)


# A placement over several host devices (core groups) must be predicted this much faster than
# the others to be chosen: its threads hand work to each other, and on a busy machine a handoff
# can wait for a time slice, so its measured time spreads wider than a one-device plan's (the
# Inception block's grouped placements measured 10-20% from their prediction where one device
# stayed within 5-10%, on the loaded 2-core EPYC of docs/explanations/devices.md)
GROUPS_MARGIN = 0.05

# the pass that joins layers of parallel branches into one node (their GEMMs batched): the placer
# looks at the graph with it and without it, since a placement may gain more by splitting the
# branches over devices than the batching saves
JOINS_BRANCHES = "batch_gemms"


def auto(net: Net, phase: str, model: CostModel, bindings: Mapping[str, int], devices: list[Device | str],
         sharing: Sharing | None = None, weights: Mapping | None = None,
         disable: tuple[str, ...] = (), default: Device | str | None = None,
         model_of: Callable[[Graph], CostModel] | None = None) -> Schedule:
    """The placer's choice for ``net``: placer.place on the one-device graph, with and without its
    branches' GEMMs batched, and the block-parallel placement (each block's branches dealt over
    the devices: a list scheduler decides layer by layer and cannot see that two branches on one
    device batch their GEMMs again); each predicted on the graph it compiles to, the fastest
    that fits kept. ``default``: where the inputs arrive and unplaced layers run (default: the
    first device). ``model_of``: the model to ask about a graph (a measured model measures the
    kernels it has not timed yet: those of each candidate's own graph), default ``model``."""
    ask = model_of or (lambda graph: model)
    devices = [parse_device(d) for d in devices]
    default = parse_device(default) if default is not None else devices[0]
    # every layer on one device is a candidate too, judged like the others: a placer weighing
    # nodes at a core group's share could otherwise never compare it at every core's speed
    home = default if default in devices else devices[0]
    candidates: list[tuple[dict[str, str], str]] = [(serial(net_graph(net, phase), home), f"every layer on {home}")]
    views = [disable] + ([disable + (JOINS_BRANCHES,)] if JOINS_BRANCHES not in disable else [])
    for view in views:
        seen = placed_graph(net, phase, {}, default, weights, view)
        chosen = place(seen, share_model(seen, ask(seen), bindings, devices, default, sharing), bindings, devices,
                       default, sharing)
        candidates.append((chosen.layers, chosen.how + ("" if view == disable else f", branches apart "
                                                                                     f"({JOINS_BRANCHES} off)")))
    if len(devices) > 1 and blocks(net_graph(net, phase)):
        candidates.append((parallel(net_graph(net, phase), devices), "each block's branches dealt over the devices"))
    best: Schedule | None = None
    best_score = 0.0
    for layers, how in candidates:
        graph = placed_graph(net, phase, layers, default, weights, disable)
        judge = ask(graph)
        predicted = simulate(graph, judge, bindings, default, sharing=sharing, how=how)
        score = predicted.seconds
        if sharing is not None and sharing.groups and len({d for d, busy in predicted.busy.items() if busy > 0}) > 1:
            score *= 1 + GROUPS_MARGIN
        if predicted.fits(judge, sharing) and (best is None or score < best_score * (1 - 1e-9)):
            best, best_score = predicted, score
    if best is None:
        raise UserError("no placement over " + ", ".join(map(str, devices)) + " fits their memory")
    return best


def share_model(graph: Graph, model: CostModel, bindings: Mapping[str, int], devices: list[Device],
                default: Device, sharing: Sharing | None) -> CostModel:
    """The model a placer weighs ``graph``'s nodes by: where the host's devices run as core groups
    and ``model`` is measured on this machine, the same graph measured with each kernel on one
    group's share of the cores (the plan's threads over the host devices), since a placement
    that uses several devices runs each kernel so; else ``model``."""
    host = [d for d in devices if d.host_memory]
    if sharing is None or not sharing.groups or len(host) < 2 or not isinstance(model, MeasuredModel):
        return model
    share = group_threads(default_threads(), len(host))
    if share == model.threads:
        return model
    return measured_model(graph, bindings, default, threads=share)


def _forward_layers(graph: Graph) -> tuple[list[str], dict[str, set[str]], dict[str, set[str]]]:
    """The forward layers in order, and who reads whom among them (a graph input is ``<name>``)."""
    order: list[str] = []
    made_by: dict[int, str] = {v.id: f"<{name}>" for name, v in graph.inputs.items()}
    readers: dict[str, set[str]] = {}
    producers: dict[str, set[str]] = {}
    for node in graph.nodes:
        if node.op in CONSTANT_OPS or "." in node.scope:
            continue                         # a gradient, an update: not the forward structure
        layer = layer_of_scope(node.scope)
        if layer not in producers:
            order.append(layer)
            producers[layer] = set()
        for v in node.inputs:
            source = made_by.get(v.id)
            if source is not None and source != layer:
                producers[layer].add(source)
                readers.setdefault(source, set()).add(layer)
        for v in node.outputs:
            made_by[v.id] = layer
    return order, readers, producers


def blocks(graph: Graph) -> list[list[list[str]]]:
    """The graph's blocks of parallel branches, each branch a list of layers (module docstring)."""
    order, readers, producers = _forward_layers(graph)
    position = {layer: i for i, layer in enumerate(order)}
    found = []
    for source in [s for s in readers if s.startswith("<")] + order:
        starts = sorted(readers.get(source, ()), key=position.__getitem__)
        if len(starts) < 2:
            continue
        branches = []
        for first in starts:
            branch, layer = [first], first
            while len(readers.get(layer, ())) == 1:
                (nxt,) = readers[layer]
                if len(producers[nxt]) != 1:
                    break
                branch.append(nxt)
                layer = nxt
            branches.append(branch)
        found.append(branches)
    return found


def serial(graph: Graph, device: Device | str) -> dict[str, str]:
    """Every layer on ``device``."""
    return {layer_of_scope(n.scope): str(parse_device(device)) for n in graph.nodes if n.op not in CONSTANT_OPS}


def parallel(graph: Graph, devices: Iterable[Device | str]) -> dict[str, str]:
    """Each branch of each block on its own device, in turn; the rest on the first device."""
    names = [str(parse_device(d)) for d in devices]
    layers = serial(graph, names[0])
    for branches in blocks(graph):
        for k, branch in enumerate(branches):
            for layer in branch:
                layers[layer] = names[k % len(names)]
    return layers


def greedy(graph: Graph, model: CostModel, bindings: Mapping[str, int], devices: Iterable[Device | str],
           sharing: Sharing | None = None) -> dict[str, str]:
    """Each layer, in the graph's order, to the device where its first node finishes first."""
    from .placer import _group_needs, _list_schedule
    devices = [parse_device(d) for d in devices]
    groups = layer_groups(graph)
    needs = _group_needs(graph, groups, bindings)
    return _list_schedule(graph, model, bindings, devices, devices[0], groups, needs, False, "greedy",
                          sharing).layers


@dataclass
class Row:
    """One placement compared: its name, its {layer: device}, its predicted run."""
    name: str
    layers: dict[str, str]
    predicted: Schedule


def compare(net: Net, phase: str, model: CostModel | None, bindings: Mapping[str, int], devices: list[Device | str],
            sharing: Sharing | None = None, manual: Mapping[str, Mapping[str, str]] | None = None,
            weights: Mapping | None = None, model_of: Callable[[Graph], CostModel] | None = None) -> list[Row]:
    """Every layer on each device, the three schedules, the placer's choice and ``manual``
    placements {name: {layer: device}}, each predicted on the graph its placement compiles to
    (by ``model_of(graph)`` where given, else ``model``)."""
    ask = model_of or (lambda graph: model)
    devices = [parse_device(d) for d in devices]
    default = devices[0]
    lowered = net_graph(net, phase)
    one_device = placed_graph(net, phase, {}, default, weights)
    candidates: dict[str, dict[str, str]] = {f"serial on {d}": serial(lowered, d) for d in devices}
    candidates["parallel"] = parallel(lowered, devices)
    candidates["greedy"] = greedy(one_device, share_model(one_device, ask(one_device), bindings, devices, default,
                                                          sharing), bindings, devices, sharing)
    candidates["auto"] = auto(net, phase, model, bindings, devices, sharing, weights, model_of=model_of).layers
    candidates.update({k: dict(v) for k, v in (manual or {}).items()})
    rows = []
    for name, layers in candidates.items():
        graph = placed_graph(net, phase, layers, default, weights)
        rows.append(Row(name, layers, simulate(graph, ask(graph), bindings, default, sharing=sharing, how=name)))
    return rows
