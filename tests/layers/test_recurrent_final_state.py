"""``return_sequence: false`` gives the last layer's final state of each direction, directions side
by side: PyTorch's ``h_n[-D:]`` (Keras's ``Bidirectional(..., return_sequences=False)``), checked
against ``nn.RNN`` / ``nn.LSTM`` / ``nn.GRU`` themselves, output and input gradient, in both
forms (the loop and the unrolled steps) and over a symbolic length."""
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
name: final_state
inputs:
  x: {shape: [N, STEPS, 3]}
layers:
  - {name: rec, type: KIND, bottom: x, top: y, num_output: 4, num_layers: LAYERS, bidirectional: true,
     return_sequence: false, unroll: UNROLL}
outputs: [y]
"""


def torch_layer(kind: str, layers: int, weights: dict) -> "torch.nn.Module":
    module = getattr(torch.nn, kind)(3, 4, num_layers=layers, bidirectional=True, batch_first=True).double()
    module.load_state_dict({k.split(".", 1)[1]: torch.from_numpy(v) for k, v in weights.items()})
    return module


@pytest.mark.parametrize("kind", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("unroll, steps, layers", [(True, 6, 1), (False, 6, 2), (False, "T", 2)])
def test_return_sequence_false_is_each_directions_final_state(tmp_path, kind, unroll, steps, layers):
    path = tmp_path / "net.yaml"
    path.write_text(NET.replace("KIND", kind).replace("UNROLL", str(unroll).lower())
                    .replace("STEPS", str(steps)).replace("LAYERS", str(layers)))
    net = Net.load(str(path))
    weights = net.init_weights(seed=3, dtype="float64")
    x = np.random.default_rng(5).normal(size=(2, 6, 3))

    graph = net.graph("infer", "float64")
    y_value = graph.outputs["y"]
    seed = graph.inputs["x"]                    # d(sum(y * r))/dx against torch's autograd
    r = np.random.default_rng(6).normal(size=(2, 8))
    graph.inputs["r"] = Value(y_value.type, name="r")
    b = Builder(graph)
    objective = b.op("reduce_sum", b.mul(y_value, graph.inputs["r"]), axes=(0, 1), keepdims=False)
    graph.outputs["grad:x"] = differentiate(graph, objective, [seed])[seed.id]
    got = Plan(graph, {"N": 2, "T": 6} if steps == "T" else {"N": 2}, weights).run({"x": x, "r": r})

    xt = torch.from_numpy(x).requires_grad_(True)
    module = torch_layer(kind, layers, weights)
    out, final = module(xt)
    h_n = final[0] if kind == "LSTM" else final
    want = torch.cat([h_n[-2], h_n[-1]], dim=1)            # forward's last, reverse's last
    (want * torch.from_numpy(r)).sum().backward()
    assert got["y"].shape == (2, 8)
    np.testing.assert_allclose(got["y"], want.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got["grad:x"], xt.grad.numpy(), rtol=1e-9, atol=1e-11)
    # the reverse half is not the sequence output's last step (what it was before): that one has
    # seen one token
    assert not np.allclose(got["y"][:, 4:], out[:, -1, 4:].detach().numpy())
