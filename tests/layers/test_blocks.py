"""If and Loop blocks in net files: a Loop over layers equals the RNN layer with the same weights
(outputs and every gradient), runs at several sequence lengths from one graph with one body
plan, an If runs the branch its bool input picks and compiles to one branch when its condition
is a constant, and mistakes inside blocks are reported where they were written."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from toolkit.compile import add_gradients
from toolkit.frontend import OBJECTIVE, Net
from toolkit.ops.autodiff import differentiate
from toolkit.runtime.plan import Plan, RuntimeState

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "cli"))
from cli_helpers import run_cli  # noqa: E402

LOOP_NET = """
name: loop_rnn
inputs:
  x: {shape: [N, T, 3]}
  h0: {shape: [N, 4]}
  label: {shape: [N], dtype: int64}
layers:
  - name: rnn
    type: Loop
    scan: {x_t: x}
    carry: {h: h0}
    top: [h_last, hs]
    output: {h_last: h}
    stack: {hs: h}
    body:
      - {name: inp, type: InnerProduct, bottom: x_t, top: a, num_output: 4}
      - {name: rec, type: InnerProduct, bottom: h, top: r, num_output: 4, bias_term: false}
      - {name: sum, type: Eltwise, bottom: [a, r], top: s}
      - {name: act, type: TanH, bottom: s, top: h}
  - {name: tmaj, type: Permute, bottom: hs, top: hst, order: [0, 2, 1]}
  - {name: pool, type: Reduction, bottom: hst, top: pooled, operation: mean, axis: 2}
  - {name: cat, type: Concat, bottom: [h_last, pooled], top: feat}
  - {name: head, type: InnerProduct, bottom: feat, top: head, num_output: 3}
  - {name: loss, type: SoftmaxWithLoss, bottom: [head, label], top: loss, phase: train}
"""

# the same computation with the RNN layer (unrolled at a fixed T): W_ih = inp.weight, b_ih =
# inp.bias, W_hh = rec.weight, b_hh = 0
RNN_NET = """
name: layer_rnn
inputs:
  x: {shape: [N, T_FIXED, 3]}
  h0: {shape: [1, N, 4]}
  label: {shape: [N], dtype: int64}
layers:
  - {name: rnn, type: RNN, bottom: [x, h0], top: [hs, hn], num_output: 4, unroll: true}
  - {name: last, type: Reshape, bottom: hn, top: h_last, shape: [-1, 4]}
  - {name: tmaj, type: Permute, bottom: hs, top: hst, order: [0, 2, 1]}
  - {name: pool, type: Reduction, bottom: hst, top: pooled, operation: mean, axis: 2}
  - {name: cat, type: Concat, bottom: [h_last, pooled], top: feat}
  - {name: head, type: InnerProduct, bottom: feat, top: head, num_output: 3}
  - {name: loss, type: SoftmaxWithLoss, bottom: [head, label], top: loss, phase: train}
"""


def load(tmp_path, text, name):
    path = tmp_path / name
    path.write_text(text)
    return Net.load(str(path))


def with_gradients(net: Net, dtype="float64"):
    graph = net.graph("train", dtype)
    for key, g in add_gradients(graph).items():
        graph.outputs[f"grad:{key}"] = g
    grads = differentiate(graph, graph.outputs[OBJECTIVE], [graph.inputs["x"], graph.inputs["h0"]])
    graph.outputs["grad:x"] = grads[graph.inputs["x"].id]
    graph.outputs["grad:h0"] = grads[graph.inputs["h0"].id]
    return graph


def inputs_for(steps: int, batch=3, seed=0):
    rng = np.random.default_rng(seed)
    return {"x": rng.normal(size=(batch, steps, 3)), "h0": rng.normal(size=(batch, 4)),
            "label": rng.integers(0, 3, batch)}


@pytest.mark.parametrize("steps", [2, 5])
def test_a_loop_of_layers_equals_the_rnn_layer_outputs_and_gradients(tmp_path, steps):
    looped = load(tmp_path, LOOP_NET, "loop.yaml")
    layer = load(tmp_path, RNN_NET.replace("T_FIXED", str(steps)), "rnn.yaml")
    weights = looped.init_weights(seed=1, dtype="float64")
    weights["inp.bias"] = np.random.default_rng(2).normal(size=4)
    as_layer = {"rnn.weight_ih_l0": weights["inp.weight"], "rnn.bias_ih_l0": weights["inp.bias"],
                "rnn.weight_hh_l0": weights["rec.weight"], "rnn.bias_hh_l0": np.zeros(4),
                "head.weight": weights["head.weight"], "head.bias": weights["head.bias"]}
    data = inputs_for(steps)
    ours = Plan(with_gradients(looped), {"N": 3, "T": steps}, weights).run(data)
    theirs = Plan(with_gradients(layer), {"N": 3}, as_layer).run(dict(data, h0=data["h0"][None]))
    np.testing.assert_allclose(ours[OBJECTIVE], theirs[OBJECTIVE], rtol=1e-12)
    pairs = {"inp.weight": "rnn.weight_ih_l0", "inp.bias": "rnn.bias_ih_l0", "rec.weight": "rnn.weight_hh_l0",
             "head.weight": "head.weight", "x": "x"}
    for mine, other in pairs.items():
        np.testing.assert_allclose(ours[f"grad:{mine}"], theirs[f"grad:{other}"], rtol=1e-10, atol=1e-13,
                                   err_msg=mine)
    np.testing.assert_allclose(ours["grad:h0"], theirs["grad:h0"][0], rtol=1e-10, atol=1e-13)


def test_one_graph_runs_several_lengths_with_one_body_plan(tmp_path):
    net = load(tmp_path, LOOP_NET, "loop.yaml")
    graph = net.graph("infer", "float64", outputs=["h_last", "head"])
    weights = net.init_weights(seed=1, dtype="float64")
    runtime = RuntimeState(np.random.default_rng(0))
    for steps in (1, 4, 9):
        data = inputs_for(steps, seed=steps)
        out = Plan(graph, {"N": 3, "T": steps}, weights, runtime=runtime).run(data)
        h = data["h0"]
        for t in range(steps):
            h = np.tanh(data["x"][:, t] @ weights["inp.weight"].T + weights["inp.bias"] + h @ weights["rec.weight"].T)
        np.testing.assert_allclose(out["h_last"], h, rtol=1e-12)
    assert len(runtime.body_plans) == 1, "the loop body was planned again for a new length"


IF_NET = """
name: pick
inputs:
  x: {shape: [N, 3]}
  flag: {shape: [], dtype: bool}
layers:
  - name: choose
    type: If
    bottom: flag
    top: y
    then:
      - {name: fc, type: InnerProduct, bottom: x, top: y, num_output: 3}
    else:
      - {name: act, type: TanH, bottom: x, top: y}
"""


def test_an_if_runs_the_branch_its_input_picks(tmp_path):
    net = load(tmp_path, IF_NET, "if.yaml")
    weights = net.init_weights(seed=3)
    graph = net.graph("infer")
    x = np.random.default_rng(4).normal(size=(2, 3)).astype(np.float32)
    plan = Plan(graph, {"N": 2}, weights)
    on = np.array(plan.run({"x": x, "flag": np.array(True)})["y"])
    off = np.array(plan.run({"x": x, "flag": np.array(False)})["y"])
    np.testing.assert_allclose(on, x @ weights["fc.weight"].T + weights["fc.bias"], rtol=1e-5)
    np.testing.assert_allclose(off, np.tanh(x), rtol=1e-6)


@pytest.mark.parametrize("flag,kept,gone", [("true", "matmul", "tanh"), ("false", "tanh", "matmul")])
def test_a_constant_condition_compiles_to_one_branch(tmp_path, flag, kept, gone):
    text = IF_NET.replace("  flag: {shape: [], dtype: bool}\n", "").replace("bottom: flag", f"condition: {flag}")
    path = tmp_path / "if_const.yaml"
    path.write_text(text)
    result = run_cli("compile", path, "--json")
    assert result.status == 0, result.err
    report = json.loads(result.out)
    assert "if" not in report["ops"] and kept in report["ops"] and gone not in report["ops"]
    changes = [c for p in report["passes"] for c in p["changes"]]
    assert any(f"always {flag.capitalize()}" in c for c in changes)


BAD_BLOCKS = """
name: bad_blocks
inputs:
  x: {shape: [N, 5, 3]}
layers:
  - name: rnn
    type: Loop
    scan: {x_t: x}
    top: hs
    stack: {hs: a}
    body:
      - {name: inp, type: InnerProdct, bottom: x_t, top: a, num_output: 4}
      - {name: act, type: TanH, bottom: a, top: a, slope: 2}
  - name: pick
    type: If
    top: y
    then:
      - {name: t, type: TanH, bottom: x, top: y}
    else:
      - {name: e, type: Sigmoid, bottom: x, top: y}
  - name: count
    type: Loop
    carry: {h: x}
    output: {h_out: h}
    top: h_out
    body:
      - {name: d, type: TanH, bottom: h, top: h}
"""


def test_mistakes_inside_blocks_are_reported_where_they_are_written(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(BAD_BLOCKS)
    result = run_cli("check", path)
    assert result.status == 2
    lines = result.err.strip().splitlines()
    text = BAD_BLOCKS.splitlines()

    def at(snippet, needle):
        row = next(i for i, line in enumerate(text) if snippet in line)
        return f"{path}:{row + 1}:{text[row].index(needle) + 1}: error: "
    assert any(line.startswith(at("InnerProdct", "InnerProdct")) and "unknown layer type 'InnerProdct'" in line
               and "InnerProduct" in line for line in lines), lines
    assert any(line.startswith(at("slope: 2", "slope")) and "unknown key 'slope'" in line for line in lines), lines
    assert any(line.startswith(at("name: pick", "name")) and "needs condition" in line for line in lines), lines
    assert any("layer 'count' (Loop)" in line and "needs scan: (blobs to step through) or trips:" in line
               for line in lines), lines
    assert all(": error: " in line for line in lines) and "Traceback" not in result.err


MORE_MISTAKES = """
name: bad_more
inputs:
  x: {shape: [N, T, 3]}
  h0: {shape: [1, N, 4]}
  flag: {shape: [], dtype: bool}
  label: {shape: [N], dtype: int64}
layers:
  - {name: gru, type: GRU, bottom: x, top: g, num_output: 4, unroll: true}
  - {name: lstm, type: LSTM, bottom: [x, h0], top: l, num_output: 4}
  - name: both
    type: Loop
    scan: {x_t: x}
    trips: 3
    top: hs
    stack: {hs: a}
    body:
      - {name: act, type: TanH, bottom: x_t, top: a}
  - name: wrong_output
    type: Loop
    scan: {x_t: x}
    top: o
    output: {o: a}
    body:
      - {name: act2, type: TanH, bottom: x_t, top: a}
  - name: twice
    type: If
    condition: true
    bottom: flag
    top: y
    then: [{name: t, type: TanH, bottom: h0, top: y}]
    else: [{name: e, type: Sigmoid, bottom: h0, top: y}]
  - name: lossy
    type: Loop
    scan: {x_t: x}
    top: hs2
    stack: {hs2: a3}
    body:
      - {name: act3, type: TanH, bottom: x_t, top: a3}
      - {name: inner_loss, type: SoftmaxWithLoss, bottom: [a3, label], top: bad}
"""


@pytest.mark.parametrize("snippet,key,message", [
    ("name: gru,", "unroll", "unroll: true needs a fixed sequence length, but T is T"),
    ("name: lstm,", "bottom", "LSTM takes bottoms [x] or [x, h0, c0]: c0 is missing"),
    ("trips: 3", "trips", "give scan: or trips:, not both"),
    ("output: {o: a}", "output", "output: 'o' names 'a', which is not a carried blob (none)"),
    ("condition: true", "condition", "give the condition as condition: true|false or as a bottom, not both"),
    ("name: inner_loss", "{name", "a loss layer cannot be inside an If or Loop block"),
])
def test_more_block_and_recurrent_mistakes(tmp_path, snippet, key, message):
    path = tmp_path / "more.yaml"
    path.write_text(MORE_MISTAKES)
    result = run_cli("check", path)
    assert result.status == 2 and "Traceback" not in result.err
    text = MORE_MISTAKES.splitlines()
    row = next(i for i, line in enumerate(text) if snippet in line)
    where = f"{path}:{row + 1}:{text[row].index(key) + 1}: error: "
    assert any(line.startswith(where) and message in line for line in result.err.splitlines()), result.err
