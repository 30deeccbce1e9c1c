"""PassContext: what one run of the pass pipeline shares besides the graph, so that the graph
itself carries only the program.

A pass is a function ``(graph, ctx) -> bool`` that changes ``graph`` in place and says whether
it changed anything (as XLA's passes do); the pipeline repeats the canonical passes until none
does. ``ctx.note`` records one line per change for ``toolkit compile --explain``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..backend.devices import CPU, Device, parse_device
from ..backend.placement import Placement


@dataclass
class PassContext:
    device: Device = CPU                 # where the graph's nodes run unless their layer says
    disabled: frozenset = frozenset()    # names of the passes switched off
    notes: list = field(default_factory=list)
    check: bool = False                  # verify the graph after every pass (tests, compile)

    def __post_init__(self):
        self.device = parse_device(self.device)
        self.disabled = frozenset(self.disabled)

    def note(self, text: str) -> None:
        """Record one change a pass made (shown by ``toolkit compile --explain``)."""
        self.notes.append(text)

    def placement(self, graph) -> Placement:
        """Where ``graph``'s nodes run: their layer's device, else the context's."""
        return Placement.of(graph, self.device)
