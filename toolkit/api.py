"""The Python API (docs/spec.md section 7): ``toolkit.load(net, weights=..., device=...)`` gives a Model
whose ``infer(**arrays)`` runs the infer phase through the batch buckets (docs/spec.md section 5).

It validates and compiles as `toolkit infer` does and raises ``toolkit.UserError`` with the
message the command would print. A Model is safe to share between threads: its session runs one
batch at a time (the bucket plans share one arena), and every output is an array of its own.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, Sequence, Union

import numpy as np

from . import settings
from .errors import UserError
from .frontend.net import Net as LoadedNet
from .ir.graph import FLOAT_DTYPES, TRAIN_DTYPES
from .runtime.session import DEFAULT_BUCKETS, InferSession

if TYPE_CHECKING:
    from .training.start import RunResult


@dataclass(frozen=True)
class TensorInfo:
    """An input or output of the infer phase, as ``Model.inputs`` and ``Model.outputs`` list them.

    Attributes:
        name: the blob's name in the net file (the key ``Model.infer`` takes or returns).
        dtype: its numpy dtype's name, such as ``"float32"``.
        shape: its shape, with None for a symbolic dimension (the batch first).
        symbols: each dimension's symbol (``"N"``, ``"T"``), or None for a fixed one.
    """
    name: str
    dtype: str
    shape: tuple[int | None, ...]
    symbols: tuple[str | None, ...]


class Model:
    """A net's infer phase compiled with its weights frozen in: call ``infer`` on it. Make one with
    ``toolkit.load``, not directly.

    A Model is safe to share between threads: its session runs one batch at a time, and every
    output is an array of its own.

    Attributes:
        name: the net's name.
        inputs: the infer phase's inputs (``TensorInfo``: name, dtype, shape, symbols).
        outputs: the infer phase's outputs, likewise.
        net: the checked net it was compiled from (a ``toolkit.Net``).
        transform: the input transform applied to every input of ``infer`` (the one the net was
            trained with), or None where ``toolkit.load(..., transform=False)`` turned it off.
    """

    def __init__(self, net, session: InferSession, inputs: list[TensorInfo], outputs: list[TensorInfo],
                 transform=None):
        self.net = net
        self.name = net.spec.name
        self.session = session
        self.inputs = inputs
        self.outputs = outputs
        # the net's input transform (train.data's scale and mean), applied to every input given
        self.transform = transform

    @property
    def device(self) -> str:
        """The device it runs on, as ``toolkit.load`` took it: ``"cpu"``, ``"gpu:1"``, ..."""
        return self.session.device.name

    @property
    def buckets(self) -> tuple[int, ...]:
        """The batch sizes compiled: a batch is cut into these, the last part padded up to one."""
        return self.session.buckets

    def infer(self, arrays: Mapping[str, np.ndarray] | np.ndarray | None = None, /,
              **named: np.ndarray) -> dict[str, np.ndarray]:
        """Run the net on a batch of any size (cut into the buckets) and return its outputs.

        Give the inputs by name (``infer(data=x)``), as a dict (``infer({"data": x})``), or, for a
        net of one input, as one array (``infer(x)``). The batch is the first axis. Safe to call
        from several threads at once.

        Args:
            arrays: a dict {input name: array}, or the one input's array.
            **named: the inputs by name.

        Returns:
            {output name: numpy array}, one row per example given.

        Raises:
            toolkit.UserError: an input the net does not have, or of the wrong shape.
            TypeError: an input that is no array of numbers, or one array for a net of several
                inputs.
        """
        positional = self._positional(arrays)
        twice = sorted(set(positional) & set(named))
        if twice:
            raise TypeError(f"infer: {', '.join(map(repr, twice))} given twice (positionally and by name)")
        given = {name: _input_array(name, value) for name, value in {**positional, **named}.items()}
        # besides the net's inputs: each example's real length along a bucketed dimension, for a batch
        # of sequences padded to one length ("@lengths:T"; default: every example is whole)
        unknown = sorted(set(given) - {t.name for t in self.inputs} - set(self.session.lengths_inputs.values()))
        if unknown:
            names = ", ".join(t.name for t in self.inputs)
            raise UserError(f"net '{self.name}' has no input {', '.join(map(repr, unknown))} (its inputs: {names})")
        if self.transform is not None:
            given = self.transform(given)
        return self.session.run(given)

    def _positional(self, arrays) -> dict:
        """The inputs given without a name: a dict of them, or the one input's array."""
        if arrays is None:
            return {}
        if isinstance(arrays, Mapping):
            if not all(isinstance(k, str) for k in arrays):
                raise TypeError(f"infer: the dict's keys are input names ({self._input_names()})")
            return dict(arrays)
        if isinstance(arrays, (str, bytes)) or not hasattr(arrays, "__len__") and not hasattr(arrays, "__array__"):
            raise TypeError(f"infer: expected an array or a dict {{input name: array}}, not {type(arrays).__name__}")
        if len(self.inputs) != 1:
            raise TypeError(f"infer: net '{self.name}' has {len(self.inputs)} inputs ({self._input_names()}); "
                            f"pass them by name, infer({', '.join(f'{t.name}=...' for t in self.inputs)}), "
                            "or as a dict")
        return {self.inputs[0].name: arrays}

    def _input_names(self) -> str:
        return ", ".join(t.name for t in self.inputs)

    def warm(self, **example: np.ndarray) -> int:
        """Compile every bucket now (and run each once), so that no later call waits for a compile.

        Args:
            **example: an input of the net by name, whose shape gives the sizes of symbolic
                dimensions other than the batch (a sequence length).

        Returns:
            The number of plans built.
        """
        return self.session.warm(example or None)

    def __repr__(self) -> str:
        return f"<toolkit.Model {self.name!r} on {self.device}, buckets {list(self.buckets)}>"


def _input_array(name: str, value) -> np.ndarray:
    """An input given to ``infer`` as an array of numbers, else a TypeError naming it (the input
    transform would fail on it in numpy's words)."""
    if isinstance(value, (str, bytes)):
        raise TypeError(f"infer: input {name!r} is a {type(value).__name__}, not an array of numbers")
    try:
        array = np.asarray(value)
    except (ValueError, TypeError) as e:        # a ragged list, an object numpy cannot take
        raise TypeError(f"infer: input {name!r} is not an array of numbers ({e})") from None
    if array.dtype.kind not in "fiub":
        raise TypeError(f"infer: input {name!r} holds {array.dtype} values, not numbers")
    return array


def tensor_infos(values: Mapping) -> list[TensorInfo]:
    from .ir.dims import Sym
    out = []
    for name, v in values.items():
        if name.startswith("@"):
            continue
        shape = tuple(d if isinstance(d, int) else None for d in v.shape)
        symbols = tuple(None if isinstance(d, int) else (str(d) if isinstance(d, Sym) else None) for d in v.shape)
        out.append(TensorInfo(name, str(v.dtype), shape, symbols))
    return out


NET_KINDS = "a file path, 'zoo:NAME', a YAML string, a dict or a net from toolkit.Net"
# what toolkit.load, toolkit.train and toolkit.Net take as a net (NET_KINDS)
NetSource = Union[str, os.PathLike, Mapping[str, object], "Net"]


class Net(LoadedNet):
    """A net file read and checked, as ``toolkit check`` does.

    ``toolkit.load`` and ``toolkit.train`` take a Net wherever they take a source. Make one to
    check a net once, or to change its settings in Python.

    Args:
        source: a file path, ``zoo:NAME``, a YAML string (any text with a line break, or a flow
            mapping ``{...}``), a dict of the net file's contents, or a Net again (loaded again
            from its source, with ``set`` on top of its own overrides).
        set: overrides applied after the file and its bases, as ``--set`` does:
            ``{"train.max_iter": 100}`` or ``["train.max_iter=100"]``.

    Attributes:
        name: the net's name.
        spec: the checked contents of the net file.
        file: the file it was read from.

    Raises:
        toolkit.UserError: every problem of the net, each located in the file or the string.
        TypeError: a source of another type.
    """

    def __new__(cls, source: NetSource, set: Mapping[str, object] | Sequence[str] | None = None):  # noqa: A002  (the CLI's name)
        settings.current()                     # a bad TOOLKIT_* value is an error before any work
        return _net(source, _overrides(set))

    def __init__(self, source: NetSource, set: Mapping[str, object] | Sequence[str] | None = None):  # noqa: A002
        """Loaded and checked by ``__new__``, once."""

    def __reduce__(self):                      # a copy or a pickle loads it again from its source
        if self._loaded_from is None:
            raise TypeError("a Net made from a net loaded elsewhere cannot be copied; make it from its source")
        source, overrides = self._loaded_from
        return _net, (source, overrides)


def _net(source, overrides: list[tuple[tuple, object]]) -> Net:
    """``source`` loaded with ``overrides`` as a Net; a Net already loaded takes them on top of
    its own (loaded again from its source)."""
    if isinstance(source, LoadedNet):
        if not overrides and isinstance(source, Net):
            return source
        recorded = getattr(source, "_loaded_from", None)
        if recorded is None:
            if not overrides:
                return _adopt(source, None)
            raise UserError("set: this net was not made by toolkit.Net; give the overrides with its source")
        source, earlier = recorded
        overrides = list(earlier) + list(overrides)
    elif isinstance(source, Mapping):
        source = _plain_copy(source)            # the net is the dict as it is now, whatever happens to it
    loaded = _load_source(source, overrides)
    return _adopt(loaded, (_where_again(source), list(overrides)))


# a net file is a few levels deep; a dict past these is no net (and would exhaust Python's stack
# in the copy and the YAML writer); the count is the YAML reader's own bound on values
MAX_DICT_DEPTH = 100
PLAIN_SCALARS = (str, int, float, bool, type(None))


def _plain_copy(source: Mapping) -> dict:
    """A copy of a net given as a dict, walked without recursion: only what a net file can hold
    (dicts, lists, strings, numbers, booleans, None; numpy scalars as numbers), at most
    MAX_DICT_DEPTH levels and MAX_NODES values, else a TypeError or UserError that says where."""
    from .frontend.yaml_loader import MAX_NODES
    root: dict = {}
    stack = [(source, root, "net", 1)]          # (a container given, its copy, where it is, its depth)
    count = 0
    while stack:
        given, copy, where, depth = stack.pop()
        if depth > MAX_DICT_DEPTH:
            shown = where if len(where) <= 60 else where[:60] + "..."
            raise UserError(f"net: the dict is nested more than {MAX_DICT_DEPTH} levels deep (at {shown})")
        items = given.items() if isinstance(given, Mapping) else enumerate(given)
        for key, value in items:
            count += 1
            if count > MAX_NODES:
                raise UserError(f"net: the dict holds more than {MAX_NODES:,} values")
            if isinstance(given, Mapping) and not isinstance(key, PLAIN_SCALARS):
                raise TypeError(f"net: a key of {where} is of type {type(key).__name__}; a net's keys are strings")
            here = f"{where}[{key!r}]"
            if isinstance(value, np.generic) and value.dtype.kind in "fiub":
                value = value.item()
            if isinstance(value, Mapping):
                inner: dict | list = {}
            elif isinstance(value, (list, tuple)):
                inner = []
            elif isinstance(value, PLAIN_SCALARS):
                inner = value
            else:
                raise TypeError(f"net: {here} is of type {type(value).__name__}; a net dict holds only dicts, lists, "
                                "strings, numbers, booleans and None")
            if isinstance(copy, dict):
                copy[key] = inner
            else:
                copy.append(inner)
            if isinstance(inner, (dict, list)):
                stack.append((value, inner, here, depth + 1))
    return root


def _where_again(source):
    """The source to load a net from again: a file's path made absolute, so that a change of the
    working folder in between does not change the file."""
    if isinstance(source, (str, os.PathLike)):
        text = os.fspath(source)
        if "\n" not in text and not text.lstrip().startswith("{") and not text.startswith("zoo:") \
                and os.path.isfile(text):
            return os.path.abspath(text)
    return source


def _adopt(loaded: LoadedNet, loaded_from) -> Net:
    net = object.__new__(Net)
    net.__dict__.update(loaded.__dict__)
    net._loaded_from = loaded_from
    return net


def _overrides(given) -> list[tuple[tuple, object]]:
    from .frontend.spec import parse_overrides
    if given is None:
        return []
    if isinstance(given, Mapping):
        if not all(isinstance(k, str) for k in given):
            raise TypeError("set: the keys are dotted names such as 'train.max_iter'")
        return [(tuple(int(p) if p.lstrip("-").isdigit() else p for p in k.split(".")), v) for k, v in given.items()]
    if isinstance(given, str) or not all(isinstance(item, str) for item in given):
        raise TypeError("set: a dict {'KEY': value} or a list of 'KEY=VALUE' strings")
    return parse_overrides(list(given))


def _set_texts(given) -> list[str]:
    """The overrides as ``KEY=VALUE`` lines, for the run's history."""
    if given is None:
        return []
    if isinstance(given, Mapping):
        import json
        return [f"{k}={json.dumps(v)}" for k, v in given.items()]
    return list(given)


def _load_source(source, overrides):

    import yaml

    from .zoo.resolve import load_net
    if isinstance(source, Mapping):
        return load_net("<dict>", overrides, text=yaml.safe_dump(dict(source), sort_keys=False))
    if isinstance(source, os.PathLike):
        source = os.fspath(source)
    if not isinstance(source, str):
        raise TypeError(f"net: expected {NET_KINDS}, not {type(source).__name__}")
    if "\n" in source or source.lstrip().startswith("{"):
        return load_net("<string>", overrides, text=source)
    if not source.strip():
        raise UserError(f"net: an empty string; expected {NET_KINDS}")
    return load_net(source, overrides)


def _text_arg(name: str, value, allow_none: bool = True) -> str | None:
    if value is None and allow_none:
        return None
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if not isinstance(value, str):
        raise TypeError(f"{name}: expected a string{' or None' if allow_none else ''}, not {type(value).__name__}")
    return value


def _device_arg(device):
    """A device name ("cpu", "gpu:1"), or a Device the commands already parsed."""
    from .backend.devices import Device
    return device if isinstance(device, Device) else _text_arg("device", device, allow_none=False)


def _pass_names(disable) -> tuple[str, ...]:
    if disable is None:
        return ()
    if isinstance(disable, str):
        return (disable,)                              # one pass, not its letters
    if not all(isinstance(name, str) for name in disable):
        raise TypeError("disable: a pass name or a list of pass names")
    return tuple(disable)


def _flag(name: str, value) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}: expected True or False, not {type(value).__name__}")
    return bool(value)


def _bucket_sizes(buckets) -> dict[str, tuple]:
    """The batch sizes per symbolic dimension ("" for the batch's), checked."""
    if buckets is None:
        return {"": DEFAULT_BUCKETS}
    per_dim = buckets if isinstance(buckets, Mapping) else {"": buckets}
    checked = {}
    for dim, sizes in per_dim.items():
        where = f"buckets{' ' + str(dim) if dim else ''}"
        if not isinstance(dim, str):
            raise TypeError(f"buckets: the dict's keys are dimension names such as 'N', not {type(dim).__name__}")
        if isinstance(sizes, (str, bytes)) or not hasattr(sizes, "__iter__"):
            raise TypeError(f"{where}: expected a list of batch sizes"
                            f"{' or a dict {dimension: sizes}' if not dim else ''}, not {type(sizes).__name__}")
        sizes = tuple(sizes)
        if not sizes or any(not isinstance(b, (int, np.integer)) or isinstance(b, bool) or b < 1 for b in sizes):
            raise UserError(f"{where} must be positive integers, got {list(sizes)}")
        checked[dim] = sizes
    return checked


def _dtype_arg(dtype, choices=FLOAT_DTYPES) -> str | None:
    if dtype is not None and dtype not in choices:
        raise UserError(f"dtype: '{dtype}' is not one of {', '.join(choices)}")
    return dtype


def load(net: NetSource, weights: str | os.PathLike | None = None, device: str = "cpu", dtype: str | None = None,
         buckets: Sequence[int] | Mapping[str, Sequence[int]] | None = None, warm: bool = False,
         disable: Sequence[str] | str = (), optimize_graph: bool = True, allow_missing: bool = False,
         transform: bool = True) -> Model:
    """Load a net with its weights and compile its infer phase, as ``toolkit infer`` does.

    Args:
        net: a file path, ``zoo:NAME``, a YAML string, a dict or a ``toolkit.Net``.
        weights: a weights file (``.safetensors`` or ``.npz``) or ``zoo:NAME`` for a zoo model's.
            Default: a zoo model's published weights.
        device: ``"cpu"``, ``"gpu"``, or one of several: ``"cpu:N"``, ``"gpu:N"``.
        dtype: the float type of the compiled graph (``"float32"``, ``"float64"``, ``"float16"``,
            ``"bfloat16"``). Default: the net's.
        buckets: the batch sizes compiled (default: the net file's ``buckets``, else 1, 2, 4,
            ..., 64), or sizes per symbolic dimension, such as ``{"N": [1, 8], "T": [16, 64]}``
            (a sequence is padded up to its bucket).
        warm: compile every bucket now rather than at its first use.
        disable: a pass name, or a list of them, to switch off (see ``toolkit compile --explain``).
        optimize_graph: False runs the graph without the optional passes (``--no-optimize``).
        allow_missing: copy the weights whose name and shape match, and start the others from
            their fillers.
        transform: apply the input transform the net was trained with (its ``train.data`` scale
            and mean, or its ``transform``) to every input of ``infer``; False feeds inputs as given.

    Returns:
        The compiled model: call its ``infer``.

    Raises:
        toolkit.UserError: a problem with the net, the weights or an argument, with the message
            the command would print.
        TypeError: an argument of the wrong type, named.
    """
    from .inference import infer_phase

    settings.current()                         # a bad TOOLKIT_* value is an error before any work
    weights = _text_arg("weights", weights)
    device = _device_arg(device)
    dtype = _dtype_arg(dtype)
    passes = _pass_names(disable)
    sizes = _bucket_sizes(buckets)
    warm, optimize_graph, allow_missing, transform = (_flag(n, v) for n, v in (
        ("warm", warm), ("optimize_graph", optimize_graph), ("allow_missing", allow_missing), ("transform", transform)))
    phase = infer_phase(Net(net), device, dtype, passes, not optimize_graph)
    loaded = phase.load_weights(weights, allow_missing=allow_missing, flag="weights")
    inputs, outputs = tensor_infos(phase.graph.inputs), tensor_infos(phase.graph.outputs)
    from .training.data import InputTransform
    spec = (None if buckets is None
            else {k: [int(b) for b in v] for k, v in sizes.items()} if isinstance(buckets, Mapping)
            else [int(b) for b in sizes[""]])
    model = Model(phase.net, phase.session(loaded, spec), inputs, outputs,
                  InputTransform.of(phase.net) if transform else None)
    if warm:
        model.warm()
    return model


def train(net: NetSource | None = None, *, out: str | None = None, resume: str | None = None,
          weights: str | None = None, allow_missing: bool = False, device: str = "cpu", dtype: str | None = None,
          set: Mapping[str, object] | Sequence[str] | None = None,  # noqa: A002  (the CLI's name)
          disable: Sequence[str] | str = (), quiet: bool = False) -> "RunResult":
    """Train a net as ``toolkit train`` does, in this process.

    Args:
        net: a file path, ``zoo:NAME``, a YAML string, a dict or a ``toolkit.Net``; None with
            ``resume`` continues with the net the run recorded.
        out: the run folder. Default: ``runs/NAME``, or the next free ``runs/NAME-2``, ...
        resume: a run folder or a checkpoint to continue.
        weights: weights to start from (a file or ``zoo:NAME``), copied by layer name.
        allow_missing: with ``weights``, start the layers they do not have from their fillers.
        device: ``"cpu"``, ``"gpu"``, ``"cpu:N"`` or ``"gpu:N"``.
        dtype: ``"float16"`` or ``"bfloat16"`` for mixed precision, ``"float32"`` for none.
            Default: the net's ``train.solver.mixed_precision``.
        set: overrides, as ``--set`` does: ``{"train.max_iter": 100}`` or
            ``["train.max_iter=100"]``.
        disable: a pass name, or a list of them, to switch off.
        quiet: print no progress lines.

    Returns:
        The run: its ``folder``, its ``status`` (0, or 128 + the signal that stopped the run
            after a checkpoint), ``iterations``, ``metrics`` (the final test metrics) and
            ``best`` (the best weights kept: metric, value, iteration, file).

    Raises:
        toolkit.UserError: a problem with the net, the data, the weights or an argument, with
            the message the command would print.
    """
    import io
    import sys

    from .backend.options import check_device
    from .compile import disabled_passes
    from .training import runs
    from .training.start import train_net

    settings.current()                         # a bad TOOLKIT_* value is an error before any work
    out, resume, weights = (_text_arg(n, v) for n, v in (("out", out), ("resume", resume), ("weights", weights)))
    allow_missing, quiet = _flag("allow_missing", allow_missing), _flag("quiet", quiet)
    device = check_device(_device_arg(device))
    dtype = _dtype_arg(dtype, TRAIN_DTYPES)
    overrides = _overrides(set)
    texts = _set_texts(set)
    if dtype == "float32":
        overrides.insert(0, (("train", "solver", "mixed_precision"), None))
    elif dtype is not None:
        overrides.insert(0, (("train", "solver", "mixed_precision", "dtype"), dtype))
    if net is None:
        if resume is None:
            raise UserError("train: give a net, or resume= a run folder to continue it as recorded")
        loaded = _load_source(str(runs.recorded_net(runs.run_of(resume))), overrides)
    else:
        loaded = _net(net, overrides)
    stream = io.StringIO() if quiet else sys.stderr
    return train_net(loaded, device, out=out, resume=resume, weights=weights, allow_missing=allow_missing,
                     overrides=overrides, set_texts=texts,
                     disable=disabled_passes(loaded, _pass_names(disable), False), stream=stream)


def quantize(net: NetSource, *, calibrate: "Mapping[str, np.ndarray] | str | os.PathLike", out: str | os.PathLike,
             weights: str | os.PathLike | None = None, method: str = "mse", examples: int = 256,
             dtype: str = "uint8", keep_float: Sequence[str] = (), bias_correction: bool = True,
             equalize: bool | None = None,
             set: Mapping[str, object] | Sequence[str] | None = None):  # noqa: A002  (the CLI's name)
    """Quantize a float model to int8 as ``toolkit quantize`` does, and write its model folder.

    Args:
        net: a file path, ``zoo:NAME``, a YAML string, a dict or a ``toolkit.Net`` (float: no
            quantization section of its own).
        calibrate: calibration data: arrays by input name, or an ``.npz`` file of them (the
            input transform is applied to them, as ``Model.infer`` applies it).
        out: the model folder to write, new or empty: ``net.yaml`` with its ``quantization``
            section (docs/spec.md section 10) and ``model.safetensors``.
        weights: the float weights (``.safetensors``). Default: a zoo model's published weights.
        method: ``"mse"`` (the range whose 8-bit values have the least squared error), ``"minmax"``,
            ``"percentile"`` (99.999) or ``"entropy"`` (KL divergence).
        examples: how many calibration examples are drawn, in a seeded order.
        dtype: the activations' type, ``"uint8"`` (with a zero point) or ``"int8"`` (symmetric).
        keep_float: layers to keep in float; softmax layers always are.
        bias_correction: add to each int8 convolution's and InnerProduct's bias the mean error its
            int8 form puts into its output over the calibration examples (``--no-bias-correction``:
            False).
        equalize: before calibration, scale each convolution's or InnerProduct's output channels
            against the weights of the layers that read them (cross-layer equalization, the same
            function in float; the folder's weights are the scaled ones). None: the default of
            ``toolkit quantize`` (``--equalize``).
        set: overrides, as ``--set`` does.

    Returns:
        What was written: its ``folder``, ``net_file``, ``weights_file``, the ``tops`` given a
            scale, the ``float_layers`` (name: why) and the number of ``examples`` used.
            ``toolkit.load(result.net_file, weights=result.weights_file)`` runs it.

    Raises:
        toolkit.UserError: a problem with the net, the weights, the data or an argument, with the
            message the command would print.
    """
    from .quantization.model import DEFAULT_EQUALIZE, quantize_model

    loaded = _net(net, _overrides(set))
    weights_file = loaded.default_weights(_text_arg("weights", weights))
    if weights_file is None:
        raise UserError("quantize: no weights to quantize: give weights=FILE")
    if isinstance(calibrate, (str, os.PathLike)):
        path = os.fspath(calibrate)
        if not path.endswith(".npz"):
            raise UserError(f"quantize: calibrate={path!r}: give arrays by input name or an .npz file of them")
        from .fileio import open_regular
        with open_regular(path) as f, np.load(f, allow_pickle=False) as arrays:
            data, name = {k: arrays[k] for k in arrays.files}, os.path.basename(path)
        files = [(name, len(next(iter(data.values()))))] if data else []
    elif isinstance(calibrate, Mapping):
        data, name, files = dict(calibrate), "arrays", []
    else:
        raise TypeError(f"calibrate: expected arrays by input name or an .npz path, not {type(calibrate).__name__}")
    return quantize_model(loaded, weights_file, data, _text_arg("out", out, allow_none=False), data_name=name,
                          method=method, max_examples=examples, dtype=dtype, keep_float=list(keep_float),
                          data_files=files, bias_correction=bool(bias_correction),
                          equalize=DEFAULT_EQUALIZE if equalize is None else bool(equalize))
