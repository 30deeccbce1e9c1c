"""A deploy net (no label, no loss) has a train step to time and draw, as `caffe time` times
forward and backward of any net (docs/spec.md section 4): `toolkit bench --train` and `toolkit
graph --phase train` add the objective sum(outputs), each output's gradient 1 everywhere, and
say so. The step is checked against its update written out in numpy."""
from __future__ import annotations

import json

import numpy as np
from cli_helpers import run_cli, write_net

from toolkit.benchmarking import bench_plan
from toolkit.frontend.heads import with_objective
from toolkit.weights import save_weights
from toolkit.zoo.resolve import load_net

DEPLOY = """
name: scores
inputs:
  data: {shape: [N, 6]}
layers:
  - {name: ip1, type: InnerProduct, bottom: data, top: ip1, num_output: 5}
  - {name: prob, type: Softmax, bottom: ip1, top: prob}
"""

# class scores without a Softmax: the objective sum(ip1) has the gradient of a linear map
LINEAR = """
name: linear
inputs:
  data: {shape: [N, 6]}
layers:
  - {name: ip1, type: InnerProduct, bottom: data, top: ip1, num_output: 5}
"""

NOTE = ("note: scores has no loss layer (a deploy net): its train step here is forward, then backward from a "
        "gradient of 1 on every element of 'prob' (the objective sum(prob)), as `caffe time` runs backward "
        "through any net")


def test_bench_train_times_a_deploy_net_and_says_what_it_added(tmp_path):
    net = write_net(tmp_path, DEPLOY)
    r = run_cli("bench", net, "--train", "--batch", "4", "--iters", "3", "--warmup", "1", "--json")
    assert r.status == 0, r.err
    assert NOTE in r.err.splitlines()
    report = json.loads(r.out)
    assert report["mode"] == "train" and report["solver"] == "sgd" and report["median_ms"] > 0


def test_graph_phase_train_draws_a_deploy_nets_step_with_its_updates(tmp_path):
    net = write_net(tmp_path, DEPLOY)
    r = run_cli("graph", net, "--phase", "train", "-o", tmp_path / "g.dot")
    assert r.status == 0, r.err
    assert NOTE in r.err.splitlines()
    text = (tmp_path / "g.dot").read_text()
    assert "ip1.weight" in text and "ip1.bias" in text and "update" in text


def test_the_step_is_sgd_on_the_sum_of_the_outputs(tmp_path):
    path = write_net(tmp_path, LINEAR)
    rng = np.random.default_rng(5)
    w = rng.standard_normal((5, 6)).astype(np.float32)
    b = rng.standard_normal(5).astype(np.float32)
    save_weights(str(tmp_path / "w.safetensors"), {"ip1.weight": w, "ip1.bias": b})
    net, note = with_objective(load_net(str(path)))
    assert "the objective sum(ip1)" in note
    plan, inputs = bench_plan(net, 4, True, weights_file=str(tmp_path / "w.safetensors"), lr=0.5)
    x = inputs["data"].copy()
    outs = plan.run(inputs)
    after = {k: np.array(plan.memory.storage_of[v.value.id].external) for k, v in plan.graph.weights.items()}
    # objective = sum over n, j of (x W^T + b)[n, j]: d/dW[j, :] = sum_n x[n, :], d/db[j] = N
    np.testing.assert_allclose(float(outs["@objective"]), float((x @ w.T + b).sum()), rtol=1e-5)
    np.testing.assert_allclose(after["ip1.weight"], w - 0.5 * np.tile(x.sum(axis=0), (5, 1)), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(after["ip1.bias"], b - 0.5 * 4, rtol=1e-6)


def test_a_net_with_a_loss_is_left_as_it_is(tmp_path):
    net = load_net(str(write_net(tmp_path, DEPLOY.replace("data: {shape: [N, 6]}", "data: {shape: [N, 6]}\n  "
                                                          "label: {shape: [N], dtype: int64}")
                                 + "  - {name: loss, type: SoftmaxWithLoss, bottom: [ip1, label], top: loss}\n")))
    same, note = with_objective(net)
    assert same is net and note is None
