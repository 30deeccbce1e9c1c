"""A quantized model folder from a float one: ``toolkit quantize`` and ``toolkit.quantize``.

The folder is what any other model folder is (``net.yaml``, ``model.safetensors``, and the
``input.json`` of the run it came from), so ``infer``, ``serve``, ``bench`` and ``toolkit.load``
take it as it is. Its net is the float net rendered (bases merged, ``--set`` applied) with a
``quantization`` section (docs/spec.md section 10): each float top's activation scale and zero
point from calibration, the layers that stay float and why, and how the scales were found. The
weights stay float32 in the file: the quantize pass makes the per-channel int8 weights from them
when a plan is built, so the float net and its int8 form are one file each, never out of step.

Softmax layers stay float (their outputs are probabilities that int8 would flatten), as do the
layers the caller lists. With ``bias_correction`` (bias.py) the section also holds, for each
quantized convolution and InnerProduct, the amount per output channel the quantize pass adds to
its bias; the float weights in the file stay as they were.
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

import numpy as np

from ..errors import UserError
from ..fileio import atomic_write
from ..inference import infer_phase
from ..weights import save_weights
from .bias import measure_bias_correction
from .collect import DEFAULT_EXAMPLES, RowSource, collect_ranges
from .equalize import equalize as equalize_weights
from .scales import quantization_section

# layer types whose outputs stay float, and why (shown by `toolkit compile --explain`)
FLOAT_TYPES = {"Softmax": "softmax: probabilities stay float"}
INPUT_FILE = "input.json"
# whether ``toolkit quantize`` measures bias correction unless told (docs/performance/real-nets.md
# has the measurements it was decided on)
DEFAULT_BIAS_CORRECTION = True
# the calibration method ``toolkit quantize`` uses unless told (docs/performance/real-nets.md has the
# measurements it was decided on)
DEFAULT_METHOD = "mse"
# whether ``toolkit quantize`` equalizes the weights (equalize.py) unless told (docs/performance/real-nets.md
# has the measurements it was decided on)
DEFAULT_EQUALIZE = True


@dataclass
class QuantizedModel:
    """What ``quantize_model`` wrote."""
    folder: Path
    net_file: Path
    weights_file: Path
    tops: list[str]                                  # the tops given a scale
    float_layers: dict[str, str] = field(default_factory=dict)   # layer -> why it stays float
    examples: int = 0
    bias_corrected: list[str] = field(default_factory=list)     # the layers given a bias correction
    equalized: dict[str, list[str]] = field(default_factory=dict)  # layer -> the layers reading its scaled channels


def _float_layers(net, asked: Iterable[str]) -> dict[str, str]:
    layers = {layer.name: layer.type for layer in net.spec.layers}
    chosen = {name: FLOAT_TYPES[kind] for name, kind in layers.items() if kind in FLOAT_TYPES}
    for name in asked:
        if name not in layers:
            raise UserError(f"--float {name}: the net has no layer of that name")
        chosen.setdefault(name, "asked to stay float")
    return chosen


def _check_out(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"--out {out}: exists and is not an empty folder; name a new folder")


def _section_text(section: dict, float_layers: dict[str, str]) -> str:
    """The section as block YAML, one top per line; floats by repr, which reads back exactly."""
    lines = ["quantization:", "  activations:"]
    for name, entry in section["activations"].items():
        lines.append(f"    {name}: {{scale: {entry['scale']!r}, zero_point: {entry['zero_point']}, "
                     f"dtype: {entry['dtype']}}}")
    if float_layers:
        lines.append("  float:")
        lines += [f"    - {{layer: {name}, reason: {_quoted(why)}}}" for name, why in float_layers.items()]
    equalized = section.get("equalized")
    if equalized:
        lines.append("  equalized:")
        lines += [f"    {name}: [{', '.join(readers)}]" for name, readers in equalized.items()]
    corrections = section.get("bias_correction")
    if corrections:
        lines.append("  bias_correction:")
        lines += [f"    {name}: [{', '.join(repr(v) for v in amounts)}]" for name, amounts in corrections.items()]
    record = section.get("calibration")
    if record:
        lines.append("  calibration:")
        for key, value in record.items():
            if key == "files" and value:
                lines.append("    files:")
                lines += [f"      - {{file: {_quoted(f['file'])}, rows: {f['rows']}}}" for f in value]
            elif isinstance(value, bool):
                lines.append(f"    {key}: {'true' if value else 'false'}")
            elif value is not None and key != "files":
                lines.append(f"    {key}: {_quoted(value) if isinstance(value, str) else repr(value)}")
    return "\n".join(lines) + "\n"


def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def quantize_model(net, weights_file: str | Path, data: "Mapping[str, np.ndarray] | RowSource", out: str | Path, *,
                   data_name: str, method: str = DEFAULT_METHOD, max_examples: int = DEFAULT_EXAMPLES,
                   dtype: str = "uint8", keep_float: Iterable[str] = (), say=None,
                   data_files: Iterable[tuple[str, int]] = (),
                   bias_correction: bool = DEFAULT_BIAS_CORRECTION,
                   equalize: bool = DEFAULT_EQUALIZE, quantize_outputs: bool = False) -> QuantizedModel:
    """Calibrates ``net`` (a loaded Net, no quantization section of its own) with ``weights_file``
    over ``data`` (arrays by input name, or a row stream as ``toolkit infer`` opens its inputs)
    and writes the quantized model folder ``out`` (new, or an empty folder). Its section records
    what produced it: the method, the examples drawn, the activations' dtype, whether bias
    correction was measured (``bias_correction``: over the same examples, bias.py), whether the
    weights were equalized first (``equalize``: equalize.py, over the same examples; the folder's
    weights are then the equalized ones, the same function in float), ``data_files`` (each file's
    name and row count) and the toolkit's version.

    The net's outputs that no layer reads get no scale (unless ``quantize_outputs``): the layer
    that computes one writes it in float32 from its int32 sums, and an add, concatenation or
    pooling that computes one runs in float, since rounding a result to 8 bits only for it to be
    dequantized for the caller loses precision and saves nothing."""
    from ..frontend.render import render_net
    from ..version import __version__
    out = Path(out)
    _check_out(out)
    if getattr(net.spec, "quantization", None) is not None:
        raise UserError(f"{net.file}: the net is quantized already (it has a quantization section); "
                        "quantize its float net")
    weights_file = Path(weights_file)
    if weights_file.suffix != ".safetensors":
        raise UserError(f"{weights_file}: write the weights as .safetensors to quantize them (a model folder's "
                        "weights file)")
    float_layers = _float_layers(net, keep_float)
    weights: "str | dict[str, np.ndarray]" = str(weights_file)
    equalized: dict[str, list[str]] = {}
    if equalize:
        arrays = infer_phase(net, "cpu", "float32").load_weights(str(weights_file))
        weights, equalized = equalize_weights(net, arrays, data, max_examples=max_examples)
        if say is not None:
            say(f"equalization: {len(equalized)} layers' output channels scaled against their readers'")
    fed = []
    ranges = collect_ranges(net, weights, data, method=method, max_examples=max_examples,
                            say=lambda line: fed.append(line) or (say(line) if say else None))
    if not quantize_outputs:
        unread = _unread_outputs(net)
        ranges = {top: r for top, r in ranges.items() if top not in unread}
    examples = min(max_examples, _rows(data))
    record = {"method": method, "examples": examples, "data": data_name, "dtype": dtype,
              "bias_correction": bool(bias_correction), "equalization": bool(equalize),
              "files": [{"file": name, "rows": int(rows)} for name, rows in data_files],
              "toolkit_version": __version__}
    section = quantization_section(ranges, dtype, calibration=record)
    if equalized:
        section["equalized"] = equalized
    if bias_correction:
        section["bias_correction"] = measure_bias_correction(
            net, weights, data, section["activations"], float_layers, max_examples=max_examples,
            say=say)
    text = render_net(net, folder=out).rstrip("\n") + "\n" + _section_text(section, float_layers)
    out.mkdir(parents=True, exist_ok=True)
    weights_out = out / "model.safetensors"
    if equalized:
        save_weights(str(weights_out), weights, _metadata(weights_file))
    else:
        atomic_write(weights_out, lambda tmp: shutil.copyfile(weights_file, tmp))
    about = Path(net.file).parent / INPUT_FILE
    if about.is_file():
        atomic_write(out / INPUT_FILE, lambda tmp: shutil.copyfile(about, tmp))
    net_out = out / "net.yaml"
    atomic_write(net_out, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    return QuantizedModel(out, net_out, weights_out, list(section["activations"]), float_layers, examples,
                          list(section.get("bias_correction", {})), equalized)


def _unread_outputs(net) -> set[str]:
    """The infer phase's outputs that no layer reads, by top name."""
    graph = net.graph("infer", "float32")
    readers = graph.consumers()
    return {v.name for v in graph.outputs.values() if v.name and not readers.get(v.id)}


def _metadata(weights_file: Path) -> dict[str, str] | None:
    """The float weights file's own metadata, kept in the equalized file."""
    from safetensors import safe_open
    with safe_open(str(weights_file), framework="numpy") as f:
        return dict(f.metadata() or {}) or None


def _rows(data) -> int:
    if isinstance(data, Mapping):
        return len(next(iter(data.values())))
    return data.rows
