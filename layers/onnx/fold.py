"""Constant folding at import: nodes whose inputs are all known are evaluated, by ONNX's reference
evaluator for numbers and by the rules below for shapes holding symbolic dimensions (numpy arrays
of dtype object whose elements are numbers and ``Sym`` polynomials)."""
from __future__ import annotations

import math

import numpy as np

from toolkit.ir.dims import DimError, Sym
from toolkit.ir.graph import Value
from toolkit.onnxtypes import ONNX_ELEMENT_TYPES

from .convert import FOLDERS, NUMPY, NodeError, is_const, is_symbolic

# ops that draw random numbers are never folded (the graph has no op for them: they stay unsupported)
RANDOM = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"}


def _normal(a: np.ndarray) -> np.ndarray:
    """An object array of plain numbers back to int64 (numpy gives a bare element for a 0-d pick)."""
    if not isinstance(a, np.ndarray):
        out = np.empty((), dtype=object)
        out[()] = a
        a = out
    if is_symbolic(a) and not any(isinstance(x, Sym) for x in a.reshape(-1).tolist()):
        return np.array(a.tolist(), dtype=np.int64).reshape(a.shape)
    return a


def _dims_array(shape) -> np.ndarray:
    if all(isinstance(d, int) for d in shape):
        return np.array(shape, dtype=np.int64)
    out = np.empty(len(shape), dtype=object)
    out[:] = list(shape)
    return out


def fold(imp, node, ins: list) -> list | None:
    """The outputs of ``node`` where they are known at import, else None."""
    op = node.op_type
    if op == "Constant":
        return [_constant(imp, node)]
    if op == "Shape" and isinstance(ins[0], Value):
        rank = ins[0].rank
        start, end = imp.attr(node, "start", 0), imp.attr(node, "end", rank)
        start, end = (max(0, min(rank, s + rank if s < 0 else s)) for s in (start, end))
        return [_dims_array(tuple(ins[0].shape)[start:end])]
    if op == "Size" and isinstance(ins[0], Value):
        total = math.prod(ins[0].shape) if all(isinstance(d, int) for d in ins[0].shape) else None
        if total is None:
            out = np.empty((), dtype=object)
            out[()] = _product(ins[0].shape)
            return [out]
        return [np.array(total, dtype=np.int64)]
    if op == "CastLike" and is_const(ins[0]) and isinstance(ins[1], Value) and ins[1].dtype in NUMPY:
        return [np.asarray(ins[0]).astype(NUMPY[ins[1].dtype])]       # a constant in a computed value's type
    if op in RANDOM or not node.input or any(isinstance(x, Value) for x in ins):
        return None
    if any(is_const(x) and is_symbolic(x) for x in ins):
        try:
            return _symbolic(imp, node, ins)
        except DimError as e:       # (H - 5) / 2: no integer polynomial of H; a fixed H has an answer
            raise NodeError(f"folding it at import failed: {e} (a size computed from the input's symbolic "
                            "dimensions must be whole for every value of them: give the input fixed sizes)")
        except (ValueError, IndexError, TypeError) as e:      # shapes or axes that do not fit
            raise NodeError(f"folding it at import failed: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
    if op in ("If", "Loop", "Scan"):
        return None
    _check_size(node, ins)
    from onnx.reference import ReferenceEvaluator
    try:
        outs = ReferenceEvaluator(node).run(None, {n: x for n, x in zip(node.input, ins) if n})
    except Exception as e:            # the evaluator's own complaint about the node
        raise NodeError(f"folding it at import failed: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
    return [np.asarray(o) for o in outs]


FOLDERS.append(fold)


def _product(dims):
    total = 1
    for d in dims:
        total = total * d
    return total


def _constant(imp, node) -> np.ndarray:
    from onnx import numpy_helper
    for a in node.attribute:
        if a.name == "value":
            try:
                return numpy_helper.to_array(a.t)
            except (ValueError, TypeError) as e:       # data that does not fill the tensor's dims
                raise NodeError(f"its tensor cannot be read: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
        if a.name in ("value_float", "value_int"):
            return np.array(imp.attr(node, a.name), dtype=np.float32 if a.name == "value_float" else np.int64)
        if a.name in ("value_floats", "value_ints"):
            return np.array(imp.attr(node, a.name), dtype=np.float32 if a.name == "value_floats" else np.int64)
    raise NodeError("a Constant without a dense value (sparse and string constants have no counterpart here)")


def _ints(x) -> list[int]:
    return [int(v) for v in np.asarray(x).reshape(-1).tolist()]


def _symbolic(imp, node, ins: list) -> list:
    """Shape arithmetic over arrays holding symbolic dimensions."""
    op = node.op_type
    a = ins[0]
    if op == "Identity":
        return [a]
    if op == "Gather":
        axis = imp.attr(node, "axis", 0)
        return [_normal(np.take(a, np.asarray(ins[1]).astype(np.int64), axis=axis))]
    if op == "Concat":
        parts = [np.asarray(x, dtype=object) for x in ins if x is not None]
        return [_normal(np.concatenate(parts, axis=imp.attr(node, "axis", 0)))]
    if op in ("Unsqueeze", "Squeeze"):
        axes = _ints(ins[1]) if len(ins) > 1 and ins[1] is not None else imp.attr(node, "axes")
        if op == "Unsqueeze":
            out = a
            rank = a.ndim + len(axes)
            for axis in sorted(x % rank for x in axes):
                out = np.expand_dims(out, axis)
            return [out]
        return [np.squeeze(a, axis=tuple(axes)) if axes else np.squeeze(a)]
    if op == "Slice":
        starts, ends = _ints(ins[1]), _ints(ins[2])
        axes = _ints(ins[3]) if len(ins) > 3 and ins[3] is not None else list(range(len(starts)))
        steps = _ints(ins[4]) if len(ins) > 4 and ins[4] is not None else [1] * len(starts)
        index = [slice(None)] * a.ndim
        for s, e, ax, st in zip(starts, ends, axes, steps):
            index[ax] = slice(s, e, st)
        return [_normal(a[tuple(index)])]
    if op == "Reshape" and is_symbolic(a):
        return [a.reshape(_ints(ins[1]))]
    if op == "Cast":
        to = ONNX_ELEMENT_TYPES.get(imp.attr(node, "to"))
        if to in ("int64", "int32"):
            return [a]
        raise NodeError(f"a symbolic dimension cast to {to}")
    if op in ("Add", "Sub", "Mul", "Div"):
        x, y = (np.asarray(v, dtype=object) for v in ins[:2])
        if op == "Div":
            return [_normal(np.vectorize(_exact_div, otypes=[object])(x, y))]
        fn = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply}[op]
        return [_normal(fn(x, y))]
    if op == "Equal":
        x, y = (np.asarray(v, dtype=object) for v in ins[:2])
        return [np.vectorize(lambda p, q: bool(p == q), otypes=[bool])(x, y)]
    if op == "Where":
        return [_normal(np.where(np.asarray(ins[0], dtype=bool), np.asarray(ins[1], dtype=object),
                                 np.asarray(ins[2], dtype=object)))]
    if op == "ConstantOfShape":
        return [_fill(imp, node, a)]
    if not is_symbolic(a):
        return None          # numbers shaped by a symbolic shape (Expand, Reshape): the graph's ops
    raise NodeError(f"{op} over a shape with symbolic dimensions has no counterpart here")


def _exact_div(p, q):
    if isinstance(p, Sym) or isinstance(q, Sym):
        return p // q                 # exact, or DimError
    return int(p) // int(q) if int(q) else 0


def _fill(imp, node, shape: np.ndarray) -> Value:
    """ConstantOfShape of a symbolic shape: the value broadcast to it, as a graph op."""
    from onnx import numpy_helper
    t = imp.attr(node, "value")
    value = numpy_helper.to_array(t).reshape(-1)[0] if t is not None else np.float32(0)
    scalar = imp.b.scalar(value.item(), str(np.asarray(value).dtype))
    dims = tuple(d if isinstance(d, Sym) else int(d) for d in shape.reshape(-1).tolist())
    return imp.b.op("broadcast_to", scalar, shape=dims)


# a constant computed at import larger than this is refused: models carry their large arrays as
# initializers, and a file's few bytes must not make the importer allocate without bound
MAX_FOLDED_BYTES = 1 << 30


def _elements(node, ins: list) -> int:
    """An upper bound on the elements ``node``'s output will hold, from its inputs alone."""
    op = node.op_type
    arrays = [np.asarray(x) for x in ins if x is not None]
    sizes = [a.size for a in arrays]

    def ints(i):
        return [int(v) for v in np.asarray(ins[i]).reshape(-1)] if len(ins) > i and ins[i] is not None else []
    if op == "ConstantOfShape":
        return math.prod(max(d, 0) for d in ints(0))
    if op == "Range":
        start, limit, delta = (float(np.asarray(x).reshape(-1)[0]) for x in ins[:3])
        count = (limit - start) / delta if delta else 0.0
        if not math.isfinite(count):          # an infinite or NaN bound: no count of elements at all
            raise NodeError(f"a range from {start:g} to {limit:g} by {delta:g} has no finite length")
        return max(0, math.ceil(count))
    if op == "Tile":
        return math.prod(d * max(r, 0) for d, r in zip(arrays[0].shape, ints(1)))
    if op == "Expand":
        shape = ints(1)
        rank = max(arrays[0].ndim, len(shape))
        dims = [1] * (rank - arrays[0].ndim) + list(arrays[0].shape)
        want = [1] * (rank - len(shape)) + shape
        return math.prod(max(a, b) for a, b in zip(dims, want))
    if op in ("MatMul", "Gemm") and len(arrays) >= 2 and arrays[0].ndim >= 1 and arrays[1].ndim >= 1:
        a, b = arrays[0].shape, arrays[1].shape
        return math.prod(a[:-1] or (1,)) * (b[-1] if len(b) > 1 else 1) * math.prod(b[:-2] or (1,))
    if op == "Pad":
        pads = ints(1)
        half = len(pads) // 2
        return math.prod(d + max(lo, 0) + max(hi, 0) for d, lo, hi in
                         zip(arrays[0].shape, pads[:half] or [0] * arrays[0].ndim, pads[half:] or [0] * arrays[0].ndim))
    try:                       # elementwise ops broadcast their inputs; the rest hold no more than them
        broadcast = math.prod(np.broadcast_shapes(*[a.shape for a in arrays]))
    except ValueError:
        broadcast = 0
    return max([broadcast, sum(sizes)])


def _check_size(node, ins: list) -> None:
    from toolkit.hostmem import human_bytes, too_big
    nbytes = _elements(node, ins) * 8
    # the fixed cap first: the memory free at the moment moves between the net's phases (each
    # imports the model), and two texts of one problem would be reported as two
    why = (f"over the {human_bytes(MAX_FOLDED_BYTES)} a constant computed at import may hold"
           if nbytes > MAX_FOLDED_BYTES else None) or too_big(nbytes)
    if why:
        raise NodeError(f"folding it at import would make a constant of up to {human_bytes(nbytes)}, {why}")
