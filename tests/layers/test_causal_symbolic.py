"""Causal attention over a symbolic sequence length: the mask is made from positions (``iota``)
when a plan binds T, so one net file serves every length. Checked against PyTorch's
nn.MultiheadAttention with generate_square_subsequent_mask and against
scaled_dot_product_attention(is_causal=True): outputs, and the gradients of the input and of
every weight, at several lengths from one graph."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from toolkit.frontend import Net  # noqa: E402
from toolkit.ir.graph import Value  # noqa: E402
from toolkit.ops import Builder  # noqa: E402
from toolkit.ops.autodiff import differentiate  # noqa: E402
from toolkit.runtime.plan import Plan  # noqa: E402

NET = """
name: decoder
inputs:
  x: {shape: [N, T, 8]}
  PADDING
layers:
  - {name: attn, type: MultiHeadAttention, bottom: BOTTOMS, top: y, num_heads: 2, causal: true}
outputs: [y]
"""


def load(tmp_path, padding: bool) -> Net:
    text = NET.replace("PADDING", "pad: {shape: [N, T], dtype: bool}" if padding else "")
    text = text.replace("BOTTOMS", "[x, pad]" if padding else "x")
    path = tmp_path / "decoder.yaml"
    path.write_text(text)
    return Net.load(str(path))


def with_gradients(net: Net):
    """The infer graph plus d(sum(y * r))/d(x and every weight)."""
    graph = net.graph("infer", "float64")
    y = graph.outputs["y"]
    graph.inputs["r"] = Value(y.type, name="r")
    b = Builder(graph)
    objective = b.op("reduce_sum", b.mul(y, graph.inputs["r"]), axes=(0, 1, 2), keepdims=False)
    wrt = {"x": graph.inputs["x"], **{k: w.value for k, w in graph.weights.items()}}
    grads = differentiate(graph, objective, list(wrt.values()))
    for name, v in wrt.items():
        graph.outputs[f"grad:{name}"] = grads[v.id]
    return graph


def torch_attention(weights):
    mha = torch.nn.MultiheadAttention(8, 2, batch_first=True).double()
    mha.load_state_dict({k.split(".", 1)[1]: torch.from_numpy(v) for k, v in weights.items()})
    return mha


@pytest.mark.parametrize("padding", [False, True])
def test_causal_attention_over_a_symbolic_length_matches_pytorch(tmp_path, padding):
    net = load(tmp_path, padding)
    assert net.spec.inputs["x"].shape[1] == "T"
    graph = with_gradients(net)
    assert "iota" in {n.op for n in graph.nodes}     # the mask waits for T
    weights = net.init_weights(seed=2, dtype="float64")
    rng = np.random.default_rng(3)
    for weight in weights.values():                 # biases start at zero: move them
        weight += rng.normal(0, 0.1, weight.shape)
    mha = torch_attention(weights)
    for steps in (1, 3, 7):
        x = rng.normal(size=(2, steps, 8))
        r = rng.normal(size=(2, steps, 8))
        feeds = {"x": x, "r": r}
        pad = None
        if padding:                                  # the last keys of example 1 are padding
            pad = np.zeros((2, steps), bool)
            pad[1, max(1, steps - 2):] = True
            feeds["pad"] = pad
        got = Plan(graph, {"N": 2, "T": steps}, weights).run(feeds)

        xt = torch.from_numpy(x).requires_grad_(True)
        mask = torch.nn.Transformer.generate_square_subsequent_mask(steps, dtype=torch.float64)
        ignored = None if pad is None else torch.zeros(pad.shape, dtype=torch.float64).masked_fill(
            torch.from_numpy(pad), float("-inf"))
        want, _ = mha(xt, xt, xt, attn_mask=mask, need_weights=False, key_padding_mask=ignored)
        mha.zero_grad()
        (want * torch.from_numpy(r)).sum().backward()
        np.testing.assert_allclose(got["y"], want.detach().numpy(), rtol=1e-10, atol=1e-12, err_msg=f"T={steps}")
        np.testing.assert_allclose(got["grad:x"], xt.grad.numpy(), rtol=1e-9, atol=1e-11, err_msg=f"T={steps}")
        for name, param in mha.named_parameters():
            np.testing.assert_allclose(got[f"grad:attn.{name}"], param.grad.numpy(), rtol=1e-9, atol=1e-11,
                                       err_msg=f"{name} at T={steps}")


def test_the_mask_is_pytorchs_is_causal(tmp_path):
    """The same scores as scaled_dot_product_attention(is_causal=True), heads split by hand."""
    net = load(tmp_path, False)
    weights = net.init_weights(seed=5, dtype="float64")
    graph = net.graph("infer", "float64")
    x = np.random.default_rng(9).normal(size=(3, 5, 8))
    got = Plan(graph, {"N": 3, "T": 5}, weights).run({"x": x})["y"]
    w_in, b_in = (torch.from_numpy(weights[f"attn.in_proj_{k}"]) for k in ("weight", "bias"))
    q, k, v = (torch.from_numpy(x) @ w_in.T + b_in).chunk(3, dim=-1)
    heads = [t.reshape(3, 5, 2, 4).transpose(1, 2) for t in (q, k, v)]
    out = torch.nn.functional.scaled_dot_product_attention(*heads, is_causal=True)
    out = out.transpose(1, 2).reshape(3, 5, 8) @ torch.from_numpy(weights["attn.out_proj.weight"]).T
    out = out + torch.from_numpy(weights["attn.out_proj.bias"])
    np.testing.assert_allclose(got, out.numpy(), rtol=1e-10, atol=1e-12)


def test_causal_with_different_query_and_key_lengths_is_an_error(tmp_path):
    path = tmp_path / "cross.yaml"
    path.write_text("""
name: cross
inputs:
  q: {shape: [N, T, 8]}
  kv: {shape: [N, S, 8]}
layers:
  - {name: attn, type: MultiHeadAttention, bottom: [q, kv, kv], top: y, num_heads: 2, causal: true}
outputs: [y]
""")
    with pytest.raises(Exception, match="causal needs as many queries as keys.*is T.*S"):
        Net.load(str(path)).graph("infer")
