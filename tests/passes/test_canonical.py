"""The canonicalising passes: constant folding (with shape-derived values, the size cap, random
ops never folded), constant dedup, common-subexpression elimination (forward and backward), and
freezing weights. Each: what changed, the verifier, and the numbers before == after."""
from __future__ import annotations

import numpy as np
from pass_helpers import N, Tiny, apply, assert_same_numbers, check_pass, ops, random_feeds

from toolkit.ops.autodiff import differentiate
from toolkit.ops.verify import verify
from toolkit.passes.constants import FOLD_FREE_BYTES, dedup_constants, fold_constants, freeze_weights
from toolkit.passes.context import PassContext
from toolkit.passes.cse import eliminate_common
from toolkit.passes.prune import eliminate_dead_code


# -- fold_constants ------------------------------------------------------------------------------
def constant_chain():
    """exp(c1 * c2) + x: the constant part folds, the input part stays."""
    t = Tiny()
    x = t.input("x", (3, 4))
    c = t.b.op("exp", t.b.mul(t.const(np.linspace(-1, 1, 4)), t.b.scalar(0.5, "float64")))
    t.out("y", t.b.add(x, c))
    return t.g


def test_fold_evaluates_constant_subgraphs(rng):
    ctx = PassContext()
    g = check_pass(constant_chain, [fold_constants, eliminate_dead_code], rng, ctx=ctx)
    assert ops(g) == ["constant", "add"]
    np.testing.assert_allclose(g.nodes[0].attrs["value"], np.exp(np.linspace(-1, 1, 4) * 0.5))
    assert any("evaluated at compile time" in n for n in ctx.notes)


def test_fold_never_touches_random_ops_or_inputs(rng):
    def make():
        t = Tiny("train")
        x = t.input("x", (3, 4))
        mask = t.b.op("dropout_mask", t.const(np.ones((3, 4))), ratio=0.5)    # random, on a constant
        t.out("y", t.b.mul(x, mask))
        return t.g
    g, ctx = make(), PassContext()
    assert not fold_constants(g, ctx)                # nothing folded, and the pass says so
    assert "dropout_mask" in ops(g)                  # a different mask every run: never a constant
    assert not any("evaluated" in n for n in ctx.notes)


def test_fold_size_cap():
    """broadcast_to a scalar: folded while the result is small, kept as an op once folding would
    add more than FOLD_FREE_BYTES over what it reads."""
    def make(rows):
        t = Tiny()
        t.out("y", t.b.op("broadcast_to", t.b.scalar(2.0, "float64"), shape=(rows, 1024)))
        return t.g
    small = apply(make(FOLD_FREE_BYTES // 8 // 1024), fold_constants)
    assert small.outputs["y"].producer.op == "constant"
    large = apply(make(4 * FOLD_FREE_BYTES // 8 // 1024), fold_constants)
    assert large.outputs["y"].producer.op == "broadcast_to"


def test_fold_leaves_symbolic_shapes_to_the_plan(rng):
    def make():
        t = Tiny()
        x = t.input("x", (N, 4))
        t.out("y", t.b.add(x, t.b.op("broadcast_to", t.b.scalar(1.0, "float64"), shape=(N, 4))))
        return t.g
    g = check_pass(make, fold_constants, rng)
    assert "broadcast_to" in ops(g)                  # N is unknown until a plan binds it


def test_fold_shape_derived_factor(rng):
    """bessel_correct's n / (n - 1) is a constant once n is a number; with a symbolic n it is not."""
    def make(count):
        def build():
            t = Tiny()
            v = t.input("v", (4,))
            t.out("y", t.b.op("bessel_correct", v, count=count))
            return t.g
        return build
    g = check_pass(make(10), fold_constants, rng)
    assert ops(g) == ["scalar", "mul"] and g.nodes[0].attrs["value"] == 10 / 9
    g = apply(make(3 * N)(), fold_constants)
    assert ops(g) == ["bessel_correct"]


def test_fold_keeps_run_time_errors_at_run_time():
    """A constant label out of range: the reference raises, so the node stays and the user
    error comes when the plan runs, not as a crash of the compiler."""
    t = Tiny()
    logp = t.input("logp", (2, 3))
    label = t.const(np.array([0, 7]), "int64")
    t.out("y", t.b.op("nll_loss", t.b.op("log_softmax", t.const(np.zeros((2, 3))), axis=1), label,
                      axis=1, ignore_index=None))
    t.out("z", logp)
    g = apply(t.g, fold_constants)
    assert "nll_loss" in ops(g)


# -- dedup_constants -------------------------------------------------------------------------------
def test_dedup_merges_equal_constants_only(rng):
    def make():
        t = Tiny()
        x = t.input("x", (2, 3))
        a, b = t.const([1.0, 2.0, 3.0]), t.const([1.0, 2.0, 3.0])
        c = t.const([1.0, 2.0, 3.0], "float32")                                  # other dtype
        d = t.const([[1.0, 2.0, 3.0]])                                           # other shape
        neg0, pos0 = t.b.scalar(-0.0, "float64"), t.b.scalar(0.0, "float64")     # other bytes
        y = t.b.add(t.b.mul(x, a), t.b.mul(x, b))
        t.out("y", t.b.add(t.b.add(y, d), t.b.add(neg0, pos0)))
        t.out("c", t.b.op("cast", c, dtype="float64"))
        return t.g
    g = check_pass(make, dedup_constants, rng)
    constants = [n for n in g.nodes if n.op in ("constant", "scalar")]
    assert len(constants) == 5                         # a == b merged; c, d, -0 and +0 kept apart
    muls = [n for n in g.nodes if n.op == "mul"]
    assert muls[0].inputs[1] is muls[1].inputs[1]


# -- eliminate_common --------------------------------------------------------------------------------
def test_cse_merges_repeated_pure_work_and_commuted_operands(rng):
    def make():
        t = Tiny()
        x, y = t.input("x", (3, 4)), t.input("y", (3, 4))
        s1, s2 = t.b.op("sigmoid", x), t.b.op("sigmoid", x)
        t.out("a", t.b.add(t.b.mul(s1, y), t.b.mul(y, s2)))          # y*s2 is s1*y commuted
        t.out("b", t.b.sub(s1, y))
        t.out("c", t.b.sub(y, s2))                                    # sub is not commutative
        return t.g
    g = check_pass(make, [eliminate_common, eliminate_dead_code], rng)
    assert ops(g).count("sigmoid") == 1 and ops(g).count("mul") == 1 and ops(g).count("sub") == 2


def test_cse_never_merges_random_ops():
    t = Tiny("train")
    x = t.input("x", (3, 4))
    t.out("a", t.b.mul(x, t.b.op("dropout_mask", x, ratio=0.5)))
    t.out("b", t.b.mul(x, t.b.op("dropout_mask", x, ratio=0.5)))
    g = apply(t.g, eliminate_common)
    assert ops(g).count("dropout_mask") == 2


def test_cse_shares_forward_work_with_the_backward_pass(rng):
    """softplus' gradient is g * sigmoid(x); with sigmoid(x) also in the forward pass the backward
    pass reuses it instead of computing it again."""
    def make():
        t = Tiny("train")
        x = t.input("x", (3, 4))
        w = t.weight("w", (3, 4))
        h = t.b.mul(x, w)
        y = t.b.add(t.b.op("softplus", h), t.b.op("sigmoid", h))
        loss = t.b.reduce_sum(y, (0, 1))
        t.out("loss", loss)
        t.out("dw", differentiate(t.g, loss, [w])[w.id])
        return t.g
    before = make()
    assert ops(before).count("sigmoid") == 2            # the forward one and the one in softplus' gradient
    g = check_pass(make, [eliminate_common, eliminate_dead_code], rng)
    assert ops(g).count("sigmoid") == 1


# -- freeze_weights -------------------------------------------------------------------------------------
def test_freeze_turns_fixed_weights_into_shared_constants(rng):
    def make():
        t = Tiny()
        x = t.input("x", (2, 3))
        w = t.weight("w", (3,))
        s = t.weight("s", (3,), trainable=False)
        t.out("y", t.b.mul(t.b.add(x, w), s))
        t.g.updates["s"] = t.b.mul(s, t.b.scalar(0.5, "float64"))   # s changes every step: stays a weight
        return t.g
    before = make()
    feeds = random_feeds(before, rng)
    arrays = {"w": feeds["w"], "s": feeds["s"]}
    after = freeze_weights(make(), arrays)
    verify(after)
    assert set(after.weights) == {"s"} and ops(after)[0] == "constant"
    assert np.shares_memory(after.nodes[0].attrs["value"], arrays["w"])     # never copied
    assert not after.nodes[0].attrs["value"].flags.writeable
    assert_same_numbers(before, after, feeds)
