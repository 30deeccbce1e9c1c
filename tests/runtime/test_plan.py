"""Compiled plans against the reference interpreter (and PyTorch) on multi-op graphs: memory
reuse, repeated runs, symbolic batch bindings, in-place weight updates and constant folding."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from toolkit.ir.dims import Sym
from toolkit.ir.graph import Graph, TensorType, Value, Weight
from toolkit.ops import Builder
from toolkit.ops.autodiff import differentiate
from toolkit.ops.interpreter import interpret
from toolkit.runtime.memory import nbytes_of
from toolkit.runtime.plan import Plan

N = Sym.named("N")
LR = 0.1


def add_input(graph, name, shape, dtype):
    v = Value(TensorType(tuple(shape), dtype), name=name)
    graph.inputs[name] = v
    return v


def add_weight(graph, name, shape, dtype, trainable=True):
    v = Value(TensorType(tuple(shape), dtype), name=name)
    graph.weights[name] = Weight(name, v, trainable, {"type": "constant", "value": 0.0})
    return v


def convnet(dtype="float64", batch=N, train=False):
    """x[N,3,8,8] -> conv(3->4, 3x3, pad 1) -> relu -> maxpool 2x2 -> reshape [N,64] -> matmul^T
    -> + bias -> softmax; in train mode also the NLL loss of log_softmax, gradients and SGD updates."""
    g = Graph("train" if train else "infer")
    x = add_input(g, "x", (batch, 3, 8, 8), dtype)
    cw = add_weight(g, "conv.weight", (4, 3, 3, 3), dtype)
    fw = add_weight(g, "fc.weight", (10, 64), dtype)
    fb = add_weight(g, "fc.bias", (10,), dtype)
    b = Builder(g, "net")
    h = b.op("conv2d", x, cw, stride=(1, 1), pad=(1, 1), dilation=(1, 1), group=1)
    h = b.op("relu", h)
    h = b.op("max_pool2d", h, kernel=(2, 2), stride=(2, 2), pad=(0, 0), ceil_mode=False)
    h = b.reshape(h, (batch, 64))
    logits = b.add(b.op("matmul", h, fw, trans_a=False, trans_b=True), fb)
    g.outputs["prob"] = b.op("softmax", logits, axis=1)
    if train:
        label = add_input(g, "label", (batch,), "int64")
        logp = b.op("log_softmax", logits, axis=1)
        loss = b.op("nll_loss", logp, label, axis=1, ignore_index=None)
        g.outputs["loss"] = loss
        params = [cw, fw, fb]
        grads = differentiate(g, loss, params)
        for name, w in (("conv.weight", cw), ("fc.weight", fw), ("fc.bias", fb)):
            ub = Builder(g, f"{name}.sgd")
            g.updates[name] = ub.sub(w, ub.scale(grads[w.id], LR))
    return g


def init_weights(rng, dtype="float64"):
    return {"conv.weight": rng.normal(0, 0.3, (4, 3, 3, 3)).astype(dtype),
            "fc.weight": rng.normal(0, 0.2, (10, 64)).astype(dtype),
            "fc.bias": rng.normal(0, 0.1, (10,)).astype(dtype)}


def torch_forward(x, w, label=None):
    tw = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in w.items()}
    h = F.conv2d(torch.tensor(x, dtype=torch.float64), tw["conv.weight"], padding=1)
    h = F.max_pool2d(F.relu(h), 2, 2).flatten(1)
    logits = F.linear(h, tw["fc.weight"], tw["fc.bias"])
    prob = torch.softmax(logits, 1)
    if label is None:
        return prob.detach().numpy()
    loss = F.cross_entropy(logits, torch.tensor(label))
    loss.backward()
    return prob.detach().numpy(), float(loss.detach()), {k: (t - LR * t.grad).detach().numpy() for k, t in tw.items()}


def snapshot(outputs):
    return {k: np.array(v) for k, v in outputs.items()}


@pytest.mark.parametrize("dtype,tol", [("float32", 1e-5), ("float64", 1e-12)])
def test_convnet_plan_matches_interpreter_and_torch(rng, dtype, tol):
    g = convnet(dtype)
    w = init_weights(rng, dtype)
    x = rng.normal(size=(3, 3, 8, 8)).astype(dtype)
    plan = Plan(g, {"N": 3}, w)
    got = snapshot(plan.run({"x": x}))["prob"]
    ref = interpret(g, {"x": x}, w)[0]["prob"]
    assert got.dtype == np.dtype(dtype) and got.shape == (3, 10)
    np.testing.assert_allclose(got, ref, rtol=tol, atol=tol)
    np.testing.assert_allclose(got, torch_forward(x.astype(np.float64), w), rtol=10 * tol, atol=10 * tol)
    np.testing.assert_allclose(got.sum(axis=1), 1.0, rtol=tol)
    # the multi-op chain really runs as kernels: one call per non-view node
    ops = [n.op for n in plan.steps]
    assert ops == ["conv2d", "relu", "max_pool2d", "matmul", "add", "softmax"]


def test_memory_is_reused():
    g = convnet("float64", batch=4, train=True)
    w = init_weights(np.random.default_rng(0))
    plan = Plan(g, {}, w)
    values = list(g.inputs.values()) + [o for n in g.nodes for o in n.outputs]
    total = sum(nbytes_of(v.type.concrete({}), v.dtype) for v in values)
    assert plan.peak_bytes < 0.6 * total, (plan.peak_bytes, total)
    # arena storages are distinct buffers; values share them
    assert len(plan.memory.storages) < len(values)


def test_dead_buffers_are_recycled():
    """Ops that cannot run in place (matmul) still reuse buffers freed by dead values: a chain of
    eight products ping-pongs between two buffers (the input's included), not nine."""
    g = Graph("infer")
    x = add_input(g, "x", (16, 16), "float64")
    w = add_weight(g, "w", (16, 16), "float64")
    b = Builder(g, "chain")
    h = x
    for _ in range(8):
        h = b.op("matmul", h, w, trans_a=False, trans_b=False)
    g.outputs["y"] = h
    warr = np.random.default_rng(2).normal(0, 0.25, (16, 16))
    plan = Plan(g, {}, {"w": warr})
    one = 16 * 16 * 8
    assert plan.peak_bytes == 2 * one
    xv = np.random.default_rng(3).normal(size=(16, 16))
    np.testing.assert_allclose(plan.run({"x": xv})["y"], xv @ np.linalg.matrix_power(warr, 8), rtol=1e-10)


def test_elementwise_chain_runs_in_place():
    """A chain of in-place-capable unary ops reuses the input's buffer: peak = one tensor."""
    g = Graph("infer")
    x = add_input(g, "x", (64, 32), "float64")
    b = Builder(g, "chain")
    h = x
    for op in ("neg", "exp", "sqrt", "log", "tanh", "sigmoid", "square", "abs"):
        h = b.op(op, h)
    g.outputs["y"] = h
    plan = Plan(g, {}, {})
    one = 64 * 32 * 8
    assert plan.peak_bytes == one
    xv = np.random.default_rng(1).normal(size=(64, 32))
    expected = np.abs((1 / (1 + np.exp(-np.tanh(np.log(np.sqrt(np.exp(-xv)))))) ** 2))
    np.testing.assert_allclose(plan.run({"x": xv})["y"], expected, rtol=1e-12)
    # ... and the caller's array is never written
    before = xv.copy()
    plan.run({"x": xv})
    np.testing.assert_array_equal(xv, before)


def test_repeated_runs_stay_correct(rng):
    g = convnet("float64", batch=2)
    w = init_weights(rng)
    plan = Plan(g, {}, w)
    batches = [rng.normal(size=(2, 3, 8, 8)) for _ in range(3)]
    firsts = []
    for x in batches + batches:            # every batch twice, interleaved
        got = snapshot(plan.run({"x": x}))["prob"]
        np.testing.assert_allclose(got, interpret(g, {"x": x}, w)[0]["prob"], rtol=1e-12, atol=1e-12)
        firsts.append(got)
    for a, b in zip(firsts[:3], firsts[3:]):
        np.testing.assert_array_equal(a, b)
    assert not np.allclose(firsts[0], firsts[1])


def test_symbolic_batch_bindings(rng):
    g = convnet("float64")                  # batch is the symbol N
    assert g.symbols() == {"N"}
    w = init_weights(rng)
    for n in (1, 2, 5):
        plan = Plan(g, {"N": n}, w)
        x = rng.normal(size=(n, 3, 8, 8))
        got = snapshot(plan.run({"x": x}))["prob"]
        assert got.shape == (n, 10)
        np.testing.assert_allclose(got, interpret(g, {"x": x}, w)[0]["prob"], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(got, torch_forward(x, w), rtol=1e-10, atol=1e-12)
        # rows are independent: each row equals a batch-of-one run
        single = Plan(g, {"N": 1}, w)
        np.testing.assert_allclose(single.run({"x": x[-1:]})["prob"][0], got[-1], rtol=1e-12, atol=1e-14)


def test_train_step_updates_weights_in_place(rng):
    g = convnet("float64", train=True)
    w = init_weights(rng)
    arrays = {k: v.copy() for k, v in w.items()}
    ids = {k: id(v) for k, v in arrays.items()}
    plan = Plan(g, {"N": 4}, arrays)
    # each update is computed straight into its weight's storage: nothing to copy afterwards
    assert plan.runner.copy_updates == []
    expected = {k: v.copy() for k, v in w.items()}
    for step in range(3):
        x = rng.normal(size=(4, 3, 8, 8))
        label = rng.integers(0, 10, 4)
        interp_out, interp_upd = interpret(g, {"x": x, "label": label}, expected)
        _, torch_loss, torch_upd = torch_forward(x, expected, label)
        out = snapshot(plan.run({"x": x, "label": label}))
        np.testing.assert_allclose(out["loss"], interp_out["loss"], rtol=1e-12)
        np.testing.assert_allclose(out["loss"], torch_loss, rtol=1e-10)
        for k in w:
            assert id(arrays[k]) == ids[k]
            np.testing.assert_allclose(arrays[k], interp_upd[k], rtol=1e-12, atol=1e-14, err_msg=f"step {step} {k}")
            np.testing.assert_allclose(arrays[k], torch_upd[k], rtol=1e-9, atol=1e-12, err_msg=f"step {step} {k}")
        assert not np.allclose(arrays["fc.weight"], expected["fc.weight"])
        expected = {k: v.copy() for k, v in arrays.items()}


def test_update_copied_when_weight_is_read_after_it(rng):
    """w <- w * 0.5, but the output reads w after the update node: the update must go to a fresh
    buffer and be copied back after the run, and the output must see the old w."""
    g = Graph("train")
    x = add_input(g, "x", (3,), "float64")
    w = add_weight(g, "w", (3,), "float64")
    b = Builder(g, "t")
    upd = b.scale(w, 0.5)
    g.updates["w"] = upd
    g.outputs["y"] = b.add(x, w)               # after the update node, reads the old w
    warr = np.array([1.0, 2.0, 4.0])
    plan = Plan(g, {}, {"w": warr})
    assert len(plan.runner.copy_updates) == 1
    xv = np.array([10.0, 20.0, 30.0])
    np.testing.assert_array_equal(plan.run({"x": xv})["y"], [11.0, 22.0, 34.0])
    np.testing.assert_array_equal(warr, [0.5, 1.0, 2.0])
    np.testing.assert_array_equal(plan.run({"x": xv})["y"], [10.5, 21.0, 32.0])
    np.testing.assert_array_equal(warr, [0.25, 0.5, 1.0])


def test_inplace_update_respects_views_of_the_weight():
    g = Graph("train")
    x = add_input(g, "x", (3, 2), "float64")
    w = add_weight(g, "w", (2, 3), "float64")
    b = Builder(g, "t")
    view = b.reshape(w, (3, 2))                     # a view of w, read after the update below
    g.updates["w"] = b.sub(w, b.scalar(1.0, "float64"))
    g.outputs["y"] = b.mul(view, x)
    warr = np.arange(6.0).reshape(2, 3)
    expected = interpret(g, {"x": np.ones((3, 2))}, {"w": warr.copy()})[0]["y"]
    got = Plan(g, {}, {"w": warr}).run({"x": np.ones((3, 2))})["y"]
    np.testing.assert_array_equal(got, expected)


def test_profile_times_every_call(rng):
    g = convnet("float64", batch=2)
    w = init_weights(rng)
    plan = Plan(g, {}, w)
    x = rng.normal(size=(2, 3, 8, 8))
    timings = plan.profile({"x": x})
    assert [n for n, _ in timings] == plan.steps
    assert all(t >= 0 for _, t in timings)
    np.testing.assert_allclose(plan.output_views["prob"], interpret(g, {"x": x}, w)[0]["prob"], rtol=1e-12)


def test_infer_session_keeps_a_bounded_number_of_plans():
    """Memory must not grow with every new input shape: old plans are dropped, least recent first."""
    from toolkit.ir.dims import Sym
    from toolkit.runtime.session import InferSession
    g = Graph("infer")
    x = add_input(g, "x", (Sym.named("N"), Sym.named("T")), "float64")
    g.outputs["y"] = Builder(g, "t").op("relu", x)
    session = InferSession(g, {}, buckets=(1, 2))
    session.max_plans = 3
    for t in range(1, 8):
        out = session.run({"x": -np.ones((2, t)) * np.arange(t)})["y"]
        np.testing.assert_array_equal(out, np.zeros((2, t)))
    assert len(session.plans) == 3
    assert [dict(k)["T"] for k in session.plans] == [5, 6, 7]
