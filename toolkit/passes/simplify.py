"""Algebraic simplification: a table of local rewrite rules, keyed by the op they match.

Each rule's docstring states its algebra first and then where it must not fire. A rule returns
the value that replaces the matched node's output (an existing value, or one it emitted), or
None. Rules never change a value's type: x * ones that broadcasts x to a larger shape is not x.
Floating-point facts the rules respect: nan * 0 and inf * 0 are nan, inf - inf is nan, so
x * 0 -> 0 and x - x -> 0 hold for integers only; merging two scalings must not overflow or
underflow where the separate ones did not.
"""
from __future__ import annotations

from collections import Counter
from typing import Callable

import numpy as np

from ..ir.graph import FLOAT_DTYPES, INT_DTYPES, Graph, Node, Value
from .context import PassContext
from .rewrite import Emitter, Substitution, all_equal, reader_counts, scalar_of


class Match:
    """What a rule may use: the graph, reader counts, constants, and emitting nodes that run just
    before the matched node."""

    def __init__(self, graph: Graph, readers: dict[int, int], node: Node):
        self.graph = graph
        self.readers = readers
        self.node = node
        self.out = node.outputs[0]
        self.emitter = Emitter(node.scope)

    def emit(self, op: str, *inputs: Value, **attrs) -> Value:
        return self.emitter.op(op, *inputs, **attrs)

    def scalar(self, value: float, dtype: str) -> Value:
        return self.emitter.scalar(value, dtype)

    def sole_reader(self, v: Value) -> bool:
        """The matched node is the only reader of ``v`` (and ``v`` is no graph output or update)."""
        return self.readers.get(v.id, 0) == 1

    def same_type(self, v: Value) -> bool:
        return v.type == self.out.type


Rule = Callable[[Node, Match], "Value | None"]
RULES: dict[str, list[Rule]] = {}


def rule(*ops: str):
    def register(fn: Rule) -> Rule:
        for op in ops:
            RULES.setdefault(op, []).append(fn)
        return fn
    return register


def _orders(node: Node):
    a, b = node.inputs
    return ((a, b), (b, a))


def _producer(v: Value, op: str) -> Node | None:
    node = v.producer
    return node if node is not None and node.op == op else None


# -- arithmetic identities ---------------------------------------------------------------------
@rule("mul")
def mul_by_one(node: Node, m: Match):
    """x * 1 -> x. Not where the ones broadcast x to a larger shape (the result is not x)."""
    for x, c in _orders(node):
        if all_equal(c, 1) and m.same_type(x):
            return x
    return None


@rule("mul")
def mul_by_zero_integer(node: Node, m: Match):
    """x * 0 -> 0 for integer x. Never for floats: nan * 0 and inf * 0 are nan, not 0."""
    if m.out.dtype not in INT_DTYPES:
        return None
    for _x, c in _orders(node):
        if all_equal(c, 0):
            return m.emit("broadcast_to", m.scalar(0, m.out.dtype), shape=m.out.shape)
    return None


@rule("add")
def add_zero(node: Node, m: Match):
    """x + 0 -> x. Not where the zeros broadcast x to a larger shape. (-0 + 0 is +0, which
    equals -0 as a number; nothing else changes.)"""
    for x, c in _orders(node):
        if all_equal(c, 0) and m.same_type(x):
            return x
    return None


@rule("sub")
def sub_zero(node: Node, m: Match):
    """x - 0 -> x. Not where the zeros broadcast x; 0 - x is not rewritten (it is -x only up to
    the sign of a zero result)."""
    x, c = node.inputs
    if all_equal(c, 0) and m.same_type(x):
        return x
    return None


@rule("div")
def div_by_one(node: Node, m: Match):
    """x / 1 -> x. Not where the ones broadcast x to a larger shape."""
    x, c = node.inputs
    if all_equal(c, 1) and m.same_type(x):
        return x
    return None


@rule("div")
def div_by_power_of_two(node: Node, m: Match):
    """x / c -> x * (1/c) for a scalar c = +-2^k (exact: 1/c is exactly representable). Not for
    other c (1/3 rounds), nor where 1/c would overflow or be subnormal."""
    x, c_val = node.inputs
    c = scalar_of(c_val)
    if c is None or m.out.dtype not in FLOAT_DTYPES or c == 0 or not np.isfinite(c):
        return None
    mantissa, _exp = np.frexp(abs(c))
    inverse = np.asarray(1.0 / c, dtype=m.out.dtype)
    if mantissa != 0.5 or not np.isfinite(inverse) or abs(inverse) < np.finfo(m.out.dtype).tiny:
        return None
    return m.emit("mul", x, m.scalar(float(inverse), m.out.dtype))


@rule("neg")
def neg_neg(node: Node, m: Match):
    """-(-x) -> x. (Exact; nothing to guard.)"""
    inner = _producer(node.inputs[0], "neg")
    return inner.inputs[0] if inner is not None else None


@rule("add")
def add_neg(node: Node, m: Match):
    """x + (-y) -> x - y and (-x) + y -> y - x (exact). Not where y broadcasts differently from
    x: the shapes are kept because sub broadcasts exactly as add does."""
    x, y = node.inputs
    if (inner := _producer(y, "neg")) is not None:
        return m.emit("sub", x, inner.inputs[0])
    if (inner := _producer(x, "neg")) is not None:
        return m.emit("sub", y, inner.inputs[0])
    return None


@rule("sub")
def sub_neg(node: Node, m: Match):
    """x - (-y) -> x + y (exact)."""
    x, y = node.inputs
    inner = _producer(y, "neg")
    return m.emit("add", x, inner.inputs[0]) if inner is not None else None


@rule("mul")
def mul_neg_neg(node: Node, m: Match):
    """(-x) * (-y) -> x * y (exact: negation only flips the sign bit)."""
    a, b = (_producer(v, "neg") for v in node.inputs)
    if a is not None and b is not None:
        return m.emit("mul", a.inputs[0], b.inputs[0])
    return None


def _merged_scale(a: float, b: float, dtype: str) -> float | None:
    """a * b in ``dtype`` when merging x*a*b into x*(a*b) cannot overflow or underflow where the
    separate products did not: the merged factor must be finite and normal (or a true zero)."""
    if dtype not in FLOAT_DTYPES:
        return None
    with np.errstate(over="ignore", under="ignore"):       # overflow is the case being ruled out
        prod = np.multiply(np.asarray(a, dtype), np.asarray(b, dtype))
    if not np.isfinite(prod):
        return None
    if prod == 0:
        return 0.0 if (a == 0 or b == 0) else None
    if abs(prod) < np.finfo(dtype).tiny:
        return None
    return float(prod)


@rule("mul")
def merge_scalings(node: Node, m: Match):
    """(x * a) * b -> x * (a*b) and (-x) * b -> x * (-b), for 0-d constants a and b. Not when a*b
    overflows to inf or underflows (x * 1e30 * 1e30 is inf either way, but 0 * inf is nan)."""
    for x, c in _orders(node):
        b = scalar_of(c)
        if b is None or c.dtype != m.out.dtype:
            continue
        if (inner := _producer(x, "neg")) is not None and m.same_type(inner.inputs[0]):
            return m.emit("mul", inner.inputs[0], m.scalar(-b, m.out.dtype))
        inner = _producer(x, "mul")
        if inner is None:
            continue
        for y, d in _orders(inner):
            a = scalar_of(d)
            if a is None or not m.same_type(y):
                continue
            merged = _merged_scale(a, b, m.out.dtype)
            if merged is not None:
                return m.emit("mul", y, m.scalar(merged, m.out.dtype))
    return None


@rule("neg")
def neg_of_scaling(node: Node, m: Match):
    """-(x * a) -> x * (-a) for a 0-d constant a (exact: rounding is symmetric in the sign)."""
    inner = _producer(node.inputs[0], "mul")
    if inner is None:
        return None
    for y, d in _orders(inner):
        a = scalar_of(d)
        if a is not None and m.same_type(y):
            return m.emit("mul", y, m.scalar(-a, m.out.dtype))
    return None


# -- data movement -----------------------------------------------------------------------------
@rule("reshape")
def reshape_chain(node: Node, m: Match):
    """reshape(reshape(x, s1), s2) -> reshape(x, s2); reshape(x, shape of x) -> x. (Reshapes are
    row-major relabellings, so only the last one matters; a transpose in between stops it.)"""
    x = node.inputs[0]
    if m.same_type(x):
        return x
    inner = _producer(x, "reshape")
    if inner is not None:
        source = inner.inputs[0]
        if m.same_type(source):
            return source
        return m.emit("reshape", source, shape=node.attrs["shape"])
    return None


@rule("transpose")
def transpose_chain(node: Node, m: Match):
    """transpose(transpose(x, p), q) -> transpose(x, p[q]); the identity permutation -> x."""
    perm = tuple(node.attrs["perm"])
    if perm == tuple(range(len(perm))):
        return node.inputs[0]
    inner = _producer(node.inputs[0], "transpose")
    if inner is None:
        return None
    composed = tuple(inner.attrs["perm"][q] for q in perm)
    if composed == tuple(range(len(composed))):
        return inner.inputs[0]
    return m.emit("transpose", inner.inputs[0], perm=composed)


@rule("broadcast_to")
def broadcast_to_same(node: Node, m: Match):
    """broadcast_to(x, shape of x) -> x. Not when the target is larger (that is the op's job)."""
    x = node.inputs[0]
    return x if m.same_type(x) else None


@rule("reduce_sum", "reduce_mean")
def reduce_trivial(node: Node, m: Match):
    """sum or mean over no axes, or over axes of size 1 only -> reshape(x): each output is one
    input element. Not when any reduced axis is longer than 1."""
    x = node.inputs[0]
    axes = [a % x.rank for a in node.attrs["axes"]] if x.rank else []
    if any(x.shape[a] != 1 for a in axes):
        return None
    if m.same_type(x):
        return x
    return m.emit("reshape", x, shape=m.out.shape)


@rule("slice")
def slice_whole(node: Node, m: Match):
    """x[0:n] along an axis of length n -> x. Not for a proper part of the axis."""
    x = node.inputs[0]
    return x if m.same_type(x) and node.attrs["start"] == 0 else None


@rule("pad_axis")
def pad_nothing(node: Node, m: Match):
    """pad(x, 0, 0) -> x."""
    x = node.inputs[0]
    return x if node.attrs["before"] == 0 and node.attrs["after"] == 0 and m.same_type(x) else None


@rule("concat")
def concat_flatten(node: Node, m: Match):
    """concat(x) -> x; concat(a, concat(b, c), d) -> concat(a, b, c, d) along the same axis.
    Not when the inner concat runs along another axis."""
    if len(node.inputs) == 1:
        return node.inputs[0]
    axis = node.attrs["axis"] % m.out.rank
    flat, changed = [], False
    for v in node.inputs:
        inner = _producer(v, "concat")
        if inner is not None and inner.attrs["axis"] % v.rank == axis:
            flat.extend(inner.inputs)
            changed = True
        else:
            flat.append(v)
    return m.emit("concat", *flat, axis=axis) if changed else None


@rule("add")
def pads_to_concat(node: Node, m: Match):
    """pad(a, [p, q]) + pad(b, [p + len(a), r]) along one axis -> pad(concat(a, b), [p, r]): two
    zero-padded pieces side by side are their concatenation (autodiff's sum of Slice gradients).
    Not when the pieces overlap or leave a gap between them (then the sum is not a concatenation)."""
    pa, pb = (_producer(v, "pad_axis") for v in node.inputs)
    if pa is None or pb is None or pa.attrs["axis"] % m.out.rank != pb.attrs["axis"] % m.out.rank:
        return None
    if not m.same_type(pa.outputs[0]) or not m.same_type(pb.outputs[0]):
        return None
    axis = pa.attrs["axis"] % m.out.rank
    for first, second in ((pa, pb), (pb, pa)):
        a = first.inputs[0]
        if first.attrs["before"] + a.shape[axis] == second.attrs["before"]:
            joined = m.emit("concat", a, second.inputs[0], axis=axis)
            return m.emit("pad_axis", joined, axis=axis, before=first.attrs["before"], after=second.attrs["after"])
    return None


@rule("cast")
def cast_same(node: Node, m: Match):
    """cast(x, dtype of x) -> x."""
    x = node.inputs[0]
    return x if m.same_type(x) else None


# -- activations, dropout, pooling -------------------------------------------------------------
@rule("relu")
def relu_relu(node: Node, m: Match):
    """relu(relu(x)) -> relu(x) (relu is idempotent)."""
    inner = _producer(node.inputs[0], "relu")
    return inner.outputs[0] if inner is not None else None


@rule("mul")
def dropout_outside_training(node: Node, m: Match):
    """x * dropout_mask(x) -> x outside the train phase (dropout is the identity there). Never in
    the train phase, where the mask is random."""
    if m.graph.phase == "train":
        return None
    for x, mask in _orders(node):
        if _producer(mask, "dropout_mask") is not None and m.same_type(x):
            return x
    return None


def _nondecreasing(node: Node) -> bool:
    """f(max(a, b)) == max(f(a), f(b)) for every a, b: f never decreases."""
    if node.op in ("relu", "sigmoid", "tanh", "softplus"):
        return True
    if node.op in ("leaky_relu", "elu"):
        return node.attrs["alpha"] >= 0
    return False


@rule("max_pool2d")
def pool_before_activation(node: Node, m: Match):
    """maxpool(f(x)) -> f(maxpool(x)) for a nondecreasing f (relu, sigmoid, tanh, softplus, leaky
    relu and elu with alpha >= 0): the activation then touches a kernel-area fewer values, and the
    pooling can fuse with the convolution before it. Not for gelu (not monotone), average pooling,
    or when f(x) has another reader (a train graph's backward pass reads it)."""
    act = node.inputs[0].producer
    if act is None or len(act.outputs) != 1 or not _nondecreasing(act) or not m.sole_reader(act.outputs[0]):
        return None
    pooled = m.emit("max_pool2d", act.inputs[0], **node.attrs)
    return m.emit(act.op, pooled, **act.attrs)


@rule("matmul")
def matmul_of_transpose(node: Node, m: Match):
    """matmul(transpose(a), b) -> matmul(a, b) with trans_a flipped (likewise for b): BLAS reads
    the transpose in place. Only when the transpose swaps the last two axes and nothing else."""
    a, b = node.inputs
    attrs = dict(node.attrs)
    changed = False
    for key, v, pos in (("trans_a", a, 0), ("trans_b", b, 1)):
        t = _producer(v, "transpose")
        if t is None:
            continue
        r = v.rank
        if tuple(t.attrs["perm"]) != tuple(range(r - 2)) + (r - 1, r - 2):
            continue
        attrs[key] = not attrs[key]
        if pos == 0:
            a = t.inputs[0]
        else:
            b = t.inputs[0]
        changed = True
    return m.emit("matmul", a, b, **attrs) if changed else None


# The largest constant stored transposed: folding the transpose holds the weight twice for a
# moment, which for VGG-16's fc6 (411 MB) made compiling it peak at 1.8x the net's weights. A
# GEMM that large is bound by reading the weight once whichever way it lies.
PRETRANSPOSE_MAX_BYTES = 64 << 20


@rule("matmul")
def pretranspose_constant_operand(node: Node, m: Match):
    """matmul(a, C, trans_b) -> matmul(a, transpose(C)) for a constant C (a frozen InnerProduct
    weight) of at most 64 MiB, and likewise for a constant first operand; the transpose folds to
    a constant, so the GEMM reads row-major memory. Measured with OpenBLAS on 2-core EPYC:
    [64,800]x[800,500] took 657 us read transposed vs 537 us row-major, [4,256]x[256,384] 54 vs
    8 us. Not for a weight that changes every step (a train graph's): that would copy it on
    every step."""
    a, b = node.inputs
    attrs = dict(node.attrs)
    changed = False
    for key, v in (("trans_a", a), ("trans_b", b)):
        if (attrs[key] and v.rank == 2 and v.producer is not None and v.producer.op == "constant"
                and v.producer.attrs["value"].nbytes <= PRETRANSPOSE_MAX_BYTES):
            attrs[key] = False
            changed = True
            if key == "trans_a":
                a = m.emit("transpose", a, perm=(1, 0))
            else:
                b = m.emit("transpose", b, perm=(1, 0))
    return m.emit("matmul", a, b, **attrs) if changed else None


# -- the pass -------------------------------------------------------------------------------------
def simplify(graph: Graph, ctx: PassContext) -> bool:
    """Apply the rule table once over the graph in order: each node is matched against the rules
    for its op, the first that fires replaces the node's output (the pipeline repeats the
    canonicalising passes until nothing changes)."""
    readers = reader_counts(graph)
    subst = Substitution()
    out: list[Node] = []
    fired: Counter = Counter()
    for node in graph.nodes:
        subst.apply_to_node(node)
        replacement = None
        if len(node.outputs) == 1:
            for fn in RULES.get(node.op, ()):
                match = Match(graph, readers, node)
                replacement = fn(node, match)
                if replacement is not None:
                    fired[fn.__name__] += 1
                    for new in match.emitter.take():
                        for v in new.inputs:
                            readers[v.id] = readers.get(v.id, 0) + 1
                        out.append(new)
                    break
        if replacement is None:
            out.append(node)
            continue
        for v in node.inputs:
            readers[v.id] -= 1
        readers[replacement.id] = readers.get(replacement.id, 0) + readers.get(node.outputs[0].id, 0)
        subst.replace(node.outputs[0], replacement)
    graph.nodes = out
    subst.apply(graph)
    for name, count in sorted(fired.items()):
        ctx.note(f"simplify: {name} x{count}")
    return bool(fired)
