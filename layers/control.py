"""If and Loop: blocks of layers, lowered by the frontend (toolkit/frontend/blocks.py) to the
graph's ``if`` and ``loop`` ops. Only their parameter models live here; the nested layer lists
are validated like the net's own layers, each mistake at its own FILE:LINE:COL.

    - name: head                       # If: one of two blocks, chosen by a bool
      type: If
      condition: true                  # a constant (``--set``-able): the other block is removed
      bottom: flag                     # ... or a bool scalar blob, read when the net runs
      top: y                           # what both blocks must produce
      then: [LAYERS]
      else: [LAYERS]

    - name: rnn                        # Loop: the body once per step
      type: Loop
      scan: {x_t: x}                   # body blob <- one step of x [N, T, ...] (axis 1) per step
      carry: {h: h0}                   # body blob <- its first value; then what the body left in it
      trips: 8                         # the step count when nothing is scanned
      top: [h_last, hs]
      output: {h_last: h}              # top <- the carried blob's final value
      stack: {hs: h}                   # top <- the body blob of every step, stacked on axis 1
      body: [LAYERS]
"""
from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, Optional

from pydantic import Field

from schemas.base import Bool, LayerBase, Name, PositiveInt

from .registry import LayerError, layer


class IfParams(LayerBase):
    type: Literal["If"]
    condition: Optional[Bool] = None
    then: Annotated[list[Any], Field(min_length=1)]
    else_: Annotated[list[Any], Field(min_length=1, alias="else")]

    BOTTOMS: ClassVar[tuple[int, Optional[int]]] = (0, 1)
    TOPS: ClassVar[tuple[int, Optional[int]]] = (1, None)


class LoopParams(LayerBase):
    type: Literal["Loop"]
    scan: dict[Name, Name] = {}
    carry: dict[Name, Name] = {}
    trips: Optional[PositiveInt] = None
    output: dict[Name, Name] = {}
    stack: dict[Name, Name] = {}
    body: Annotated[list[Any], Field(min_length=1)]

    BOTTOMS: ClassVar[tuple[int, Optional[int]]] = (0, 0)
    TOPS: ClassVar[tuple[int, Optional[int]]] = (1, None)


BLOCK_TYPES = ("If", "Loop")


def _lowered_by_the_frontend(p, ctx, bottoms):
    raise LayerError(f"{p.type} is a block: toolkit/frontend/blocks.py lowers it")


layer(IfParams)(_lowered_by_the_frontend)
layer(LoopParams)(_lowered_by_the_frontend)
