"""Cross-layer activation equalization before calibration (Nagel et al. 2019, "Data-Free
Quantization Through Weight Equalization and Bias Correction", section 4.1; with the activations'
calibrated ranges in the balance, as SmoothQuant does).

An activation is quantized per tensor, so a channel whose values stay small gets few of its
256 steps; the weights that read it are quantized per output channel, so an input channel
whose weights are small beside the rest of their row gets few of the row's steps. Between a
convolution (or InnerProduct) P and the layers C that read its output through ops that commute
with a positive scale per channel (ReLU, max and average pooling, concatenation along the
channels), P's output channel i divided by s_i (its weights' row i and its bias i) and the
input channel i of every C multiplied by s_i (their weights' column i) compute the same
function in float:  C(relu(P(x) / s)) * s == C(relu(P(x))).  P's own weights lose nothing (a
row's scale goes into its per-channel step); s_i trades the activation's channel range a_i
(made a_i / s_i) against the range w_i of the weights that read it, relative to their rows'
largest (made w_i * s_i). s_i = sqrt(a_i / w_i) gives both sqrt(a_i w_i): the channels meet in
the middle (``strength`` 0.5; 1 evens the activations out fully, 0 the weights).

A range below one step of its tensor's own (an activation channel that stayed at zero over the
calibration data, an input channel whose weights were pruned) counts as one step, so that no
s_i runs off to 0 or infinity; an activation's range is taken relative to its tensor's largest,
so that s_i stays between 1/16 and 11.3.

What is equalized: each P whose output reaches only convolutions and InnerProducts, through
only such ops (a value that is a graph output, feeds a residual add, a BatchNorm, a softmax or
anything else leaves P as it is); a concatenation's channels are each their own producer's, and
a value read by several layers (a fire module's squeeze output) scales the columns of each.
The graph is the float infer graph as lowered (before any pass): its weights are the model
file's arrays, by name, and the transform returns them scaled."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from ..inference import infer_phase
from .collect import DEFAULT_BATCH, DEFAULT_EXAMPLES, RowSource, _Arrays, float_runs

DEFAULT_STRENGTH = 0.5
# ops y = f(x) with f(x * s) == f(x) * s for a positive scale s per channel
PER_CHANNEL_HOMOGENEOUS = ("relu", "max_pool2d", "avg_pool2d")
# uint8 activations' and int8 weights' steps over a range: a channel's range floors at one step
ACTIVATION_LEVELS = 255
WEIGHT_LEVELS = 127


@dataclass
class Reader:
    """A convolution or InnerProduct that reads a producer's channels: its layer and weight, and
    where the producer's channels sit among its input channels."""
    layer: str
    weight: str
    kind: str                        # "conv2d" or "matmul"
    group: int                       # a convolution's groups (a matmul's: 1)
    in_channels: int                 # all its input channels
    offset: int                      # the producer's first channel among them
    trans_b: bool = True             # a matmul's weight is [N, K] (x @ W^T)
    top: str = ""                    # the value it reads: where its input channels are measured


@dataclass
class Producer:
    """A convolution or InnerProduct whose output channels can be scaled, and its readers."""
    layer: str
    weight: str
    bias: str | None
    kind: str
    channels: int
    readers: list[Reader] = field(default_factory=list)


def _named_weight(graph, v) -> str | None:
    """The weight file's name of ``v`` where it is a weight as given (no op between)."""
    if v.producer is None and v.name in graph.weights and graph.weights[v.name].value is v:
        return v.name
    return None


def _reads(node, v) -> bool:
    return bool(node.inputs) and node.inputs[0] is v


def _as_reader(graph, node, v, offset: int) -> Reader | None:
    """``node`` as a reader of ``v`` (its data input) whose input channel ``offset``.. are the
    producer's, or None where its weight cannot be scaled per input channel."""
    if not _reads(node, v) or len(node.inputs) < 2 or any(x is v for x in node.inputs[1:]):
        return None
    weight = _named_weight(graph, node.inputs[1])
    if weight is None:
        return None
    if node.op == "conv2d":
        return Reader(node.scope, weight, "conv2d", int(node.attrs["group"]), int(v.shape[1]), offset, top=v.name)
    a = node.attrs
    if node.op == "matmul" and not a["trans_a"] and v.rank == 2:
        return Reader(node.scope, weight, "matmul", 1, int(v.shape[1]), offset, bool(a["trans_b"]), top=v.name)
    return None


def _producer(graph, node, readers: Mapping) -> tuple[Producer, object] | None:
    """``node`` as a producer, with the value its output channels leave in (after its bias add);
    ``readers``: the graph's consumers."""
    if node.op not in ("conv2d", "matmul") or len(node.inputs) < 2:
        return None
    weight = _named_weight(graph, node.inputs[1])
    if weight is None:
        return None
    out = node.outputs[0]
    if node.op == "conv2d":
        bias = _named_weight(graph, node.inputs[2]) if len(node.inputs) == 3 else None
        if len(node.inputs) == 3 and bias is None:
            return None
        return Producer(node.scope, weight, bias, "conv2d", int(out.shape[1])), out
    a = node.attrs
    if a["trans_a"] or out.rank != 2 or not a["trans_b"]:
        return None
    uses = readers.get(out.id, [])
    bias = None
    if len(uses) == 1 and uses[0].op == "add" and out not in graph.outputs.values():
        add = uses[0]
        other = add.inputs[1] if add.inputs[0] is out else add.inputs[0]
        name = _named_weight(graph, other)
        if name is not None and tuple(other.shape) == (int(out.shape[1]),):
            bias, out = name, add.outputs[0]
    return Producer(node.scope, weight, bias, "matmul", int(out.shape[1])), out


def equalization_pairs(graph) -> list[Producer]:
    """Each producer whose output reaches only convolutions and InnerProducts through ops that
    commute with a per-channel scale, with those readers, in the graph's order."""
    readers = graph.consumers()
    outputs = {v.id for v in graph.outputs.values()}
    # top name -> its last value: what a run asked for that top returns, where a reader's input is measured
    last = {out.name: out for node in graph.nodes for out in node.outputs if out.name}
    walk = _Walk(graph, readers, outputs, last)
    # a weight two layers share (tied weights) would be scaled for both: such layers are left alone
    shared = {name for name, w in graph.weights.items() if len(readers.get(w.value.id, [])) > 1}
    found = []
    for node in graph.nodes:
        made = _producer(graph, node, readers)
        if made is None:
            continue
        producer, out = made
        if walk(out, 0, producer.readers) and not ({producer.weight, producer.bias} |
                                                   {r.weight for r in producer.readers}) & shared:
            found.append(producer)
    return found


@dataclass
class _Walk:
    """The readers a producer's channels reach in ``graph``."""
    graph: object
    readers: dict
    outputs: set
    last: dict

    def __call__(self, v, offset: int, found: list[Reader], depth: int = 0) -> bool:
        """Collect the readers of ``v`` (channels ``offset``.. of it the producer's); False where
        some path reaches anything but a convolution or InnerProduct that can be scaled."""
        uses = self.readers.get(v.id, [])
        if v.id in self.outputs or not uses or depth > 64:
            return False
        for node in uses:
            if node.op in PER_CHANNEL_HOMOGENEOUS and _reads(node, v) and len(node.inputs) == 1:
                if not self(node.outputs[0], offset, found, depth + 1):
                    return False
            elif node.op == "concat" and v.rank >= 2 and node.attrs["axis"] % v.rank == 1 \
                    and sum(x is v for x in node.inputs) == 1:
                before = 0
                for x in node.inputs:
                    if x is v:
                        break
                    before += int(x.shape[1])
                if not self(node.outputs[0], offset + before, found, depth + 1):
                    return False
            else:
                reader = _as_reader(self.graph, node, v, offset)
                if reader is None or self.last.get(v.name) is not v:
                    return False        # no weight to scale, or its input no top a run can return
                found.append(reader)
        return True


def _reader_columns(w: np.ndarray, reader: Reader, channels: int) -> np.ndarray:
    """The reader's weight relative to each row's largest magnitude, as [rows, producer channel,
    taps] for the producer's ``channels``: how many of its row's steps each weight gets."""
    if reader.kind == "matmul":
        w2 = w if reader.trans_b else w.T                      # [N, K]
        cols = w2[:, reader.offset:reader.offset + channels]
        rows = np.abs(w2).max(axis=1)
        return np.abs(cols)[:, :, None] / np.maximum(rows, np.finfo(np.float32).tiny)[:, None, None]
    per_group = reader.in_channels // reader.group
    out_per_group = w.shape[0] // reader.group
    rows = np.abs(w).reshape(w.shape[0], -1).max(axis=1)
    rel = np.abs(w).reshape(w.shape[0], w.shape[1], -1) / np.maximum(rows, np.finfo(np.float32).tiny)[:, None, None]
    out = np.zeros((w.shape[0], channels, rel.shape[2]))
    for c in range(channels):
        channel = reader.offset + c
        g, local = divmod(channel, per_group)
        out[g * out_per_group:(g + 1) * out_per_group, c] = rel[g * out_per_group:(g + 1) * out_per_group, local]
    return out


def equalization_scales(producers: list[Producer], weights: Mapping[str, np.ndarray],
                        top_ranges: Mapping[str, np.ndarray], strength: float = DEFAULT_STRENGTH
                        ) -> dict[str, np.ndarray]:
    """Producer layer -> s per output channel: (a_i / (T w_i)) ** strength with a_i the largest
    magnitude of its channel i where its readers read it (``top_ranges``: top -> the largest
    magnitude of each of its channels over the calibration data), T the largest of those tops'
    own, and w_i the largest of its readers' weights in column i relative to their rows'. The
    producers whose channels are concatenated share T, so their channels are balanced alike."""
    scales = {}
    for p in producers:
        a = np.zeros(p.channels)
        w = np.zeros(p.channels)
        top = 0.0
        for r in p.readers:
            measured = np.asarray(top_ranges[r.top], np.float64)
            a = np.maximum(a, measured[r.offset:r.offset + p.channels])
            top = max(top, float(measured.max()))
            relative = _reader_columns(np.asarray(weights[r.weight], np.float64), r, p.channels)
            w = np.maximum(w, relative.max(axis=(0, 2)))
        if not top > 0:
            continue                     # a value that stayed at zero: nothing to balance
        a = np.maximum(a / top, 1.0 / ACTIVATION_LEVELS)
        w = np.maximum(w, 1.0 / WEIGHT_LEVELS)
        scales[p.layer] = (a ** strength / w ** (1.0 - strength)).astype(np.float32)
    return scales


def apply_scales(producers: list[Producer], weights: Mapping[str, np.ndarray],
                 scales: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The weights with each producer's output channel i divided by s_i and its readers' input
    channel i multiplied by s_i (new arrays; the others as given)."""
    out = dict(weights)
    for p in producers:
        s = scales.get(p.layer)
        if s is None:
            continue
        w = np.asarray(out[p.weight], np.float32)
        if p.kind == "conv2d":
            w = w / s.reshape(-1, *[1] * (w.ndim - 1))
        else:
            w = w / s.reshape(-1, 1)                             # [N, K]: row n is output n
        out[p.weight] = w.astype(np.float32)
        if p.bias is not None:
            out[p.bias] = (np.asarray(out[p.bias], np.float32) / s).astype(np.float32)
        for r in p.readers:
            rw = np.array(out[r.weight], np.float32)
            if r.kind == "matmul":
                if r.trans_b:
                    rw[:, r.offset:r.offset + p.channels] *= s
                else:
                    rw[r.offset:r.offset + p.channels, :] *= s[:, None]
            else:
                per_group, out_per_group = r.in_channels // r.group, rw.shape[0] // r.group
                for c in range(p.channels):
                    g, local = divmod(r.offset + c, per_group)
                    rw[g * out_per_group:(g + 1) * out_per_group, local] *= s[c]
            out[r.weight] = rw
    return out


def measure_top_ranges(net, weights: Mapping[str, np.ndarray], data: "Mapping[str, np.ndarray] | RowSource",
                           producers: list[Producer], *, max_examples: int = DEFAULT_EXAMPLES,
                           batch_size: int = DEFAULT_BATCH, seed: int = 0, device: str = "cpu",
                           transform: bool = True) -> dict[str, np.ndarray]:
    """Top -> the largest magnitude of each of its channels, for each top the producers' readers
    read, over the calibration data (the same seeded draw as ``collect_ranges``)."""
    source = _Arrays(data) if isinstance(data, Mapping) else data
    phase = infer_phase(net, device, "float32")
    tops = list(dict.fromkeys(r.top for p in producers for r in p.readers))
    largest: dict[str, np.ndarray] = {}
    for _, values in float_runs(phase, weights, source, tops, max_examples, batch_size, seed, transform):
        for t in tops:
            x = np.abs(np.asarray(values[t], np.float32))
            m = x.max(axis=tuple(i for i in range(x.ndim) if i != 1))
            largest[t] = m if t not in largest else np.maximum(largest[t], m)
    return largest


def equalize(net, weights: Mapping[str, np.ndarray], data: "Mapping[str, np.ndarray] | RowSource",
             strength: float = DEFAULT_STRENGTH, **options) -> tuple[dict[str, np.ndarray], dict[str, list[str]]]:
    """The weights equalized over the calibration ``data`` (``options``: ``max_examples``,
    ``batch_size``, ``seed``, ``device``, ``transform`` as ``collect_ranges`` takes them), and
    which layers were: producer layer -> the layers reading its scaled channels. ``net``: a
    loaded Net."""
    producers = equalization_pairs(net.graph("infer", "float32"))
    if not producers:
        return dict(weights), {}
    ranges = measure_top_ranges(net, weights, data, producers, **options)
    scales = equalization_scales(producers, weights, ranges, strength)
    done = {p.layer: list(dict.fromkeys(r.layer for r in p.readers)) for p in producers if p.layer in scales}
    return apply_scales(producers, weights, scales), done
