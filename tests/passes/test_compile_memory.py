"""Memory while a net with large weights compiles: the fillers draw without a float64 copy of the
whole array, frozen weights handed to the compiler are held once (a weight folded into its
transpose is dropped at once, not when the pass ends or the cycle collector runs), and weights
over the pre-transpose limit stay as they are. Measured with tracemalloc, which sees numpy's
allocations."""
from __future__ import annotations

import gc
import importlib
import tracemalloc
import weakref

import numpy as np

from toolkit.compile import optimize
from toolkit.frontend import Net
from toolkit.weights import FILL_CHUNK

BIG_NET = """\
name: wide
inputs:
  data: {shape: [N, 2048], dtype: float32}
layers:
  - {name: fc1, type: InnerProduct, bottom: data, top: fc1, num_output: 2048}
  - {name: relu1, type: ReLU, bottom: fc1, top: fc1}
  - {name: fc2, type: InnerProduct, bottom: fc1, top: fc2, num_output: 1024}
  - {name: fc3, type: InnerProduct, bottom: fc2, top: fc3, num_output: 1024}
outputs: [fc3]
"""
simplify_module = importlib.import_module("toolkit.passes.simplify")   # the package exports the function
WEIGHT_BYTES = (2048 * 2048 + 2048 + 2048 * 1024 + 1024 + 1024 * 1024 + 1024) * 4


def _trans_b(graph) -> dict[str, bool]:
    """Each GEMM's trans_b flag by layer, fused epilogues' heads included."""
    flags = {}
    for n in graph.nodes:
        if n.op == "matmul":
            flags[n.scope.split("+")[0].split(".")[0]] = n.attrs["trans_b"]
        elif n.op == "fused_epilogue" and n.attrs["head"] == "matmul":
            flags[n.scope.split("+")[0].split(".")[0]] = dict(n.attrs["head_attrs"])["trans_b"]
    return flags


def _net(tmp_path) -> Net:
    path = tmp_path / "wide.yaml"
    path.write_text(BIG_NET)
    return Net.load(str(path))


def test_fillers_draw_without_a_float64_copy_of_the_array(tmp_path):
    net = _net(tmp_path)
    tracemalloc.start()
    try:
        weights = net.init_weights(seed=0)
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert sum(w.nbytes for w in weights.values()) == WEIGHT_BYTES
    # the weights, plus one chunk of float64 draws (a float64 copy of fc1 alone would be 32 MiB)
    assert peak <= WEIGHT_BYTES + FILL_CHUNK * 8 * 2, (peak, WEIGHT_BYTES)


def test_frozen_weights_are_held_once_while_they_fold(tmp_path):
    net = _net(tmp_path)
    graph = net.graph("infer")
    gc.collect()
    gc.disable()                    # what is freed must be freed by its last reference alone
    try:
        tracemalloc.start()
        weights = net.init_weights(seed=0)
        originals = {k: weakref.ref(v) for k, v in weights.items() if k.endswith("weight")}
        graph = optimize(graph, (), weights, consume_weights=True)
        _now, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert weights == {}                                    # handed over
        # every InnerProduct weight was folded into its transpose, and the original is gone
        assert all(ref() is None for ref in originals.values()), [k for k, r in originals.items() if r()]
    finally:
        gc.enable()
    assert sorted(_trans_b(graph).values()) == [False] * 3
    # the weights once, plus one weight's transposed copy at a time (not every weight twice)
    assert peak <= WEIGHT_BYTES + 2048 * 2048 * 4 + (2 << 20), (peak, WEIGHT_BYTES)


def test_a_weight_over_the_pretranspose_limit_is_read_transposed_in_place(tmp_path, monkeypatch):
    monkeypatch.setattr(simplify_module, "PRETRANSPOSE_MAX_BYTES", 2048 * 1024 * 4)
    net = _net(tmp_path)
    weights = net.init_weights(seed=0)
    big = weakref.ref(weights["fc1.weight"])
    graph = optimize(net.graph("infer"), (), weights, consume_weights=True)
    flags = _trans_b(graph)
    assert flags == {"fc1": True, "fc2": False, "fc3": False}, flags
    assert big() is not None                                  # fc1's weight is the constant itself
    x = np.random.default_rng(0).standard_normal((3, 2048)).astype(np.float32)
    from toolkit.runtime.plan import Plan
    net2 = _net(tmp_path)
    reference = optimize(net2.graph("infer"), ("simplify",), net2.init_weights(seed=0))
    want = Plan(reference, {"N": 3}, {}).run({"data": x})["fc3"]
    got = Plan(graph, {"N": 3}, {}).run({"data": x})["fc3"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
