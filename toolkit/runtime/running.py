"""Running a plan: the inputs copied (or uploaded) into its buffers, its calls run on as many
threads as the machine leaves free (team.py) with the BLAS library held to one, the weights'
updates copied back where the memory plan put them elsewhere, or, for a captured GPU plan, all
of that after the copies as one launch: ``choose_capture`` decides whether a plan's run is
recorded (capture.py says what stops it, and records and replays it).
"""
from __future__ import annotations

import time
from typing import Callable

import numpy as np

from ..backend.placement import layer_of_scope
from .build import PlanBuild
from .calls import Calls
from .capture import CapturedRun, capture_blocker
from .layout import ValueViews
from .memory import MemoryPlan
from .team import team_for


class Runner:
    """One plan's run. ``input_views``/``output_views``: the graph's inputs' and outputs' arrays
    (the outputs valid until the next run); ``copy_updates``: (weight array, its update) pairs
    the memory plan could not make the same storage; ``graph_run``: the captured run, if any."""

    def __init__(self, built: PlanBuild, memory: MemoryPlan, views: ValueViews, calls: Calls,
                 run_calls: list, out_names: list[str], threads: int):
        graph = built.graph
        self.calls, self.run_calls, self.threads = calls, run_calls, threads
        self.team = team_for(threads)         # fewer threads while the cores are taken (team.py)
        self.input_views = {name: views(v) for name, v in graph.inputs.items()}
        self.host_inputs = [(k, b) for k, b in self.input_views.items() if isinstance(b, np.ndarray)]
        self.device_inputs = [(k, b, built.device.uploader(b)) for k, b in self.input_views.items()
                              if not isinstance(b, np.ndarray)]
        self.output_views = {n: views(graph.outputs[n]) for n in out_names}
        self.copy_updates = []
        fixed = built.fixed
        for name, upd in graph.updates.items():
            weight = fixed[graph.weights[name].value.id]
            if memory.storage_of[upd.id] is not weight:
                self.copy_updates.append((weight.external, views(upd)))
        self.graph_run: CapturedRun | None = None

    def use_team(self) -> None:
        """Run on as many threads as the machine leaves free now (team.py)."""
        team, calls = self.team, self.calls
        size = self.threads if team is None else team.current()     # the team is sized for the plan's threads
        # the workers, and a library whose source another plan also built, are shared: the
        # size is set on every run, skipping the call into C where it is already so (this
        # method runs before every plan run: a LeNet batch-1 run takes 8 us in all)
        if calls.workers is not None:
            calls.workers.team = size
        for linked in calls.linked:
            if linked.lib.tk_team != size:
                linked.set_team(size)

    def run_inputs(self, inputs, timings: list | None) -> None:
        """Copy ``inputs`` in and run (``timings``: each call timed into it, never captured)."""
        for name, buf in self.host_inputs:
            np.copyto(buf, inputs[name], casting="same_kind")
        for name, _buf, upload in self.device_inputs:     # one copy each, queued: from the host or the device
            upload(inputs[name])
        if timings is None and self.graph_run is not None:
            for hook in self.calls.before_run:
                hook()
            self.graph_run()                  # the calls and the weight copies, one launch
            return
        self.execute(timings)
        self.copy_back()

    def copy_back(self) -> None:
        for target, source in self.copy_updates:
            target[...] = source

    def device_run(self) -> None:
        """What a captured graph holds: every call, then the weight copies."""
        for call in self.run_calls:
            call()
        self.copy_back()

    def execute(self, timings: list | None = None, nested: bool = False) -> None:
        """Run the calls on what the input buffers hold now (see ``Plan.execute``)."""
        self.use_team()
        calls: Calls = self.calls
        for hook in calls.before_run:
            hook()
        if nested:
            for call in self.run_calls:
                call()
            return
        blas = calls.blas
        if blas is not None:
            blas.set_threads(1)               # the plan's own threads split the work (parallel.py)
        try:
            if timings is None:
                for call in self.run_calls:
                    call()
            else:
                for node, call in zip(calls.steps, calls.calls):
                    start = time.perf_counter()
                    call()
                    timings.append((node, time.perf_counter() - start))
        finally:
            if blas is not None:
                blas.restore()


def choose_capture(devices, device, steps, entries, asked: bool | None, call_blockers,
                   run: Callable[[], None]) -> tuple[CapturedRun | None, str | None]:
    """(the captured run of a plan's ``run``, or None; why not, for --explain, or None). A plan
    on the host has nothing to capture and nothing to say; a GPU plan is captured unless
    ``capture_blocker`` or one of its numpy kernels (``call_blockers``: (node, why or None))
    says why not."""
    if not any(d.graphs for d in devices):
        return None, None
    why = capture_blocker(devices, steps, entries, asked)
    why = why or next((f"layer '{layer_of_scope(n.scope)}': its {n.op} kernel {fn_why}"
                       for n, fn_why in call_blockers if fn_why), None)
    if why is not None:
        return None, why
    return CapturedRun(device, run), None
