"""InferSession: runs a forward graph on arrays of any batch size through per-bucket plans.

A symbolic batch dimension (the leading dimension of every input) is served by a few static
plans, one per bucket size: n rows run on the smallest bucket that holds them, padded and sliced
back; more rows than the largest bucket are cut into chunks. Plans are built on first use (or
ahead with ``warm``) and reused. Inputs without a symbolic leading dimension use one plan per
distinct shape.
"""
from __future__ import annotations

import threading
from collections import Counter, OrderedDict
from typing import Callable, Mapping

import numpy as np

from ..backend.devices import CPU, Device, parse_device, to_host
from ..errors import UserError
from ..ir.dims import Sym
from ..ir.graph import FLOAT_DTYPES, Graph
from ..ir.binding import bind_symbols
from .plan import Plan, RuntimeState

DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
MAX_PLANS = 16          # plans kept per session beyond the buckets (shapes other than the batch)


def batch_symbol(graph: Graph) -> str | None:
    """The symbol that leads every input's shape, if there is one such symbol."""
    leads = set()
    for v in graph.inputs.values():
        if v.rank == 0:
            continue                  # per-step scalars (a solver's @lr) have no batch
        if not v.shape or not isinstance(v.shape[0], Sym) or len(v.shape[0].terms) != 1:
            return None
        (mono, coeff), = v.shape[0].terms.items()
        if coeff != 1 or len(mono) != 1:
            return None
        leads.add(mono[0])
    return leads.pop() if len(leads) == 1 else None


def batch_bindings(graph: Graph, batch: int, extra: dict[str, int] | None = None) -> dict[str, int]:
    """Numbers for every symbolic dimension: the batch symbol gets ``batch``, the others must be
    in ``extra`` (``--dim T=32``)."""
    bindings = dict(extra or {})
    symbol = batch_symbol(graph)
    if symbol is not None:
        bindings[symbol] = batch
    missing = sorted(graph.symbols() - set(bindings))
    if missing:
        raise UserError(f"give a size for the symbolic dimension(s) {', '.join(missing)} with --dim NAME=SIZE")
    return bindings


def check_input_arrays(graph: Graph, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The arrays a graph needs, cast to its dtypes; a missing or wrongly typed array is a UserError."""
    out = {}
    for name, v in graph.inputs.items():
        if name not in arrays:
            raise UserError(f"input '{name}' is missing (the net needs: {', '.join(graph.inputs)})")
        arr = np.asarray(arrays[name])
        if v.dtype in FLOAT_DTYPES:
            if arr.dtype.kind not in "fiub":
                raise UserError(f"input '{name}' has dtype {arr.dtype}; the net needs numbers ({v.dtype})")
        elif arr.dtype.kind not in "iub":
            raise UserError(f"input '{name}' has dtype {arr.dtype}; the net needs integers ({v.dtype})")
        out[name] = np.asarray(arr, dtype=v.dtype, order="C")
    return out


class InferSession:
    """The infer graph at any batch size. One lock serialises runs, so it is safe to share
    between threads; the bucket plans of one shape (all but the batch) share one arena per
    device, sized by the largest bucket, so memory does not grow with the buckets used."""

    def __init__(self, graph: Graph, weights: Mapping[str, np.ndarray], device: Device | str = CPU,
                 buckets: tuple[int, ...] = DEFAULT_BUCKETS, reuse_memory: bool = True):
        self.graph = graph
        self.weights = {k: weights[k] for k in graph.weights}
        self.device = parse_device(device)
        self.reuse_memory = reuse_memory
        self.buckets = tuple(sorted(set(buckets)))
        self.batch_symbol = batch_symbol(graph)
        self.runtime = RuntimeState(np.random.default_rng(0))
        # least recently used first; bounded so that memory does not grow with every new shape
        self.plans: OrderedDict[tuple, Plan] = OrderedDict()
        self.max_plans = max(len(self.buckets), MAX_PLANS)
        self.arenas: OrderedDict[tuple, dict] = OrderedDict()   # shape but the batch -> {device: buffer}
        self.lock = threading.RLock()
        self.bucket_runs: Counter = Counter()       # bucket size -> runs (for --verbose)

    def _shape_key(self, bindings: dict[str, int]) -> tuple:
        return tuple(sorted((k, v) for k, v in bindings.items() if k != self.batch_symbol))

    def _allocator(self, shape_key: tuple) -> Callable:
        arenas = self.arenas.setdefault(shape_key, {})
        self.arenas.move_to_end(shape_key)
        while len(self.arenas) > MAX_PLANS:
            self.arenas.popitem(last=False)          # plans still holding one keep it alive

        def allocate(device, nbytes: int):
            have = arenas.get(device)
            if have is None or have.nbytes < nbytes:
                have = arenas[device] = device.empty(nbytes)
            return have[:nbytes]
        return allocate

    def plan_for(self, bindings: dict[str, int]) -> Plan:
        key = tuple(sorted(bindings.items()))
        with self.lock:
            if key in self.plans:
                self.plans.move_to_end(key)
                return self.plans[key]
            shape_key = self._shape_key(bindings)
            if self.batch_symbol is not None and shape_key not in self.arenas:
                largest = {**bindings, self.batch_symbol: self.buckets[-1]}
                if largest != bindings:
                    self.plan_for(largest)          # first: its arena is the one the others share
            plan = Plan(self.graph, bindings, self.weights, self.device, self.runtime,
                        allocate=self._allocator(shape_key), reuse_memory=self.reuse_memory)
            self.plans[key] = plan
            if len(self.plans) > self.max_plans:
                self.plans.popitem(last=False)
            return plan

    def warm(self, example: Mapping[str, np.ndarray] | None = None) -> int:
        """Build every bucket's plan now and run each once on zeros (a GPU plan twice: its CUDA
        graph is captured on the second run), so that no request pays for compiling, loading
        native code, first-touching memory or capturing. Returns the plans built.
        ``example``: arrays giving the sizes of symbolic dimensions other than the batch."""
        base = {} if example is None else bind_symbols(self.graph, {k: np.shape(v) for k, v in example.items()})
        if self.batch_symbol is None:
            if self.graph.symbols() - set(base):
                return 0                              # no shape to build for until a request comes
            sizes = [None]
        else:
            missing = self.graph.symbols() - set(base) - {self.batch_symbol}
            if missing:
                raise UserError(f"to warm the buckets, give the size of {', '.join(sorted(missing))}")
            sizes = list(reversed(self.buckets))      # the largest first: its arena is shared
        with self.lock:
            for size in sizes:
                bindings = dict(base) if size is None else {**base, self.batch_symbol: size}
                plan = self.plan_for(bindings)
                zeros = {name: np.zeros(v.type.concrete(bindings), v.dtype) for name, v in self.graph.inputs.items()}
                for _ in range(2 if plan.graph_run is not None else 1):   # a GPU plan's second run captures it
                    plan.run(zeros)
                plan.synchronize()
        return len(sizes)

    def run(self, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        arrays = check_input_arrays(self.graph, arrays)
        bindings = bind_symbols(self.graph, {k: a.shape for k, a in arrays.items()})
        with self.lock:
            if self.batch_symbol is None:
                outs = self.plan_for(bindings).run(arrays)
                self.bucket_runs[None] += 1
                return {k: _host_copy(v) for k, v in outs.items()}
            n = bindings[self.batch_symbol]
            pieces: list[dict[str, np.ndarray]] = []
            start = 0
            while start < n:                      # n >= 1: bind_symbols refuses an empty batch
                rows = min(n - start, self.buckets[-1])
                size = next(b for b in self.buckets if b >= rows)
                chunk = {k: _pad_rows(a[start: start + rows], size) for k, a in arrays.items()}
                outs = self.plan_for({**bindings, self.batch_symbol: size}).run(chunk)
                self.bucket_runs[size] += 1
                pieces.append({k: self._slice_back(k, v, rows, size, n) for k, v in outs.items()})
                start += rows
        return {k: np.concatenate([p[k] for p in pieces]) if len(pieces) > 1 else pieces[0][k]
                for k in pieces[0]}

    def keeps_batch(self, output: str) -> bool:
        """Whether an output's leading dimension is the batch, so that padded rows can be cut
        off and the outputs of several runs joined along it."""
        lead = self.graph.outputs[output].shape[:1]
        return bool(lead) and isinstance(lead[0], Sym) and self.batch_symbol in lead[0].symbols

    def _slice_back(self, name: str, value: np.ndarray, rows: int, size: int, total: int) -> np.ndarray:
        batched = self.keeps_batch(name)
        if not batched and rows == size == total:
            return _host_copy(value)       # one exact bucket: nothing was padded
        if not batched:
            raise UserError(f"output '{name}' does not keep the batch dimension, so it cannot be "
                            "computed in buckets; pass --buckets with one size at least the batch")
        return _host_copy(value[:rows])


def _pad_rows(a: np.ndarray, size: int) -> np.ndarray:
    if a.shape[0] == size:
        return a
    pad = np.zeros((size - a.shape[0],) + a.shape[1:], dtype=a.dtype)
    return np.concatenate([a, pad])


def _host_copy(value) -> np.ndarray:
    """A numpy array of its own: outputs are views of an arena the next run overwrites (and on
    a GPU they live on the device)."""
    host = to_host(value)
    return host.copy() if host is value else host
