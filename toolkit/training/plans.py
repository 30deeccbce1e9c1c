"""The plan cache: the compiled plans of one graph, one per batch binding (an epoch's short last
batch, a sequence length's bucket), all sharing the weight arrays and the runtime state; and what tells a
run's progress of each plan's compile."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..backend.devices import CPU, Device
from ..ir.binding import bind_symbols
from ..ir.graph import Graph
from ..runtime.plan import Plan, RuntimeState
from .progress import Progress


@dataclass
class PlanCache:
    """Plans of one graph by batch binding, all sharing the weight arrays and the runtime state."""

    graph: Graph
    weights: dict[str, np.ndarray]
    runtime: RuntimeState
    device: Device = CPU
    reuse_memory: bool = True
    plans: dict = field(default_factory=dict)
    # told of each plan built: the input shapes and the seconds its build (the kernel compile) took
    on_build: Callable[[dict, float], None] | None = None

    def run(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        shapes = {k: np.shape(v) for k, v in arrays.items()}
        key = tuple(sorted(shapes.items()))
        build_s = None
        if key not in self.plans:
            started = time.perf_counter()
            bindings = bind_symbols(self.graph, shapes)
            self.plans[key] = Plan(self.graph, bindings, {k: self.weights[k] for k in self.graph.weights},
                                   self.device, self.runtime, reuse_memory=self.reuse_memory)
            build_s = time.perf_counter() - started
        outs = self.plans[key].run(arrays)
        if build_s is not None and self.on_build is not None:     # told once the plan has run: a
            self.on_build(shapes, build_s)                        # step that fails says only why
        return outs


# a plan built after the first of its kind (another batch size: an epoch's short last batch) is
# shown only when its compile took this long; with run-time sizes most take a few milliseconds
SHOWN_COMPILE_S = 0.5


def compile_reporter(progress: Progress, what: str) -> Callable[[dict, float], None]:
    """What a PlanCache calls after building a plan: the first build on a line of its own, later
    ones when they took a while, each left out of the iterations' speed."""
    built = []

    def report(shapes: dict, seconds: float) -> None:
        if not built:
            progress.compiled(what, seconds)
        else:
            rows = next((s[0] for s in shapes.values() if len(s)), None)
            progress.compiled(f"{what} for a batch of {rows}" if rows is not None else what, seconds,
                              show=seconds >= SHOWN_COMPILE_S)
        built.append(seconds)
    return report
