"""A plan's build: the graph resolved for one set of concrete sizes before any memory is
planned. Each value's shape and dtype, the nodes evaluated once now (pure nodes on constants)
and the steps left to run, each step's kernel chosen from the registry, and the storages of what
the graph owns (weights on their layer's device, constants, computed constants, the inputs).

``PlanBuild`` is the one object the later units of a plan read (layout.py plans its memory,
calls.py makes its calls, scheduling.py and capture.py order and record them); ``memory_figures``
makes one without evaluating anything, for the memory figures alone.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from ..backend.devices import CPU, Device
from ..backend.placement import Placement, layer_of_scope
from ..backend.registry import KERNELS, KernelMissing, load_device
from ..codegen.loops import SizeInt
from ..errors import UserError
from ..hostmem import human_bytes, too_big
from ..ir.graph import Graph, Node
from ..ops.base import get_op
from .execution import Execution, kernel_context, kernel_dtype
from .memory import FOREVER, MAX_COUNTED_BYTES, Storage, exact_nbytes, nbytes_of


@dataclass(frozen=True)
class PlanBuild:
    """The graph under ``bindings``: ``shapes``/``dtypes`` by value id, ``steps`` (the nodes run
    on every call, in graph order), ``entries`` (each step's registry entry, by ``id(node)``) and
    ``fixed`` (the storages the memory plan does not place, and the inputs', by value id)."""

    graph: Graph
    bindings: dict[str, int]
    placement: Placement
    devices: list[Device]
    shapes: dict
    dtypes: dict
    steps: list[Node]
    entries: dict
    fixed: dict[int, Storage]

    @property
    def device(self) -> Device:
        """Where the nodes run that no layer places elsewhere."""
        return self.placement.default

    @functools.cached_property
    def sized(self) -> tuple[dict, dict]:
        """(bindings, shapes) with each symbolic dimension a ``SizeInt``: for the builders whose
        kernels read the sizes when they run (codegen/loops.py). Made on first use."""
        bindings = {k: SizeInt.of(k, v) for k, v in self.bindings.items()}
        return bindings, concrete_types(self.graph, bindings)[0]

    def sizes_text(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in sorted(self.bindings.items())) or "these shapes"

    def check_fits(self, nodes: list[Node], nbytes: int, what: str) -> None:
        """A UserError naming the largest value among ``nodes``' outputs (and, for the buffers,
        the graph's inputs), its shape and bytes, when ``nbytes`` of ``what`` cannot be
        allocated here; nothing is allocated before it."""
        why = too_big(nbytes)
        if why is None:
            return
        values = [(f"layer '{layer_of_scope(n.scope)}': its {n.op} output", v) for n in nodes for v in n.outputs]
        if what == "buffers":
            values += [(f"input '{name}'", v) for name, v in self.graph.inputs.items()]
        at_least = "at least " if nbytes >= MAX_COUNTED_BYTES else ""     # a value's count is capped there
        largest = f"the plan needs {at_least}{human_bytes(nbytes)} of {what} at {self.sizes_text()}, {why}"
        if values:
            name, v = max(values, key=lambda item: exact_nbytes(self.shapes[item[1].id], item[1].dtype))
            shape = ", ".join(map(str, self.shapes[v.id]))
            size = human_bytes(exact_nbytes(self.shapes[v.id], v.dtype))
            largest = f"{name} [{shape}] ({v.dtype}) is {size}; {largest}"
        raise UserError(largest)


def concrete_types(graph: Graph, bindings: Mapping[str, int]) -> tuple[dict, dict]:
    """Shape (numbers) and dtype of every value of the graph under ``bindings``."""
    shapes, dtypes = {}, {}
    for v in graph.graph_values():
        shapes[v.id], dtypes[v.id] = v.type.concrete(bindings), v.dtype
    for node in graph.nodes:
        for v in node.outputs:
            shapes[v.id], dtypes[v.id] = v.type.concrete(bindings), v.dtype
    return shapes, dtypes


def split_build_time(graph: Graph) -> tuple[list[Node], list[Node]]:
    """(nodes evaluated once when the plan is built: pure nodes on constants; the steps that run
    on every call), both in graph order. Constant nodes are in neither: the plan shares them."""
    constant_ids: set[int] = set()
    build, steps = [], []
    for node in graph.nodes:
        if node.op == "constant":
            constant_ids.add(node.outputs[0].id)
        elif get_op(node.op).pure and all(v.id in constant_ids for v in node.inputs):
            build.append(node)
            constant_ids.update(o.id for o in node.outputs)
        else:
            steps.append(node)
    return build, steps


def graph_storages(graph: Graph, shapes, weights: Mapping[str, np.ndarray] | None, device: Device,
                   keep_inputs: bool = False) -> dict[int, Storage]:
    """Storages of what the graph owns: weights (their arrays; a placeholder when ``weights`` is
    None) and constants, which the memory plan never places, and the inputs, which it does
    (``keep_inputs``: alive to the end, so no kernel writes over them in place)."""
    fixed: dict[int, Storage] = {}
    for name, w in graph.weights.items():
        arr = weights[name] if weights is not None else np.empty(0, w.value.dtype)
        fixed[w.value.id] = Storage(arr.nbytes, FOREVER, external=arr)
    for name, upd in graph.updates.items():
        fixed[graph.weights[name].value.id].update_of = upd.id
    for v in graph.inputs.values():
        fixed[v.id] = Storage(max(int(np.prod(shapes[v.id])) * np.dtype(v.dtype).itemsize, 1),
                              FOREVER if keep_inputs else -1, device=device)
    for node in graph.nodes:
        if node.op == "constant":             # shared with the graph (read-only), never copied
            arr = node.attrs["value"]
            fixed[node.outputs[0].id] = Storage(arr.nbytes, FOREVER, external=arr)
    return fixed


def lookup_kernel(placement: Placement, node: Node):
    """The registry entry for a node on its device (kernels are keyed by the device's kind)."""
    return KERNELS.lookup(node.op, placement.node(node), kernel_dtype(node))


def check_placed(graph: Graph, placement: Placement, steps: list[Node]) -> None:
    """Every node reads values of its own device (or constants): the placement pass ran. (Values
    in the host's memory can be read from any host device, so a read between two cpu:N works.)"""
    weights_of = {w.value.id: w for w in graph.weights.values()}
    for node in steps:
        if node.op == "transfer":
            continue
        here = placement.node(node)
        for v in node.inputs:
            p = v.producer
            if p is None:
                home = placement.weight(weights_of[v.id]) if v.id in weights_of else placement.default
            elif p.op in ("constant", "scalar"):
                continue
            else:
                home = placement.node(p)
            if home != here and not (home.host_memory and here.host_memory):
                raise KernelMissing(f"node {node.op} of '{node.scope}' on {here} reads a value on {home}; "
                                    "the place_devices pass inserts the transfer (it cannot be disabled)")


def build_plan(graph: Graph, bindings: Mapping[str, int], weights: Mapping[str, np.ndarray] | None,
               placement: Placement, execution: Execution | None = None,
               keep_inputs: bool = False) -> PlanBuild:
    """The build of ``graph`` under ``bindings``: kernels chosen, and with an ``execution``, the
    build-time nodes evaluated and the weights placed on their devices. Without one (the memory
    figures alone), nothing is loaded or computed: computed constants and missing ``weights``
    get placeholder storages of no bytes, which the memory plan never places anyway."""
    bindings = dict(bindings)
    devices = placement.devices(graph)
    if execution is not None:
        load_device(CPU)                      # constants on any device are computed on the host
        for d in devices:
            load_device(d)
    shapes, dtypes = concrete_types(graph, bindings)
    fixed = graph_storages(graph, shapes, weights, placement.default, keep_inputs)
    build_nodes, steps = split_build_time(graph)
    if execution is not None:
        check_placed(graph, placement, steps)
    entries = {id(n): lookup_kernel(placement, n) for n in steps}
    built = PlanBuild(graph, bindings, placement, devices, shapes, dtypes, steps, entries, fixed)
    if execution is None:
        for node in build_nodes:
            for v in node.outputs:
                fixed[v.id] = Storage(nbytes_of(shapes[v.id], dtypes[v.id]), FOREVER, external=np.empty(0))
        return built
    _evaluate_at_build(built, build_nodes, execution)
    _place_weights(built)
    return built


def _evaluate_at_build(built: PlanBuild, nodes: list[Node], execution: Execution) -> None:
    """Pure nodes on constants, computed once now, on the host, never in the loop."""
    shapes, dtypes, fixed = built.shapes, built.dtypes, built.fixed
    built.check_fits(nodes, sum(nbytes_of(shapes[v.id], dtypes[v.id]) for n in nodes for v in n.outputs),
                     "constants computed when the plan is built")
    for node in nodes:
        ins = [fixed[v.id].view(shapes[v.id], dtypes[v.id]) for v in node.inputs]
        outs = [np.empty(shapes[v.id], dtypes[v.id]) for v in node.outputs]
        entry = KERNELS.lookup(node.op, CPU, kernel_dtype(node))
        entry.factory(kernel_context(node, shapes, built.bindings, CPU, execution))(ins, outs)
        for v, arr in zip(node.outputs, outs):
            fixed[v.id] = Storage(arr.nbytes, FOREVER, external=arr)


def _place_weights(built: PlanBuild) -> None:
    """Weights live with their layer's device; host arrays given for another device are
    copied there (a trainer passes device arrays, so that its updates land in its store)."""
    for w in built.graph.weights.values():
        where = built.placement.weight(w)
        if not where.host_memory:
            built.fixed[w.value.id].external = where.to_device(built.fixed[w.value.id].external)
