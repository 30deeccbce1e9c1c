"""Intra-op parallelism by splitting the batch: a large batch-parallel op runs as one kernel per
core, each on its own rows, while the BLAS library is held to one thread for the whole run.

Why not leave the cores to the BLAS library: numpy's im2col copies, pooling and transposes run
on one core, and a GEMM that reads a matrix just written on that core pays to move it to the
other one. Splitting the batch keeps each core on its own rows from the first copy to the last
write, which made LeNet's convolutions about 1.5x faster on 2 cores. Weight gradients split too:
each core sums its own rows and the shares are added. Mixing in the BLAS library's own threads
is worse than either: they spin after each call and take the core our helper needs.
"""
from __future__ import annotations

import queue
import threading
from typing import Callable

from ..hostcpu import usable_cores
from ..ir.dims import Sym
from ..ir.graph import Node
from ..ops.base import get_op
from ..settings import current

# Below this much work per op, handing rows to another core costs more than it saves.
MIN_SPLIT_FLOPS = 4_000_000
MIN_SPLIT_BYTES = 1 << 19
# A GEMM needs more: half the rows take well over half the time at small row counts (each core
# still streams the whole weight). Measured on 2-core EPYC, single-threaded BLAS, rows split in
# two: [64,128]x[128,384] (6.3 MFLOP) 84 us whole vs 133 us split, [64,256]x[256,256] (8.4) 111
# vs 131, [64,256]x[256,512] (16.8) 218 vs 203, [64,800]x[800,500] (51) 659 vs 485.
MIN_SPLIT_GEMM_FLOPS = 16_000_000


def default_threads() -> int:
    """The ``threads`` setting (``TOOLKIT_THREADS``), else the cores this process may use: its
    affinity mask, capped by its cgroup's CPU quota (hostcpu.py), shared among a data-parallel
    job's local ranks."""
    chosen = current().threads
    if chosen is not None:
        return chosen
    cores = usable_cores()
    # the ranks of a data-parallel job on this machine share its cores: more threads than cores
    # (each rank's MPI progress polls while it waits) made a LeNet step 100x slower
    from ..distributed.launcher import local_ranks
    return max(1, cores // local_ranks())


class Blas:
    """The BLAS libraries' thread count, through threadpoolctl (made for exactly this); one
    shared instance, since finding the libraries scans the process."""

    _instance: "Blas | None" = None

    def __init__(self):
        try:
            from threadpoolctl import ThreadpoolController
            self.libs = [c for c in ThreadpoolController().lib_controllers if c.user_api == "blas"]
        except Exception:   # no controllable BLAS: splitting still helps the numpy-only parts
            self.libs = []
        self.default = max((lib.num_threads for lib in self.libs), default=1)

    @classmethod
    def shared(cls) -> "Blas":
        if cls._instance is None:
            cls._instance = cls()
        return cls._instance

    def set_threads(self, n: int) -> None:
        for lib in self.libs:
            lib.set_num_threads(n)

    def restore(self) -> None:
        self.set_threads(self.default)


class Workers:
    """n-1 persistent helper threads; the calling thread does the first share of each job.
    ``team`` (set before a run, team.py) is how many of the n take part: with fewer, each takes
    several shares in turn; with one, the caller runs them all and no helper wakes."""

    _shared: dict[int, "Workers"] = {}
    _lock = threading.Lock()

    def __init__(self, n: int):
        self.n = n
        self.team = n
        self.jobs = [queue.SimpleQueue() for _ in range(n - 1)]
        self.done: queue.SimpleQueue = queue.SimpleQueue()
        for q in self.jobs:
            threading.Thread(target=self._loop, args=(q,), daemon=True).start()

    @classmethod
    def shared(cls, n: int) -> "Workers":
        with cls._lock:
            if n not in cls._shared:
                cls._shared[n] = cls(n)
            return cls._shared[n]

    def _loop(self, jobs: queue.SimpleQueue) -> None:
        while True:
            job = jobs.get()
            try:
                job()
                self.done.put(None)
            except BaseException as e:  # handed back to the caller, which re-raises it
                self.done.put(e)

    def run(self, shares: list[Callable[[], None]], then: Callable[[], None] | None = None) -> None:
        team = max(1, min(self.team, self.n, len(shares)))
        if team == 1:
            for share in shares:
                share()
        else:
            groups = shares if team == len(shares) else [_InTurn(shares[k::team]) for k in range(team)]
            self._run_groups(groups)
        if then is not None:
            then()

    def _run_groups(self, groups: list[Callable[[], None]]) -> None:
        for q, group in zip(self.jobs, groups[1:]):
            q.put(group)
        error = None
        try:
            groups[0]()
        except BaseException as e:
            error = e
        for _ in groups[1:]:
            result = self.done.get()
            error = error or result
        if error is not None:
            raise error


class _InTurn:
    """Several shares run one after another on one thread."""

    def __init__(self, shares: list[Callable[[], None]]):
        self.shares = shares

    def __call__(self) -> None:
        for share in self.shares:
            share()


def split_kind(node: Node) -> tuple[str, list[bool]] | None:
    """How a node may be split by batch rows: ("rows", batched) when each output row depends on
    the same rows of the batched inputs; ("sum", batched) when the output is a sum over the batch
    (weight gradients: each share sums its rows, then the shares are added); None otherwise."""
    opdef = get_op(node.op)
    if len(node.outputs) != 1 or not opdef.pure:
        return None
    out = node.outputs[0]
    ins = node.inputs
    if opdef.batch_sum or (node.op == "matmul" and node.attrs["trans_a"] and not node.attrs["trans_b"]
                           and all(v.rank == 2 for v in ins)):
        lead = ins[0].shape[0] if ins and ins[0].shape else None
        if isinstance(lead, Sym) and all(v.shape[0] == lead for v in ins):
            return "sum", [True] * len(ins)
        return None
    if not opdef.batch_rows:
        return None
    if node.op in ("softmax", "log_softmax") and node.attrs["axis"] % out.rank == 0:
        return None
    if not out.shape or not isinstance(out.shape[0], Sym):
        return None
    lead = out.shape[0]
    flags = [v.rank == out.rank and isinstance(v.shape[0], Sym) and v.shape[0] == lead for v in ins]
    return ("rows", flags) if any(flags) else None


def _is_gemm(node: Node) -> bool:
    return node.op == "matmul" or (node.op == "fused_epilogue" and node.attrs["head"] == "matmul")


def worth_splitting(node: Node, flops: int, out_bytes: int) -> bool:
    if _is_gemm(node):
        return flops >= MIN_SPLIT_GEMM_FLOPS
    return flops >= MIN_SPLIT_FLOPS or out_bytes >= MIN_SPLIT_BYTES
