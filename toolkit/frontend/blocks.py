"""Lowering the If and Loop blocks of a net file (layers/control.py has their keys) to the
graph's ``if`` and ``loop`` ops.

A block's layers are validated and lowered like the net's own, into a body graph; they may read
any blob above the block (and a Loop's body its scanned steps and carried blobs), and their
weights belong to the net under their own layer names. Every mistake inside a block is reported
where it was written.
"""
from __future__ import annotations

import numpy as np

from ..ops.base import Builder
from ..ops.control import if_, loop


class BlockFailed(Exception):
    """A block's own layers had problems (already recorded at their locations)."""


def _layers_of(lowering, raw: list, block: tuple) -> list:
    from layers import LAYERS, net_model_for

    from .spec import validate_block
    layers, problems = validate_block(raw, block, lowering.positions, net_model_for({"layers": raw}),
                                      {t: d.params for t, d in LAYERS.items()})
    if problems:
        lowering.problems.extend(problems)
        raise BlockFailed()
    return layers


def _lower_into(lowering, layers, block: tuple, graph, blobs: dict) -> dict:
    inner = dict(blobs)
    if not lowering.lower_layers(layers, block, graph, inner):
        raise BlockFailed()
    return inner


def lower_block(lowering, layer, path: tuple, graph, blobs: dict, bottoms: list) -> list:
    if layer.type == "If":
        return _lower_if(lowering, layer, path, graph, blobs, bottoms)
    return _lower_loop(lowering, layer, path, graph, blobs)


def _lower_if(lowering, p, path, graph, blobs, bottoms):
    from layers.registry import LayerError
    b = Builder(graph, p.name)
    if p.condition is not None:
        if bottoms:
            raise LayerError("give the condition as condition: true|false or as a bottom, not both", "condition")
        cond = b.op("constant", value=np.array(bool(p.condition)))
    else:
        if not bottoms:
            raise LayerError("an If needs condition: true|false, or a bool scalar bottom read when the net runs",
                             "condition")
        cond = bottoms[0]
        if cond.shape != () or cond.dtype != "bool":
            raise LayerError(f"the condition bottom must be a bool scalar, got {cond.dtype} "
                             f"[{', '.join(map(str, cond.shape))}]", "bottom")
    branches = {"then": _layers_of(lowering, p.then, path + ("then",)),
                "else": _layers_of(lowering, p.else_, path + ("else",))}

    def branch(key):
        def build(bb: Builder):
            inner = _lower_into(lowering, branches[key], path + (key,), bb.graph, blobs)
            missing = [t for t in p.tops if t not in inner]
            if missing:
                raise LayerError(f"the {key} block produces no blob '{missing[0]}' (the If's tops must be "
                                 "produced by both blocks)", "top")
            return [inner[t] for t in p.tops]
        return build
    return if_(b, cond, branch("then"), branch("else"))


def _swap_first_axes(b: Builder, v):
    """[N, T, ...] <-> [T, N, ...]: blobs are batch-first, a loop steps along axis 0."""
    return b.op("transpose", v, perm=(1, 0) + tuple(range(2, v.rank)))


def _lower_loop(lowering, p, path, graph, blobs):
    from layers.registry import LayerError
    b = Builder(graph, p.name)
    for key in ("scan", "carry"):
        for inner_name, outer in getattr(p, key).items():
            if outer not in blobs:
                raise LayerError(f"{key}: '{inner_name}' starts from '{outer}', which no layer above produces", key)
    if not p.scan and p.trips is None:
        raise LayerError("a Loop needs scan: (blobs to step through) or trips: (a step count)", "trips")
    if p.scan and p.trips is not None:
        raise LayerError("give scan: or trips:, not both (a scanned loop runs once per step of its sequences)",
                         "trips")
    for top, name in p.output.items():
        if name not in p.carry:
            raise LayerError(f"output: '{top}' names '{name}', which is not a carried blob "
                             f"({', '.join(p.carry) or 'none'})", "output")
    named = list(p.output) + list(p.stack)
    if sorted(named) != sorted(p.tops) or len(set(named)) != len(named):
        raise LayerError(f"the tops [{', '.join(p.tops)}] must be exactly the names given by output: and stack: "
                         f"[{', '.join(named)}]", "top")
    sequences = []
    for inner_name, outer in p.scan.items():
        x = blobs[outer]
        if x.rank < 2:
            raise LayerError(f"scan: '{outer}' is [{', '.join(map(str, x.shape))}]; a scanned blob is batch-first "
                             "[N, T, ...] and the loop steps along T", "scan")
        sequences.append(_swap_first_axes(b, x))
    body = _layers_of(lowering, p.body, path + ("body",))
    carried, scanned = list(p.carry), list(p.scan)

    def step(bb: Builder, carries, steps):
        start = dict(blobs)
        start.update(zip(carried, carries))
        start.update(zip(scanned, steps))
        inner = _lower_into(lowering, body, path + ("body",), bb.graph, start)
        for top, name in p.stack.items():
            if name not in inner:
                raise LayerError(f"stack: '{top}' names '{name}', which the body does not produce", "stack")
        return [inner[n] for n in carried], [inner[n] for n in p.stack.values()]

    outs = loop(b, [blobs[o] for o in p.carry.values()], sequences, step, trips=p.trips)
    finals = dict(zip(carried, outs[:len(carried)]))
    values = {top: finals[name] for top, name in p.output.items()}
    for top, stacked in zip(p.stack, outs[len(carried):]):
        values[top] = _swap_first_axes(b, stacked) if stacked.rank >= 2 else stacked
    return [values[t] for t in p.tops]
