"""Lowering a validated NetSpec to the graph of one phase: bottoms resolved to the latest top
of that name above (in-place tops included), each layer lowered by the catalog, shapes inferred
as nodes are added. Every problem is collected with the location of the key it concerns.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from schemas.base import weight_owner

from ..errors import Location, Problem, did_you_mean
from ..ir.binding import lengths_input
from ..ir.dims import Sym, as_dim, format_dim
from ..ir.graph import FLOAT_DTYPES, Graph, TensorType, Value, Weight
from ..ops.base import Builder, ShapeError
from .blocks import BlockFailed, lower_block
from .yaml_loader import Positions

OBJECTIVE = "@objective"   # the train graph's total loss; '@' cannot appear in a blob name


class LowerContext:
    """What a layer lowering may use: the builder, the phase, weight and state declarations."""

    def __init__(self, graph: Graph, layer, phase: str, float_dtype: str, declared: dict[str, tuple],
                 root: Graph | None = None, sync_batchnorm: bool = False, base_dir: str = ".",
                 bucketed: "Bucketed | None" = None, memo: dict | None = None):
        # weights and state updates belong to the net's graph (``root``); the nodes go to
        # ``graph``, which is a block's body inside an If or Loop
        self.graph = root if root is not None else graph
        self.in_block = root is not None and root is not graph
        self.layer = layer
        self.phase = phase
        self.float_dtype = float_dtype
        # data-parallel training: BatchNorm takes its statistics over every rank
        self.sync_batchnorm = sync_batchnorm
        self.base_dir = base_dir          # the net file's folder: a layer's relative file names start there
        self.b = Builder(graph, layer.name)
        self._declared = declared         # every weight key -> (shape, layer) across phases
        self.param_count = 0
        self.param_names: list[str] = []        # the parameters the layer asked for, in order
        self.bucketed = bucketed or Bucketed(frozenset(), None)
        # what a layer worked out once and may reuse when the same net lowers another phase (an
        # ONNX layer's converted model): one dict per net, keyed by the layer's own keys
        self.memo = memo if memo is not None else {}

    # -- buckets over a sequence length (layers/padded.py) -------------------------------------
    def bucketed_symbol(self, dim) -> str | None:
        """The bucketed symbol ``dim`` is (padded up to a bucket, real lengths in ``lengths``), or None."""
        from layers.padded import bucketed_symbol
        return bucketed_symbol(dim, self.bucketed.symbols)

    def lengths(self, symbol: str) -> Value:
        """Each example's real length along the bucketed dimension ``symbol``: [N] in the net's float
        dtype (exact below 2^24), from the graph input ``lengths_input(symbol)``."""
        return self.bucketed.lengths(symbol, self.graph, self.float_dtype, self.b)

    def valid_positions(self, symbol: str, rank: int, position_axis: int, batch_axis: int) -> Value:
        """1 at the real positions along ``symbol``, 0 in the padding: a float mask of rank
        ``rank`` with N on ``batch_axis``, the positions on ``position_axis`` and 1 elsewhere."""
        b = self.b
        dim = Sym.named(symbol)
        shape = [1] * rank
        shape[position_axis] = dim
        position = b.op("iota", shape=tuple(shape), axis=position_axis, dtype=self.float_dtype)
        lengths = self.lengths(symbol)
        at = [1] * rank
        at[batch_axis] = lengths.shape[0]
        # real where length >= position + 1
        return b.op("ge_mask", b.reshape(lengths, tuple(at)), b.add(position, b.scalar(1.0, self.float_dtype)))

    def real_mask(self, v: Value, axes=None) -> Value | None:
        """1 at ``v``'s real positions along its bucketed dimensions (among ``axes``; default all), 0
        in the padding, broadcastable to ``v``; None where none of them is a bucketed dimension. The
        batch must lead ``v``: each example has its own length."""
        from layers.registry import LayerError
        mask = None
        for a in range(v.rank) if axes is None else axes:
            symbol = self.bucketed_symbol(v.shape[a])
            if symbol is None:
                continue
            if a == 0 or self.bucketed.batch is None or v.shape[0] != self.bucketed.batch:
                raise LayerError(f"a value padded along the bucketed dimension {symbol} needs the batch first, got "
                                 f"{self.fmt(v)}", "bottom")
            one = self.valid_positions(symbol, v.rank, a, 0)
            mask = one if mask is None else self.b.mul(mask, one)
        return mask

    @staticmethod
    def fmt(v: Value) -> str:
        return "[" + ", ".join(format_dim(d) for d in v.shape) + "]"

    def _multiplier(self, key: str) -> float:
        """This parameter's lr_mult / decay_mult: one number for all, or one per parameter."""
        values = getattr(self.layer, key, None)
        if values is None:
            return 1.0
        if isinstance(values, (int, float)):
            return float(values)
        if self.param_count >= len(values):
            from layers.registry import LayerError
            raise LayerError(f"{len(values)} {key} values given, but the layer has more parameters", key)
        return float(values[self.param_count])

    def param(self, pname: str, shape: tuple, fan_in: int = 1, fan_out: int = 1,
              default_filler: dict | None = None, filler_key: str | None = None) -> Value:
        from layers.registry import LayerError
        layer = self.layer
        owner = weight_owner(layer, pname)
        key = f"{owner}.{pname}"
        self.param_names.append(pname)
        lr_mult = self._multiplier("lr_mult")
        decay_mult = self._multiplier("decay_mult")
        self.param_count += 1
        if owner != layer.name:
            if key not in self.graph.weights and key in self._declared:
                # the owner is a layer of another phase (Caffe's test net sharing the train
                # net's layer of the same name): its weight, as it declared it
                declared_shape, owner_layer = self._declared[key]
                value = Value(TensorType(tuple(declared_shape), self.float_dtype), name=key)
                self.graph.weights[key] = Weight(key, value, True, {"type": "xavier", "variance_norm": "fan_in"},
                                                 lr_mult, decay_mult, owner_layer, fan_in, fan_out)
            if key not in self.graph.weights:
                raise LayerError(f"share: layer '{owner}' above has no parameter '{pname}' to share", "share")
            existing = self.graph.weights[key]
            if tuple(existing.value.shape) != tuple(shape):
                raise LayerError(f"share: '{key}' has shape {self.fmt(existing.value)} but this layer needs "
                                 f"[{', '.join(map(str, shape))}]", "share")
            return existing.value
        filler_key = filler_key or ("weight_filler" if pname == "weight" else "bias_filler")
        filler = getattr(layer, filler_key, None)
        init = filler.model_dump() if filler is not None else (default_filler or {"type": "xavier",
                                                                                   "variance_norm": "fan_in"})
        value = Value(TensorType(tuple(shape), self.float_dtype), name=key)
        self.graph.weights[key] = Weight(key, value, True, init, lr_mult, decay_mult, layer.name, fan_in, fan_out)
        self._declared.setdefault(key, (tuple(shape), layer.name))
        return value

    def state(self, pname: str, shape: tuple, fill: float, init: dict | None = None) -> Value:
        """A weight no gradient updates (running statistics, a fixed matrix): ``fill`` everywhere,
        or the filler ``init``."""
        key = f"{weight_owner(self.layer, pname)}.{pname}"
        if key in self.graph.weights:
            return self.graph.weights[key].value
        value = Value(TensorType(tuple(shape), self.float_dtype), name=key)
        self.graph.weights[key] = Weight(key, value, False, init or {"type": "constant", "value": fill},
                                         0.0, 0.0, self.layer.name)
        self._declared.setdefault(key, (tuple(shape), self.layer.name))
        return value

    def update(self, pname: str, value: Value) -> None:
        if self.in_block:
            from layers.registry import LayerError
            raise LayerError(f"{self.layer.type} updates its state in phase {self.phase}, which a layer "
                             "inside an If or Loop block cannot do")
        key = f"{weight_owner(self.layer, pname)}.{pname}"
        self.graph.updates[key] = value


class Bucketed:
    """The bucketed dimensions of a lowering (symbols other than the batch whose inputs are padded)
    and the one lengths value per symbol that every layer reads."""

    def __init__(self, symbols: frozenset[str], batch: Sym | None):
        self.symbols = symbols
        self.batch = batch
        self._lengths: dict[str, Value] = {}

    def lengths(self, symbol: str, root: Graph, float_dtype: str, b: Builder) -> Value:
        if symbol not in self._lengths:
            name = lengths_input(symbol)
            if name not in root.inputs:
                root.inputs[name] = Value(TensorType((self.batch,), "int64"), name=name)
            self._lengths[symbol] = Builder(root, "lengths").op("cast", root.inputs[name], dtype=float_dtype)
        return self._lengths[symbol]


def _batch_of(spec) -> Sym | None:
    """The symbol leading every input's shape (the batch), if one does."""
    leads = {as_dim(i.shape[0]) for i in spec.inputs.values() if i.shape}
    lead = leads.pop() if len(leads) == 1 else None
    return lead if isinstance(lead, Sym) and len(lead.symbols) == 1 else None


def _count_problem(what: str, n: int, bounds: tuple) -> str | None:
    lo, hi = bounds
    if n < lo or (hi is not None and n > hi):
        if hi is None:
            want = f"at least {lo}"
        elif lo == hi:
            want = str(lo)
        else:
            want = f"{lo} to {hi}"
        return f"takes {want} {what}{'s' if want != '1' else ''}, got {n}"
    return None


@dataclass
class Lowered:
    """A phase's graph before output selection, the latest value of every blob name, and the
    problems found while building it."""

    graph: Graph
    blobs: dict[str, Value]
    problems: list[Problem]


def lowering_key(spec, phase: str, float_dtype: str | None, sync_batchnorm: bool = False,
                 bucketed: frozenset[str] = frozenset()) -> tuple:
    """What a lowering of ``spec`` depends on besides the spec: two calls of ``lower_phase``
    with equal keys build equal graphs. ``float_dtype`` matters only through the input dtypes
    and the float type of the parameters it gives (None and the net's own float type are one)."""
    dtypes = tuple(float_dtype if float_dtype and i.dtype in FLOAT_DTYPES else i.dtype for i in spec.inputs.values())
    declared_floats = [i.dtype for i in spec.inputs.values() if i.dtype in FLOAT_DTYPES]
    net_float = float_dtype or (declared_floats[0] if declared_floats else "float32")
    return phase, dtypes, net_float, bool(sync_batchnorm), frozenset(bucketed)


def lower_phase(spec, positions: Positions, phase: str, float_dtype: str | None,
                declared: dict[str, tuple], loss_layers: set[str] | None = None,
                sync_batchnorm: bool = False, bucketed: frozenset[str] = frozenset(),
                memo: dict | None = None) -> Lowered:
    """The graph of ``phase`` (default outputs: tops nothing consumes) and the problems found.
    ``loss_layers``: names of the objective's layers (None: every layer whose type ends in Loss).
    ``bucketed``: symbolic dimensions (not the batch) whose inputs come padded up to a bucket, each
    example's real length in the input ``lengths_input(symbol)`` (layers/padded.py). ``memo``: what the layers
    may keep for the same net's other lowerings (``LowerContext.memo``)."""
    graph = Graph(phase)
    blobs: dict[str, Value] = {}
    for name, inp in spec.inputs.items():
        dtype = inp.dtype
        if float_dtype and dtype in FLOAT_DTYPES:
            dtype = float_dtype
        v = Value(TensorType(tuple(as_dim(d) for d in inp.shape), dtype), name=name)
        graph.inputs[name] = v
        blobs[name] = v
    declared_floats = [i.dtype for i in spec.inputs.values() if i.dtype in FLOAT_DTYPES]
    net_float = float_dtype or (declared_floats[0] if declared_floats else "float32")
    batch = _batch_of(spec)
    padded = frozenset(bucketed)
    problems: list[Problem] = []
    if padded and batch is None:
        problems.append(Problem(f"buckets over {', '.join(sorted(padded))} need a batch dimension leading every "
                                "input (each example has its own length)", positions.locate(("inputs",))))
    if batch is not None and batch.symbols & padded:
        padded -= batch.symbols                     # the batch's buckets need no lengths
    lowering = Lowering(graph, positions, phase, net_float, declared, loss_layers, sync_batchnorm,
                        Bucketed(padded, batch), memo)
    lowering.problems += problems
    lowering.lower_layers(spec.layers, ("layers",), graph, blobs)
    # one name per value, the latest top; a top that only renames an input (Dropout outside
    # train, a phase-skipped layer) is an output too, as Caffe's would be
    graph.outputs = {name: v for name, v in blobs.items()
                     if v.id not in lowering.consumed and name not in graph.inputs
                     and lowering.exported.get(v.id) == name}
    return Lowered(graph, blobs, lowering.problems)


class Lowering:
    """Lowers lists of layers in order: the net's, and (through frontend/blocks.py) the blocks
    of If and Loop layers into body graphs. Problems are collected with their locations."""

    def __init__(self, root: Graph, positions: Positions, phase: str, float_dtype: str,
                 declared: dict[str, tuple], loss_layers: set[str] | None, sync_batchnorm: bool = False,
                 bucketed: Bucketed | None = None, memo: dict | None = None):
        self.root = root
        self.memo = memo if memo is not None else {}
        self.bucketed = bucketed or Bucketed(frozenset(), None)
        self.sync_batchnorm = sync_batchnorm
        self.positions = positions
        self.phase = phase
        self.float_dtype = float_dtype
        self.declared = declared          # every weight key -> (shape, layer) across phases
        self.loss_layers = loss_layers
        self.problems: list[Problem] = []
        self.consumed: set[int] = set()
        self.exported: dict[int, str] = {}    # value id -> the latest top name it was given
        self.broken: set[str] = set()         # tops of layers that failed: their users stay quiet

    def lower_layers(self, layers, prefix: tuple, graph: Graph, blobs: dict[str, Value]) -> bool:
        """Lower ``layers`` (written at document path ``prefix``) into ``graph``, reading and
        updating ``blobs``; returns whether every layer lowered."""
        from layers import LAYERS
        from layers.control import BLOCK_TYPES
        from layers.registry import LayerError
        positions = self.positions
        phase = self.phase
        problems = self.problems
        broken = self.broken
        clean = True

        def where(i: int, key: str | None = None, value: bool = False) -> Location:
            path = prefix + (i,) + ((key,) if key else ())
            return positions.locate(path, prefer_key=not value)

        all_tops: dict[str, list[tuple[int, Any]]] = {}
        for i, layer in enumerate(layers):
            for t in layer.tops:
                all_tops.setdefault(t, []).append((i, layer))

        for i, layer in enumerate(layers):
            if phase not in layer.phases:
                continue
            if getattr(layer, "broken", False):      # failed validation, already reported
                broken.update(layer.tops)
                clean = False
                continue
            ldef = LAYERS[layer.type]
            label = f"layer '{layer.name}' ({layer.type})"
            bad_counts = False
            for what, items, bounds, key in (("bottom", layer.bottoms, ldef.params.BOTTOMS, "bottom"),
                                             ("top", layer.tops, ldef.params.TOPS, "top")):
                msg = _count_problem(what, len(items), bounds)
                if msg:
                    problems.append(Problem(f"{label} {msg}", where(i, key) if key in _keys(layer) else where(i)))
                    bad_counts = True
            if bad_counts:
                broken.update(layer.tops)
                clean = False
                continue
            bottoms, missing = [], False
            for j, bname in enumerate(layer.bottoms):
                if bname in blobs:
                    bottoms.append(blobs[bname])
                    continue
                missing = True
                if bname in broken:
                    continue
                loc = positions.locate(prefix + (i, "bottom") + ((j,) if isinstance(layer.bottom, list) else ()),
                                       prefer_key=False)
                why = _dangling(bname, i, phase, all_tops, blobs, positions, prefix, layers)
                problems.append(Problem(f"{label}: {why}", loc))
            if missing:
                broken.update(layer.tops)
                clean = False
                continue
            if self.bucketed.symbols:
                from layers.padded import padding_problem
                why = padding_problem(layer, bottoms, self.bucketed.symbols, phase)
                if why:
                    problems.append(Problem(f"{label}: {why}", where(i)))
                    broken.update(layer.tops)
                    clean = False
                    continue
            ctx = LowerContext(graph, layer, phase, self.float_dtype, self.declared, self.root, self.sync_batchnorm,
                               os.path.dirname(self.positions.file or "") or ".", self.bucketed, self.memo)
            try:
                if layer.type in BLOCK_TYPES:
                    tops = lower_block(self, layer, prefix + (i,), graph, blobs, bottoms)
                else:
                    tops = ldef.lower(layer, ctx, bottoms)
                for key in ("lr_mult", "decay_mult"):
                    vals = getattr(layer, key, None)
                    if isinstance(vals, list) and len(vals) != ctx.param_count:
                        raise LayerError(f"{len(vals)} {key} values for {ctx.param_count} parameters", key)
                share = getattr(layer, "share", None)
                unknown = sorted(set(share) - set(ctx.param_names)) if isinstance(share, dict) else []
                if unknown:
                    raise LayerError(f"share names no parameter {', '.join(map(repr, unknown))} of this layer (its "
                                     f"parameters: {', '.join(ctx.param_names) or 'none'})", "share")
            except BlockFailed:
                broken.update(layer.tops)
                clean = False
                continue
            except LayerError as e:
                loc = where(i, e.key) if e.key and e.key in _keys(layer) else where(i)
                problems.append(Problem(f"{label}: {e}", loc))
                broken.update(layer.tops)
                clean = False
                continue
            except ShapeError as e:
                problems.append(Problem(f"{label}: {e}", where(i)))
                broken.update(layer.tops)
                clean = False
                continue
            for v in bottoms:
                self.consumed.add(v.id)
            for tname, v in zip(layer.tops, tops):
                v.name = v.name or tname
                blobs[tname] = v
                # a layer that passes its bottom through (Flatten to the same shape, Dropout outside
                # train) hands the value on under its top's name: unread, that top is an output
                self.consumed.discard(v.id)
                self.exported[v.id] = tname
            is_loss = layer.name in self.loss_layers if self.loss_layers is not None else ldef.type.endswith("Loss")
            if is_loss:
                if graph is not self.root:
                    problems.append(Problem(f"{label}: a loss layer cannot be inside an If or Loop block", where(i)))
                    clean = False
                    continue
                weights = layer.loss_weight if isinstance(layer.loss_weight, list) else [layer.loss_weight] * len(tops)
                for tname, lw in zip(layer.tops, weights):
                    graph.losses[tname] = 1.0 if lw is None else float(lw)
        return clean


def _keys(layer) -> set[str]:
    return set(layer.model_fields_set) | {"name", "type"}


def _dangling(bname: str, index: int, phase: str, all_tops, blobs, positions: Positions,
              prefix: tuple = ("layers",), layers=()) -> str:
    producers = all_tops.get(bname, [])
    below = [(j, producer) for j, producer in producers if j > index]
    if below:
        j, other = below[0]
        where = positions.locate(prefix + (j,))
        line = where.line if where.file == positions.file else where   # a base file's layer: FILE:LINE:COL
        if not positions.merged:
            return (f"bottom '{bname}' is produced only below, by layer '{other.name}' (line {line}); "
                    "a bottom must be produced above the layer that uses it")
        # a net built on bases: a layer merged into a base keeps the base's place and a new one goes
        # at the end, whatever the lines say; `after:` places the producer just above this layer
        place = (f"after: {layers[index - 1].name}" if index > 0 else f"before: {layers[index].name}") \
            if len(layers) > index else None
        hint = f"; place it with `{place}` on layer '{other.name}'" if place else ""
        return (f"bottom '{bname}' is produced by layer '{other.name}' ({'line ' if isinstance(line, int) else ''}"
                f"{line}), which comes after this layer in the merged net (layer {j + 1} against {index + 1}: a layer "
                f"merged into a base keeps its place there, a new one goes at the end){hint}")
    other_phase = [(j, producer) for j, producer in producers if j < index and phase not in producer.phases]
    if other_phase:
        j, other = other_phase[0]
        return (f"bottom '{bname}' is not produced in phase {phase}: layer '{other.name}' runs only in "
                f"phase {', '.join(other.phases)}")
    if any(j == index for j, _l in producers):
        return (f"unknown bottom '{bname}': no layer above produces it (this layer writes it in place, "
                f"so it must exist before){did_you_mean(bname, list(blobs) + list(all_tops))}")
    return f"unknown bottom '{bname}'{did_you_mean(bname, list(blobs) + list(all_tops))}"
