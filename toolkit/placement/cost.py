"""The cost model measured on this machine: ``MeasuredModel`` answers ``CostModel``'s questions
from kernel timings, and ``measured_model(graph, bindings, default_device)`` makes one for a
graph, measuring what this machine has not measured before.

An op's time is the median of its step's time over profiled runs of the graph's own plan
(``Plan.profile``, as ``toolkit bench --per-layer`` times it), so each kernel is timed among its
neighbours, with the caches as a real run leaves them; the medians are scaled to add up to the
plan's median plain run (``profile_steps`` says why). Times are kept per (op, kernel dtype,
bound shapes and attributes, device kind, threads per kernel, ``1/2`` for one thread in each of
two core groups: ``kernel_runs``): ``cpu`` and ``cpu:1`` are the
same cores and kernels, so they share their entries. A shape not measured is predicted from
the same node measured at other sizes (``family_key``: its symbolic shapes unbound), time = a +
b * its work (``scaled_from``); failing that, a fitted time (``Fit``): time = a + b * FLOPs +
c * bytes over the measured nodes of its op, else of every op on that device kind. That form
because the kernels here are of three kinds: a fixed per-call cost (Python dispatch, a thread
team's start) that dominates small ops, GEMMs and convolutions that go at a FLOP rate, and
elementwise and data-movement ops bound by the bytes they touch; a single FLOP rate would call a
large copy free.

Transfers between devices are measured copies (the ``transfer`` kernel between ``cpu`` and
``cpu:1``, several sizes) fitted to a latency and a bandwidth per pair of device kinds. Only the
host is measured: a GPU's kernels and copies are not (``op_seconds`` and ``transfer_seconds``
refuse a device kind with no measurement, as ``FlopsModel`` refuses a device with no rate).

A device's memory limit is the memory this process may still allocate (hostmem.py) for the
host's devices; every ``cpu:N`` shares it, so a placer must count their arenas together.
``arena_bytes`` gives each device's arena as the memory planner makes it for the measured
placement.

Measurements are cached per machine under the cache folder (``placement/``), in a file keyed by
the processor's model name, the cores this process may use and the toolkit's version; a file
that does not parse, or names another machine or version, is ignored and rewritten.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import numpy as np

from ..backend.devices import Device, parse_device
from ..cachedir import cache_root
from ..hostcpu import usable_cores
from ..hostmem import available_memory
from ..ir.binding import bind_attrs
from ..ir.dims import Sym, evaluate, format_dim
from ..ir.graph import FLOAT_DTYPES, Graph, Node, TensorType, Value
from ..ops import Builder
from ..ops.base import get_op
from ..runtime.device_groups import group_makespan
from ..runtime.execution import kernel_dtype
from ..version import __version__
from .model import Link, value_bytes
from .simulate import waves_seconds

CACHE_FORMAT = 2
PROFILED_RUNS = 15
WARMUP_RUNS = 5
MIN_PROFILED_SECONDS = 0.5       # a measurement spans at least this, so that a burst of load is outvoted
MAX_PROFILED_RUNS = 5000
KEPT_MEASUREMENTS = 5            # an op's time is the median of its latest measurements, in whichever nets
LINK_SIZES = (1 << 12, 1 << 16, 1 << 20, 1 << 22, 1 << 24)     # bytes of the copies a link is fitted to


# ---------------------------------------------------------------- what a measurement is keyed by

def processor_name() -> str:
    """The processor's model name as the system reports it (``lscpu``'s 'Model name')."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or platform.machine() or "unknown"


def machine_identity() -> dict:
    """What a cache file must name to be trusted: the measurements hold only for this processor,
    this many cores and this version's kernels."""
    return {"format": CACHE_FORMAT, "processor": processor_name(), "cores": usable_cores(),
            "version": __version__}


def cache_path() -> Path:
    ident = machine_identity()
    digest = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]
    return cache_root() / "placement" / f"costs-{digest}.json"


def _bound_shape(v: Value, bindings: Mapping[str, int]) -> tuple[int, ...]:
    return tuple(int(evaluate(d, bindings)) for d in v.shape)


def _attr_text(value) -> str:
    """A stable text of bound attributes (sorted keys; no object addresses)."""
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_attr_text(value[k])}" for k in sorted(value, key=str)) + "}"
    if isinstance(value, (list, tuple)):
        return "(" + ",".join(_attr_text(v) for v in value) + ")"
    if isinstance(value, (str, int, float, bool)) or value is None:
        return repr(value)
    if isinstance(value, np.ndarray):
        return f"array{value.shape}{value.dtype}"
    if isinstance(value, Sym):
        return format_dim(value)
    return type(value).__name__


def kernel_runs(execution) -> int | str:
    """How a plan's kernels run, as its measurements are filed: the threads each kernel uses, and
    where devices run as core groups, how many groups run beside it (``1/2``): a kernel beside
    another group's takes longer than alone on its share of the cores (the cores' caches and
    memory, and on a busy machine the cores themselves, are shared), and only a grouped plan's
    own measurement says how much longer."""
    if execution.groups:
        return f"{execution.kernel_threads}/{len(execution.groups)}"
    return execution.kernel_threads


def op_key(node: Node, bindings: Mapping[str, int], kind: str, threads: int | str) -> str:
    """What a measured time is filed under: the op, its kernel's dtype, its bound input and output
    shapes and attributes, the device kind and the threads each kernel may use."""
    text = "|".join([node.op, kernel_dtype(node), kind, str(threads),
                     ";".join(f"{_bound_shape(v, bindings)}{v.dtype}" for v in node.inputs),
                     ";".join(f"{_bound_shape(v, bindings)}{v.dtype}" for v in node.outputs),
                     _attr_text(bind_attrs(node.attrs, bindings))])
    return f"{node.op}/{kind}/{hashlib.sha1(text.encode()).hexdigest()[:20]}"


def family_key(node: Node, kind: str, threads: int | str) -> str:
    """What the measurements of one node at several sizes share: ``op_key`` with the symbolic
    sizes left unbound (``N*16``), so that a node at a batch not measured is predicted from the
    same node at the batches that were."""
    text = "|".join([node.op, kernel_dtype(node), kind, str(threads),
                     ";".join(f"({','.join(format_dim(d) for d in v.shape)}){v.dtype}" for v in node.inputs),
                     ";".join(f"({','.join(format_dim(d) for d in v.shape)}){v.dtype}" for v in node.outputs),
                     _attr_text(node.attrs)])
    return hashlib.sha1(text.encode()).hexdigest()[:20]


def node_flops(node: Node, bindings: Mapping[str, int]) -> float:
    opdef = get_op(node.op)
    if opdef.flops is None:
        return 0.0
    return float(evaluate(opdef.flops([v.type for v in node.inputs], [v.type for v in node.outputs], node.attrs),
                          bindings))


def node_bytes(node: Node, bindings: Mapping[str, int]) -> float:
    return float(sum(value_bytes(v, bindings) for v in list(node.inputs) + node.outputs))


# ---------------------------------------------------------------- the model of shapes not measured

@dataclass(frozen=True)
class Fit:
    """time = fixed + per_flop * FLOPs + per_byte * bytes, each coefficient at least 0."""
    fixed_s: float
    per_flop_s: float
    per_byte_s: float
    samples: int

    def seconds(self, flops: float, nbytes: float) -> float:
        return self.fixed_s + self.per_flop_s * flops + self.per_byte_s * nbytes


def fit_samples(samples: list[tuple[float, float, float]]) -> Fit | None:
    """Least squares of time on (1, FLOPs, bytes) over ``samples`` [(flops, bytes, seconds)], with
    no coefficient below 0 (a feature whose coefficient comes out negative is dropped and the
    rest refitted), relative to each sample's time so that the many small kernels count as much as
    the few large ones. None with no samples."""
    if not samples:
        return None
    a = np.array([[1.0, f, b] for f, b, _ in samples])
    t = np.array([s for _, _, s in samples])
    weight = 1.0 / np.maximum(t, 1e-7)
    active = [0, 1, 2]
    while True:
        cols = a[:, active] * weight[:, None]
        coef, *_ = np.linalg.lstsq(cols, t * weight, rcond=None)
        if (coef >= 0).all() or len(active) == 1:
            break
        active.pop(int(np.argmin(coef)))
    full = [0.0, 0.0, 0.0]
    for i, c in zip(active, coef):
        full[i] = max(float(c), 0.0)
    return Fit(full[0], full[1], full[2], len(samples))


def scaled_from(samples: list[tuple[float, float, float]], flops: float, nbytes: float) -> float:
    """A node's time from the same node at other sizes [(seconds, FLOPs, bytes)]: time = a + b x
    work (its FLOPs, or its bytes where it has none), fitted with a and b at least 0 where the
    samples have two sizes or more, else the one sample scaled by the work."""
    use_flops = all(f > 0 for _, f, _ in samples) and flops > 0
    points = sorted({(f if use_flops else b, s) for s, f, b in samples})
    work = flops if use_flops else nbytes
    if len({w for w, _ in points}) < 2:
        w0, t0 = points[0]
        return t0 * work / w0 if w0 > 0 else t0
    w = np.array([p[0] for p in points])
    t = np.array([p[1] for p in points])
    slope, fixed = np.polyfit(w, t, 1)
    if slope < 0:
        return float(np.mean(t))
    if fixed < 0:
        slope, fixed = float(np.sum(w * t) / np.sum(w * w)), 0.0
    return float(fixed + slope * work)


# ---------------------------------------------------------------- the cache file

def _valid_seconds(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and 0 <= x < 3600


def _valid_op_entry(v) -> bool:
    return (isinstance(v, list) and len(v) == 4 and isinstance(v[3], str)
            and all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0
                    for x in v[:2])
            and isinstance(v[2], list) and 0 < len(v[2]) <= KEPT_MEASUREMENTS and all(map(_valid_seconds, v[2])))


def load_cache(path: Path | None = None) -> dict:
    """The cached measurements of this machine: {"ops": {key: [flops, bytes, [seconds, ...],
    family]}
    (the latest ``KEPT_MEASUREMENTS`` measurements of each),
    "links": {"src->dst": [latency_s, bytes_per_s], "groups": [start_s, wait_s]}}; empty where
    the file is missing, does not parse, or names another machine or version (never trusted then)."""
    empty = {"ops": {}, "links": {}}
    path = path or cache_path()
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return empty
    if not isinstance(data, dict) or data.get("machine") != machine_identity():
        return empty
    ops, links = data.get("ops"), data.get("links")
    if not isinstance(ops, dict) or not isinstance(links, dict):
        return empty
    good_ops = {k: v for k, v in ops.items() if isinstance(k, str) and _valid_op_entry(v)}
    good_links = {k: list(v) for k, v in links.items()
                  if isinstance(k, str) and isinstance(v, list) and len(v) == 2 and _valid_seconds(v[0])
                  and isinstance(v[1], (int, float)) and math.isfinite(v[1]) and v[1] > 0}
    return {"ops": good_ops, "links": good_links}


def save_cache(cache: dict, path: Path | None = None) -> None:
    """Write ``cache`` whole (a new file renamed over the old, so a reader never sees half)."""
    path = path or cache_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"machine": machine_identity(), **cache}))
        os.replace(tmp, path)
    except OSError:
        pass                     # a read-only cache folder: measure again next time


# ---------------------------------------------------------------- the model

@dataclass
class MeasuredModel:
    """``CostModel`` from this machine's measurements (see the module's docstring). ``ops``:
    key -> (seconds, FLOPs, bytes); ``links``: (source kind, destination kind) -> ``Link``;
    ``threads``: how each kernel was measured (``kernel_runs``: its threads, 1 where branches run
    side by side, ``1/2`` beside another core group)."""
    bindings: Mapping[str, int]
    ops: dict[str, tuple[float, float, float]]
    links: dict[tuple[str, str], Link]
    threads: int | str
    arenas: dict[str, int] = field(default_factory=dict)
    fits: dict[tuple[str, str], Fit | None] = field(default_factory=dict)
    # family_key -> [(seconds, FLOPs, bytes)]: the same node measured at other sizes
    families: dict[str, list] = field(default_factory=dict)
    # what running the host's devices as core groups costs beyond their steps: each run's start
    # and end (the helper threads woken and joined), and each wait for another device's step
    group_start_s: float = 0.0
    group_wait_s: float = 0.0

    def group_seconds(self, waits: int) -> float:
        """What a grouped run with ``waits`` waits across devices costs beyond its steps."""
        return self.group_start_s + waits * self.group_wait_s

    def key(self, node: Node, device: Device) -> str:
        return op_key(node, self.bindings, parse_device(device).kind, self.threads)

    def measured(self, node: Node, device: Device) -> bool:
        """Whether ``node``'s time on ``device`` is a measurement (else it is predicted from the
        same node at other sizes, or fitted)."""
        return self.key(node, device) in self.ops

    def fit(self, op: str, kind: str) -> Fit | None:
        """The fitted time of ``op`` on a device kind: over its own measured nodes where there
        are at least 3, else over every op measured on that kind."""
        if (op, kind) not in self.fits:
            prefix, every = f"{op}/{kind}/", f"/{kind}/"
            own = [(f, b, s) for k, (s, f, b) in self.ops.items() if k.startswith(prefix)]
            if len(own) < 3:
                own = [(f, b, s) for k, (s, f, b) in self.ops.items() if every in k]
            self.fits[(op, kind)] = fit_samples(own)
        return self.fits[(op, kind)]

    def op_seconds(self, node: Node, device: Device) -> float:
        device = parse_device(device)
        if node.op == "transfer":
            return self.transfer_seconds(node.inputs[0], node.attrs["src"], node.attrs["dst"])
        found = self.ops.get(self.key(node, device))
        if found is not None:
            return found[0]
        flops, nbytes = node_flops(node, self.bindings), node_bytes(node, self.bindings)
        same = self.families.get(family_key(node, device.kind, self.threads))
        if same:
            return scaled_from(same, flops, nbytes)
        fit = self.fit(node.op, device.kind)
        if fit is None:
            raise KeyError(f"no kernel timings measured on a {device.kind} device")
        return fit.seconds(flops, nbytes)

    def transfer_seconds(self, value: Value, src: Device, dst: Device) -> float:
        src, dst = parse_device(src), parse_device(dst)
        if src == dst:
            return 0.0
        link = self.links.get((src.kind, dst.kind))
        if link is None:
            raise KeyError(f"no copies measured from {src.kind} to {dst.kind}")
        return link.seconds(value_bytes(value, self.bindings))

    def memory_limit(self, device: Device) -> int | None:
        """The host's devices: the memory this process may still allocate (all ``cpu:N``
        together); a device whose memory is not the host's: None (not measured)."""
        return available_memory() if parse_device(device).host_memory else None

    def arena_bytes(self, device: Device) -> int | None:
        """The arena the memory planner made on ``device`` for the measured placement."""
        return self.arenas.get(str(parse_device(device)))


# ---------------------------------------------------------------- measuring

def _stand_in(v: Value, bindings, rng) -> np.ndarray:
    shape = _bound_shape(v, bindings)
    if v.dtype in FLOAT_DTYPES:
        return (rng.standard_normal(shape) * 0.1).astype(v.dtype)
    return np.zeros(shape, dtype=v.dtype)


def _plan_of(graph: Graph, bindings, device, concurrent: bool | None, threads: int | None = None):
    from ..runtime.plan import Plan
    rng = np.random.default_rng(0)
    weights = {}
    for name, w in graph.weights.items():
        init = w.init or {}
        if init.get("type") == "constant":         # solver slots, the loss scale: as a run starts them
            weights[name] = np.full(_bound_shape(w.value, {}), init.get("value", 0.0), dtype=w.value.dtype)
        else:
            weights[name] = _stand_in(w.value, {}, rng)
    return Plan(graph, bindings, weights, device, concurrent=concurrent, capture=False, threads=threads)


def _inputs_of(graph: Graph, bindings) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    inputs = {}
    for name, v in graph.inputs.items():
        if name.startswith("@"):                   # the solver's per-step scalars
            inputs[name] = np.full(_bound_shape(v, bindings), 1e-3, dtype=v.dtype)
        else:
            inputs[name] = _stand_in(v, bindings, rng)
    return inputs


def profile_steps(plan, inputs, runs: int = PROFILED_RUNS, warmup: int = WARMUP_RUNS,
                  min_seconds: float = MIN_PROFILED_SECONDS, whole_run: bool = True,
                  group_costs: tuple[float, float] = (0.0, 0.0)) -> list[float]:
    """Each step's median seconds over at least ``runs`` profiled runs, and as many more as fill
    ``min_seconds`` (up to ``MAX_PROFILED_RUNS``), after ``warmup`` plain runs and a tenth of that
    time: on a shared machine another process's burst can last longer than a few runs of a small
    net, and the median only sees past it when the runs are spread over a longer time.

    ``whole_run``: each profiled run follows a plain one, timed, and the medians are scaled to add
    up to the plain runs' median (as the plan runs them: one after another, in its waves on the
    threads, or each device's steps on its own thread: device_groups.group_makespan), so that
    the copies of a run's inputs and the gaps between its calls are in the steps' times, and the
    interruptions of a busy machine: nearly every run is interrupted somewhere, but each step's
    median is one of its uninterrupted times, and their sum fell 35% short of the median run
    under a load of 8 on 2 cores. A grouped plan's run less its groups' own cost (``group_costs``:
    start, per wait; the model adds it back as a whole) is what its steps are scaled to."""
    start = time.perf_counter()
    done = 0
    while done < warmup or time.perf_counter() - start < min_seconds / 10:
        plan.run(inputs)
        done += 1
    rows, plain = [], []
    start = time.perf_counter()
    while len(rows) < runs or (time.perf_counter() - start < min_seconds and len(rows) < MAX_PROFILED_RUNS):
        if whole_run:
            began = time.perf_counter()
            plan.run(inputs)
            plain.append(time.perf_counter() - began)
        rows.append([s for _, s in plan.profile(inputs)])
    medians = np.median(np.array(rows), axis=0)
    # what the steps' times add up to in a plain run: their sum, their waves' on the threads or
    # their devices' groups' (a profiled run times its steps one after another)
    waves, groups = getattr(plan.schedule, "waves", None), getattr(plan.schedule, "groups", None)
    if plan.execution.concurrent and waves:
        total = waves_seconds(waves, medians, plan.execution.threads)
    elif groups is not None:
        total = group_makespan(groups, [float(x) for x in medians])
    else:
        total = float(medians.sum())
    run = float(np.median(plain)) if plain else 0.0
    if groups is not None:
        # the groups' own cost is the model's to add (MeasuredModel.group_seconds), not the steps'
        run = max(run - group_costs[0] - group_costs[1] * groups.cross_edges(), run / 4)
    scale = run / total if whole_run and total > 0 else 1.0
    return [float(x) * scale for x in medians]


def _file(cache: dict, node: Node, bindings, kind: str, threads: int | str, seconds: float) -> None:
    """Add a measurement of ``node``, keeping the latest ``KEPT_MEASUREMENTS``."""
    key = op_key(node, bindings, kind, threads)
    entry = cache["ops"].get(key)
    kept = entry[2] if entry is not None else []
    kept = (kept + [seconds])[-KEPT_MEASUREMENTS:]
    cache["ops"][key] = [node_flops(node, bindings), node_bytes(node, bindings), kept,
                         family_key(node, kind, threads)]


def measure_graph(graph: Graph, bindings, device, cache: dict, concurrent: bool | None = None,
                  runs: int = PROFILED_RUNS, plan=None, threads: int | None = None,
                  group_costs: tuple[float, float] = (0.0, 0.0)) -> tuple[int | str, dict[str, int]]:
    """Profile ``graph``'s plan (``plan`` where the caller has built it, else one built here with
    stand-in weights) and file each step's median time in ``cache["ops"]``; nodes the plan
    evaluates once when it is built (no step) cost 0. ``threads``: the plan's threads (default:
    every free core). ``group_costs``: (start, wait) of a grouped run (``measure_groups``), left out
    of its steps' times. Returns (how its kernels ran: ``kernel_runs``, each device's arena bytes)."""
    from ..backend.placement import Placement
    plan = plan if plan is not None else _plan_of(graph, bindings, device, concurrent, threads)
    inputs = _inputs_of(graph, bindings)
    threads = kernel_runs(plan.execution)
    where = Placement.of(graph, device)
    seconds = profile_steps(plan, inputs, runs, group_costs=group_costs)
    stepped = set()
    for node, s in zip(plan.steps, seconds):
        stepped.add(id(node))
        if node.op != "transfer":
            _file(cache, node, bindings, where.node(node).kind, threads, s)
    for node in graph.nodes:
        if id(node) not in stepped and node.op != "transfer":
            _file(cache, node, bindings, where.node(node).kind, threads, 0.0)
    arenas = {str(d): int(n) for d, n in plan.memory.peak_by_device.items()}
    return threads, arenas


def _copy_graph(nbytes: int, src: str, dst: str) -> Graph:
    g = Graph("infer")
    x = Value(TensorType((nbytes // 4,), "float32"), name="x")
    g.inputs = {"x": x}
    g.outputs = {"y": Builder(g, "copy").op("transfer", x, src=src, dst=dst)}
    return g


def measure_link(src: str, dst: str, sizes=LINK_SIZES, runs: int = PROFILED_RUNS) -> Link:
    """A link fitted to the median times of the ``transfer`` kernel copying ``sizes`` bytes."""
    samples = []
    for nbytes in sizes:
        g = _copy_graph(nbytes, src, dst)
        plan, inputs = _plan_of(g, {}, src, None), _inputs_of(g, {})
        (seconds,) = [s for node, s in zip(plan.steps, profile_steps(plan, inputs, runs, min_seconds=0.1,
                                                                            whole_run=False))
                      if node.op == "transfer"]
        samples.append((nbytes, seconds))
    n = np.array([b for b, _ in samples], dtype=float)
    t = np.array([s for _, s in samples])
    per_byte, latency = np.polyfit(n, t, 1, w=1.0 / np.maximum(t, 1e-7))
    per_byte = max(float(per_byte), 1e-13)
    return Link(max(float(latency), 0.0), 1.0 / per_byte)


def measure_groups(runs: int = 1000, handoffs: int = 20) -> tuple[float, float]:
    """(a grouped run's start and end, each wait across devices), in seconds: the median time of
    two core groups' run of empty steps with no wait, and of a chain of empty steps that passes
    from one group to the other ``handoffs`` times, each wait then a sleep and a wake-up
    (runtime/device_groups.py). A plan's waits find their step done already as often as not:
    the chain's is the cost of the wait that does not."""
    from ..backend.devices import CPU
    from ..runtime.device_groups import GroupRun, group_schedule
    other = parse_device("cpu:1")

    def median_run(steps: int) -> float:
        on = [CPU if k % 2 == 0 else other for k in range(steps)]
        reads = [[(k - 1, 0, 8)] if k else [] for k in range(steps)]      # each reads the one before
        writes = [[(k, 0, 8)] for k in range(steps)]
        if steps == 2:
            reads = [[], []]                                                 # two steps apart: no wait
        run = GroupRun(group_schedule((CPU, other), on, reads, writes, [False] * steps, threads=1),
                       [lambda: None] * steps)
        for _ in range(runs // 10):
            run()
        times = []
        for _ in range(runs):
            began = time.perf_counter()
            run()
            times.append(time.perf_counter() - began)
        return float(np.median(times))
    start = median_run(2)
    return start, max((median_run(handoffs + 1) - start) / handoffs, 1e-9)


def measured_model(graph: Graph, bindings: Mapping[str, int], default_device: Device | str = "cpu",
                   concurrent: bool | None = None, cache_file: Path | None = None, plan=None,
                   threads: int | None = None) -> MeasuredModel:
    """The measured model of ``graph`` bound to ``bindings`` (its nodes placed by their layers'
    ``device:`` keys, else on ``default_device``): read from this machine's cache, measuring the
    graph's plan (a few seconds) when some node's time is not there yet, and the host's copies
    once per machine. ``concurrent``: the kernels as a plan with branches side by side runs them
    (one thread each); default: the ``TOOLKIT_CONCURRENT`` setting. ``plan``: the graph's plan
    where the caller has one (a benchmark's), measured instead of a second one built here; its
    runs with stand-in inputs update a train step's weights, as any run does. ``threads``: the
    plan's threads (default: every free core); a graph placed over several host devices that
    may run at once runs them as core groups (runtime/device_groups.py), each kernel on its
    group's share, and is measured so. ``threads=1`` on a one-device graph gives the kernels'
    times on one core: a two-group placement's on a two-core machine, for the placer to weigh."""
    from ..backend.placement import Placement
    from ..runtime.device_groups import overlapping_devices
    from ..runtime.execution import choose_execution
    device = parse_device(default_device)
    where = Placement.of(graph, device)
    for d in where.devices(graph):
        if not d.host_memory:
            raise KeyError(f"the measured cost model times host devices only, not {d}")
    cache = load_cache(cache_file)
    execution = choose_execution(where.devices(graph), bindings, threads, concurrent, None, True, None,
                                 running=overlapping_devices(graph, where, bindings))
    asked, threads = threads, kernel_runs(execution)
    changed = False
    missing = [n for n in graph.nodes
               if n.op != "transfer" and op_key(n, bindings, where.node(n).kind, threads) not in cache["ops"]]
    arenas: dict[str, int] = {}
    if "groups" not in cache["links"]:
        cache["links"]["groups"] = list(measure_groups())
        changed = True
    if missing:
        threads, arenas = measure_graph(graph, bindings, device, cache, concurrent, plan=plan, threads=asked,
                                        group_costs=tuple(cache["links"]["groups"]))
        changed = True
    if "cpu->cpu" not in cache["links"]:
        link = measure_link("cpu", "cpu:1")
        cache["links"]["cpu->cpu"] = [link.latency_s, link.bytes_per_s]
        changed = True
    if changed:
        save_cache(cache, cache_file)
    if not arenas:
        arenas = _arenas(graph, bindings, device, execution.concurrent)
    links = {tuple(k.split("->")): Link(*v) for k, v in cache["links"].items() if "->" in k}
    group_start, group_wait = cache["links"]["groups"]
    ops = {k: (float(np.median(v[2])), v[0], v[1]) for k, v in cache["ops"].items()}
    families: dict[str, list] = {}
    for k, v in cache["ops"].items():
        families.setdefault(v[3], []).append(ops[k])
    return MeasuredModel(dict(bindings), ops, links, threads, arenas, families=families, group_start_s=group_start,
                         group_wait_s=group_wait)


def _arenas(graph: Graph, bindings, device, concurrent: bool) -> dict[str, int]:
    from ..backend.placement import Placement
    from ..runtime.build import build_plan
    from ..runtime.layout import plan_build_memory
    built = build_plan(graph, bindings, None, Placement.of(graph, device))
    memory = plan_build_memory(built, list(graph.outputs), not concurrent)
    return {str(d): int(n) for d, n in memory.peak_by_device.items()}
