"""The measured cost model (toolkit/placement/cost.py): its keys, its fit for shapes not measured,
its cache (never trusting a corrupt or foreign file), and its prediction of a real net's step
time against the step as it measures, interleaved on this machine (predict.py)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from toolkit import settings
from toolkit.benchmarking import bench_plan, time_plan
from toolkit.frontend.spec import parse_overrides
from toolkit.hostmem import available_memory
from toolkit.ir.dims import Sym
from toolkit.ir.graph import Graph, TensorType, Value
from toolkit.ops import Builder
from toolkit.placement import cost
from toolkit.placement.cost import (
    Fit,
    MeasuredModel,
    fit_samples,
    load_cache,
    machine_identity,
    measured_model,
    op_key,
    save_cache,
)
from toolkit.placement.model import Link
from toolkit.placement.predict import predict_plan
from toolkit.zoo.resolve import load_net


def _matmuls(widths=(64, 64)):
    g = Graph("infer")
    x = Value(TensorType((Sym.named("N"), 64), "float32"), name="x")
    g.inputs = {"x": x}
    b = Builder(g, "ip")
    out = x
    for k, width in enumerate(widths):
        w = Value(TensorType((out.shape[1], width), "float32"), name=f"w{k}")
        g.inputs[f"w{k}"] = w
        out = b.op("matmul", out, w, trans_a=False, trans_b=False)
    g.outputs = {"y": out}
    return g


def test_a_key_names_the_op_its_bound_shapes_and_attributes_the_kind_and_the_threads():
    g = _matmuls((64, 64))
    first, second = [n for n in g.nodes if n.op == "matmul"]
    assert op_key(first, {"N": 8}, "cpu", 2) == op_key(second, {"N": 8}, "cpu", 2)   # the same GEMM twice
    keys = {op_key(first, {"N": 8}, "cpu", 2), op_key(first, {"N": 16}, "cpu", 2),
            op_key(first, {"N": 8}, "cpu", 1), op_key(first, {"N": 8}, "gpu", 2)}
    assert len(keys) == 4
    other = _matmuls((64, 64))                     # another graph, the same op: the same key
    assert op_key(other.nodes[0], {"N": 8}, "cpu", 2) == op_key(first, {"N": 8}, "cpu", 2)
    flipped = Builder(other, "ip").op("matmul", other.inputs["x"], other.inputs["x"], trans_a=True, trans_b=False)
    assert op_key(flipped.producer, {"N": 64}, "cpu", 2) != op_key(first, {"N": 64}, "cpu", 2)


def test_the_fit_recovers_a_fixed_cost_a_flop_rate_and_a_byte_rate():
    truth = Fit(2e-6, 1e-10, 5e-11, 0)
    samples = [(f, b, truth.seconds(f, b)) for f, b in [(0, 1e3), (1e6, 1e4), (1e8, 1e5), (1e3, 1e7), (5e7, 5e6)]]
    fit = fit_samples(samples)
    assert (fit.fixed_s, fit.per_flop_s, fit.per_byte_s) == pytest.approx((2e-6, 1e-10, 5e-11), rel=1e-6)
    # times that fall with the bytes would need a negative rate: that feature is dropped, the
    # rest refitted, and no coefficient is below 0
    falling = fit_samples([(0, 1e3, 3e-6), (0, 1e6, 2e-6), (0, 1e7, 1e-6)])
    assert falling.per_byte_s == 0 and falling.per_flop_s == 0 and falling.fixed_s > 0
    assert fit_samples([]) is None


def _model_of(g, measured_seconds: dict, links=None) -> MeasuredModel:
    ops = {}
    for node, seconds in measured_seconds.items():
        ops[op_key(node, {"N": 8}, "cpu", 2)] = (seconds, cost.node_flops(node, {"N": 8}),
                                                 cost.node_bytes(node, {"N": 8}))
    return MeasuredModel({"N": 8}, ops, links or {("cpu", "cpu"): Link(1e-6, 1e9)}, threads=2)


def test_a_measured_time_is_answered_as_measured_a_shape_not_measured_by_the_fit():
    g = _matmuls((64, 32, 16, 8))
    a, b, c, d = [n for n in g.nodes if n.op == "matmul"]
    # three GEMMs at 1 us + 1 ns per FLOP: the fourth is predicted at that rate
    rate = {n: 1e-6 + 1e-9 * cost.node_flops(n, {"N": 8}) for n in (a, b, c, d)}
    model = _model_of(g, {a: rate[a], b: rate[b], c: rate[c]})
    assert model.op_seconds(a, "cpu") == rate[a] and model.op_seconds(b, "cpu:1") == rate[b]  # cpu:1: the same cores
    assert model.measured(a, "cpu") and not model.measured(d, "cpu")
    assert model.op_seconds(d, "cpu") == pytest.approx(rate[d], rel=1e-3)
    with pytest.raises(KeyError, match="gpu"):
        model.op_seconds(a, "gpu")
    x = g.inputs["x"]
    assert model.transfer_seconds(x, "cpu", "cpu:1") == pytest.approx(1e-6 + 8 * 64 * 4 / 1e9)
    assert model.transfer_seconds(x, "cpu:1", "cpu:1") == 0.0
    with pytest.raises(KeyError, match="cpu to gpu"):
        model.transfer_seconds(x, "cpu", "gpu")
    limit = model.memory_limit("cpu:1")
    assert limit is not None and abs(limit - available_memory()) < 256 << 20 and model.memory_limit("gpu") is None


def test_a_node_at_a_size_not_measured_is_predicted_from_the_same_node_at_the_sizes_that_were():
    g = _matmuls((64,))
    (node,) = [n for n in g.nodes if n.op == "matmul"]
    family = cost.family_key(node, "cpu", 2)
    assert family == cost.family_key(_matmuls((64,)).nodes[0], "cpu", 2)
    # measured at N = 4 and 8 as 1 us + 1 ns per FLOP: N = 32 follows the line
    line = {n: 1e-6 + 1e-9 * 2 * n * 64 * 64 for n in (4, 8, 32)}
    samples = [(line[n], 2.0 * n * 64 * 64, 0.0) for n in (4, 8)]
    model = MeasuredModel({"N": 32}, {}, {}, threads=2, families={family: samples})
    assert not model.measured(node, "cpu")
    assert model.op_seconds(node, "cpu") == pytest.approx(line[32], rel=1e-9)
    # one size measured: its time scaled by the FLOPs
    one = MeasuredModel({"N": 32}, {}, {}, threads=2, families={family: samples[:1]})
    assert one.op_seconds(node, "cpu") == pytest.approx(line[4] * 8, rel=1e-9)


def test_a_corrupt_or_foreign_cache_file_is_ignored_and_a_good_one_read_back(tmp_path):
    path = tmp_path / "costs.json"
    good = {"ops": {"matmul/cpu/abc": [1024.0, 4096.0, [1e-5, 2e-5, 3e-5], "f00"]},
            "links": {"cpu->cpu": [1e-6, 1e10]}}
    save_cache(good, path)
    assert load_cache(path) == good
    for text in ["{not json", json.dumps([1, 2]), json.dumps({"machine": {**machine_identity(), "processor": "other"},
                                                               **good}),
                 json.dumps({"machine": {**machine_identity(), "version": "0.0.0"}, **good})]:
        path.write_text(text)
        assert load_cache(path) == {"ops": {}, "links": {}}
    # entries that are not times are dropped one by one, the rest kept
    bad = {"machine": machine_identity(), "ops": {"a": [1, 2, [float("nan")], "f"], "b": [1, 2, [], "f"], "c": "x",
                                                  "e": [1, 2, [1e-6]], "d": [1, 2, [1e-6], "f"]},
           "links": {"cpu->cpu": [1e-6, -5], "cpu->gpu": [1e-6, 1e9]}}
    path.write_text(json.dumps(bad))
    assert load_cache(path) == {"ops": {"d": [1, 2, [1e-6], "f"]}, "links": {"cpu->gpu": [1e-6, 1e9]}}


def _branchnet_plan(batch=8, placed=()):
    net = load_net("zoo:branchnet", parse_overrides([f"layers.{name}.device=cpu:1" for name in placed]))
    return bench_plan(net, batch, False)


def test_a_graph_is_measured_once_then_answered_from_the_cache(tmp_path, monkeypatch):
    plan, _ = _branchnet_plan(placed=("branch_tanh", "act_tanh"))
    with settings.use(cache=tmp_path):
        model = measured_model(plan.graph, plan.bindings, "cpu")
        assert cost.cache_path().is_file()

        def refuse(*args, **kwargs):
            raise AssertionError("measured again")
        monkeypatch.setattr(cost, "measure_graph", refuse)
        monkeypatch.setattr(cost, "measure_link", refuse)
        again = measured_model(plan.graph, plan.bindings, "cpu")
    for node in plan.steps:
        if node.op != "transfer":
            assert again.op_seconds(node, "cpu") == model.op_seconds(node, "cpu") > 0
            assert again.measured(node, "cpu")
    (move, *_) = [n for n in plan.steps if n.op == "transfer"]
    link = model.links[("cpu", "cpu")]
    assert 0 <= link.latency_s < 1e-3 and 1e8 < link.bytes_per_s < 1e12       # a memory copy, whatever the load
    assert model.transfer_seconds(move.inputs[0], "cpu", "cpu:1") > 0
    assert set(model.arenas) == {"cpu", "cpu:1"} and all(n > 0 for n in model.arenas.values())


def test_a_gpu_placement_is_not_claimed(tmp_path):
    g = _matmuls((64,))
    g.layer_devices = {"ip": "gpu"}
    with settings.use(cache=tmp_path), pytest.raises(KeyError, match="host devices only"):
        measured_model(g, {"N": 8}, "cpu")


def test_the_predicted_step_of_the_inception_block_is_within_a_quarter_of_the_measured_one(tmp_path):
    """Rounds of (measure the model afresh, predict, time the plan), so that both see the same
    load on a shared machine; the median of the rounds' errors is compared. The goal is 25%; on a
    machine other processes keep busy the prediction and the run still see different moments, so
    the test allows 35% (docs/explanations/devices.md, "What a placement costs", has the figures)."""
    net = load_net("benchmarks/nets/inception.yaml")
    plan, inputs = bench_plan(net, 8, False)
    errors = []
    for r in range(5):
        with settings.use(cache=tmp_path / f"round{r}"):
            predicted = predict_plan(plan).seconds
        measured = float(np.median(time_plan(plan, inputs, 50, 3)))
        errors.append(predicted / measured - 1)
    assert abs(np.median(errors)) < 0.35, [f"{100 * e:+.0f}%" for e in errors]


def test_compile_explain_and_bench_give_the_prediction_beside_what_they_show(tmp_path):
    from tests.cli.cli_helpers import run_cli
    placed = ["--set", "layers.branch_tanh.device=cpu:1", "--set", "layers.act_tanh.device=cpu:1"]
    with settings.use(cache=tmp_path):
        text = run_cli("compile", "zoo:branchnet", "--explain", "--batch", "8", *placed)
        as_json = run_cli("compile", "zoo:branchnet", "--explain", "--json", "--batch", "8", *placed)
        plain = run_cli("compile", "zoo:branchnet", "--json", "--batch", "8", *placed)
        bench = run_cli("bench", "zoo:branchnet", "--batch", "8", "--iters", "5", "--json", "--predict", *placed)
        unasked = run_cli("bench", "zoo:branchnet", "--batch", "8", "--iters", "5", "--json", *placed)
    assert text.status == as_json.status == plain.status == bench.status == 0
    (line,) = [line for line in text.out.splitlines() if line.startswith("predicted step time at N=8: ")]
    predicted = json.loads(as_json.out)["predicted"]
    # the transfers are steps too: 2 here, each way once; the tanh branch is too little work to
    # run beside the others on a core group of its own (runtime/device_groups.py)
    assert predicted["schedule"] == "serial" and predicted["fitted"] == 0 and predicted["ms"] > 0
    assert f"{predicted['kernels']} of {predicted['kernels']} kernels timed on this machine" in line
    assert "the plan running its steps one after another" in line
    assert "predicted" not in json.loads(plain.out)            # measured only when asked for by name
    report = json.loads(bench.out)
    assert report["predicted"]["ms"] > 0 and report["predicted"]["kernels"] == report["kernel_calls"]
    assert unasked.status == 0 and "predicted" not in json.loads(unasked.out)    # bench measures it only asked
