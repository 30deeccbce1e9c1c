"""toolkit.load(...).infer(...): equal to the compiled plan at every batch size, safe from many
threads at once, bounded memory across buckets, and user mistakes raised as toolkit.UserError."""
from __future__ import annotations

import threading

import numpy as np
import pytest

import toolkit


@pytest.fixture(scope="module")
def model():
    return toolkit.load("zoo:lenet", warm=True)


def test_infer_equals_the_reference_interpreter_at_any_batch(model):
    from toolkit.ops.interpreter import interpret
    from toolkit.zoo.resolve import load_net
    net = load_net("zoo:lenet")
    weights = net.load_weights(net.default_weights(None))
    x = np.random.default_rng(0).standard_normal((150, 1, 8, 8)).astype(np.float32)   # 64 + 64 + 22
    # the net was trained on x * 0.0625 (its train.data scale): infer applies that by default
    want = interpret(net.graph("infer"), {"data": x * np.float32(0.0625)}, weights)[0]["prob"]
    raw = toolkit.load("zoo:lenet", transform=False)
    np.testing.assert_allclose(raw.infer(data=x * np.float32(0.0625))["prob"], want, rtol=1e-5, atol=1e-6)
    got = model.infer(data=x)["prob"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(model.infer({"data": x[:3]})["prob"], want[:3], rtol=1e-5, atol=1e-6)
    with pytest.raises(toolkit.UserError, match="empty dimension"):
        model.infer(data=x[:0])


def test_many_threads_get_their_own_answers(model):
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((1 + i % 9, 1, 8, 8)).astype(np.float32) for i in range(16)]
    want = [model.infer(data=x)["prob"] for x in xs]
    got: dict[int, list] = {i: [] for i in range(16)}

    def work(i):
        for _ in range(10):
            got[i].append(model.infer(data=xs[i])["prob"])
    threads = [threading.Thread(target=work, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # each thread's answers are its own inputs' (another input's answer differs by far more than
    # this); not bit-equal, since how many cores a kernel splits its sums over follows how busy
    # the machine is when it runs
    for i in range(16):
        for g in got[i]:
            np.testing.assert_allclose(g, want[i], rtol=1e-5, atol=1e-7)


def test_the_buckets_share_one_arena(model):
    session = model.session
    arenas = {id(plan.memory.storages[0].arena.base if plan.memory.storages[0].arena.base is not None
                  else plan.memory.storages[0].arena) for plan in session.plans.values()}
    assert len(session.plans) == len(model.buckets) and len(arenas) == 1


def test_mistakes_are_user_errors():
    with pytest.raises(toolkit.UserError, match="no such file"):
        toolkit.load("missing.yaml")
    with pytest.raises(toolkit.UserError, match="unknown device"):
        toolkit.load("zoo:lenet", device="tpu")
    with pytest.raises(toolkit.UserError, match="buckets must be positive"):
        toolkit.load("zoo:lenet", buckets=[0, 4])
    m = toolkit.load("zoo:lenet", buckets=[1, 8])
    with pytest.raises(toolkit.UserError, match="no input 'image'"):
        m.infer(image=np.zeros((1, 1, 8, 8), np.float32))
    with pytest.raises(toolkit.UserError, match="shape"):
        m.infer(data=np.zeros((1, 1, 8, 9), np.float32))
