"""ONNX's matrix products: MatMul, Gemm and Einsum."""
from __future__ import annotations

from toolkit.ir.graph import FLOAT_DTYPES, Value

from .base import converts


@converts("MatMul")
def _matmul(imp, node):
    from .quantized import qdq_product
    fused = qdq_product(imp, node)       # a dequantized input and int8 weight: one qgemm
    if fused is not None:
        return fused
    a0, b0 = imp.env[node.input[0]], imp.env[node.input[1]]
    like = a0 if isinstance(a0, Value) else b0
    a, b = imp.value(node.input[0], like), imp.value(node.input[1], like)
    bb = imp.b
    squeeze = []
    if a.rank == 1:
        a = bb.reshape(a, (1,) + tuple(a.shape))
        squeeze.append(-2)
    if b.rank == 1:
        b = bb.reshape(b, tuple(b.shape) + (1,))
        squeeze.append(-1)
    y = bb.op("matmul", a, b, trans_a=False, trans_b=False)
    if squeeze:                     # numpy's rule: a 1-d operand's added axis is dropped again
        keep = [d for i, d in enumerate(y.shape) if i - y.rank not in squeeze]
        y = bb.reshape(y, tuple(keep))
    return [y]


@converts("Gemm")
def _gemm(imp, node):
    from .quantized import qdq_product
    fused = qdq_product(imp, node)
    if fused is not None:
        return fused
    a0 = imp.env[node.input[0]]
    a = imp.value(node.input[0]) if isinstance(a0, Value) else None
    w = imp.value(node.input[1], a)
    a = a if a is not None else imp.value(node.input[0], w)
    b = imp.b
    y = b.op("matmul", a, w, trans_a=bool(imp.attr(node, "transA", 0)), trans_b=bool(imp.attr(node, "transB", 0)))
    y = b.scale(y, float(imp.attr(node, "alpha", 1.0)))
    c = imp.optional(node, 2)
    if c is not None:
        beta = float(imp.attr(node, "beta", 1.0))
        if beta:
            y = b.add(y, b.scale(imp.value(c, y), beta))
    return [y]


@converts("Einsum")
def _einsum(imp, node):
    """One operand: a permutation and sums; two: a batched matrix product (indices in both and
    the output are the batch, in both but not the output are summed). No repeated index within
    one operand (a diagonal), no ellipsis."""
    equation = imp.attr(node, "equation")
    equation = (equation.decode() if isinstance(equation, bytes) else equation).replace(" ", "")
    if "..." in equation:
        imp.fail(f"the equation {equation!r}: an ellipsis has no counterpart here")
    if "->" not in equation:              # implicit: the indices seen once, in alphabetical order
        letters = equation.replace(",", "")
        equation += "->" + "".join(sorted(ch for ch in set(letters) if letters.count(ch) == 1))
    lhs, out = equation.split("->")
    terms = lhs.split(",")
    if len(terms) != len(node.input) or len(terms) > 2 or any(len(set(t)) != len(t) for t in terms + [out]):
        imp.fail(f"the equation {equation!r}: one or two operands without repeated indices only")
    values = [imp.value(n) for n in node.input]
    for t, v in zip(terms, values):
        if len(t) != v.rank:
            imp.fail(f"the equation {equation!r}: operand {t!r} names {len(t)} axes, the input has {v.rank}")
    if any(ch not in lhs for ch in out):
        imp.fail(f"the equation {equation!r}: an output index that no operand has")
    like = next((v for v in values if v.dtype in FLOAT_DTYPES), values[0])
    values = [v if v.dtype == like.dtype else imp.value(n, like) for v, n in zip(values, node.input)]
    b = imp.b
    if len(terms) == 1:
        (t,), (x,) = terms, values
        summed = [i for i, c in enumerate(t) if c not in out]
        y = b.reduce_sum(x, summed) if summed else x
        kept = [c for c in t if c in out]
        perm = tuple(kept.index(c) for c in out)
        return [y if perm == tuple(range(len(perm))) else b.op("transpose", y, perm=perm)]
    ta, tb = terms
    a, c = values
    size = {}
    for term, v in ((ta, a), (tb, c)):
        for ch, d in zip(term, v.shape):
            size.setdefault(ch, d)
    batch = [ch for ch in ta if ch in tb and ch in out]
    contract = [ch for ch in ta if ch in tb and ch not in out]
    free_a = [ch for ch in ta if ch not in tb]
    free_b = [ch for ch in tb if ch not in ta]
    if any(ch not in out for ch in free_a + free_b):
        imp.fail(f"the equation {equation!r}: an index of one operand summed alone has no counterpart here")

    def arranged(v, term, order, shape):
        perm = tuple(term.index(ch) for ch in order)
        if perm != tuple(range(len(perm))):
            v = b.op("transpose", v, perm=perm)
        return b.reshape(v, shape)

    def prod(chars):
        total = 1
        for ch in chars:
            total = total * size[ch]
        return total
    lead = tuple(size[ch] for ch in batch)
    a3 = arranged(a, ta, batch + free_a + contract, lead + (prod(free_a), prod(contract)))
    b3 = arranged(c, tb, batch + contract + free_b, lead + (prod(contract), prod(free_b)))
    if not lead:
        a3, b3 = b.reshape(a3, (1,) + tuple(a3.shape)), b.reshape(b3, (1,) + tuple(b3.shape))
    y = b.op("matmul", a3, b3, trans_a=False, trans_b=False)
    order = batch + free_a + free_b
    y = b.reshape(y, tuple(size[ch] for ch in order))
    perm = tuple(order.index(ch) for ch in out)
    return [y if perm == tuple(range(len(perm))) else b.op("transpose", y, perm=perm)]
