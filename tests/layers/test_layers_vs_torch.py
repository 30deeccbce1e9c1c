"""Every catalog layer against PyTorch (peers.torch_net), in float32 and float64.

Each case is a small net exercising one layer kind with non-default parameters. With random
weights (biases and BatchNorm statistics perturbed away from 0 and 1) loaded into both sides:
- infer phase: every blob, through the reference interpreter and through a compiled Plan;
- train phase: the objective, each loss top, the gradient of the objective with respect to every
  trainable parameter (compile.add_gradients) and every float input, and the running statistics
  after the step (graph.updates), through the interpreter and a Plan.
Tolerances: 1e-4 relative in float32, 1e-7 in float64 (elementwise, with an absolute floor of the
same fraction of the largest expected magnitude).

The cases are ``layer_cases.py``; loading, weighting and feeding one is ``layer_case_nets.py``.
"""
from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from numeric_asserts import TOL, assert_close  # noqa: E402  (tests/ is on the path)

from layers import LAYERS  # noqa: E402
from layers.control import BLOCK_TYPES  # noqa: E402
from peers.torch_net import SUPPORTED, TorchNet, to_numpy  # noqa: E402
from tests.layers.layer_case_nets import load_net, random_inputs, random_weights, run_plan, tops_in  # noqa: E402
from tests.layers.layer_cases import BY_ID, CASES  # noqa: E402
from toolkit.compile import add_gradients  # noqa: E402
from toolkit.frontend import OBJECTIVE, Net  # noqa: E402
from toolkit.ir.binding import bind_symbols  # noqa: E402
from toolkit.ir.graph import FLOAT_DTYPES  # noqa: E402
from toolkit.ops.autodiff import differentiate  # noqa: E402
from toolkit.ops.interpreter import interpret  # noqa: E402
from toolkit.runtime.plan import Plan  # noqa: E402


# -- tests ---------------------------------------------------------------------------------------
def test_translator_and_cases_cover_the_catalog():
    # If and Loop are blocks of other layers: tests/layers/test_blocks.py checks them against the
    # same layers written out; an ONNX layer runs a model file, checked against PyTorch and ONNX
    # Runtime on the same file in tests/importers/test_onnx_models.py
    catalog = set(LAYERS) - set(BLOCK_TYPES) - {"ONNX"}
    assert catalog <= SUPPORTED, f"no torch translation for {sorted(catalog - SUPPORTED)}"
    covered = {layer["type"] for case in CASES for layer in case.layers}
    assert catalog <= covered, f"layer types without a test case: {sorted(catalog - covered)}"


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case_id", list(BY_ID))
def test_infer_forward_matches_torch(tmp_path, case_id, dtype):
    case = BY_ID[case_id]
    net = load_net(tmp_path, case)
    weights = random_weights(net, dtype)
    inputs = random_inputs(net, case, dtype)
    names = tops_in(net, "infer")

    peer = TorchNet(net, "infer", dtype)
    peer.load(weights)
    expected = to_numpy(peer.forward(inputs))

    graph = net.graph("infer", dtype, outputs=names)
    interpreted, updates = interpret(graph, inputs, weights)
    assert updates == {}
    planned = run_plan(graph, copy.deepcopy(weights), inputs, names)
    for name in names:
        assert_close(interpreted[name], expected[name], dtype, f"{case_id}: blob '{name}' (interpreter)")
        assert_close(planned[name], expected[name], dtype, f"{case_id}: blob '{name}' (plan)")


def train_graph_with_gradients(net: Net, dtype: str):
    """The train graph plus outputs d(objective)/d(every trainable weight) and /d(every float input)."""
    graph = net.graph("train", dtype)
    weight_grads = add_gradients(graph)
    float_inputs = {k: v for k, v in graph.inputs.items() if v.dtype in FLOAT_DTYPES}
    input_grads = differentiate(graph, graph.outputs[OBJECTIVE], list(float_inputs.values()))
    for key, g in weight_grads.items():
        graph.outputs[f"grad:{key}"] = g
    for name, v in float_inputs.items():
        if input_grads[v.id] is not None:
            graph.outputs[f"dinput:{name}"] = input_grads[v.id]
    return graph


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case_id", list(BY_ID))
def test_train_step_matches_torch(tmp_path, case_id, dtype):
    case = BY_ID[case_id]
    net = load_net(tmp_path, case)
    weights = random_weights(net, dtype)
    inputs = random_inputs(net, case, dtype)

    peer = TorchNet(net, "train", dtype, dropout_rng=np.random.default_rng(0))
    peer.load(weights)
    objective, blobs = peer.train_step(inputs)
    torch_grads = peer.grads()
    torch_input_grads = peer.input_grads()
    torch_state = peer.state()

    graph = train_graph_with_gradients(net, dtype)
    names = list(graph.outputs)
    interpreted, updates = interpret(graph, inputs, weights, rng=np.random.default_rng(0))
    plan_weights = copy.deepcopy(weights)
    planned = run_plan(graph, plan_weights, inputs, names)

    grad_keys = {n.split(":", 1)[1] for n in names if n.startswith("grad:")}
    assert grad_keys == set(torch_grads), "parameters with a gradient differ from torch's"
    assert grad_keys, "the case trains no parameter"
    input_keys = {n.split(":", 1)[1] for n in names if n.startswith("dinput:")}
    assert input_keys == set(torch_input_grads), "float inputs with a gradient differ from torch's"
    assert set(updates) == set(graph.updates)

    for source, out in (("interpreter", interpreted), ("plan", planned)):
        assert_close(out[OBJECTIVE], objective.numpy(), dtype, f"{case_id}: objective ({source})")
        for top in peer.loss_weights:
            assert_close(out[top], blobs[top].detach().numpy(), dtype, f"{case_id}: loss '{top}' ({source})")
        for key in grad_keys - set(case.zero_grads):
            assert_close(out[f"grad:{key}"], torch_grads[key], dtype, f"{case_id}: d/d {key} ({source})")
        for key in case.zero_grads:
            noise = TOL[dtype] * max(np.abs(g).max() for g in torch_grads.values())
            assert np.abs(out[f"grad:{key}"]).max() <= noise, f"{case_id}: d/d {key} should vanish ({source})"
            assert np.abs(torch_grads[key]).max() <= noise, f"{case_id}: torch's d/d {key} should vanish"
        for name in input_keys:
            assert_close(out[f"dinput:{name}"], torch_input_grads[name], dtype,
                         f"{case_id}: d/d input '{name}' ({source})")
    # running statistics after the step: graph.updates (interpreter) / the plan's weights, and torch's buffers
    for key in graph.updates:
        assert_close(updates[key], torch_state[key], dtype, f"{case_id}: updated {key} (interpreter)")
        assert_close(plan_weights[key], torch_state[key], dtype, f"{case_id}: updated {key} (plan)")
    for key in peer.buffers:
        if key not in graph.updates:     # frozen statistics stay as loaded on both sides
            np.testing.assert_array_equal(torch_state[key], weights[key].astype(torch_state[key].dtype))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_batchnorm_running_statistics_over_steps(tmp_path, dtype):
    """Three train steps chaining the running statistics: each step's graph.updates fed back as
    weights equals torch's buffers after three forwards in train mode (momentum, unbiased var)."""
    case = BY_ID["batchnorm_conv_train_stats"]
    net = load_net(tmp_path, case)
    weights = random_weights(net, dtype)
    peer = TorchNet(net, "train", dtype)
    peer.load(weights)
    graph = net.graph("train", dtype)
    assert set(graph.updates) == {"bn.running_mean", "bn.running_var"}
    plan_weights = copy.deepcopy(weights)
    plan = None
    state = dict(weights)
    for step in range(3):
        inputs = random_inputs(net, case, dtype, seed=100 + step)
        peer.forward(inputs)
        _, updates = interpret(graph, inputs, state)
        state.update(updates)
        if plan is None:
            plan = Plan(graph, bind_symbols(graph, {k: v.shape for k, v in inputs.items()}), plan_weights)
        plan.run(inputs)
    torch_state = peer.state()
    for key in ("bn.running_mean", "bn.running_var"):
        assert not np.allclose(torch_state[key], weights[key]), "the statistics did not move"
        assert_close(state[key], torch_state[key], dtype, f"{key} after 3 steps (interpreter)")
        assert_close(plan_weights[key], torch_state[key], dtype, f"{key} after 3 steps (plan)")


def test_comparison_detects_a_small_mismatch(tmp_path):
    """The oracle is not vacuous: a 1% change of one weight, or average pooling's divisor rule
    flipped on the torch side, fails the comparison."""
    case = BY_ID["conv_grouped_dilated_strided_padded"]
    net = load_net(tmp_path, case)
    weights = random_weights(net, "float32")
    inputs = random_inputs(net, case, "float32")
    changed = copy.deepcopy(weights)
    changed["conv.weight"][1, 0, 1, 1] *= 1.01
    peer = TorchNet(net, "infer", "float32")
    peer.load(changed)
    expected = to_numpy(peer.forward(inputs))
    out, _ = interpret(net.graph("infer", "float32", outputs=["conv"]), inputs, weights)
    with pytest.raises(AssertionError):
        assert_close(out["conv"], expected["conv"], "float32", "conv")

    case = BY_ID["pool_ave_padded_ceil_exclude_pad"]
    flipped = copy.deepcopy(case)
    flipped.layers[0]["count_include_pad"] = True
    net = load_net(tmp_path, case)
    (tmp_path / "flipped").mkdir()
    other = load_net(tmp_path / "flipped", flipped)
    inputs = random_inputs(net, case, "float32")
    out, _ = interpret(net.graph("infer", "float32", outputs=["pool"]), inputs, {})
    expected = to_numpy(TorchNet(other, "infer").forward(inputs))
    with pytest.raises(AssertionError):
        assert_close(out["pool"], expected["pool"], "float32", "pool")


@pytest.mark.parametrize("case_id, phase, change", [
    ("attention_causal_self", "infer", lambda layers: layers[0].update(causal=False)),
    ("attention_key_padding_mask", "infer", lambda layers: layers[0].update(bottom=["x"])),
    ("attention_dropout", "train", lambda layers: layers[0].update(dropout=0.0)),
])
def test_attention_comparison_sees_masks_and_dropout(tmp_path, case_id, phase, change):
    """The attention cases are not vacuous: the causal mask, the key padding mask and the
    attention dropout each change the result (torch runs the net without it, the toolkit with)."""
    case = BY_ID[case_id]
    changed = copy.deepcopy(case)
    change(changed.layers)
    net = load_net(tmp_path, case)
    (tmp_path / "changed").mkdir()
    other = load_net(tmp_path / "changed", changed)
    weights = random_weights(net, "float64")
    inputs = random_inputs(net, case, "float64")
    peer = TorchNet(other, phase, "float64", dropout_rng=np.random.default_rng(0))
    peer.load(weights)
    expected = to_numpy(peer.forward(inputs))
    graph = net.graph(phase, "float64", outputs=["attn"])
    out, _ = interpret(graph, inputs, weights, rng=np.random.default_rng(0))
    with pytest.raises(AssertionError):
        assert_close(out["attn"], expected["attn"], "float64", "attn")


def test_torch_net_round_trips_weights_and_reports_keys(tmp_path):
    net = load_net(tmp_path, BY_ID["batchnorm_conv_train_stats"])
    weights = random_weights(net, "float64")
    peer = TorchNet(net, "train", "float64")
    peer.load(weights)
    assert set(peer.keys) == set(net.declared)
    state = peer.state()
    for key, arr in weights.items():
        np.testing.assert_array_equal(state[key], arr)
    with pytest.raises(KeyError, match="bn.running_var"):
        peer.load({k: v for k, v in weights.items() if k != "bn.running_var"})
    with pytest.raises(ValueError, match="conv.bias"):
        peer.load({**weights, "conv.bias": np.zeros(5)})
    assert peer.output_names == ["loss"]
    assert TorchNet(net, "infer").output_names == ["head"]
