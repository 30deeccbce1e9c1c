"""Symbolic dimensions (integer polynomials over named symbols) and the graph's text dump."""
from __future__ import annotations

import pytest

from toolkit.ir.dims import DimError, Sym, as_dim, evaluate, format_dim, is_static, product
from toolkit.ir.graph import Graph, TensorType, Value, Weight
from toolkit.ops import Builder

N = Sym.named("N")
M = Sym.named("M")


def test_add_sub_collect_terms():
    assert format_dim(N + 1) == "N + 1"
    assert format_dim(1 + N) == "N + 1"
    assert N + N == 2 * N
    assert format_dim(N + M + N) == "M + 2*N"
    assert format_dim(N - 3) == "N - 3"
    assert format_dim(3 - N) == "-N + 3"
    assert format_dim(-N) == "-N"


def test_results_without_symbols_collapse_to_int():
    for d, value in ((N - N, 0), ((N + 2) - N, 2), (N * 0, 0), ((2 * N) // N, 2), (N // N, 1)):
        assert type(d) is int and d == value


def test_mul_is_polynomial():
    assert format_dim(N * 2) == "2*N"
    assert format_dim(N * N) == "N*N"
    assert format_dim((N + 1) * (N - 1)) == "N*N - 1"
    assert format_dim((N + 1) * (N + 1)) == "N*N + 2*N + 1"
    assert format_dim(N * M * 3) == "3*M*N"
    assert N * M == M * N
    assert hash(N * M) == hash(M * N)
    assert product([N, 3, M, 2]) == 6 * M * N
    assert product([]) == 1


def test_exact_floordiv():
    assert (2 * N + 4) // 2 == N + 2
    assert (6 * N * M) // (3 * N) == 2 * M
    assert (N * M + N) // N == M + 1
    assert format_dim((4 * N * N) // (2 * N)) == "2*N"
    assert 12 // Sym.lift(4) == 3


@pytest.mark.parametrize("num,den", [
    (N + 1, 2),            # odd constant term
    (3 * N, 2),
    (N, M),                # a symbol the numerator lacks
    (N * M + 1, N),        # one term not divisible
    (3 * N, 2 * N),        # coefficient not divisible by the monomial's
    (N, 0),
    (N + 1, N + 2),        # a non-monomial divisor
    (6, N),                # int // symbol
])
def test_inexact_floordiv_raises(num, den):
    with pytest.raises(DimError):
        num // den


def test_mod_and_comparisons():
    assert (4 * N) % 2 == 0
    with pytest.raises(DimError):
        (N + 1) % 2
    for compare in (lambda: N < 3, lambda: N <= M, lambda: N > 0, lambda: N >= 1):
        with pytest.raises(DimError):
            compare()
    assert N == Sym.named("N") and N != M and N != 1 and N + 0 == N
    assert (N == "N") is False


def test_evaluate():
    d = 3 * N * M - 2 * N + 7
    assert d.symbols == {"N", "M"}
    assert evaluate(d, {"N": 2, "M": 5}) == 30 - 4 + 7
    assert evaluate(5, {}) == 5
    assert evaluate(N * N, {"N": 7}) == 49
    with pytest.raises(DimError, match="'M' has no value"):
        evaluate(d, {"N": 2})


def test_format_and_helpers():
    assert format_dim(4) == "4"
    assert format_dim(-2) == "-2"
    # terms by degree (highest first), then by symbol names
    assert format_dim(N * N * 2 - N * M + 5) == "-M*N + 2*N*N + 5"
    assert repr(N + 1) == "N + 1"
    assert as_dim("T") == Sym.named("T") and as_dim(7) == 7 and type(as_dim(7)) is int
    assert is_static(3) and not is_static(N)


def test_tensor_type_concrete_and_str():
    t = TensorType((N, 3, 2 * M), "float32")
    assert t.concrete({"N": 4, "M": 5}) == (4, 3, 10)
    assert t.numel == 6 * M * N
    assert str(t) == "f32[N, 3, 2*M]"
    assert t.rank == 3


def test_graph_dump_lists_ops_and_types():
    g = Graph("train")
    x = Value(TensorType((N, 3, 8, 8), "float32"), name="data")
    g.inputs["data"] = x
    w = Value(TensorType((4, 3, 3, 3), "float32"), name="conv1.weight")
    g.weights["conv1.weight"] = Weight("conv1.weight", w, True, {"type": "xavier"})
    b = Builder(g, "conv1")
    y = b.op("conv2d", x, w, stride=(1, 1), pad=(1, 1), dilation=(1, 1), group=1)
    z = Builder(g, "relu1").op("relu", y)
    flat = Builder(g, "flat").reshape(z, (N, 256))
    g.outputs["out"] = flat
    g.updates["conv1.weight"] = w
    text = g.dump()
    lines = text.splitlines()
    assert lines[0] == "graph train {" and lines[-1] == "}"
    assert f"input {x!r} data: f32[N, 3, 8, 8]" in text
    assert f"param {w!r} conv1.weight: f32[4, 3, 3, 3]" in text
    assert (f"{y!r}: f32[N, 4, 8, 8] = conv2d({x!r}, {w!r}) "
            "stride=(1,1) pad=(1,1) dilation=(1,1) group=1  # conv1") in text
    assert f"{z!r}: f32[N, 4, 8, 8] = relu({y!r})  # relu1" in text
    assert f"{flat!r}: f32[N, 256] = reshape({z!r}) shape=(N,256)  # flat" in text
    assert f"output out = {flat!r}" in text
    assert f"update conv1.weight <- {w!r}" in text
    # one line per node, in order
    node_lines = [ln for ln in lines if " = " in ln and not ln.strip().startswith("output")]
    assert [ln.split(" = ")[1].split("(")[0] for ln in node_lines] == ["conv2d", "relu", "reshape"]
