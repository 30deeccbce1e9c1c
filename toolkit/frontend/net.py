"""``Net``: a net file loaded and checked in every phase, that hands out per-phase graphs.

Loading validates the whole file at once (schema, wiring, shapes in every phase, duplicate
names, outputs, shares), so one run reports every problem. Each phase is lowered once per
lowering key (``lowering_key``: the phase, the float type, the bucketed dimensions...): the net keeps that
lowering and hands out copies, since passes change the graphs they are given. The weights
(which file, fillers, reading a file against the net) live in net_weights.py.
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np

from ..errors import Problem, SpecError, UserError, did_you_mean
from ..ir.graph import Graph, copy_graph
from ..ir.live import keep_live
from ..ops.base import Builder
from . import net_weights
from .compose import compose
from .lower import OBJECTIVE, Lowered, lower_phase, lowering_key
from .quant_checks import quantization_problems
from .resolver import ZOO_PREFIX, Resolver, zoo_model
from .spec import duplicate_layer_names, from_command_line, validate_net
from .train_checks import train_problems
from .yaml_loader import Positions

PHASES = ("train", "test", "infer")


class Net:
    def __init__(self, spec, positions: Positions, file: str):
        self.spec = spec
        self.positions = positions
        self.file = file
        self.declared: dict[str, tuple] = {}      # weight key -> (shape, layer), every phase
        self.raw: dict = {}                       # the merged net as plain data (what render prints)
        self.files: list[str] = [file]            # this file, then the bases it is built on
        self.bases: list[str] = []                # its bases as written in it
        self.zoo = None                           # the zoo model when loaded as zoo:NAME
        self.zoo_files: dict[str, str] = {}       # real path of each zoo model's net it reads -> zoo:NAME
        self.resolve: Resolver | None = None      # what found it (and finds its weights)
        # layers whose weights start from their fillers whatever a weights file holds under their
        # names: a new head (`toolkit train --new-head`), a layer a derived net deletes and writes anew
        self.fresh_layers: frozenset[str] = frozenset()
        self._lowerings: dict[tuple, Lowered] = {}     # lowering_key -> the lowering, never handed out
        self._memo: dict = {}                          # what layers keep across lowerings (LowerContext.memo)
        problems = duplicate_layer_names({"layers": [layer.model_dump() for layer in spec.layers]}, positions)
        problems += self._check_losses()
        problems += self._check_passes()
        checked = {}
        for phase in PHASES:
            # the phases lowered in order share one declared dict: a test layer may share a
            # weight a train layer declares
            checked[phase] = self.kept_lowering(phase, declared=self.declared)
            problems += checked[phase].problems
        problems += self._check_outputs(checked["infer"])
        problems += self._check_buckets()
        problems += quantization_problems(spec, positions,
                                          None if checked["infer"].problems else checked["infer"].blobs)
        problems += train_problems(spec, positions, *(None if checked[p].problems else checked[p].graph
                                                      for p in ("train", "test")))
        unique = list({(str(p.location), p.message): p for p in problems}.values())
        if unique:
            unique.sort(key=lambda p: (p.location.line, p.location.col) if p.location else (0, 0))
            raise SpecError(*unique)

    @classmethod
    def load(cls, path: str, overrides: list[tuple[tuple, Any]] = (), resolve: Resolver | None = None,
             text: str | None = None) -> "Net":
        """A net file, or ``zoo:NAME``, with its bases merged and ``--set`` overrides applied.
        ``resolve`` finds the files of ``zoo:`` names (the net's and its bases'): the model zoo's
        (``toolkit.zoo.resolve.load_net`` passes it)."""
        from layers import LAYERS, NetSpec, net_model_for
        model = None
        if text is None and path.endswith(".onnx"):
            return cls.load_onnx(path, overrides, resolve)
        if text is None and path.startswith(ZOO_PREFIX):
            model = zoo_model(resolve, path)
            path = str(model.net)
        composed = compose(path, resolve, text)
        try:
            spec, raw, positions = validate_net(composed.data, composed.positions, NetSpec,
                                                {k: d.params for k, d in LAYERS.items()}, overrides,
                                                narrow=net_model_for)
            net = cls(spec, positions, path)
        except SpecError as error:
            error = _with_wiring_problems(error)
            raise SpecError(*[from_command_line(composed.explain(p)) for p in error.problems]) from None
        net.raw = raw
        net.files = composed.files
        net.bases = composed.bases
        net.fresh_layers = frozenset(composed.replaced)
        net.zoo = model
        net.zoo_files = {**composed.zoo, **({os.path.realpath(model.net): f"{ZOO_PREFIX}{model.name}"}
                                            if model is not None else {})}
        net.resolve = resolve
        return net

    @classmethod
    def load_onnx(cls, path: str, overrides: list[tuple[tuple, Any]] = (), resolve: Resolver | None = None) -> "Net":
        """An ONNX model (whatever its file's name) as the net of one ONNX layer: its problems
        name the model as given, not a place in a net file the user never wrote."""
        try:
            return cls.load(path, overrides, resolve, _onnx_net_text(path))
        except SpecError as e:
            raise UserError(*[_onnx_message(p.message, path) for p in e.problems]) from None

    # -- weights (net_weights.py) -------------------------------------------------------------
    def weights_or_published(self, given: str | None) -> str | None:
        """``given``, else a ``zoo:NAME`` net's published weights, else None (the caller's default)."""
        return given or (self.default_weights(None) if self.zoo is not None else None)

    def default_weights(self, given: str | None, flag: str = "--weights") -> str | None:
        return net_weights.default_weights(self, given, flag)

    def init_weights(self, seed: int = 0, dtype: str | None = None) -> dict[str, np.ndarray]:
        return net_weights.init_weights(self, seed, dtype)

    def load_weights(self, path: str | None, allow_missing: bool = False, seed: int = 0,
                     dtype: str | None = None, say=None) -> dict[str, np.ndarray]:
        return net_weights.load_weights(self, path, allow_missing, seed, dtype, say)

    def weights_file(self, given: str) -> str:
        return net_weights.weights_file(self, given)

    @property
    def name(self) -> str:
        return self.spec.name

    # -- checks that span layers -------------------------------------------------------------
    def _check_losses(self) -> list[Problem]:
        problems = []
        seen = {layer.name for layer in self.spec.layers}
        if self.spec.train and self.spec.train.losses:
            for j, name in enumerate(self.spec.train.losses):
                if name not in seen:
                    problems.append(Problem(f"train.losses names no layer '{name}'{did_you_mean(name, seen)}",
                                            self.positions.locate(("train", "losses", j), prefer_key=False)))
        return problems

    def _check_passes(self) -> list[Problem]:
        from ..passes.pipeline import pass_names
        if not self.spec.optimize:
            return []
        known = pass_names()
        return [Problem(f"optimize.disable: unknown pass '{name}'{did_you_mean(name, known)} "
                        f"(the passes are: {', '.join(known)})",
                        self.positions.locate(("optimize", "disable", j), prefer_key=False))
                for j, name in enumerate(self.spec.optimize.disable) if name not in known]

    def _check_buckets(self) -> list[Problem]:
        """The net file's ``buckets`` name symbolic dimensions of its inputs, and the layers reading
        a padded one can keep the padding out (lowered with those buckets: layers/padded.py)."""
        if self.spec.gears is not None:       # given besides buckets (schemas/net.py)
            return [Problem("gears is the old name of buckets, and buckets is given too: keep buckets",
                            self.positions.locate(("gears",)))]
        buckets = self.spec.buckets or {}
        # a file may still say ``gears``, the old name: its problems name that key
        key = "gears" if ("gears",) in self.positions.keys else "buckets"
        symbols = {d for i in self.spec.inputs.values() for d in i.shape if isinstance(d, str)}
        problems = [Problem(f"{key}: the inputs have no symbolic dimension '{name}'{did_you_mean(name, symbols)} "
                            f"(they have: {', '.join(sorted(symbols)) or 'none'})",
                            self.positions.locate((key, name)))
                    for name in buckets if name not in symbols]
        padded = frozenset(name for name in buckets if name in symbols)
        if padded and not problems:
            for phase in ("infer", "train"):
                if any(phase in layer.phases for layer in self.spec.layers):
                    problems += self.kept_lowering(phase, bucketed=padded).problems
        return problems

    def _loss_layers(self) -> set[str] | None:
        if self.spec.train and self.spec.train.losses:
            return set(self.spec.train.losses)
        return None

    def kept_lowering(self, phase: str, dtype: str | None = None, sync_batchnorm: bool = False,
                      bucketed: frozenset[str] = frozenset(), declared: dict | None = None) -> Lowered:
        """The net's own lowering of one phase, lowered on first request: to read, never to
        change (``lower`` hands out copies). ``declared``: the weights dict the lowering adds
        to (by default a copy of the net's: a layer may share a weight of another phase's layer)."""
        key = lowering_key(self.spec, phase, dtype, sync_batchnorm, frozenset(bucketed))
        if key not in self._lowerings:
            self._lowerings[key] = lower_phase(
                self.spec, self.positions, phase, dtype, dict(self.declared) if declared is None else declared,
                self._loss_layers(), sync_batchnorm, frozenset(bucketed), self._memo)
        return self._lowerings[key]

    def lower(self, phase: str, dtype: str | None = None, sync_batchnorm: bool = False,
              bucketed: frozenset[str] = frozenset()) -> Lowered:
        """A lowering of one phase that the caller may change (a copy of the kept one).
        ``bucketed``: symbolic dimensions whose inputs come padded, with lengths (frontend/lower.py)."""
        kept = self.kept_lowering(phase, dtype, sync_batchnorm, bucketed)
        values: dict = {}
        graph = copy_graph(kept.graph, values)
        return Lowered(graph, {name: values.get(v.id, v) for name, v in kept.blobs.items()}, list(kept.problems))

    def _check_outputs(self, infer: Lowered) -> list[Problem]:
        if not self.spec.outputs:
            return []
        blobs = infer.blobs
        # a top of an infer layer that failed to lower is missing because of that layer's own
        # (already reported) problem: no second error for the output that names it
        declared_tops = {t for layer in self.spec.layers if "infer" in layer.phases for t in layer.tops}
        problems = []
        for j, name in enumerate(self.spec.outputs):
            if name not in blobs and name not in declared_tops:
                problems.append(Problem(f"output '{name}' is not produced in phase infer"
                                        f"{did_you_mean(name, blobs)}",
                                        self.positions.locate(("outputs", j), prefer_key=False)))
        return problems

    # -- graphs ------------------------------------------------------------------------------
    def graph(self, phase: str, dtype: str | None = None, outputs: list[str] | None = None,
              sync_batchnorm: bool = False, bucketed: frozenset[str] = frozenset()) -> Graph:
        """The forward graph of ``phase``, cut to what its outputs need. Train graphs output each loss top and the
        loss_weight-weighted objective under OBJECTIVE. ``sync_batchnorm``: BatchNorm's batch
        statistics are sums over the ranks of a data-parallel job (optim/data_parallel.py).
        ``bucketed``: symbolic dimensions (a sequence length T) whose inputs come padded up to a
        bucket, each example's real length in the input ``lengths_input(T)``."""
        lowered = self.lower(phase, dtype, sync_batchnorm, bucketed)
        if lowered.problems:
            raise SpecError(*lowered.problems)
        graph, blobs = lowered.graph, lowered.blobs
        graph.layer_devices = {layer.name: layer.device for layer in self.spec.layers if layer.device}
        # what the quantize pass rewrites: the infer phase of a net with a quantization section,
        # and its test phase, which measures the int8 net (toolkit test, a published card's metric)
        graph.quantization = self.spec.quantization if phase in ("infer", "test") else None
        graph.precision = self.spec.precision
        if outputs is None and phase == "infer" and self.spec.outputs:
            outputs = list(self.spec.outputs)
        if outputs is not None:
            missing = [o for o in outputs if o not in blobs]
            if missing:
                raise UserError(f"no blob named {', '.join(missing)} in phase {phase}")
            graph.outputs = {o: blobs[o] for o in outputs}
        if phase == "train":
            if not graph.losses:
                deploy = not any(layer.type.endswith("Loss") for layer in self.spec.layers)
                raise UserError(f"{self.file}: the train phase has no loss layer (a type ending in 'Loss', "
                                "or train.losses)" + ("; to fine-tune a deploy net's classifier, `toolkit train "
                                                      "NET --weights W --new-head NUM_CLASSES` adds one"
                                                      if deploy else ""))
            b = Builder(graph, "objective")
            terms = [b.scale(blobs[t], w) for t, w in graph.losses.items()]
            graph.outputs.update({t: blobs[t] for t in graph.losses})
            graph.outputs[OBJECTIVE] = b.add_all(terms)
        # the phase's graph is what its outputs need: its inputs are those they read (an infer
        # graph takes no label), for every consumer, the pipeline's or not (ir/live.py)
        keep_live(graph)
        return graph


def _with_wiring_problems(error: SpecError) -> SpecError:
    """Schema problems plus the wiring and shape problems of the layers that did validate, so
    that one run reports both kinds."""
    partial = getattr(error, "partial", None)
    if partial is None:
        return error
    problems = list(error.problems)
    for phase in PHASES:
        problems += lower_phase(partial, error.positions, phase, None, {}, None).problems
    unique = list({(str(p.location), p.message): p for p in problems}.values())
    unique.sort(key=lambda p: (p.location.line, p.location.col) if p.location else (0, 0))
    return SpecError(*unique)


def _onnx_net_text(path: str) -> str:
    """The net file of an ONNX model given where a net is expected."""
    import os

    from ..importers.onnx.files import loaded_model
    from ..importers.onnx.netfile import net_text
    return net_text(loaded_model(path).model, os.path.basename(path), _onnx_layer_name(path))


def _onnx_message(message: str, path: str) -> str:
    """A problem of the one ONNX layer of a model's net file, said of the model as the user named
    it: without the layer, and its path rather than the ``file:`` key's name relative to it."""
    import os
    message = message.removeprefix(f"layer '{_onnx_layer_name(path)}' (ONNX): ")
    name = os.path.basename(path) + ":"
    return path + message[len(name) - 1:] if message.startswith(name) else message


def _onnx_layer_name(path: str) -> str:
    from ..importers.onnx.files import loaded_model
    from ..importers.onnx.netfile import model_name
    return model_name(loaded_model(path).model, path)
