"""Kernels that take symbolic sizes when they run (codegen/loops.py's ``SizeInt``).

A plan bound to one sequence length compiles kernels whose text holds no bound size, so the
plans of other lengths load the same library instead of compiling their own; every output must
equal that of a plan with each size compiled in, and of the numpy kernels.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from toolkit import settings
from toolkit.codegen import toolchain
from toolkit.codegen.loops import Buf, Const, For, Kernel, Names, Size, SizeInt, Store, Un, lift, sizes_used
from toolkit.codegen.native import NativeCall, with_sizes
from toolkit.codegen.render import CDialect, CudaDialect
from toolkit.compile import add_gradients, optimize
from toolkit.frontend import Net
from toolkit.runtime.plan import Plan

needs_cc = pytest.mark.skipif(toolchain.compiler() is None, reason="no C compiler on this machine (cc, gcc or clang)")

# every builder that takes run-time sizes: matmul and its epilogue (InnerProduct), fused and
# single elementwise ops, softmax, reduce_mean (LayerNorm, Reduction over T), concat (the
# directions of the GRU's final state), reduce_sum (bias gradients, in training)
NET = """
name: sizes
inputs:
  x: {shape: [N, T, 8]}
  label: {shape: [N], dtype: int64}
layers:
  - {name: embed, type: InnerProduct, bottom: x, top: e, num_output: 16, axis: 2}
  - {name: attn, type: MultiHeadAttention, bottom: e, top: a, num_heads: 2, causal: true}
  - {name: res, type: Eltwise, bottom: [e, a], top: r}
  - {name: ln, type: LayerNorm, bottom: r, top: r}
  - {name: act, type: GELU, bottom: r, top: g}
  - {name: gru, type: GRU, bottom: g, top: h, num_output: 8, bidirectional: true, return_sequence: false}
  - {name: feat, type: Permute, bottom: g, top: gt, order: [0, 2, 1]}
  - {name: pool, type: Reduction, bottom: gt, top: pooled, operation: mean, axis: 2}
  - {name: join, type: Concat, bottom: [h, pooled], top: j, axis: 1}
  - {name: fc, type: InnerProduct, bottom: j, top: fc, num_output: 5}
  - {name: prob, type: Softmax, bottom: fc, top: prob, phase: infer}
  - {name: loss, type: SoftmaxWithLoss, bottom: [fc, label], top: loss, phase: train}
outputs: [prob]
"""


@pytest.fixture(autouse=True)
def native_on(monkeypatch, tmp_path):
    """Native kernels (the suite runs numpy's by default), compiled into a cache of this test's
    own, with every compiler run counted."""
    runs = []
    real = toolchain._run_compiler

    def counted(*args, **kwargs):
        runs.append(args)
        return real(*args, **kwargs)
    monkeypatch.setattr(toolchain, "_run_compiler", counted)
    with settings.use(native=True, cache=tmp_path / "cache"):
        yield runs


@pytest.fixture
def net(tmp_path):
    path = tmp_path / "net.yaml"
    path.write_text(NET)
    return Net.load(str(path))


def feeds(n, t, seed=0):
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((n, t, 8)).astype(np.float32)}


def c_semantics(e, env) -> int:
    """An expression's value as the C dialect computes it (division truncating toward zero)."""
    if isinstance(e, Size):
        return env[e.name]
    if isinstance(e, Const):
        return int(e.value)
    if isinstance(e, Un):
        return -c_semantics(e.a, env)
    a, b = c_semantics(e.a, env), c_semantics(e.b, env)
    if e.op == "/":
        q = abs(a) // abs(b)
        return q if (a >= 0) == (b > 0) else -q
    if e.op == "%":
        r = abs(a) % abs(b)
        return r if a >= 0 else -r
    return {"+": a + b, "-": a - b, "*": a * b}[e.op]


def test_size_arithmetic_computes_pythons_numbers_in_c():
    """Each operation on a SizeInt keeps Python's number, and its expression, evaluated as C
    evaluates it, gives that number: the ceiling idiom -(-m // t) and negative remainders too."""
    ops = [lambda x, c: x + c, lambda x, c: c + x, lambda x, c: x - c, lambda x, c: c - x, lambda x, c: x * c,
           lambda x, c: c * x, lambda x, c: x // c, lambda x, c: c // x, lambda x, c: x % c, lambda x, c: c % x,
           lambda x, c: -(-x // c), lambda x, c: -x, lambda x, c: x * x + c, lambda x, c: (x - 20) // c,
           lambda x, c: (x - 20) % c, lambda x, c: (x * 3) // (x + c)]
    symbolic = 0
    for t, c, op in itertools.product(range(-3, 41), range(-4, 9), ops):
        try:
            want = op(t, c)
        except ZeroDivisionError:
            continue
        got = op(SizeInt.of("T", t), c)
        assert got == want
        if isinstance(got, SizeInt):
            symbolic += 1
            assert c_semantics(got.expr, {"T": t}) == want, (t, c, got)
    assert symbolic > 5000                       # most results keep their expression


def test_a_kernel_takes_its_sizes_as_an_argument():
    """Const(SizeInt) and lift(SizeInt) render the expression; int() of one renders the number;
    the sizes argument is appended and read once at the kernel's entry."""
    t = SizeInt.of("T", 7) * 4
    names = Names()
    i = names.var("i")
    y = Buf("y", "float32", 28, const=False)
    kernel = Kernel("k", [y], [For(i, lift(0, "int64"), lift(t, "int64"), [Store(y, i, Const(t, "float32"))])])
    assert sizes_used(kernel) == ["T"]
    call = with_sizes(NativeCall(kernel, [np.zeros(28, np.float32)]), {"T": 7, "N": 2})
    assert [p.name for p in call.kernel.params] == ["y", "tk_sizes"] and call.arrays[-1].tolist() == [7]
    text = CDialect().kernel(call.kernel)
    assert "const int64_t tk_size_T = tk_sizes[0];" in text
    assert "i1 < (tk_size_T * 4L)" in text and "((float)(tk_size_T * 4L))" in text
    baked = Kernel("k", [y], [For(i, lift(0, "int64"), lift(int(t), "int64"), [Store(y, i, lift(0.0, "float32"))])])
    assert sizes_used(baked) == [] and "i1 < 28L" in CDialect().kernel(baked)
    with pytest.raises(ValueError, match="does not bind"):
        with_sizes(NativeCall(kernel, [np.zeros(28, np.float32)]), {"N": 2})
    parallel = Kernel("k", [y], [For(i, lift(0, "int64"), lift(t, "int64"), [Store(y, i, lift(0.0, "float32"))],
                                     parallel=True)])
    with pytest.raises(TypeError, match="run-time sizes"):
        CudaDialect().kernel(parallel)


@needs_cc
def test_plans_of_other_lengths_share_one_library_and_equal_fixed_sizes(net, native_on):
    graph = optimize(net.graph("infer"), (), dict(weights := net.init_weights(0)), "cpu")
    plans = {(2, 9): Plan(graph, {"N": 2, "T": 9}, weights)}
    first = len(native_on)                       # the plan's unit and the GRU loop body's
    assert first == 2
    for n, t in [(2, 10), (3, 23), (3, 4)]:
        plans[n, t] = Plan(graph, {"N": n, "T": t}, weights)
    assert len(native_on) == first               # the other lengths compile nothing
    sources = {p.native_source for p in plans.values()}
    assert len(sources) == 1 and "tk_size_T" in sources.pop()
    libraries = {id(linked.lib) for p in plans.values() for linked in p.made.linked}
    assert len(libraries) == 1
    for (n, t), plan in plans.items():
        got = plan.run(feeds(n, t))["prob"]
        fixed = Plan(graph, {"N": n, "T": t}, weights, run_time_sizes=False).run(feeds(n, t))["prob"]
        numpy_kernels = Plan(graph, {"N": n, "T": t}, weights, native=False).run(feeds(n, t))["prob"]
        np.testing.assert_allclose(got, fixed, rtol=1e-6, atol=1e-7, err_msg=f"N={n} T={t}")
        np.testing.assert_allclose(got, numpy_kernels, rtol=1e-5, atol=1e-6, err_msg=f"N={n} T={t}")
    assert {p.impls.count("native") for p in plans.values()} == {plans[2, 9].impls.count("native")} != {0}


@needs_cc
def test_a_length_that_changes_a_kernels_shape_gets_its_own_library_and_is_right(net):
    """T=1 merges away a dimension (its elementwise loops are laid out differently) and N=1 makes
    the classifier a row times a matrix: their texts differ, so each is compiled apart, and their
    outputs are still those of the fixed sizes."""
    graph = optimize(net.graph("infer"), (), dict(weights := net.init_weights(0)), "cpu")
    long = Plan(graph, {"N": 2, "T": 9}, weights)
    for n, t in [(2, 1), (1, 9)]:
        other = Plan(graph, {"N": n, "T": t}, weights)
        assert other.native_source != long.native_source
        fixed = Plan(graph, {"N": n, "T": t}, weights, run_time_sizes=False)
        np.testing.assert_allclose(other.run(feeds(n, t))["prob"], fixed.run(feeds(n, t))["prob"], rtol=1e-6,
                                   atol=1e-7, err_msg=f"N={n} T={t}")


@needs_cc
def test_gradients_at_two_lengths_equal_fixed_sizes(net):
    """The training graph (matmul gradients, reduce_sum of bias gradients, the loss) with run-time
    sizes, at T=6 and T=11 from one library: every weight's gradient equals that of the plans
    with sizes compiled in, and of the numpy kernels."""
    graph = net.graph("train")
    for key, g in add_gradients(graph).items():
        graph.outputs[f"grad:{key}"] = g
    weights = net.init_weights(0)
    sized = {}
    for n, t in [(3, 6), (2, 11)]:
        batch = {**feeds(n, t, seed=t), "label": np.arange(n) % 5}
        sized[n, t] = Plan(graph, {"N": n, "T": t}, weights)
        got = sized[n, t].run(batch)
        fixed = Plan(graph, {"N": n, "T": t}, weights, run_time_sizes=False).run(batch)
        numpy_kernels = Plan(graph, {"N": n, "T": t}, weights, native=False).run(batch)
        grads = [k for k in got if k.startswith("grad:")]
        assert len(grads) == len(weights)
        for k in grads:
            np.testing.assert_allclose(got[k], fixed[k], rtol=1e-5, atol=1e-6, err_msg=f"{k} T={t}")
            np.testing.assert_allclose(got[k], numpy_kernels[k], rtol=1e-4, atol=1e-5, err_msg=f"{k} T={t}")
    assert sized[3, 6].native_source == sized[2, 11].native_source


@needs_cc
def test_lengths_on_either_side_of_the_thread_threshold_get_libraries_of_their_own(tmp_path):
    """Whether a loop runs on threads is decided from the number (deciding as it runs doubled
    the compile time), so T=4 and T=128 differ in text; both are right, and T=96 shares T=128's."""
    path = tmp_path / "wide.yaml"
    path.write_text("name: wide\ninputs:\n  x: {shape: [N, T, 512]}\nlayers:\n"
                    "  - {name: act, type: GELU, bottom: x, top: y}\n  - {name: sm, type: Softmax, bottom: y, top: p}\n"
                    "outputs: [p]\n")
    net = Net.load(str(path))
    graph = optimize(net.graph("infer"), (), {}, "cpu")
    rng = np.random.default_rng(3)
    sources = {}
    for t in (4, 96, 128):                       # 2 048, 49 152 and 65 536 elements
        x = rng.standard_normal((1, t, 512)).astype(np.float32)
        plan = Plan(graph, {"N": 1, "T": t}, {}, threads=2)
        sources[t] = plan.native_source
        want = Plan(graph, {"N": 1, "T": t}, {}, native=False).run({"x": x})["p"]
        np.testing.assert_allclose(plan.run({"x": x})["p"], want, rtol=1e-5, atol=1e-7, err_msg=f"T={t}")
    assert sources[96] == sources[128] != sources[4]
    assert "#pragma omp parallel for" in sources[128] and "#pragma omp parallel for" not in sources[4]
