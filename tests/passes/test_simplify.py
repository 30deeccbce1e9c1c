"""The simplification rule table: every rule has a graph where it fires and a near miss where it
must not (NaN/inf semantics, integer-only algebra, broadcasting that changes the shape, the
wrong phase, another reader); in both the numbers before and after the pass are equal, with
0, -0, inf, -inf and nan among the inputs where the floating-point facts matter."""
from __future__ import annotations

import numpy as np
import pytest
from pass_helpers import Tiny, apply, check_pass, ops

from toolkit.passes.context import PassContext
from toolkit.passes.simplify import RULES, simplify


def _graph(phase="infer"):
    return Tiny(phase)


def binary(op, x_shape, c_value, c_shape=(), dtype="float64", swap=False):
    def make():
        t = _graph()
        x = t.input("x", x_shape, dtype)
        c = t.const(np.full(c_shape, c_value), dtype)
        t.out("y", t.b.op(op, *((c, x) if swap else (x, c))))
        return t.g
    return make


def unary_chain(*steps, shape=(3, 4), phase="infer"):
    """x -> steps[0] -> steps[1] ...; a step is (op, attrs)."""
    def make():
        t = _graph(phase)
        v = t.input("x", shape)
        for op, attrs in steps:
            v = t.b.op(op, v, **attrs)
        t.out("y", v)
        return t.g
    return make


def two_inputs(build, shapes=((3, 4), (3, 4)), dtype="float64", phase="infer"):
    def make():
        t = _graph(phase)
        x, y = t.input("x", shapes[0], dtype), t.input("y", shapes[1], dtype)
        t.out("z", build(t, x, y))
        return t.g
    return make


def pads(first, second, total=5):
    """pad(a) + pad(b) along axis 1 of a [2, total] result; first/second = (before, length)."""
    def make():
        t = _graph()
        a, b = t.input("a", (2, first[1])), t.input("b", (2, second[1]))
        pa = t.b.op("pad_axis", a, axis=1, before=first[0], after=total - first[0] - first[1])
        pb = t.b.op("pad_axis", b, axis=1, before=second[0], after=total - second[0] - second[1])
        t.out("z", t.b.add(pa, pb))
        return t.g
    return make


def concat_of_concat(inner_axis):
    def make():
        t = _graph()
        a, b, c = t.input("a", (2, 2)), t.input("b", (2, 2)), t.input("c", (2, 2))
        inner = t.b.op("concat", b, c, axis=inner_axis)
        outer_a = a if inner_axis == 1 else t.b.op("concat", a, a, axis=0)
        t.out("z", t.b.op("concat", outer_a, inner, axis=1))
        return t.g
    return make


def scaled(first, second, dtype="float64"):
    def make():
        t = _graph()
        x = t.input("x", (3, 4), dtype)
        t.out("y", t.b.mul(t.b.mul(x, t.b.scalar(first, dtype)), t.b.scalar(second, dtype)))
        return t.g
    return make


def pool_of(act, pool="max_pool2d", second_reader=False, **act_attrs):
    def make():
        t = _graph()
        x = t.input("x", (2, 3, 6, 6))
        a = t.b.op(act, x, **act_attrs)
        attrs = dict(kernel=(2, 2), stride=(2, 2), pad=(0, 0), ceil_mode=False)
        if pool == "avg_pool2d":
            attrs["count_include_pad"] = True
        t.out("y", t.b.op(pool, a, **attrs))
        if second_reader:
            t.out("a", a)
        return t.g
    return make


def matmul_transposed(perm, shape=(4, 3)):
    def make():
        t = _graph()
        a, b = t.input("a", shape), t.input("b", (shape[-2], 5) if len(shape) == 2 else (3, 3, 5))
        t.out("y", t.b.op("matmul", t.b.op("transpose", a, perm=perm), b, trans_a=False, trans_b=False))
        return t.g
    return make


def dropout_times(phase):
    def make():
        t = _graph(phase)
        x = t.input("x", (4, 5))
        t.out("y", t.b.mul(x, t.b.op("dropout_mask", x, ratio=0.5)))
        return t.g
    return make


def matmul_with(weight_kind):
    def make():
        t = _graph()
        x = t.input("x", (3, 4))
        w = t.const(np.arange(20.0).reshape(5, 4) / 20) if weight_kind == "constant" else t.weight("w", (5, 4))
        t.out("y", t.b.op("matmul", x, w, trans_a=False, trans_b=True))
        return t.g
    return make


# rule -> (a graph where it fires, a near miss where it must not)
CASES: dict[str, tuple] = {
    "mul_by_one": (binary("mul", (3, 4), 1.0), binary("mul", (4,), 1.0, (3, 4))),   # ones that broadcast x
    "mul_by_zero_integer": (binary("mul", (3, 4), 0, dtype="int64"), binary("mul", (3, 4), 0.0)),  # nan*0 is nan
    "add_zero": (binary("add", (3, 4), 0.0, swap=True), binary("add", (4,), 0.0, (3, 4))),
    "sub_zero": (binary("sub", (3, 4), 0.0), binary("sub", (3, 4), 0.0, swap=True)),               # 0 - x
    "div_by_one": (binary("div", (3, 4), 1.0), binary("div", (4,), 1.0, (3, 4))),
    "div_by_power_of_two": (binary("div", (3, 4), -0.25), binary("div", (3, 4), 3.0)),              # 1/3 rounds
    "neg_neg": (unary_chain(("neg", {}), ("neg", {})), unary_chain(("abs", {}), ("neg", {}))),
    "add_neg": (two_inputs(lambda t, x, y: t.b.add(x, t.b.op("neg", y))),
                two_inputs(lambda t, x, y: t.b.add(x, t.b.op("abs", y)))),
    "sub_neg": (two_inputs(lambda t, x, y: t.b.sub(x, t.b.op("neg", y))),
                two_inputs(lambda t, x, y: t.b.sub(t.b.op("neg", x), y))),
    "mul_neg_neg": (two_inputs(lambda t, x, y: t.b.mul(t.b.op("neg", x), t.b.op("neg", y))),
                    two_inputs(lambda t, x, y: t.b.mul(t.b.op("neg", x), y))),
    # x * 1e30 * 1e30 in float32: merged, 1e60 is inf and 0 * inf is nan
    "merge_scalings": (scaled(2.0, -3.0), scaled(1e30, 1e30, "float32")),
    "neg_of_scaling": (two_inputs(lambda t, x, y: t.b.op("neg", t.b.mul(x, t.b.scalar(3.0, "float64")))),
                       two_inputs(lambda t, x, y: t.b.op("neg", t.b.mul(x, y)))),
    "reshape_chain": (unary_chain(("reshape", {"shape": (12,)}), ("reshape", {"shape": (2, 6)})),
                      unary_chain(("reshape", {"shape": (4, 3)}), ("transpose", {"perm": (1, 0)}),
                                  ("reshape", {"shape": (12,)}))),
    "transpose_chain": (unary_chain(("transpose", {"perm": (1, 0)}), ("transpose", {"perm": (1, 0)})),
                        unary_chain(("transpose", {"perm": (1, 0)}), ("relu", {}), ("transpose", {"perm": (1, 0)}))),
    "broadcast_to_same": (unary_chain(("broadcast_to", {"shape": (3, 4)})),
                          unary_chain(("broadcast_to", {"shape": (2, 4)}), shape=(1, 4))),
    "reduce_trivial": (unary_chain(("reduce_sum", {"axes": (1,), "keepdims": False}), shape=(3, 1, 2)),
                       unary_chain(("reduce_sum", {"axes": (1,), "keepdims": False}), shape=(3, 2, 2))),
    "slice_whole": (unary_chain(("slice", {"axis": 1, "start": 0, "stop": 4})),
                    unary_chain(("slice", {"axis": 1, "start": 0, "stop": 3}))),
    "pad_nothing": (unary_chain(("pad_axis", {"axis": 0, "before": 0, "after": 0})),
                    unary_chain(("pad_axis", {"axis": 0, "before": 1, "after": 0}))),
    "concat_flatten": (concat_of_concat(1), concat_of_concat(0)),
    "pads_to_concat": (pads((0, 2), (2, 3)), pads((0, 3), (2, 3))),                                 # overlap
    "cast_same": (unary_chain(("cast", {"dtype": "float64"})), unary_chain(("cast", {"dtype": "float32"}))),
    "relu_relu": (unary_chain(("relu", {}), ("relu", {})), unary_chain(("leaky_relu", {"alpha": 0.1}), ("relu", {}))),
    "dropout_outside_training": (dropout_times("infer"), dropout_times("train")),
    "pool_before_activation": (pool_of("relu"), pool_of("gelu", approximate="none")),             # gelu dips
    "matmul_of_transpose": (matmul_transposed((1, 0)), matmul_transposed((1, 0, 2), shape=(4, 3, 3))),
    "pretranspose_constant_operand": (matmul_with("constant"), matmul_with("weight")),    # a live weight
}

# more near misses for the same rules: each must leave the graph alone
EXTRA_MISSES = [
    ("pool_before_activation", pool_of("relu", pool="avg_pool2d")),          # averages do not commute
    ("pool_before_activation", pool_of("relu", second_reader=True)),         # relu(x) read elsewhere
    ("pool_before_activation", pool_of("leaky_relu", alpha=-0.5)),           # decreasing for x < 0
    ("merge_scalings", scaled(1e-30, 1e-30, "float32")),                     # merged factor underflows
    ("div_by_power_of_two", binary("div", (3, 4), 0.0)),
]


def rule_names() -> set[str]:
    return {fn.__name__ for fns in RULES.values() for fn in fns}


def test_every_rule_has_a_firing_and_a_non_firing_case():
    assert set(CASES) == rule_names()


def fired(ctx: PassContext, rule: str) -> bool:
    return any(note.startswith(f"simplify: {rule} x") for note in ctx.notes)


@pytest.mark.parametrize("rule", sorted(set(CASES) - {"dropout_outside_training"}))
def test_rule_fires_and_keeps_the_numbers(rule, rng):
    make_fire, _ = CASES[rule]
    ctx = PassContext()
    check_pass(make_fire, simplify, rng, special=True, ctx=ctx)
    assert fired(ctx, rule), ctx.notes


def test_dropout_is_the_identity_outside_training():
    """The graph before holds a random mask, so its numbers are not the reference: the
    reference is the layer's definition, x itself, outside the train phase."""
    ctx = PassContext()
    after = apply(CASES["dropout_outside_training"][0](), simplify, ctx=ctx)
    assert fired(ctx, "dropout_outside_training")
    assert after.outputs["y"] is after.inputs["x"]


@pytest.mark.parametrize("rule", sorted(CASES))
def test_rule_does_not_fire_on_its_near_miss(rule, rng):
    _, make_miss = CASES[rule]
    random = rule == "dropout_outside_training"            # a random mask: structure only
    ctx = PassContext()
    if random:
        apply(make_miss(), simplify, ctx=ctx)
    else:
        check_pass(make_miss, simplify, rng, special=True, ctx=ctx)
    assert not fired(ctx, rule), ctx.notes


@pytest.mark.parametrize("rule,make", EXTRA_MISSES, ids=[f"{r}-{i}" for i, (r, _) in enumerate(EXTRA_MISSES)])
def test_more_near_misses(rule, make, rng):
    ctx = PassContext()
    check_pass(make, simplify, rng, special=True, ctx=ctx)
    assert not fired(ctx, rule), ctx.notes


def test_what_the_rules_leave(rng):
    """Structure: the operations that remain after each rule, where it fires."""
    g = apply(CASES["neg_neg"][0](), simplify)
    assert g.outputs["y"] is g.inputs["x"] and ops(g) == ["neg"]          # the inner neg: dead code now
    g = apply(CASES["div_by_power_of_two"][0](), simplify)
    assert g.outputs["y"].producer.op == "mul"
    assert float(g.outputs["y"].producer.inputs[1].producer.attrs["value"]) == -4.0
    g = apply(CASES["merge_scalings"][0](), simplify)
    assert g.outputs["y"].producer.op == "mul" and g.outputs["y"].producer.inputs[0] is g.inputs["x"]
    g = apply(CASES["pool_before_activation"][0](), simplify)
    assert g.outputs["y"].producer.op == "relu" and g.outputs["y"].producer.inputs[0].producer.op == "max_pool2d"
    g = apply(CASES["pads_to_concat"][0](), simplify)
    assert g.outputs["z"].producer.op == "pad_axis" and g.outputs["z"].producer.inputs[0].producer.op == "concat"
    g = apply(CASES["transpose_chain"][0](), simplify)
    assert g.outputs["y"] is g.inputs["x"]
    g = apply(CASES["matmul_of_transpose"][0](), simplify)
    assert g.outputs["y"].producer.attrs["trans_a"] is True and g.outputs["y"].producer.inputs[0] is g.inputs["a"]
