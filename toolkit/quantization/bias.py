"""Empirical bias correction (Nagel et al. 2019, "Data-Free Quantization Through Weight
Equalization and Bias Correction", section 4.2, the empirical form): the mean error that a
convolution's or InnerProduct's int8 form puts into its output, per output channel, over the
calibration data, to be added to its bias so that the int8 output's mean is the float one's.

A layer's int8 form computes W~ x~ where the float net computes W x: W~ its weights quantized
per output channel and dequantized (ops/quant.py's ``quantize_weights``, as the quantize pass
makes them), x~ its input quantized at its top's scale and dequantized (clipped where the
calibration clipped the range). Both are linear in the input, so the mean of each output
channel over the batch and the output positions is the weights dotted with the mean input
patch: for a convolution, the mean over (n, oh, ow) of the padded input at each (channel, kh,
kw) tap, which sums batch by batch. The correction is mean(W x) - mean(W~ x~), in float64.

Each layer's correction is measured on the float net's input to it (its own error, as the
float net feeds it), not on the int8 net's: the corrections of earlier layers do not change the
input a later layer's correction is measured on. The weights and biases measured are the ones
the quantize pass quantizes: the infer graph's after ``fold_batch_norm`` (a BatchNorm folded into
its convolution is corrected with it).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from ..compile import optimize
from ..inference import infer_phase
from ..ops.conv import conv_out_size
from ..ops.quant import dequantize_linear_reference, quantize_linear_reference
from ..passes.pipeline import pass_names
from ..passes.quantize import Head, layer_of, match_head, quantize_weights
from ..passes.rewrite import kept_ids
from .collect import DEFAULT_BATCH, DEFAULT_EXAMPLES, RowSource, _Arrays, _check_counts, float_runs


@dataclass
class _Layer:
    """One convolution or InnerProduct to correct, and the sums of its input's taps so far."""
    name: str
    top: str                         # the top its input is (an InnerProduct's flattened)
    head: Head
    scale: float
    zero_point: int
    dtype: str
    float_sum: np.ndarray | None = None     # the input's taps summed over rows and positions
    quantized_sum: np.ndarray | None = None  # the same of the input quantized and dequantized
    count: int = 0


def _passes_after_fold() -> tuple[str, ...]:
    """The passes from ``quantize`` on: the graph measured is the one the quantize pass reads."""
    names = pass_names()
    return tuple(names[names.index("quantize"):])


def _layers(graph, activations: Mapping[str, Mapping], float_layers) -> list[_Layer]:
    """The heads the quantize pass would quantize whose input is a top with a scale, in order."""
    readers, kept = graph.consumers(), kept_ids(graph)
    last = {}
    for node in graph.nodes:
        for v in node.outputs:
            if v.name:
                last[v.name] = v
    found = []
    for node in graph.nodes:
        if node.op not in ("conv2d", "matmul") or layer_of(node) in float_layers:
            continue
        head = match_head(node, readers, kept)
        if not isinstance(head, Head):
            continue
        x = head.x
        if x.producer is not None and x.producer.op == "reshape" and x.name not in activations:
            x = x.producer.inputs[0]          # an InnerProduct's flattened input: its top's values
        top = x.name if x.name in graph.inputs else (x.name if last.get(x.name) is x else None)
        if top is None or top not in activations:
            continue
        act = activations[top]
        found.append(_Layer(layer_of(node), top, head, float(act["scale"]), int(act["zero_point"]),
                            act.get("dtype", "uint8")))
    return found


def _fake_quantized(x: np.ndarray, layer: _Layer) -> np.ndarray:
    """``x`` quantized at the layer's input scale and dequantized, as the int8 net's
    quantize_linear and dequantize_linear compute it."""
    q = quantize_linear_reference(x, layer.scale, layer.zero_point, layer.dtype)
    return dequantize_linear_reference(q, layer.scale, layer.zero_point)


def _tap_sums(x: np.ndarray, head: Head) -> tuple[np.ndarray, int]:
    """The input's values summed over rows and output positions at each tap a weight multiplies:
    [C, kh, kw] for a convolution (padding counts as zero), [I] for an InnerProduct; and how many
    (row, position) pairs were summed."""
    if head.node.op == "matmul":
        flat = x.reshape(len(x), -1).astype(np.float64)
        return flat.sum(axis=0), len(flat)
    a = head.node.attrs
    (sh, sw), (ph, pw), (dh, dw) = a["stride"], a["pad"], a["dilation"]
    kh, kw = head.weight.shape[2:]
    n, c, h, w = x.shape
    oh, ow = conv_out_size(h, kh, sh, ph, dh), conv_out_size(w, kw, sw, pw, dw)
    padded = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw))) if ph or pw else x
    sums = np.empty((c, kh, kw))
    for i in range(kh):
        for j in range(kw):
            taps = padded[:, :, i * dh:i * dh + sh * (oh - 1) + 1:sh, j * dw:j * dw + sw * (ow - 1) + 1:sw]
            sums[:, i, j] = taps.sum(axis=(0, 2, 3), dtype=np.float64)
    return sums, n * oh * ow


def _mean_output(weight: np.ndarray, tap_means: np.ndarray, head: Head) -> np.ndarray:
    """The mean of each output channel of the layer without its bias, from its input's tap means."""
    w = weight.astype(np.float64)
    if head.node.op == "matmul":
        return w @ tap_means
    group = head.node.attrs["group"]
    out, per_group = w.shape[0], w.shape[1]
    w = w.reshape(group, out // group, per_group, *w.shape[2:])
    m = tap_means.reshape(group, per_group, *tap_means.shape[1:])
    return np.einsum("gocij,gcij->go", w, m).reshape(out)


def measure_bias_correction(net, weights: "str | Mapping[str, np.ndarray] | None",
                            data: "Mapping[str, np.ndarray] | RowSource", activations: Mapping[str, Mapping],
                            float_layers=(), *, max_examples: int = DEFAULT_EXAMPLES,
                            batch_size: int = DEFAULT_BATCH, seed: int = 0, device: str = "cpu",
                            transform: bool = True, say=None) -> dict[str, list[float]]:
    """Layer -> the amount per output channel to add to its bias: mean(W x) - mean(W~ x~) over
    the calibration ``data`` (the same seeded draw as ``collect_ranges``), for each convolution and
    InnerProduct whose input is a top of ``activations`` (top -> {scale, zero_point, dtype}) and
    whose layer is not in ``float_layers``. ``net``: a file, ``zoo:NAME`` or a loaded Net."""
    source = _Arrays(data) if isinstance(data, Mapping) else data
    _check_counts(source, max_examples, batch_size)
    phase = infer_phase(net, device, "float32")
    loaded = dict(weights) if isinstance(weights, Mapping) else phase.load_weights(weights)
    graph = optimize(phase.net.graph("infer", "float32"), _passes_after_fold(), dict(loaded), device)
    layers = _layers(graph, activations, set(float_layers))
    if not layers:
        return {}
    tops = list(dict.fromkeys(layer.top for layer in layers))
    computed = [t for t in tops if t not in phase.graph.inputs]
    fed = 0
    for batch, values in float_runs(phase, loaded, source, computed, max_examples, batch_size, seed, transform):
        values.update({t: batch[t] for t in tops if t in batch})
        for layer in layers:
            x = np.asarray(values[layer.top], dtype=np.float32)
            exact, count = _tap_sums(x, layer.head)
            rounded, _ = _tap_sums(_fake_quantized(x, layer), layer.head)
            layer.float_sum = exact if layer.float_sum is None else layer.float_sum + exact
            layer.quantized_sum = rounded if layer.quantized_sum is None else layer.quantized_sum + rounded
            layer.count += count
        fed += len(next(iter(batch.values())))
        if say is not None:
            say(f"bias correction: {fed} examples")
    out = {}
    for layer in layers:
        wq, w_scales = quantize_weights(layer.head.weight)
        dequantized = wq.astype(np.float64) * np.asarray(w_scales, np.float64).reshape(-1, *[1] * (wq.ndim - 1))
        error = _mean_output(layer.head.weight, layer.float_sum / layer.count, layer.head) - \
            _mean_output(dequantized, layer.quantized_sum / layer.count, layer.head)
        out[layer.name] = [float(np.float32(e)) for e in error]
    return out
