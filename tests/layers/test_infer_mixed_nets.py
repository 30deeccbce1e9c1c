"""Acceptance: nets that mix every catalog layer kind run through compiled Plans and match PyTorch
(peers.torch_net) to 1e-4 relative in float32 (1e-7 in float64).

Between them the three nets use every layer type of the catalog: grouped, dilated, strided and
padded convolution, BatchNorm on running statistics (perturbed away from 0 / 1) followed by a
learned Scale, Scale by a second bottom, max and average pooling with padding and ceil_mode (and
global), Concat, Slice with slice_point and equal split, Eltwise sum with coefficients / prod /
max, Reshape with 0 and -1, Flatten, InnerProduct on an axis, every activation, Softmax /
LogSoftmax on axes, Dropout, and the losses and Accuracy in the train and test phases; the third
mixes in Caffe's PReLU, MVN, Bias, LRN within a channel, Swish, Clip and Threshold, and its
MultinomialLogistic, Infogain, Hinge and Contrastive losses in the train phase, and SPP; the
second an LSTMUnit step and Caffe's own LSTM and RNN; the third
uses the extended catalog's layers (Embed, LayerNorm, MatMul, Permute,
Reduction, Tile, LRN, Pad, Deconvolution, Crop, Power, ArgMax, MultiHeadAttention, and the recurrent
GRU, LSTM and RNN).
"""
from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from numeric_asserts import TOL, assert_close  # noqa: E402  (tests/ is on the path)

from layers import LAYERS  # noqa: E402
from layers.control import BLOCK_TYPES  # noqa: E402
from peers.torch_net import TorchNet, to_numpy  # noqa: E402
from toolkit.compile import add_gradients  # noqa: E402
from toolkit.frontend import OBJECTIVE, Net  # noqa: E402
from toolkit.ir.graph import FLOAT_DTYPES  # noqa: E402
from toolkit.ops.autodiff import differentiate  # noqa: E402
from toolkit.runtime.plan import Plan  # noqa: E402

IMAGE_NET = """
name: mixed_image
inputs:
  data:  {shape: [N, 3, 12, 12], dtype: float32}
  label: {shape: [N], dtype: int64}
  gain:  {shape: [10, 10], dtype: float32}
  similar: {shape: [N], dtype: float32}
layers:
  - {name: conv1, type: Convolution, bottom: data, top: conv1, num_output: 8, kernel_size: 3, pad: 1}
  - {name: bn1, type: BatchNorm, bottom: conv1, top: conv1}
  - {name: relu1, type: ReLU, bottom: conv1, top: conv1}
  - {name: conv2, type: Convolution, bottom: conv1, top: conv2, num_output: 8, kernel_size: 3, pad: 2,
     dilation: 2, group: 4}
  - {name: elu2, type: ELU, bottom: conv2, top: conv2, alpha: 0.5}
  - {name: prelu2, type: PReLU, bottom: conv2, top: conv2}
  - {name: mvn2, type: MVN, bottom: conv2, top: conv2}
  - {name: bias2, type: Bias, bottom: conv2, top: conv2}
  - {name: pool1, type: Pooling, bottom: conv2, top: pool1, pool: max, kernel_size: 3, stride: 2, pad: 1,
     ceil_mode: true}
  - {name: lrn1, type: LRN, bottom: pool1, top: pool1, norm_region: within_channel, local_size: 3, alpha: 0.3}
  - {name: spp1, type: SPP, bottom: pool1, top: spp1, pyramid_height: 2, pool: ave}
  - {name: conv_a, type: Convolution, bottom: pool1, top: conv_a, num_output: 4, kernel_size: 1}
  - {name: sig_a, type: Sigmoid, bottom: conv_a, top: sig_a}
  - {name: conv_b, type: Convolution, bottom: pool1, top: conv_b, num_output: 6, kernel_size: [3, 2],
     stride: [1, 1], pad: [1, 1], dilation: [1, 2], group: 2}
  - {name: tanh_b, type: TanH, bottom: conv_b, top: tanh_b}
  - {name: swish_b, type: Swish, bottom: tanh_b, top: tanh_b, beta: 1.5}
  - {name: clip_b, type: Clip, bottom: tanh_b, top: tanh_b, min: -0.4, max: 0.6}
  - {name: cat, type: Concat, bottom: [sig_a, tanh_b], top: cat}
  - {name: slice, type: Slice, bottom: cat, top: [s1, s2, s3], slice_point: [2, 6]}
  - {name: esum, type: Eltwise, bottom: [s2, s3], top: esum, coeff: [0.7, -1.3]}
  - {name: eprod, type: Eltwise, bottom: [s2, s3], top: eprod, operation: prod}
  - {name: emax, type: Eltwise, bottom: [esum, eprod], top: emax, operation: max}
  - {name: thr, type: Threshold, bottom: s1, top: thr, threshold: 0.1}
  - {name: cat2, type: Concat, bottom: [s1, emax, esum, thr], top: cat2}
  - {name: pool2, type: Pooling, bottom: cat2, top: pool2, pool: ave, kernel_size: 3, stride: 2, pad: 1,
     ceil_mode: true, count_include_pad: false}
  - {name: bn2, type: BatchNorm, bottom: pool2, top: pool2, affine: false, eps: 0.001}
  - {name: sc2, type: Scale, bottom: pool2, top: pool2, bias_term: true}
  - {name: flat, type: Reshape, bottom: pool2, top: flat, shape: [0, -1]}
  - {name: ip1, type: InnerProduct, bottom: flat, top: ip1, num_output: 32}
  - {name: gelu, type: GELU, bottom: ip1, top: ip1}
  - {name: drop, type: Dropout, bottom: ip1, top: ip1, dropout_ratio: 0.4}
  - {name: ip2, type: InnerProduct, bottom: ip1, top: ip2, num_output: 10}
  - {name: loss, type: SoftmaxWithLoss, bottom: [ip2, label], top: loss, phase: train}
  - {name: prob_t, type: Softmax, bottom: ip2, top: prob_t, phase: train}
  - {name: mlog, type: MultinomialLogisticLoss, bottom: [prob_t, label], top: mlog, phase: train, loss_weight: 0.2}
  - {name: infogain, type: InfogainLoss, bottom: [ip2, label, gain], top: infogain, phase: train, loss_weight: 0.1}
  - {name: hinge, type: HingeLoss, bottom: [ip2, label], top: hinge, phase: train, norm: l2, loss_weight: 0.1}
  - {name: ip3, type: InnerProduct, bottom: ip1, top: ip3, num_output: 10, phase: train}
  - {name: pairs, type: ContrastiveLoss, bottom: [ip2, ip3, similar], top: pairs, phase: train, loss_weight: 0.1}
  - {name: accuracy, type: Accuracy, bottom: [ip2, label], top: accuracy, phase: test, top_k: 3}
  - {name: prob, type: Softmax, bottom: ip2, top: prob, phase: infer}
  - {name: logp, type: LogSoftmax, bottom: ip2, top: logp, phase: infer}
outputs: [prob, logp, spp1]
"""

SEQUENCE_NET = """
name: mixed_sequence
inputs:
  seq:    {shape: [N, 6, 20], dtype: float32}
  target: {shape: [N, 4, 3], dtype: float32}
  cont:   {shape: [N, 4], dtype: float32}
  steps:  {shape: [6, N], dtype: float32}
layers:
  - {name: r1, type: Reshape, bottom: seq, top: r1, shape: [0, 0, 4, -1]}
  - {name: conv1, type: Convolution, bottom: r1, top: conv1, num_output: 6, kernel_size: [2, 3],
     stride: [1, 2], pad: [1, 1], group: 3}
  - {name: bn1, type: BatchNorm, bottom: conv1, top: conv1, momentum: 0.2}
  - {name: lrelu, type: ReLU, bottom: conv1, top: conv1, negative_slope: 0.1}
  - {name: gmax, type: Pooling, bottom: conv1, top: gmax, pool: max, global_pooling: true}
  - {name: gave, type: Pooling, bottom: conv1, top: gave, pool: ave, global_pooling: true}
  - {name: mpool, type: Pooling, bottom: conv1, top: mpool, pool: max, kernel_size: 2, pad: 1}
  - {name: apool, type: Pooling, bottom: mpool, top: apool, pool: ave, kernel_size: 3, stride: 2, pad: 1}
  - {name: flat, type: Flatten, bottom: apool, top: flat}
  - {name: sp, type: Softplus, bottom: flat, top: sp}
  - {name: lg, type: Log, bottom: sp, top: lg}
  - {name: ab, type: AbsVal, bottom: flat, top: ab}
  - {name: ex, type: Exp, bottom: ab, top: ex}
  - {name: th, type: TanH, bottom: flat, top: th}
  - {name: sg, type: Sigmoid, bottom: flat, top: sg}
  - {name: mix, type: Eltwise, bottom: [lg, ex, th, sg], top: mix, coeff: [1.0, -0.1, 2.0, 0.5]}
  - {name: fmax, type: Flatten, bottom: gmax, top: fmax}
  - {name: fave, type: Flatten, bottom: gave, top: fave, axis: 1, end_axis: 2}
  - {name: fave2, type: Reshape, bottom: fave, top: fave, shape: [0, -1]}
  - {name: cat, type: Concat, bottom: [mix, ab, fmax, fave], top: cat}
  - {name: ip1, type: InnerProduct, bottom: cat, top: ip1, num_output: 24}
  - {name: gelu, type: GELU, bottom: ip1, top: ip1, approximate: tanh}
  - {name: drop, type: Dropout, bottom: ip1, top: ip1, dropout_ratio: 0.25}
  - {name: r2, type: Reshape, bottom: ip1, top: r2, shape: [0, 4, -1]}
  - {name: sm, type: Softmax, bottom: r2, top: sm, axis: -1}
  - {name: lsm, type: LogSoftmax, bottom: r2, top: lsm, axis: 1}
  - {name: slice, type: Slice, bottom: sm, top: [p1, p2, p3], axis: 1, slice_point: [1, 3]}
  - {name: halves, type: Slice, bottom: lsm, top: [h1, h2], axis: 2}
  - {name: pmax, type: Eltwise, bottom: [p1, p3], top: pmax, operation: max}
  - {name: hsum, type: Eltwise, bottom: [h1, h2], top: hsum, coeff: [-1.5, 0.5]}
  - {name: gated, type: Scale, bottom: [h1, h2], top: gated, axis: 0}
  - {name: ip2, type: InnerProduct, bottom: lsm, top: ip2, num_output: 3, axis: 2}
  - {name: tm, type: Permute, bottom: seq, top: tm, order: [1, 0, 2]}
  - {name: clstm, type: CaffeLSTM, bottom: [tm, steps], top: clstm, num_output: 3}
  - {name: crnn, type: CaffeRNN, bottom: [tm, steps], top: crnn, num_output: 2}
  - {name: gates, type: InnerProduct, bottom: lsm, top: gates, num_output: 12, axis: 2}
  - {name: unit, type: LSTMUnit, bottom: [ip2, gates, cont], top: [cell, hidden]}
  - {name: l2, type: EuclideanLoss, bottom: [ip2, target], top: l2, phase: train, loss_weight: 0.3}
  - {name: bce, type: SigmoidCrossEntropyLoss, bottom: [ip2, target], top: bce, phase: [train, test]}
outputs: [sm, ip2, pmax, hsum, p2, gated, hidden, clstm, crnn]
"""

# the extended catalog: a token branch (Embed, LayerNorm, dot-product attention by MatMul and
# causal MultiHeadAttention, Permute, Reduction, Tile) and an image branch (LRN, reflect Pad,
# Deconvolution, Crop, Power)
EXTENDED_NET = """
name: mixed_extended
inputs:
  img:    {shape: [N, 4, 6, 6], dtype: float32}
  tokens: {shape: [N, 5], dtype: int64}
  target: {shape: [N, 4, 3], dtype: float32}
layers:
  - {name: emb, type: Embed, bottom: tokens, top: emb, input_dim: 10, num_output: 8}
  - {name: ln, type: LayerNorm, bottom: emb, top: emb}
  - {name: att, type: MatMul, bottom: [emb, emb], top: att, transpose_b: true}
  - {name: sm, type: Softmax, bottom: att, top: att, axis: -1}
  - {name: mha, type: MultiHeadAttention, bottom: emb, top: mha, num_heads: 2, causal: true}
  - {name: ctx, type: MatMul, bottom: [att, mha], top: ctx}
  - {name: perm, type: Permute, bottom: ctx, top: perm, order: [0, 2, 1]}
  - {name: red, type: Reduction, bottom: perm, top: red, operation: mean, axis: 2}
  - {name: tile, type: Tile, bottom: red, top: tile, tiles: 2}
  - {name: bn, type: BatchNorm, bottom: img, top: bn}
  - {name: lrn, type: LRN, bottom: bn, top: lrn, local_size: 3, alpha: 0.1}
  - {name: pad, type: Pad, bottom: lrn, top: pad, pads: [[1, 1], [1, 1]], mode: reflect}
  - {name: up, type: Deconvolution, bottom: pad, top: up, num_output: 3, kernel_size: 2, stride: 2}
  - {name: crop, type: Crop, bottom: [up, img], top: crop, offset: 2}
  - {name: pw, type: Power, bottom: crop, top: pw, power: 2, scale: 0.5, shift: 1}
  - {name: flat, type: Flatten, bottom: pw, top: flat}
  - {name: gru, type: GRU, bottom: emb, top: gru, num_output: 6, bidirectional: true}
  - {name: lstm, type: LSTM, bottom: gru, top: lstm, num_output: 4, return_sequence: false, unroll: false}
  - {name: rnn, type: RNN, bottom: emb, top: rnn, num_output: 3, num_layers: 2, nonlinearity: relu,
     return_sequence: false}
  - {name: cat, type: Concat, bottom: [flat, tile, lstm, rnn], top: cat}
  - {name: ip, type: InnerProduct, bottom: cat, top: ip, num_output: 12}
  - {name: r, type: Reshape, bottom: ip, top: r, shape: [0, 4, 3]}
  - {name: best, type: ArgMax, bottom: r, top: best, axis: 2, phase: infer}
  - {name: l2, type: EuclideanLoss, bottom: [r, target], top: l2, phase: [train, test]}
outputs: [r, best]
"""

NETS = {"image": IMAGE_NET, "sequence": SEQUENCE_NET, "extended": EXTENDED_NET}
# biases right before a BatchNorm on batch statistics: zero gradient in exact arithmetic
ZERO_GRADS = {"image": {"conv1.bias"}, "sequence": {"conv1.bias"}, "extended": set()}


@pytest.fixture(scope="module")
def nets(tmp_path_factory) -> dict[str, Net]:
    folder = tmp_path_factory.mktemp("mixed")
    out = {}
    for key, text in NETS.items():
        path = folder / f"{key}.yaml"
        path.write_text(text)
        out[key] = Net.load(str(path))
    return out


def random_weights(net: Net, dtype: str, seed: int = 3) -> dict[str, np.ndarray]:
    weights = net.init_weights(seed, dtype)
    rng = np.random.default_rng(seed + 1)
    types = {layer.name: layer.type for layer in net.spec.layers}
    for key, arr in weights.items():
        layer = net.declared[key][1]              # the declaring layer: names may hold dots, as keys
        pname = key[len(layer) + 1:]
        if pname in ("bias", "running_mean") or pname.endswith(("_bias", ".bias")):
            arr[...] = rng.normal(0.0, 0.5, arr.shape)
        elif pname == "running_var":
            arr[...] = rng.uniform(0.4, 2.5, arr.shape)
        elif pname == "weight" and types[layer] in ("BatchNorm", "Scale", "LayerNorm"):   # filled with 1
            arr[...] = rng.uniform(0.5, 1.5, arr.shape)
    return weights


def random_inputs(net: Net, dtype: str, batch: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for name, spec in net.spec.inputs.items():
        shape = tuple(batch if isinstance(d, str) else d for d in spec.shape)
        if spec.dtype in FLOAT_DTYPES:
            arr = rng.uniform(0, 1, shape) if name == "target" else rng.normal(0.0, 1.5, shape)
            out[name] = arr.astype(dtype)
        else:
            out[name] = rng.integers(0, 10, shape).astype(spec.dtype)
    return out


def build_plan(graph, weights, batch: int) -> Plan:
    return Plan(graph, {symbol: batch for symbol in graph.symbols()}, weights)


def test_the_mixed_nets_use_every_catalog_layer(nets):
    used = {layer.type for net in nets.values() for layer in net.spec.layers}
    # If and Loop are blocks of other layers, checked with those layers in tests/layers/test_blocks.py;
    # the ONNX layer runs a model file (tests/importers/test_onnx_models.py)
    catalog = set(LAYERS) - set(BLOCK_TYPES) - {"ONNX"}
    assert used == catalog, f"not mixed in: {sorted(catalog - used)}"
    image = {layer.name: layer for layer in nets["image"].spec.layers}
    assert image["conv2"].group > 1 and image["conv2"].dilation != 1
    assert image["pool1"].pad and image["pool2"].pad and image["pool2"].pool == "ave"


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("key", list(NETS))
def test_infer_plan_matches_torch(nets, key, batch, dtype):
    """The infer outputs through one compiled Plan, run twice on different inputs (its buffers
    are reused), and through a second Plan that also outputs every intermediate blob."""
    net = nets[key]
    weights = random_weights(net, dtype)
    peer = TorchNet(net, "infer", dtype)
    peer.load(weights)
    graph = net.graph("infer", dtype)
    assert list(graph.outputs) == list(net.spec.outputs)
    plan = build_plan(graph, copy.deepcopy(weights), batch)
    for seed in (1, 2):
        inputs = random_inputs(net, dtype, batch, seed)
        expected = to_numpy(peer.forward(inputs))
        views = plan.run(inputs)
        for name in net.spec.outputs:
            assert views[name].dtype == np.dtype(dtype)
            assert_close(views[name], expected[name], dtype, f"{key}: output '{name}' (batch {batch}, run {seed})")

    names = [t for layer in net.spec.layers if "infer" in layer.phases for t in layer.tops]
    names = list(dict.fromkeys(names))
    every = build_plan(net.graph("infer", dtype, outputs=names), copy.deepcopy(weights), batch)
    views = every.run(inputs)
    for name in names:
        assert_close(views[name], expected[name], dtype, f"{key}: blob '{name}' (batch {batch})")


@pytest.mark.parametrize("key", list(NETS))
def test_test_phase_metrics_match_torch(nets, key):
    net = nets[key]
    weights = random_weights(net, "float32")
    inputs = random_inputs(net, "float32", 4, seed=5)
    peer = TorchNet(net, "test")
    peer.load(weights)
    expected = to_numpy(peer.forward(inputs))
    graph = net.graph("test")
    views = build_plan(graph, copy.deepcopy(weights), 4).run(inputs)
    assert list(graph.outputs)
    for name in graph.outputs:
        assert_close(views[name], expected[name], "float32", f"{key}: test metric '{name}'")


@pytest.mark.parametrize("key", list(NETS))
def test_train_step_plan_matches_torch(nets, key):
    """One train step of the whole net through a Plan: objective, every parameter gradient, the
    input gradient and the BatchNorm running statistics (Dropout masks drawn alike on both sides)."""
    net = nets[key]
    dtype = "float32"
    weights = random_weights(net, dtype)
    inputs = random_inputs(net, dtype, 4, seed=9)
    peer = TorchNet(net, "train", dtype, dropout_rng=np.random.default_rng(0))
    peer.load(weights)
    objective, _ = peer.train_step(inputs)

    graph = net.graph("train", dtype)
    grads = add_gradients(graph)
    float_inputs = [v for v in graph.inputs.values() if v.dtype in FLOAT_DTYPES]
    dinputs = differentiate(graph, graph.outputs[OBJECTIVE], float_inputs)
    for name, g in grads.items():
        graph.outputs[f"grad:{name}"] = g
    for name, v in graph.inputs.items():
        if v.dtype in FLOAT_DTYPES and dinputs[v.id] is not None:
            graph.outputs[f"dinput:{name}"] = dinputs[v.id]
    plan_weights = copy.deepcopy(weights)
    views = build_plan(graph, plan_weights, 4).run(inputs)

    assert set(grads) == set(peer.grads())
    assert_close(views[OBJECTIVE], objective.numpy(), dtype, f"{key}: objective")
    torch_grads = peer.grads()
    noise = TOL[dtype] * max(np.abs(g).max() for g in torch_grads.values())
    for name, g in torch_grads.items():
        if name in ZERO_GRADS[key]:
            assert np.abs(views[f"grad:{name}"]).max() <= noise and np.abs(g).max() <= noise, name
        else:
            assert_close(views[f"grad:{name}"], g, dtype, f"{key}: d/d {name}")
    input_grads = peer.input_grads()
    assert {n[len("dinput:"):] for n in graph.outputs if n.startswith("dinput:")} == set(input_grads)
    for name, g in input_grads.items():
        assert_close(views[f"dinput:{name}"], g, dtype, f"{key}: d/d input '{name}'")
    state = peer.state()
    assert graph.updates
    for name in graph.updates:
        assert_close(plan_weights[name], state[name], dtype, f"{key}: updated {name}")
