"""A compiled plan: the graph resolved for one set of concrete input shapes into a flat list of
kernel calls on preallocated buffers. Pure nodes on constants are evaluated once at build time.

``Plan.run`` copies inputs in, runs the calls, applies weight updates and returns views of the
output buffers, valid until the next run.
"""
from __future__ import annotations

import contextlib
import functools
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np

from ..backend.devices import CPU, Device
from ..backend.placement import Placement, layer_of_scope
from ..backend.registry import KERNELS, KernelContext, KernelMissing, load_device
from ..codegen import toolchain
from ..codegen.loops import SizeInt
from ..codegen.native import Linked, NativeCall, units as native_units, with_sizes
from ..envswitch import switch
from ..errors import UserError, notice
from ..hostmem import human_bytes, too_big
from ..ir.binding import bind_attrs
from ..ir.graph import FLOAT_DTYPES, Graph, Node
from ..ops.base import get_op
from .capture import CapturedRun, capture_blocker
from .concurrency import concurrent_default, conflicts, wave_calls, waves
from .memory import FOREVER, MAX_COUNTED_BYTES, Storage, exact_nbytes, nbytes_of, plan_memory
from .parallel import Blas, Workers, default_threads, split_kind, worth_splitting
from .streams import StreamSchedule, assign_streams, stream_calls
from .team import team_for


@dataclass
class RuntimeState:
    """Per-executor mutable state that kernels may use: the random generator of impure ops, and
    scratch memory that kernels borrow for the length of one call (fused programs' temporaries).

    Scratch is shared by every kernel of the plans that share this state, one set per share of a
    split op (``KernelContext.share``): kernels of one share run one after another, so they may
    all use the same few buffers, which then stay in cache. (Plans sharing a state must not run
    at the same time; they do not: a session or a trainer runs one plan at a time.)"""

    rng: np.random.Generator
    scratch: dict = field(default_factory=dict)
    # control-flow bodies' plans, by (body, its shapes, device): a loop body's shapes do not
    # depend on the trip count, so plans of one graph for several sequence lengths share them
    body_plans: dict = field(default_factory=dict)

    def scratch_array(self, key: tuple, shape: tuple[int, ...], dtype) -> np.ndarray:
        """A scratch array for ``key`` (share, slot), grown when a kernel needs more."""
        dtype = np.dtype(dtype)
        need = max(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize, 1)
        buf = self.scratch.get(key)
        if buf is None or buf.nbytes < need:
            buf = np.empty(need, np.uint8)
            self.scratch[key] = buf
        return buf[:int(np.prod(shape, dtype=np.int64)) * dtype.itemsize].view(dtype).reshape(shape)


def view_offset(node: Node, shapes, dtypes, bindings) -> int | None:
    """Where output 0 starts in input 0's memory, in bytes, when it is a view of it: a reshape
    (row-major relabelling), or a slice that is one contiguous run (every axis before the sliced
    one has length 1, as the rows of a matrix or the columns of a one-row one); else None."""
    if get_op(node.op).alias:
        return 0
    if node.op == "slice":
        shape = shapes[node.inputs[0].id]
        axis = node.attrs["axis"] % len(shape)
        if all(d == 1 for d in shape[:axis]):
            inner = int(np.prod(shape[axis + 1:], dtype=np.int64))
            start = bind_attrs(node.attrs["start"], bindings)
            return int(start) * inner * np.dtype(dtypes[node.inputs[0].id]).itemsize
    return None


def gather_offsets(node: Node, shapes, dtypes) -> tuple[list[int], int | None] | None:
    """For a concatenation that memory.py may gather in place: where each input's first image
    starts in the output, in bytes, and None where every axis before the joined one has length 1
    (each input one contiguous run: batch 1 along channels), else the bytes from one image of
    the output to the next (only the batch axis before the joined one: each input's images lie
    that far apart). None for anything else."""
    if node.op != "concat":
        return None
    out = node.outputs[0]
    shape = shapes[out.id]
    axis = node.attrs["axis"] % len(shape)
    if any(dtypes[v.id] != dtypes[out.id] for v in node.inputs):
        return None
    item = np.dtype(dtypes[out.id]).itemsize
    inner = int(np.prod(shape[axis + 1:], dtype=np.int64)) * item
    offsets, at = [], 0
    for v in node.inputs:
        offsets.append(at * inner)
        at += shapes[v.id][axis]
    if all(d == 1 for d in shape[:axis]):
        return offsets, None
    if all(d == 1 for d in shape[1:axis]):
        return offsets, int(np.prod(shape[1:], dtype=np.int64)) * item
    return None


# ops whose native kernels write an output whose images are strided (blocked.output_image_stride)
STRIDED_WRITERS = ("conv2d_blocked", "to_blocked")


def writes_strided(node: Node, placement: Placement) -> bool:
    """Whether ``node``'s kernel writes a strided view of images (a gathered concatenation's part
    at a batch over 1): the blocked convolutions on the host, alone or with their store's
    epilogue, and the reorder into the blocked layout. Should the native kernel not be built,
    the plan's numpy call writes a contiguous copy and copies it into the view
    (Plan._python_call)."""
    head = node.attrs.get("head") if node.op == "fused_epilogue" else node.op
    return head in STRIDED_WRITERS and placement.node(node).host_memory


def _into_strided(fn, ins, outs, temps, strided):
    """Run ``fn`` on ``temps`` (``outs`` with contiguous stand-ins, made once, for the strided
    outputs at positions ``strided``), then copy the stand-ins into their views."""
    fn(ins, temps)
    for k in strided:
        np.copyto(outs[k], temps[k])


def kernel_dtype(node: Node) -> str:
    for v in list(node.inputs) + node.outputs:
        if v.dtype in FLOAT_DTYPES:
            return v.dtype
    return node.outputs[0].dtype


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


def kept_values(graph: Graph, out_names: list[str]) -> set[int]:
    return {graph.outputs[n].id for n in out_names} | {v.id for v in graph.updates.values()}


def memory_figures(graph: Graph, bindings: Mapping[str, int], device: Device | str = CPU,
                   reuse_memory: bool = True) -> dict[str, int]:
    """The memory plan of ``graph`` under ``bindings`` as a Plan would make it (peak, naive and
    lower-bound bytes), computed without building kernels or allocating the arena."""
    placement = Placement.of(graph, device)
    shapes, dtypes = concrete_types(graph, bindings)
    fixed = graph_storages(graph, shapes, None, placement.default)
    build, steps = split_build_time(graph)
    for node in build:
        for v in node.outputs:
            fixed[v.id] = Storage(nbytes_of(shapes[v.id], dtypes[v.id]), FOREVER, external=np.empty(0))
    entries = {id(n): lookup_kernel(placement, n) for n in steps}
    memory = plan_memory(steps, shapes, dtypes, fixed, kept_values(graph, list(graph.outputs)),
                         inplace_pairs=lambda n: entries[id(n)].inplace_pairs(n),
                         view_offset=lambda n: view_offset(n, shapes, dtypes, bindings),
                         reuse=reuse_memory, allocate=False, device_of=placement.node,
                         gather_offsets=lambda n: gather_offsets(n, shapes, dtypes),
                         writes_strided=lambda n: writes_strided(n, placement))
    return memory.summary()


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


def _new_arena(device, nbytes: int):
    return device.empty(nbytes)


# "0" compiles every size into the kernels, as before run-time sizes (a plan per length then
# compiles its own library): for measuring what they cost, and a way back should one misbehave
RUN_TIME_SIZES_ENV = "TOOLKIT_RUN_TIME_SIZES"


def _sizes(bindings: Mapping[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(bindings.items())) or "these shapes"


class Plan:
    def __init__(self, graph: Graph, bindings: Mapping[str, int], weights: Mapping[str, np.ndarray],
                 device: Device | str = CPU, runtime: RuntimeState | None = None, outputs: list[str] | None = None,
                 threads: int | None = None, native: bool | None = None, concurrent: bool | None = None,
                 keep_inputs: bool = False, allocate: Callable | None = None, reuse_memory: bool = True,
                 capture: bool | None = None, run_time_sizes: bool | None = None):
        """``device``: where the nodes run that no layer places elsewhere. ``keep_inputs``: no
        kernel overwrites an input buffer, so a caller may fill some inputs once and run many
        times (a loop body's invariants). ``allocate(device, nbytes)``: where each device's arena
        comes from (default: a new buffer); plans that never run at the same time may share one
        (InferSession's buckets). ``reuse_memory``: the memory planner's buffer reuse
        (``--disable plan_memory`` turns it off). ``capture``: record a GPU plan's run as a CUDA
        graph after its first run (capture.py; default on where it can be, False for a body
        that runs inside another plan). ``run_time_sizes``: the kernels of builders registered for it
        read the symbolic dimensions when they run rather than as compiled-in numbers, so the
        plans of other lengths reuse the compiled library (False: every size compiled in; default:
        on unless ``TOOLKIT_RUN_TIME_SIZES=0``)."""
        self.graph = graph
        self.bindings = dict(bindings)
        if run_time_sizes is None:
            run_time_sizes = switch(RUN_TIME_SIZES_ENV)
        self.run_time_sizes = run_time_sizes and bool(self.bindings)
        self._sized_shapes = self._sized_bindings = None
        self.placement = Placement.of(graph, device)
        self.device = self.placement.default
        self.devices = self.placement.devices(graph)
        load_device(CPU)                          # constants on any device are computed on the host
        for d in self.devices:
            load_device(d)
        self.threads = default_threads() if threads is None else threads
        self._team = team_for(self.threads)       # fewer threads while the cores are taken (team.py)
        self._linked: list[Linked] = []           # one per compiled unit
        self.runtime = runtime or RuntimeState(np.random.default_rng(0))
        self.reuse_memory = reuse_memory
        self._choose_execution(concurrent)
        self.shapes, self.dtypes = concrete_types(graph, self.bindings)
        fixed = graph_storages(graph, self.shapes, weights, self.device, keep_inputs)
        build, steps = split_build_time(graph)
        check_placed(graph, self.placement, steps)
        self.entries = {id(n): lookup_kernel(self.placement, n) for n in steps}
        self._evaluate_at_build(build, fixed)
        self._place_weights(fixed)
        out_names = list(graph.outputs) if outputs is None else outputs
        self.memory = self._plan_memory(steps, fixed, out_names, allocate)
        self._on_device: dict[tuple, object] = {}
        self._bind_inputs()
        self._make_calls(steps, native)
        self._schedule()
        self._bind_outputs(out_names, fixed)
        self._choose_capture(capture)

    # -- build phases, in order ---------------------------------------------------------------
    def _choose_execution(self, concurrent: bool | None) -> None:
        """Branches side by side (concurrency.py; on CUDA streams on a GPU, streams.py) or each
        op split across the cores (parallel.py)."""
        wanted = concurrent_default() if concurrent is None else concurrent
        on_host = all(d.host_threads for d in self.devices)
        self.on_streams = bool(wanted and all(d.streams for d in self.devices))
        self.concurrent = bool(wanted and on_host and self.threads > 1) or self.on_streams
        self.schedule: StreamSchedule | None = None
        self._share_of: dict[int, int] = {}

    def _evaluate_at_build(self, build: list[Node], fixed: dict[int, Storage]) -> None:
        """Pure nodes on constants, computed once now, on the host, never in the loop."""
        shapes, dtypes = self.shapes, self.dtypes
        self._check_fits(build, sum(nbytes_of(shapes[v.id], dtypes[v.id]) for n in build for v in n.outputs),
                         "constants computed when the plan is built")
        for node in build:
            ins = [fixed[v.id].view(shapes[v.id], dtypes[v.id]) for v in node.inputs]
            outs = [np.empty(shapes[v.id], dtypes[v.id]) for v in node.outputs]
            entry = KERNELS.lookup(node.op, CPU, kernel_dtype(node))
            entry.factory(self._context(node, CPU))(ins, outs)
            for v, arr in zip(node.outputs, outs):
                fixed[v.id] = Storage(arr.nbytes, FOREVER, external=arr)

    def _place_weights(self, fixed: dict[int, Storage]) -> None:
        """Weights live with their layer's device; host arrays given for another device are
        copied there (a trainer passes device arrays, so that its updates land in its store)."""
        for w in self.graph.weights.values():
            where = self.placement.weight(w)
            if not where.host_memory:
                fixed[w.value.id].external = where.to_device(fixed[w.value.id].external)

    def _plan_memory(self, steps: list[Node], fixed, out_names: list[str], allocate: Callable | None):
        return plan_memory(
            steps, self.shapes, self.dtypes, fixed, kept_values(self.graph, out_names),
            inplace_pairs=lambda n: self.entries[id(n)].inplace_pairs(n),
            view_offset=lambda n: view_offset(n, self.shapes, self.dtypes, self.bindings),
            # concurrent waves need values of different branches apart: a buffer handed from
            # one branch to another would order them (concurrency.py)
            reuse=self.reuse_memory and not self.concurrent,
            allocate=lambda where, nbytes: self._arena(allocate or _new_arena, where or self.device, nbytes, steps),
            device_of=self.placement.node,
            gather_offsets=lambda n: gather_offsets(n, self.shapes, self.dtypes),
            writes_strided=lambda n: writes_strided(n, self.placement))

    def _arena(self, allocate: Callable, where: Device, nbytes: int, steps: list[Node]):
        """A device's arena of ``nbytes``, after checking the host can hold it (a GPU's own
        allocator says when it cannot)."""
        if where.host_memory:
            self._check_fits(steps, nbytes, "buffers")
        return allocate(where, nbytes)

    def _check_fits(self, nodes: list[Node], nbytes: int, what: str) -> None:
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
        largest = f"the plan needs {at_least}{human_bytes(nbytes)} of {what} at {_sizes(self.bindings)}, {why}"
        if values:
            name, v = max(values, key=lambda item: exact_nbytes(self.shapes[item[1].id], item[1].dtype))
            shape = ", ".join(map(str, self.shapes[v.id]))
            size = human_bytes(exact_nbytes(self.shapes[v.id], v.dtype))
            largest = f"{name} [{shape}] ({v.dtype}) is {size}; {largest}"
        raise UserError(largest)

    def _view(self, v, reader: Node | None = None):
        """v's array; a host constant read on another device is copied there once."""
        memory = self.memory
        st = memory.storage_of[v.id]
        arr = st.view(self.shapes[v.id], self.dtypes[v.id], memory.offset_of.get(v.id, 0),
                      memory.image_stride_of.get(v.id))
        where = self.placement.node(reader) if reader is not None else None
        if where is not None and not where.host_memory and isinstance(arr, np.ndarray):
            key = (v.id, where)
            if key not in self._on_device:
                self._on_device[key] = where.to_device(arr)
            arr = self._on_device[key]
        return arr

    def _bind_inputs(self) -> None:
        self.input_views = {name: self._view(v) for name, v in self.graph.inputs.items()}
        self.host_inputs = [(k, b) for k, b in self.input_views.items() if isinstance(b, np.ndarray)]
        self.device_inputs = [(k, b, self.device.uploader(b)) for k, b in self.input_views.items()
                              if not isinstance(b, np.ndarray)]

    def _make_calls(self, steps: list[Node], native: bool | None) -> None:
        """One call per step that is not a view: a generated native kernel where a builder
        takes the node (all of them linked as one unit), else the registry's numpy kernel."""
        self.workers = Workers.shared(self.threads) if self.threads > 1 else None
        split_workers = None if self.concurrent else self.workers
        native_on = native if native is not None else toolchain.available()
        self.calls = []
        self.steps = []
        self.before_run: list[Callable[[], None]] = []
        self._call_blockers: list[tuple[Node, str | None]] = []
        self.impls: list[str] = []                # "native" or "numpy", per step
        self.split_steps = 0
        natives: list[tuple[int, NativeCall, list, list]] = []
        python: list[tuple[int, Node, list, list]] = []
        step_arrays: list[tuple[list, list]] = []
        for node in steps:
            if id(node) in self.memory.views:
                continue                          # a view: nothing to run
            ins, outs = [self._view(v, node) for v in node.inputs], [self._view(v) for v in node.outputs]
            builder = KERNELS.native(node.op, self.placement.node(node)) if native_on else None
            with self._building(node):
                native_call = None
                if builder is not None:
                    sized = self.run_time_sizes and KERNELS.native_takes_sizes(node.op, self.placement.node(node))
                    native_call = builder(self._context(node, sized=sized), ins, outs)
                    if native_call is not None and sized:
                        native_call = with_sizes(native_call, self.bindings)
            if self.concurrent:                   # its own scratch: steps of a wave run at once
                self._share_of[id(node)] = len(self.calls) + 1
            if native_call is not None:
                natives.append((len(self.calls), native_call, ins, outs))
                self.impls.append("native")
            else:
                python.append((len(self.calls), node, ins, outs))
                self.impls.append("numpy")
            self.calls.append(None)
            self.steps.append(node)
            step_arrays.append((ins, outs))
        # native kernels run their own threads (OpenMP); numpy steps beside them run on one,
        # or the two pools would fight over the cores (measured: 4x slower steps)
        for p, node, ins, outs in python:
            on_host = self.placement.node(node).host_threads
            self.calls[p] = self._python_call(node, ins, outs, None if natives or not on_host else split_workers)
        self.native_source = None
        self.run_calls = self.calls
        if natives:
            self._link(natives, split_workers, step_arrays)
        # the BLAS library is held to one thread while the plan runs: the plan's threads split the
        # work, and with one thread asked for, OpenBLAS's own threads (its default: every core)
        # made a one-thread numpy plan 10x slower beside a busy process
        on_host = natives or any(self.placement.node(node).host_threads for _, node, _, _ in python)
        self.blas = Blas.shared() if on_host else None

    def _schedule(self) -> None:
        """Streams for a GPU plan's independent branches, or waves of host threads."""
        if self.on_streams:
            self.schedule = assign_streams(conflicts(*self._touches()))
            self.run_calls = stream_calls(self.schedule, self.calls, self.device)
        elif self.concurrent:
            self.waves = waves(*self._touches())
            self.run_calls = wave_calls(self.waves, self.calls, self.workers)

    def _bind_outputs(self, out_names: list[str], fixed) -> None:
        self.output_views = {n: self._view(self.graph.outputs[n]) for n in out_names}
        self.copy_updates = []
        for name, upd in self.graph.updates.items():
            if self.memory.storage_of[upd.id] is not fixed[self.graph.weights[name].value.id]:
                self.copy_updates.append((fixed[self.graph.weights[name].value.id].external, self._view(upd)))

    def _choose_capture(self, capture: bool | None) -> None:
        """A CUDA graph of the run where every device has graphs and no kernel reads the device
        from the host (capture.py); ``capture_blocker`` says why not, for --explain."""
        self.graph_run: CapturedRun | None = None
        self.capture_blocker = None
        if not any(d.graphs for d in self.devices):
            return                                # the host: nothing to capture, nothing to say
        why = capture_blocker(self.devices, self.steps, self.entries, capture)
        why = why or next((f"layer '{layer_of_scope(n.scope)}': its {n.op} kernel {fn_why}"
                           for n, fn_why in self._call_blockers if fn_why), None)
        self.capture_blocker = why
        if why is None:
            self.graph_run = CapturedRun(self.device, self._device_run)

    # -- helpers of the phases ----------------------------------------------------------------
    def _touches(self) -> tuple[list, list, list]:
        """Per step, the byte regions it reads and writes, and whether it draws random numbers
        (the input of concurrency.py and streams.py)."""
        memory, shapes, dtypes = self.memory, self.shapes, self.dtypes

        def region(v):
            st = memory.storage_of[v.id]
            start = memory.offset_of.get(v.id, 0)
            n = int(np.prod(shapes[v.id], dtype=np.int64)) * np.dtype(dtypes[v.id]).itemsize
            if st.arena is not None:
                return (id(st.arena), st.offset + start, st.offset + start + n)
            return (id(st), start, start + n)
        reads = [[region(v) for v in node.inputs] for node in self.steps]
        writes = [[region(v) for v in node.outputs] for node in self.steps]
        ordered = [not get_op(node.op).pure for node in self.steps]
        return reads, writes, ordered

    def _python_call(self, node, ins, outs, workers):
        strided = [k for k, o in enumerate(outs) if isinstance(o, np.ndarray) and not o.flags.c_contiguous]
        with self._building(node):
            split = self._split(node, ins, outs) if workers and not strided else None
            if split:
                self.split_steps += 1
                return functools.partial(workers.run, *split)
            fn = self.entries[id(node)].factory(self._context(node))
        # host work a kernel does before each run, outside a captured graph (a random key's
        # upload); a kernel that must talk to the host inside the run says why it cannot be
        # captured (a loop whose body draws random numbers every step)
        hook = getattr(fn, "before_run", None)
        if hook is not None:
            self.before_run.append(hook)
        self._call_blockers.append((node, getattr(fn, "host_sync", None)))
        if strided:
            # a gathered concatenation's part whose native kernel was not built: the numpy
            # kernel writes contiguous arrays, copied into the strided view after each call
            temps = [np.empty(o.shape, o.dtype) if k in strided else o for k, o in enumerate(outs)]
            return functools.partial(_into_strided, fn, ins, outs, temps, strided)
        return functools.partial(fn, ins, outs)

    @contextlib.contextmanager
    def _building(self, node: Node):
        """A kernel that cannot allocate its scratch while it is built (an im2col buffer, index
        maps) is a UserError naming the layer and what numpy could not allocate."""
        try:
            yield
        except MemoryError as e:
            raise UserError(f"layer '{layer_of_scope(node.scope)}': its {node.op} kernel cannot allocate its "
                            f"scratch memory at {_sizes(self.bindings)} ({str(e).splitlines()[0]})") from None

    def _link(self, natives, workers, step_arrays) -> None:
        """Compile the plan's native calls in units of at most ``codegen.native.MAX_UNIT_BYTES`` of C
        (usually one); consecutive native steps of one unit become one segment, called from
        Python once. Where the compiler fails or times out on a unit, or one kernel alone is over
        the limit, those steps run the numpy kernels after a one-line notice; where every unit
        fails, the whole plan runs them, split across the cores again."""
        units = native_units([call.kernel for _, call, *_ in natives])
        linked_any = False
        failed: list[int] = []                    # positions (in natives) left to numpy
        segment_at: dict[int, tuple] = {}         # first step of a segment -> (its call, its steps)
        self._linked = []
        sources = []
        for unit in units:
            if unit.too_big is not None:
                notice(f"{unit.too_big}; running its steps with the numpy kernels", once=unit.too_big)
                failed += unit.members
                continue
            members = [natives[k] for k in unit.members]
            positions = [p for p, *_ in members]
            segments: list[list[int]] = []
            for k, p in enumerate(positions):
                if segments and positions[segments[-1][-1]] == p - 1:
                    segments[-1].append(k)
                else:
                    segments.append([k])
            try:
                linked = Linked([c for _, c, *_ in members], segments)
            except toolchain.NativeUnavailable as e:
                notice(f"{e}; running the numpy kernels", once=str(e))
                failed += unit.members
                continue
            linked_any = True
            self._linked.append(linked)
            sources.append(linked.source)
            for k, (p, call, _ins, _outs) in enumerate(members):
                self.calls[p] = linked.step(k, call)
            for j, seg in enumerate(segments):
                segment_at[positions[seg[0]]] = (linked.segment(j), len(seg))
        if not linked_any:
            self.split_steps = 0                  # every step numpy, split across cores again
            for p, (node, (ins, outs)) in enumerate(zip(self.steps, step_arrays)):
                self.calls[p] = self._python_call(node, ins, outs, workers)
                self.impls[p] = "numpy"
            return
        for k in failed:
            p = natives[k][0]
            ins, outs = step_arrays[p]
            self.calls[p] = self._python_call(self.steps[p], ins, outs, None)
            self.impls[p] = "numpy"
        self.native_source = "\n".join(sources)
        run_calls, at = [], 0
        while at < len(self.calls):
            if at in segment_at:
                segment, length = segment_at[at]
                run_calls.append(segment)
                at += length
            else:
                run_calls.append(self.calls[at])
                at += 1
        self.run_calls = run_calls

    def _split(self, node: Node, ins, outs) -> tuple[list, object] | None:
        """One kernel call per thread on its own batch rows, for a large batch-parallel op;
        returns (shares, then) where ``then`` adds the shares of a batch-sum op."""
        kind = split_kind(node)
        if kind is None:
            return None
        mode, batched = kind
        shapes = self.shapes
        rows = shapes[node.inputs[batched.index(True)].id][0]
        out_shape = shapes[node.outputs[0].id]
        if rows < self.threads:
            return None
        opdef = get_op(node.op)
        flops = bind_attrs(opdef.flops([v.type for v in node.inputs], [v.type for v in node.outputs], node.attrs),
                           self.bindings) if opdef.flops else 0
        if not worth_splitting(node, int(flops), int(np.prod(out_shape)) * np.dtype(node.outputs[0].dtype).itemsize):
            return None
        bounds = np.linspace(0, rows, self.threads + 1).astype(int)
        partials = [outs[0]] + [np.empty_like(outs[0]) for _ in range(self.threads - 1)] if mode == "sum" else None
        shares = []
        for k, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
            def cut(shape, is_batched):
                return (hi - lo,) + tuple(shape[1:]) if is_batched else tuple(shape)
            in_shapes = [cut(shapes[v.id], b) for v, b in zip(node.inputs, batched)]
            out_shapes = [tuple(out_shape)] if mode == "sum" else [cut(out_shape, True)]
            ctx = KernelContext(node, bind_attrs(node.attrs, self.bindings), in_shapes, out_shapes,
                                kernel_dtype(node), self.placement.node(node), self.runtime, np, share=k,
                                reuse_memory=self.reuse_memory)
            fn = self.entries[id(node)].factory(ctx)
            share_ins = [a[lo:hi] if b else a for a, b in zip(ins, batched)]
            share_out = partials[k] if mode == "sum" else outs[0][lo:hi]
            shares.append(functools.partial(fn, share_ins, [share_out]))
        if mode != "sum":
            return shares, None

        def add_shares(total=outs[0], rest=partials[1:]):
            for part in rest:
                np.add(total, part, out=total)
        return shares, add_shares

    def _context(self, node: Node, device: Device | None = None, sized: bool = False) -> KernelContext:
        """``sized``: symbolic dimensions as ``SizeInt`` numbers, for a builder whose kernels take
        them at run time (codegen/loops.py)."""
        device = device or self.placement.node(node)
        shapes, bindings = self.shapes, self.bindings
        if sized:
            if self._sized_shapes is None:
                self._sized_bindings = {k: SizeInt.of(k, v) for k, v in self.bindings.items()}
                self._sized_shapes = concrete_types(self.graph, self._sized_bindings)[0]
            shapes, bindings = self._sized_shapes, self._sized_bindings
        return KernelContext(node, bind_attrs(node.attrs, bindings),
                             [shapes[v.id] for v in node.inputs], [shapes[v.id] for v in node.outputs],
                             kernel_dtype(node), device, self.runtime, device.xp,
                             share=self._share_of.get(id(node), 0), threads=1 if self.concurrent else self.threads,
                             reuse_memory=self.reuse_memory)

    def _use_team(self) -> None:
        """Run on as many threads as the machine leaves free now (team.py)."""
        team = self._team
        size = self.threads if team is None else team.current()     # the team is sized for self.threads
        # the workers, and a library whose source another plan also built, are shared: the
        # size is set on every run, skipping the call into C where it is already so (this
        # method runs before every plan run: a LeNet batch-1 run takes 8 us in all)
        if self.workers is not None:
            self.workers.team = size
        for linked in self._linked:
            if linked.lib.tk_team != size:
                linked.set_team(size)

    def synchronize(self) -> None:
        """Wait for every device of the plan to finish its queued work (GPU launches return
        before the kernels run): what a timer must do before reading the clock."""
        for device in self.devices:
            device.synchronize()

    @property
    def peak_bytes(self) -> int:
        return self.memory.peak_bytes

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self._execute(inputs, None)
        return self.output_views

    def profile(self, inputs: Mapping[str, np.ndarray]) -> list[tuple[Node, float]]:
        """One run with each call timed (seconds)."""
        timings: list[tuple[Node, float]] = []
        self._execute(inputs, timings)
        return timings

    @property
    def captured(self) -> bool:
        """Whether the run is now one launch of a CUDA graph (after the first run)."""
        return self.graph_run is not None and self.graph_run.captured

    def _execute(self, inputs, timings: list | None) -> None:
        for name, buf in self.host_inputs:
            np.copyto(buf, inputs[name], casting="same_kind")
        for name, _buf, upload in self.device_inputs:     # one copy each, queued: from the host or the device
            upload(inputs[name])
        if timings is None and self.graph_run is not None:
            for hook in self.before_run:
                hook()
            self.graph_run()                  # the calls and the weight copies, one launch
            return
        self.execute(timings)
        self._copy_updates()

    def _copy_updates(self) -> None:
        for target, source in self.copy_updates:
            target[...] = source

    def _device_run(self) -> None:
        """What a captured graph holds: every call, then the weight copies."""
        for call in self.run_calls:
            call()
        self._copy_updates()

    def execute(self, timings: list | None = None, nested: bool = False) -> None:
        """Run the calls on what the input buffers (``input_views``) hold now. ``nested``: called
        by a kernel of another plan (a loop body), which has already set the BLAS threads."""
        self._use_team()
        for hook in self.before_run:
            hook()
        if nested:
            for call in self.run_calls:
                call()
            return
        if self.blas is not None:
            self.blas.set_threads(1)          # the plan's own threads split the work (parallel.py)
        try:
            if timings is None:
                for call in self.run_calls:
                    call()
            else:
                for node, call in zip(self.steps, self.calls):
                    start = time.perf_counter()
                    call()
                    timings.append((node, time.perf_counter() - start))
        finally:
            if self.blas is not None:
                self.blas.restore()
