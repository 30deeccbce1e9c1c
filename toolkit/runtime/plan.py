"""A compiled plan: the graph resolved for one set of concrete input shapes into a flat list of
kernel calls on preallocated buffers. Pure nodes on constants are evaluated once at build time.

``Plan.run`` copies inputs in, runs the calls, applies weight updates and returns views of the
output buffers, valid until the next run.

``Plan`` is the face; each job is a unit of its own, run in this order and handing on one
``PlanBuild``:
  execution.py   threads, branches side by side or ops split, run-time sizes (``Execution``)
  build.py       shapes, kernels chosen, build-time nodes evaluated, weights placed (``PlanBuild``)
  layout.py      the memory plan of the build, its arenas, each value's array
  calls.py       one call per step: native (linked) or numpy (split across the cores)
  scheduling.py  the calls in order, in waves of threads, on CUDA streams, or a thread per host
                 device (device_groups.py: ``cpu:0`` and ``cpu:1`` as two core groups)
  running.py     inputs in, the calls run, the weights' updates copied back; whether a GPU
                 plan's run is recorded as one CUDA graph (capture.py records and replays it)
``memory_figures`` makes the build and the memory plan alone, so it cannot disagree with a plan.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Mapping

import numpy as np

from ..backend.devices import CPU, Device
from ..backend.placement import Placement
from ..ir.graph import Graph, Node
from .build import PlanBuild, build_plan
from .calls import CallMaker
from .device_groups import overlapping_devices
from .execution import RuntimeState, choose_execution
from .layout import ValueViews, plan_build_memory
from .running import Runner, choose_capture
from .scheduling import schedule

__all__ = ["Plan", "PlanBuild", "PlanOptions", "RuntimeState", "memory_figures"]


def memory_figures(graph: Graph, bindings: Mapping[str, int], device: Device | str = CPU,
                   reuse_memory: bool = True) -> dict[str, int]:
    """The memory plan of ``graph`` under ``bindings`` as a Plan would make it (peak, naive and
    lower-bound bytes), from the same build and memory planning, without building kernels,
    evaluating constants or allocating the arena."""
    built = build_plan(graph, bindings, None, Placement.of(graph, device))
    return plan_build_memory(built, list(graph.outputs), reuse_memory).summary()


@dataclass(frozen=True)
class PlanOptions:
    """What a caller may ask of a plan beyond its graph, sizes, weights, device and state; each
    also a keyword argument of ``Plan`` (``Plan(g, b, w, threads=1)``). None: the default."""

    outputs: list[str] | None = None      # the outputs kept (default: all the graph's)
    threads: int | None = None            # default: the cores this process may use
    native: bool | None = None            # generated C kernels (default: toolchain.available())
    # branches side by side (threads on the host, CUDA streams on a GPU) rather than each op
    # split across the cores (default: the TOOLKIT_CONCURRENT switch)
    concurrent: bool | None = None
    # no kernel overwrites an input buffer, so a caller may fill some inputs once and run many
    # times (a loop body's invariants)
    keep_inputs: bool = False
    # allocate(device, nbytes): where each device's arena comes from (default: a new buffer);
    # plans that never run at the same time may share one (InferSession's buckets)
    allocate: Callable | None = None
    reuse_memory: bool = True             # the memory planner's buffer reuse (--disable plan_memory)
    # record a GPU plan's run as a CUDA graph after its first run (default: on where it can be;
    # False for a body that runs inside another plan)
    capture: bool | None = None
    # the kernels of builders registered for it read the symbolic dimensions when they run
    # rather than as compiled-in numbers, so the plans of other lengths reuse the compiled
    # library (False: every size compiled in; default: on unless TOOLKIT_RUN_TIME_SIZES=0)
    run_time_sizes: bool | None = None


class Plan:
    """The face of the units above: built once for its sizes, then ``run`` (or ``execute`` on
    what ``input_views`` hold) as often as wanted. What callers read: ``steps``, ``calls`` and
    ``impls`` (one per step), ``memory`` (its plan), ``schedule``, ``capture_blocker``; the
    units themselves are ``build``, ``execution``, ``made`` (the calls) and ``runner``."""

    def __init__(self, graph: Graph, bindings: Mapping[str, int], weights: Mapping[str, np.ndarray],
                 device: Device | str = CPU, runtime: RuntimeState | None = None,
                 options: PlanOptions | None = None, **asked):
        """``device``: where the nodes run that no layer places elsewhere. ``runtime``: the state
        its kernels share with other plans (a fresh one by default). ``options``, or any of its
        fields as keyword arguments (``asked``): see ``PlanOptions``."""
        options = replace(options or PlanOptions(), **asked)
        self.graph = graph
        self.bindings = dict(bindings)
        placement = Placement.of(graph, device)
        self.execution = choose_execution(placement.devices(graph), self.bindings, options.threads,
                                          options.concurrent, options.run_time_sizes, options.reuse_memory, runtime,
                                          running=overlapping_devices(graph, placement, self.bindings))
        self.build = built = build_plan(graph, self.bindings, weights, placement, self.execution, options.keep_inputs)
        out_names = list(graph.outputs) if options.outputs is None else options.outputs
        # concurrent waves need values of different branches apart: a buffer handed from one
        # branch to another would order them (concurrency.py)
        self.memory = plan_build_memory(built, out_names, options.reuse_memory and not self.execution.concurrent,
                                        allocate=options.allocate)
        views = ValueViews(built, self.memory)
        self.made = made = CallMaker(built, self.memory, views, self.execution).make(options.native)
        self.steps, self.calls, self.impls = made.steps, made.calls, made.impls
        self.schedule = schedule(built, self.memory, made, self.execution)
        self.runner = Runner(built, self.memory, views, made, self.schedule.run_calls, out_names,
                             self.execution.threads)
        self.input_views, self.output_views = self.runner.input_views, self.runner.output_views
        self.runner.graph_run, self.capture_blocker = choose_capture(
            built.devices, built.device, made.steps, built.entries, options.capture, made.blockers,
            self.runner.device_run)

    @property
    def graph_run(self):
        """The captured run of a GPU plan (capture.py), or None where it is not captured."""
        return self.runner.graph_run

    @property
    def native_source(self) -> str | None:
        """The C of the plan's linked native calls, or None where none was built."""
        return self.made.native_source

    @property
    def peak_bytes(self) -> int:
        return self.memory.peak_bytes

    @property
    def captured(self) -> bool:
        """Whether the run is now one launch of a CUDA graph (after the first run)."""
        graph_run = self.runner.graph_run
        return graph_run is not None and graph_run.captured

    def synchronize(self) -> None:
        """Wait for every device of the plan to finish its queued work (GPU launches return
        before the kernels run): what a timer must do before reading the clock."""
        for device in self.build.devices:
            device.synchronize()

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.runner.run_inputs(inputs, None)
        return self.output_views

    def profile(self, inputs: Mapping[str, np.ndarray]) -> list[tuple[Node, float]]:
        """One run with each call timed (seconds)."""
        timings: list[tuple[Node, float]] = []
        self.runner.run_inputs(inputs, timings)
        return timings

    def execute(self, timings: list | None = None, nested: bool = False) -> None:
        """Run the calls on what the input buffers (``input_views``) hold now. ``nested``: called
        by a kernel of another plan (a loop body), which has already set the BLAS threads."""
        self.runner.execute(timings, nested)
