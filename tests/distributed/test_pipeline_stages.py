"""Pipeline stages in one process (training/stages.py, training/pipeline.py, ops/p2p.py): the
balance is the best cut, the step over M micro-batches cut into K stages with its sends and
receives gives the update of one process at the whole batch (interpreted and compiled), each
stage holds its own weights alone, activations go down the stages and their gradients back up,
and what a pipeline cannot do is one line."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from toolkit.compile import optimize, solver_config, train_graph
from toolkit.distributed.comm import Solo, use
from toolkit.errors import UserError
from toolkit.frontend.net import Net
from toolkit.ir.graph import Graph, TensorType, Value, Weight
from toolkit.ops.base import Builder
from toolkit.ops.interpreter import interpret
from toolkit.optim.solvers import host_values
from toolkit.runtime.plan import Plan
from toolkit.training.pipeline import build_pipeline, check_micro_batches, micro_batch_feed, micro_batches_of
from toolkit.training.stage_balance import Stages, balance
from toolkit.training.stages import cut

LENET = "zoo/lenet/net.yaml"


def brute_force_worst(costs, k):
    best = float("inf")
    for cuts in itertools.combinations(range(1, len(costs)), k - 1):
        bounds = [0, *cuts, len(costs)]
        best = min(best, max(sum(costs[a:b]) for a, b in zip(bounds, bounds[1:])))
    return best


@pytest.mark.parametrize("seed", range(5))
def test_balance_finds_the_cut_with_the_smallest_slowest_stage(seed):
    rng = np.random.default_rng(seed)
    costs = [float(c) for c in rng.integers(0, 100, 9)]
    for k in (1, 2, 3, 4):
        starts = balance(costs, k)
        assert starts[0] == 0 and len(starts) == k and starts == sorted(set(starts))
        bounds = starts + [len(costs)]
        worst = max(sum(costs[a:b]) for a, b in zip(bounds, bounds[1:]))
        assert worst == brute_force_worst(costs, k)


def lenet_step(rows: int, seed: int = 0):
    """The one-process train step of LeNet in float64, its weights, a batch and the step's scalars."""
    net = Net.load(LENET)
    cfg = solver_config(net)
    one = train_graph(net, cfg, "float64")
    rng = np.random.default_rng(seed)
    weights = {k: 0.1 * rng.standard_normal(tuple(w.value.shape)) for k, w in one.weights.items()}
    batch = {"data": rng.standard_normal((rows, 1, 8, 8)), "label": rng.integers(0, 10, rows)}
    return net, cfg, one, weights, batch, host_values(cfg, 0.1, 1, "float64")


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("stages,micro", [(2, 1), (2, 2), (2, 4), (3, 2), (4, 4)])
def test_the_cut_step_in_one_process_is_the_step_at_the_whole_batch(stages, micro, schedule):
    net, cfg, one, weights, batch, scalars = lenet_step(16)
    expected_out, expected = interpret(one, {**batch, **scalars}, weights)
    p = build_pipeline(net, cfg, stages, micro, 16 // micro, "float64", schedule=schedule)
    feed = {**micro_batch_feed(batch, p.forward, micro, "float64"), **scalars}
    feed = {k: v for k, v in feed.items() if k in p.cut.graph.inputs}
    with use(Solo()) as comm:
        out, updates = interpret(p.cut.one_process(), feed, weights)
        assert not comm.mailbox                           # every message sent was received
    assert set(updates) == set(expected)
    for k in expected:
        np.testing.assert_allclose(updates[k], expected[k], rtol=1e-12, atol=1e-14, err_msg=k)
    assert out["@objective"] == pytest.approx(float(expected_out["@objective"]), rel=1e-13)
    # compiled, with the passes, the plan's kernels send and receive the same
    compiled_weights = {k: np.array(v) for k, v in weights.items()}
    with use(Solo()):
        plan = Plan(optimize(p.cut.one_process()), {"N": 16 // micro}, compiled_weights)
        got = plan.run(feed)
    assert float(got["@objective"]) == pytest.approx(float(expected_out["@objective"]), rel=1e-12)
    for k in expected:
        np.testing.assert_allclose(compiled_weights[k], expected[k], rtol=1e-10, atol=1e-12, err_msg=k)


def test_each_stage_holds_its_own_weights_and_messages_go_down_then_up():
    net, cfg, one, *_ = lenet_step(8)
    p = build_pipeline(net, cfg, 2, 4, 2, "float64")
    assert p.stages.layers[0][0] == "conv1" and p.stages.layers[-1][-1] == "loss"
    assert [n for names in p.stages.layers for n in names] == \
        ["conv1", "relu1", "pool1", "conv2", "relu2", "pool2", "ip1", "relu3", "ip2", "loss"]
    held = [set(p.cut.stage_graph(s).weights) for s in range(2)]
    assert held[0].isdisjoint(held[1]) and held[0] | held[1] == set(one.weights)
    assert "conv1.weight" in held[0] and "conv1.weight@momentum" in held[0] and "ip2.weight" in held[1]
    for s in range(2):
        g = p.cut.stage_graph(s)
        assert set(g.updates) == held[s]
        assert {"@objective", "loss"} <= set(g.outputs)       # every rank logs the loss
    sent = p.cut.sent()
    activations = [r for r in sent if not r["scope"].endswith(".grad.send") and r["type"] != "f64[]"]
    gradients = [r for r in sent if r["scope"].endswith(".grad.send")]
    # one activation down and its gradient up per micro-batch; the losses' scalars to rank 0
    assert len(activations) == len(gradients) == 4
    assert all(r["from"] == 0 and r["to"] == 1 for r in activations)
    assert all(r["from"] == 1 and r["to"] == 0 for r in gradients)
    # the gradient of what went down comes up: same shape, the same bytes (float64, 2 rows)
    assert {r["type"] for r in activations} == {r["type"] for r in gradients} == {"f64[N, 32, 4, 4]"}
    assert all(r["bytes"].evaluate({"N": 2}) == 2 * 32 * 4 * 4 * 8 for r in activations + gradients)
    # the stages are balanced: the larger has the smallest FLOPs any cut gives it
    assert max(p.stages.flops) == brute_force_worst(
        [float(x) for x in _layer_flops(p)], 2)


def _layer_flops(p):
    from toolkit.training.stage_balance import layer_flops
    order = [n for names in p.stages.layers for n in names]
    flops = layer_flops(p.cut.graph, order, {s: 2 for s in p.cut.graph.symbols()})
    return [flops[n] for n in order]


def test_send_and_recv_carry_a_value_between_stages_in_one_process():
    g = Graph("infer")
    x = g.inputs["x"] = Value(TensorType((2, 3), "float32"), name="x")
    b = Builder(g, "t")
    token = b.op("send", b.op("mul", x, x), peer=1, tag=7)
    got = b.op("recv", token, peer=0, tag=7, shape=(2, 3), dtype="float32")
    g.outputs["y"] = b.op("add", got, x)
    x_in = np.arange(6, dtype=np.float32).reshape(2, 3)
    with use(Solo()) as comm:
        out, _ = interpret(g, {"x": x_in}, {})
        np.testing.assert_array_equal(out["y"], x_in * x_in + x_in)
        plan = Plan(g, {}, {})
        for scale in (1, 2):             # the kernel's buffer is reused from step to step
            np.testing.assert_array_equal(plan.run({"x": scale * x_in})["y"], (scale * x_in) ** 2 + scale * x_in)
        assert not comm.mailbox


def test_what_a_pipeline_cannot_do_is_one_line():
    net, cfg, *_ = lenet_step(8)
    with pytest.raises(UserError, match="at most 10 stages"):
        build_pipeline(net, cfg, 11, 1, 8)
    with pytest.raises(UserError, match=r"micro_batches is 3, which does not divide train.data.batch_size \(32\)"):
        check_micro_batches(32, 3)
    with pytest.raises(UserError, match="micro_batches is 8, which does not divide"):
        check_micro_batches(4, 8)
    check_micro_batches(32, 4)
    from toolkit.optim.loss_scaling import MixedPrecision
    from toolkit.optim.solvers import SolverConfig
    with pytest.raises(UserError, match="does not run mixed precision yet"):
        build_pipeline(net, SolverConfig(mixed_precision=MixedPrecision()), 2, 1, 8)
    with pytest.raises(UserError, match="the schedules are gpipe, 1f1b"):
        build_pipeline(net, cfg, 2, 1, 8, schedule="interleaved")


def test_a_short_batch_runs_as_the_most_equal_micro_batches_that_divide_it():
    assert [micro_batches_of(rows, 4) for rows in (32, 30, 158, 7, 2, 1)] == [4, 3, 2, 1, 2, 1]
    assert micro_batches_of(30, 1) == 1


def test_layers_sharing_a_weight_across_stages_are_refused():
    g = Graph("train")
    x = g.inputs["x"] = Value(TensorType((2, 4), "float64"), name="x")
    w = Value(TensorType((4, 4), "float64"), name="w")
    g.weights["a.w"] = Weight("a.w", w, True, {"type": "constant", "value": 0.0}, layer="a")
    h = Builder(g, "a").op("matmul", x, w, trans_a=False, trans_b=False)
    g.outputs["y"] = Builder(g, "c").op("matmul", h, w, trans_a=False, trans_b=False)   # layer c reads layer a's weight
    stages = Stages([["a"], ["c"]], [1, 1])
    with pytest.raises(UserError, match="layers that share a weight must be in one stage"):
        cut(g, stages)


def test_compile_explains_the_stages_their_weights_the_bytes_sent_and_the_bubble():
    import json
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-m", "toolkit.cli", "compile", LENET, "--phase", "train", "--stages", "2",
                           "--batch", "32", "--set", "train.distributed.micro_batches=4", "--set",
                           "train.distributed.balance=flops", "--json"],
                          cwd=root, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["bubble"] == pytest.approx(1 / 5) and report["micro_batch_rows"] == 8
    assert report["balanced_by"] == "FLOPs" and report["limit_moved"] is None
    stages = report["per_stage"]
    assert [n for s in stages for n in s["layers"]] == \
        ["conv1", "relu1", "pool1", "conv2", "relu2", "pool2", "ip1", "relu3", "ip2", "loss"]
    model = Net.load(LENET).init_weights()
    whole = sum(a.nbytes for k, a in model.items())
    assert sum(s["weight_bytes"] for s in stages) == whole
    assert all(s["weight_bytes"] == s["slot_bytes"] for s in stages)          # SGD's momentum: one slot each
    # the cut after pool1: [8, 16, 4, 4] float32 down and its gradient up, per micro-batch; the
    # two logged losses (loss, the objective) up to rank 0 once a step
    boundary = 8 * 16 * 4 * 4 * 4
    assert stages[0]["layers"][-1] == "pool1"
    assert report["bytes_down"] == 4 * boundary and report["bytes_up"] == 4 * boundary + 2 * 4
    slowest = max(s["predicted_ms"] for s in stages)
    assert report["predicted_step_ms"] == pytest.approx(slowest * 5 / 4, rel=1e-3)
    assert sum(s["flops_share"] for s in stages) == pytest.approx(1, abs=1e-3)


def test_compile_stages_is_for_the_train_phase():
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-m", "toolkit.cli", "compile", LENET, "--stages", "2"],
                          cwd=root, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and proc.stderr.strip() == \
        "error: --stages is for --phase train (the pipeline-parallel train step)"


BATCHNORM = """
name: bn
inputs:
  data: {shape: [N, 4], dtype: float32}
  label: {shape: [N], dtype: int64}
layers:
  - {name: ip1, type: InnerProduct, bottom: data, top: ip1, num_output: 6}
  - {name: bn1, type: BatchNorm, bottom: ip1, top: bn1}
  - {name: relu1, type: ReLU, bottom: bn1, top: relu1}
  - {name: ip2, type: InnerProduct, bottom: relu1, top: ip2, num_output: 3}
  - {name: loss, type: SoftmaxWithLoss, bottom: [ip2, label], top: loss}
"""


def test_batchnorm_in_a_pipeline_normalises_each_micro_batch_by_its_own_statistics(tmp_path):
    """The step over 2 micro-batches is two one-process steps' gradients at the micro-batch,
    averaged, with the running statistics updated by the first micro-batch and then the second."""
    from toolkit.compile import add_gradients
    from toolkit.optim.solvers import SolverConfig
    path = tmp_path / "bn.yaml"
    path.write_text(BATCHNORM)
    net = Net.load(str(path))
    plain = SolverConfig()                       # plain SGD: an update is w - lr x gradient
    rng = np.random.default_rng(3)
    p = build_pipeline(net, plain, 2, 2, 4, "float64")
    weights = {k: (rng.standard_normal(tuple(w.value.shape)) if w.trainable else
                   (np.ones if "var" in k else np.zeros)(tuple(w.value.shape)))
               for k, w in p.cut.graph.weights.items()}
    batch = {"data": rng.standard_normal((8, 4)), "label": rng.integers(0, 3, 8)}
    assert {"bn1", "ip2"} & set(p.stages.layers[1]) and "ip1" in p.stages.layers[0]
    # the reference: each micro-batch through a one-process graph of its own rows
    one = net.graph("train", "float64")
    grads = add_gradients(one)
    for name, g in grads.items():
        one.outputs[f"grad:{name}"] = g
    state = dict(weights)
    summed = {}
    for m in range(2):
        rows = slice(4 * m, 4 * m + 4)
        out, updates = interpret(one, {k: v[rows] for k, v in batch.items()}, state)
        for name in grads:
            summed[name] = summed.get(name, 0) + 0.5 * out[f"grad:{name}"]
        state = {**state, **updates}              # the running statistics move on
    scalars = host_values(plain, 1.0, 1, "float64")
    feed = {**micro_batch_feed(batch, p.forward, 2, "float64"), **scalars}
    with use(Solo()):
        _, got = interpret(p.cut.one_process(), {k: v for k, v in feed.items() if k in p.cut.graph.inputs}, weights)
    assert any("running" in k or "mean" in k for k in one.updates)
    for name in one.updates:
        np.testing.assert_allclose(got[name], state[name], rtol=1e-12, atol=1e-14, err_msg=name)
    for name, g in summed.items():
        np.testing.assert_allclose(weights[name] - got[name], g, rtol=1e-10, atol=1e-13, err_msg=name)


def test_the_schedules_orders_of_forward_and_backward_passes():
    from toolkit.training.stages import slots
    assert slots(0, 2, 3, "gpipe") == [(0, "F"), (1, "F"), (2, "F"), (2, "B"), (1, "B"), (0, "B")]
    # 1F1B: a stage runs ahead by the stages after it, then one forward, one backward
    assert slots(0, 2, 4, "1f1b") == [(0, "F"), (1, "F"), (0, "B"), (2, "F"), (1, "B"), (3, "F"), (2, "B"),
                                      (3, "B")]
    assert slots(1, 2, 4, "1f1b") == [(0, "F"), (0, "B"), (1, "F"), (1, "B"), (2, "F"), (2, "B"), (3, "F"),
                                      (3, "B")]
    assert slots(0, 3, 2, "1f1b") == [(0, "F"), (1, "F"), (0, "B"), (1, "B")]
    for s in range(3):
        order = slots(s, 3, 5, "1f1b")
        assert sorted(order) == sorted(slots(s, 3, 5, "gpipe"))
        in_flight = peak = 0
        for _, phase in order:
            in_flight += 1 if phase == "F" else -1
            peak = max(peak, in_flight)
        assert peak == 3 - s                      # activations of K - s micro-batches at most


def test_1f1b_holds_fewer_micro_batches_activations_than_gpipe():
    from toolkit.runtime.plan import memory_figures
    net, cfg, *_ = lenet_step(8)
    peaks = {}
    for schedule in ("gpipe", "1f1b"):
        p = build_pipeline(net, cfg, 2, 8, 8, "float32", schedule=schedule)
        peaks[schedule] = memory_figures(optimize(p.cut.stage_graph(0)), {"N": 8})["peak_bytes"]
    # stage 0 holds its activations of 8 micro-batches under GPipe, of 2 under 1F1B
    assert peaks["1f1b"] < 0.6 * peaks["gpipe"], peaks


def test_replicas_sum_each_stages_gradients_in_buckets_of_its_own_and_the_losses_on_the_last():
    """With replicas, each bucket holds one stage's gradients (its stage's ranks sum it), the
    buckets are numbered across the stages, and the logged losses are summed on the last stage
    before they are sent; with the sums the identity (one process) the step is unchanged."""
    from toolkit.training.pipeline import ReplicaSums
    net, cfg, one, weights, batch, scalars = lenet_step(16)
    expected_out, expected = interpret(one, {**batch, **scalars}, weights)
    sums = ReplicaSums(2, bucket_mb=0.01)           # 10 kB buckets: stage 1's gradients fill several
    p = build_pipeline(net, cfg, 2, 2, 8, "float64", replicas=sums)
    trainable = {k for k, w in one.weights.items() if w.trainable}
    assert sorted(n for names in sums.buckets for n in names) == sorted(trainable)
    seen = []
    for s in range(2):
        g = p.cut.stage_graph(s)
        starts = [n for n in g.nodes if n.op == "allreduce_start"]
        names = {v.id: k for k, w in g.weights.items() for v in [w.value]}
        held = {k for k in g.weights if k in trainable}
        assert sum(len(n.inputs) for n in starts) == len(held)
        assert all(held >= set(sums.buckets[n.attrs["bucket"]]) for n in starts)
        seen += [n.attrs["bucket"] for n in starts]
        assert not names.keys() & {v.id for n in starts for v in n.inputs}     # gradients, not weights
        assert len([n for n in g.nodes if n.op == "allreduce_sum"]) == (2 if s == 1 else 0)   # loss, objective
    assert sorted(seen) == list(range(len(sums.buckets))) and len(sums.buckets) > 2
    feed = {**micro_batch_feed(batch, p.forward, 2, "float64"), **scalars}
    with use(Solo()) as comm:
        out, updates = interpret(p.cut.one_process(), {k: v for k, v in feed.items() if k in p.cut.graph.inputs},
                                 weights)
        assert not comm.mailbox and not comm.pending
    for k in expected:
        np.testing.assert_allclose(updates[k], expected[k], rtol=1e-12, atol=1e-14, err_msg=k)
    assert out["@objective"] == pytest.approx(float(expected_out["@objective"]), rel=1e-13)
    # a replica's share of the global batch weighs its micro-batches
    half = micro_batch_feed(batch, p.forward, 2, "float64", share=0.5)
    assert float(half["@micro_weight0"]) == 0.25


def test_compile_explains_the_replicas_of_a_pipeline():
    import json
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    command = [sys.executable, "-m", "toolkit.cli", "compile", LENET, "--phase", "train", "--stages", "2",
               "--batch", "32", "--set", "train.distributed.micro_batches=4"]
    proc = subprocess.run(command + ["--ranks", "4", "--json"], cwd=root, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["replicas"]["by_replica"] == [[0, 1], [2, 3]]
    assert report["replicas"]["global_batch"] == 64 and report["micro_batch_rows"] == 8
    stages = report["per_stage"]
    assert [s["allreduce"]["ranks"] for s in stages] == [[0, 2], [1, 3]]
    # each stage sums its own weights' gradients: together the whole net's, float32
    whole = sum(a.nbytes for a in Net.load(LENET).init_weights().values())
    assert [s["allreduce"]["bytes"] for s in stages] == [s["weight_bytes"] for s in stages]
    assert sum(s["allreduce"]["bytes"] for s in stages) == whole
    proc = subprocess.run(command + ["--ranks", "3"], cwd=root, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and proc.stderr.strip() == \
        "error: --stages 2 does not divide --ranks 3 (the ranks are stages x replicas)"
