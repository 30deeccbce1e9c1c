"""The processors this process may use and how busy the machine is, as the system reports them:
what the thread count starts from (``usable_cores``) and what the team of a running plan adapts
to (``runnable_tasks``, ``own_run_delay_ns``; runtime/team.py).

A container's CPU quota is not in the affinity mask: a pod limited to one core still sees every
host core in ``sched_getaffinity``, and a team of threads sized by the mask is throttled in turn
by the quota. So the quota is read too, from the cgroup the process is in (v2 ``cpu.max``, v1
``cpu.cfs_quota_us`` over ``cpu.cfs_period_us``), every ancestor's included (a parent's limit
binds its children).
"""
from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def affinity_cores() -> int:
    """The processors the scheduler may run this process on."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def _read(path: Path | str) -> str | None:
    try:
        with open(path) as f:
            return f.read(256).strip()
    except (OSError, UnicodeDecodeError):
        return None


def _membership(proc_cgroup: str) -> dict[str, str]:
    """controller -> path from /proc/self/cgroup; the v2 unified hierarchy is under ""."""
    found = {}
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _hid, controllers, path = parts
        for controller in (controllers.split(",") if controllers else [""]):
            found[controller] = path
    return found


def _ancestry(mount: Path, path: str) -> list[Path]:
    """The cgroup's folder and each ancestor's, inside ``mount``. A container often mounts its
    own cgroup as the root, while /proc/self/cgroup names it by the host's path: where that path
    is not under the mount, the mount itself is the cgroup."""
    parts = [p for p in path.split("/") if p]
    folders = [mount.joinpath(*parts[:k]) for k in range(len(parts), -1, -1)]
    existing = [f for f in folders if f.is_dir()]
    return existing or [mount]


def _v2_limit(folder: Path) -> float | None:
    text = _read(folder / "cpu.max")
    if not text:
        return None
    fields = text.split()
    if len(fields) != 2 or fields[0] == "max":
        return None
    try:
        quota, period = int(fields[0]), int(fields[1])
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def _v1_limit(folder: Path) -> float | None:
    quota, period = _read(folder / "cpu.cfs_quota_us"), _read(folder / "cpu.cfs_period_us")
    try:
        q, p = int(quota or ""), int(period or "")
    except ValueError:
        return None
    return q / p if q > 0 and p > 0 else None


def cgroup_cpu_limit(proc_cgroup: str | None = None, root: Path = CGROUP_ROOT) -> float | None:
    """The CPU quota in cores (1.5 = one and a half), the tightest along the cgroup's ancestry,
    or None where no quota is set or the system has no cgroups."""
    if proc_cgroup is None:
        proc_cgroup = _read(Path("/proc/self/cgroup")) or ""
    member = _membership(proc_cgroup)
    limits = []
    if "" in member and (root / "cgroup.controllers").exists():             # v2, unified at the root
        limits += [_v2_limit(f) for f in _ancestry(root, member[""])]
    elif "" in member and (root / "unified" / "cgroup.controllers").exists():   # hybrid layout
        limits += [_v2_limit(f) for f in _ancestry(root / "unified", member[""])]
    for controller in ("cpu", "cpu,cpuacct"):
        if "cpu" in member:
            mount = root / controller
            if mount.is_dir():
                limits += [_v1_limit(f) for f in _ancestry(mount, member["cpu"])]
                break
    limits = [x for x in limits if x is not None]
    return min(limits) if limits else None


def usable_cores() -> int:
    """Threads worth running: the affinity mask, capped by the CPU quota. A fractional quota
    rounds down (at least one): a second thread on half a core is throttled with the first,
    which is the slowdown this is here to avoid."""
    cores = affinity_cores()
    limit = cgroup_cpu_limit()
    if limit is not None:
        cores = min(cores, max(1, math.floor(limit + 1e-9)))
    return cores


def runnable_tasks() -> int | None:
    """The machine's tasks running or waiting to run now, this thread included (the fourth field
    of /proc/loadavg); None where the system does not say."""
    text = _read("/proc/loadavg")
    try:
        return int(text.split()[3].split("/")[0]) if text else None
    except (IndexError, ValueError):
        return None


def own_run_delay_ns() -> int | None:
    """Nanoseconds this process's threads have spent ready to run but waiting for a processor,
    summed over its threads (the second field of each thread's schedstat); None where the
    kernel does not keep the figure."""
    total, seen = 0, False
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return None
    for tid in tasks:
        # a plain string, not a Path: a Path interns each part (sys.intern), and each sample's
        # thread ids, interned and dropped again, used up the interpreter's table of interned
        # strings, which CPython then rebuilds whole (megabytes in a process that has imported
        # much), inside whichever plan run took the sample
        text = _read(f"/proc/self/task/{tid}/schedstat")
        if not text:
            continue
        fields = text.split()
        if len(fields) >= 2 and fields[1].isdigit():
            total += int(fields[1])
            seen = True
    return total if seen else None
