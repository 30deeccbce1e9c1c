"""A net's weights: which file holds them (given, a ``zoo:NAME`` net's published ones, an ONNX
model's initializers), every weight started by its filler, and a weights file read and checked
against the weights the net declares (by key and shape). ``Net``'s weight methods call these.
"""
from __future__ import annotations

import math
import os

import numpy as np

from ..errors import UserError
from ..hostmem import human_bytes, too_big
from ..ir.graph import Weight
from .resolver import ZOO_PREFIX, zoo_model


def default_weights(net, given: str | None, flag: str = "--weights") -> str | None:
    """``given``, or for a ``zoo:NAME`` net its published weights (fetched if need be); None
    for a net without a single weight (activations, pooling, reshapes), which needs no file."""
    if given:
        return given
    if net.file.endswith(".onnx"):
        return net.file               # an ONNX model's weights are its initializers
    if net.zoo is not None:
        weights = zoo_model(net.resolve, f"{ZOO_PREFIX}{net.zoo.name}", need_weights=True).weights
        if weights is not None:
            return str(weights)
        raise UserError(f"zoo:{net.zoo.name} publishes no weights; pass {flag} FILE")
    if not net.declared:
        return None
    raise UserError(f"{flag} FILE is required (a zoo:NAME net uses its published weights by default)")


def weights_file(net, given: str) -> str:
    """A weights path as given, or the file of ``zoo:NAME``'s published weights."""
    if not given.startswith(ZOO_PREFIX):
        return given
    weights = zoo_model(net.resolve, given, need_weights=True).weights
    if weights is None:
        raise UserError(f"{given} publishes no weights")
    return str(weights)


def every_weight(net) -> dict[str, Weight]:
    """Every weight of the net as its phases declare it: the train phase's, then those only the
    test or infer phase has. Read-only: the Weight objects are the net's kept lowerings' own."""
    weights = dict(net.kept_lowering("train").graph.weights)
    for phase in ("test", "infer"):
        for key, w in net.kept_lowering(phase).graph.weights.items():
            weights.setdefault(key, w)
    return weights


def init_weights(net, seed: int = 0, dtype: str | None = None) -> dict[str, np.ndarray]:
    """Every weight started by its filler, after checking the machine can hold them all."""
    from ..weights import fill
    rng = np.random.default_rng(seed)
    weights = every_weight(net)
    shapes = {key: tuple(int(d) for d in w.value.shape) for key, w in weights.items()}
    dtypes = {key: np.dtype(dtype or w.value.dtype) for key, w in weights.items()}
    sizes = {key: math.prod(shapes[key]) * dtypes[key].itemsize for key in weights}
    why = too_big(sum(sizes.values()))
    if why is not None:
        key = max(sizes, key=sizes.get)
        raise UserError(f"layer '{weights[key].layer}': weight '{key}' of shape [{', '.join(map(str, shapes[key]))}] "
                        f"({dtypes[key]}) is {human_bytes(sizes[key])}; the net's weights need "
                        f"{human_bytes(sum(sizes.values()))}, {why}")
    return {key: fill(w.init, shapes[key], dtypes[key], w.fan_in, w.fan_out, rng) for key, w in weights.items()}


def load_weights(net, path: str | None, allow_missing: bool = False, seed: int = 0,
                 dtype: str | None = None, say=None) -> dict[str, np.ndarray]:
    """Weights from a file (or ``zoo:NAME``'s published ones), checked against the net by key
    and shape. ``allow_missing`` (Caffe's copy_from, PyTorch's strict=False): copy the weights
    whose key and shape match, start the others from their fillers, ignore the file's extra
    keys; ``say`` (a callable taking one line) is then given a table of what was not copied.
    ``path`` None: a net without weights (see ``default_weights``). The weights of the net's
    ``fresh_layers`` start from their fillers, the file's arrays of theirs left out (in the table)."""
    from ..weights import load_weights as read_weights
    if path is None and not net.declared:
        return {}
    path = weights_file(net, path)
    if path.endswith(".onnx"):
        return _onnx_weights(net, path, seed, dtype, allow_missing)
    reports: list = []
    fresh = frozenset(key for key, (_shape, layer) in net.declared.items() if layer in net.fresh_layers)
    loaded = read_weights(path, net.declared, allow_missing, report=reports, fresh=fresh)
    out = init_weights(net, seed, dtype) if allow_missing or fresh else {}
    for key, (_shape, _layer) in net.declared.items():
        if key in loaded:
            out[key] = np.asarray(loaded[key], dtype=dtype or "float32", order="C")
    if say is not None and reports and not reports[0].complete:
        for line in reports[0].lines(path):
            say(line)
    return out


def _onnx_weights(net, path: str, seed: int, dtype: str | None, allow_missing: bool) -> dict[str, np.ndarray]:
    """The weights of the ONNX layers that read ``path``: its initializers (the parameters'
    fillers read them); with ``allow_missing`` the other layers start from their fillers."""
    others = sorted({layer for _key, (_shape, layer) in net.declared.items()
                     if not _reads(net.spec, layer, path, os.path.dirname(net.file))})
    if others and not allow_missing:
        raise UserError(f"--weights {path}: an ONNX file holds the weights of the ONNX layers that read it; "
                        f"layer '{others[0]}' needs a weights file (.safetensors or .npz), or --allow-missing to "
                        "start it from its fillers")
    return init_weights(net, seed, dtype)


def _reads(spec, layer_name: str, path: str, base_dir: str) -> bool:
    """Whether the layer is an ONNX layer of the model file ``path``."""
    layer = next((x for x in spec.layers if x.name == layer_name), None)
    if layer is None or layer.type != "ONNX":
        return False
    own = layer.file if os.path.isabs(layer.file) else os.path.join(base_dir or ".", layer.file)
    return os.path.realpath(own) == os.path.realpath(path)
