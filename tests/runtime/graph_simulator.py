"""A stand-in for CUDA graphs (runtime/capture.py's backend) for the numpy stand-in for CuPy.

On a device, capturing runs the host's side of the run (Python, argument packing, any host
read, which fails) and records the device's side without running it; a launch runs only the
device's side, with every value the host computed at capture baked in. The stand-in's device
memory is numpy arrays, where the two sides cannot be told apart, so the simulator gets the same
effects another way:

- capture runs the run with host reads forbidden (``capture_guard``) and then puts back every
  array and every random generator as they were: nothing the capture did is left behind;
- a launch runs it again with host reads forbidden, every random generator first set back to
  its state at capture (a key drawn inside the graph is the capture's key on every launch),
  then forward to where it was (draws outside the graph go on as they would).

So a plan that forgot to launch after capturing loses a step; one that reads the device from
the host inside the graph fails at capture; one that draws a random key inside the graph, or
forgets the upload of one drawn outside it, repeats the capture's values on every step. Each
differs from the same plan run kernel by kernel, which the tests compare bit for bit. And a
launch after an array the capture wrote was freed is an error, as a replay would write into
memory the allocator may since have handed to someone else."""
from __future__ import annotations

import gc
import weakref

import numpy as np

from toolkit.backend.devices import capture_guard


def _owners() -> list[np.ndarray]:
    """Every writable numpy array that owns its memory and is reachable from a tracked object
    (numpy arrays themselves are not tracked: they are found as referents, views by their base)."""
    found: dict[int, np.ndarray] = {}
    for obj in gc.get_objects():
        for ref in gc.get_referents(obj):
            if isinstance(ref, np.ndarray):
                while isinstance(ref.base, np.ndarray):
                    ref = ref.base
                if ref.base is None and ref.flags.writeable and ref.size:
                    found[id(ref)] = ref
    return list(found.values())


def _generators() -> list[np.random.Generator]:
    return [obj for obj in gc.get_objects() if isinstance(obj, np.random.Generator)]


class SimulatedGraph:
    def __init__(self, run, generator_states):
        self.run = run
        self.generator_states = generator_states
        self.launches = 0


class SimulatedGraphs:
    made: list["SimulatedGraphs"] = []          # every backend made, for tests to count

    def __init__(self):
        self.warmed = 0
        self.graphs: list[SimulatedGraph] = []
        SimulatedGraphs.made.append(self)

    def warm(self, run) -> None:
        self.warmed += 1
        run()

    def capture(self, run) -> SimulatedGraph:
        arrays = [(a, a.copy()) for a in _owners()]
        generators = [(g, g.bit_generator.state) for g in _generators()]
        written = []
        try:
            with capture_guard(True):
                run()
        finally:
            for a, saved in arrays:
                if not np.array_equal(a, saved, equal_nan=a.dtype.kind in "fc"):
                    written.append(weakref.ref(a))
                np.copyto(a, saved)
            for g, state in generators:
                g.bit_generator.state = state
        graph = SimulatedGraph(run, generators)
        graph.written = written
        self.graphs.append(graph)
        return graph

    def launch(self, graph: SimulatedGraph) -> None:
        # the memory the graph writes must outlive it: freed, a replay would write over whatever
        # the allocator handed it to since
        if any(ref() is None for ref in graph.written):
            raise AssertionError("a buffer the captured graph writes was freed while the graph lives")
        now = [(g, g.bit_generator.state) for g, _ in graph.generator_states]
        for g, state in graph.generator_states:
            g.bit_generator.state = state
        try:
            with capture_guard(True):
                graph.run()
        finally:
            for g, state in now:
                g.bit_generator.state = state
        graph.launches += 1


def install() -> None:
    """Make every GPU plan built from now on capture through the simulator."""
    from toolkit.runtime import capture
    capture.backend_factory = lambda device: SimulatedGraphs()
