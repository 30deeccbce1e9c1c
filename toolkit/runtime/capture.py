"""Captured plans: a GPU plan's run recorded once as a CUDA graph and replayed with one launch.

A plan's run is a flat list of kernel calls; on a GPU each one costs the host tens of
microseconds (Python, CuPy's argument handling, the launch) while the device often needs a few.
Recorded once in a CUDA graph (stream capture), the whole run, weight copies included, is one
launch. What a replay needs is already in device memory: the inputs are copied into the plan's
own buffers before the launch, per-step scalars (the learning rate, Adam's bias corrections) are
inputs like the data, the loss scale and step counts are graph state, and random ops read their
per-call keys from device memory, written by their ``before_run`` hook outside the graph.

The life of a plan's run (``CapturedRun``):
  1. the first run is eager, on a stream and a memory pool of the plan's own: kernels compile,
     handles are made, and the pool fills with every temporary block the run needs;
  2. the second run is captured on that stream, with that pool (its blocks reused, nothing
     allocated from the device), then launched;
  3. every later run is one launch on the caller's stream.
The pool and every buffer the graph touches stay alive while the graph does: the plan holds
them, and the pool serves nothing else.

A plan is not captured when one of its kernels must read the device from the host during the
run (an index check, a loop's stopping condition, a collective staged through host memory), or
runs on the host; ``capture_blocker`` says which, before anything runs, and `toolkit compile
--explain` prints it. A capture that fails anyway (the driver refuses a call) leaves the plan
eager, with a one-line notice naming the cause. ``TOOLKIT_CUDA_GRAPHS=0`` turns capture off.

The graph calls go through a small backend that the device gives (``Device.graph_backend``:
CUDA's through CuPy), so that tests can put a simulator in its place.
"""
from __future__ import annotations

from typing import Callable

from ..backend.devices import CaptureUnsafe, Device, capture_guard
from ..backend.placement import layer_of_scope
from ..errors import notice
from ..settings import current, off_text


def graphs_enabled() -> bool:
    """Whether GPU plans are captured: the ``cuda_graphs`` setting (``TOOLKIT_CUDA_GRAPHS``)."""
    return current().cuda_graphs


def _device_graphs(device: Device):
    return device.graph_backend()


# Tests replace this with a simulator; a plan asks it for its device's graphs when it is built.
backend_factory: Callable[[Device], object] = _device_graphs


def capture_blocker(devices, steps, entries, asked: bool | None = None) -> str | None:
    """Why a plan on ``devices`` with these steps is not captured, or None when it can be.
    ``asked``: False where the plan's builder turned capture off (a control-flow body, which is
    captured inside its caller's graph; a benchmark's kernel-by-kernel baseline)."""
    if asked is False:
        return "capture is off for this plan"
    if not graphs_enabled():
        return off_text("cuda_graphs")
    hosts = [str(d) for d in devices if not d.graphs]
    if hosts:
        return f"it runs on {', '.join(sorted(hosts))}, which has no CUDA graphs"
    for node in steps:
        why = entries[id(node)].host_sync_of(node)
        if why:
            return f"layer '{layer_of_scope(node.scope)}': its {node.op} kernel {why}"
    return None


class CapturedRun:
    """``run`` (the plan's calls and weight copies) warmed, captured and replayed (see above)."""

    def __init__(self, device: Device, run: Callable[[], None]):
        self.run = run
        self.backend = backend_factory(device)
        self.graph = None
        self.runs = 0
        self.failed: str | None = None

    @property
    def captured(self) -> bool:
        return self.graph is not None

    def __call__(self) -> None:
        if self.graph is not None:
            self.backend.launch(self.graph)
            return
        if self.failed is not None:
            self.run()
            return
        self.runs += 1
        if self.runs == 1:
            with capture_guard(False):
                self.backend.warm(self.run)
            return
        try:
            with capture_guard(True):
                graph = self.backend.capture(self.run)
        except CaptureUnsafe as e:
            self._give_up(str(e))
            return
        except Exception as e:        # the driver refused a call: the plan stays as it was
            self._give_up(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            return
        self.graph = graph
        self.backend.launch(graph)

    def _give_up(self, why: str) -> None:
        self.failed = why
        notice(f"a GPU plan could not be captured as a CUDA graph ({why}); it runs kernel by kernel",
               once=why)
        self.run()
