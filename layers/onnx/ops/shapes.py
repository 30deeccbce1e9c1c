"""ONNX's ops that move values without computing: Reshape, Flatten, Transpose, Squeeze,
Unsqueeze, Concat, Slice, Split, Gather, Expand, Tile, Pad and ConstantOfShape."""
from __future__ import annotations

import math

import numpy as np

from toolkit.ir.graph import FLOAT_DTYPES, Value

from ..convert import NUMPY, dims_of, is_const
from .base import axes_input, converts


def _reshape_dims(imp, x: Value, target, allowzero: bool) -> tuple:
    dims = list(dims_of(target))
    for i, d in enumerate(dims):
        if isinstance(d, int) and d == 0 and not allowzero:
            if i >= x.rank:             # a 0 copies the input's size on that axis: it has none
                imp.fail(f"a 0 on axis {i} of the shape {list(dims_of(target))}, past the rank-{x.rank} "
                         "input's axes")
            dims[i] = x.shape[i]
    if sum(1 for d in dims if isinstance(d, int) and d == -1) > 1:
        imp.fail("more than one -1 in the shape")
    if -1 in [d for d in dims if isinstance(d, int)]:
        known = 1
        for d in dims:
            if not (isinstance(d, int) and d == -1):
                known = known * d
        total = 1
        for d in x.shape:
            total = total * d
        dims[[i for i, d in enumerate(dims) if isinstance(d, int) and d == -1][0]] = total // known
    return tuple(dims)


@converts("Reshape")
def _reshape(imp, node):
    x = imp.value(node.input[0])
    target = imp.const(node.input[1], "the shape")
    return [imp.b.reshape(x, _reshape_dims(imp, x, target, bool(imp.attr(node, "allowzero", 0))))]


@converts("Flatten")
def _flatten(imp, node):
    x = imp.value(node.input[0])
    axis = imp.attr(node, "axis", 1) % (x.rank + 1) if imp.attr(node, "axis", 1) >= 0 \
        else imp.attr(node, "axis") + x.rank
    lead, rest = 1, 1
    for d in x.shape[:axis]:
        lead = lead * d
    for d in x.shape[axis:]:
        rest = rest * d
    return [imp.b.reshape(x, (lead, rest))]


@converts("Transpose")
def _transpose(imp, node):
    x = imp.value(node.input[0])
    perm = imp.attr(node, "perm", list(range(x.rank))[::-1])
    return [x if list(perm) == list(range(x.rank)) else imp.b.op("transpose", x, perm=tuple(int(p) for p in perm))]


@converts("Squeeze")
def _squeeze(imp, node):
    x = imp.value(node.input[0])
    axes = axes_input(imp, node, 1, x.rank)
    if axes is None:
        axes = [i for i, d in enumerate(x.shape) if d == 1]
    for a in axes:
        if x.shape[a] != 1:
            imp.fail(f"axis {a} has size {x.shape[a]}, not 1")
    return [imp.b.reshape(x, tuple(d for i, d in enumerate(x.shape) if i not in axes))]


@converts("Unsqueeze")
def _unsqueeze(imp, node):
    x = imp.value(node.input[0])
    name = imp.optional(node, 1)
    given = list(imp.const(name, "the axes").reshape(-1)) if name is not None else imp.attr(node, "axes")
    rank = x.rank + len(given)
    axes = sorted(int(a) % rank for a in given)
    dims = list(x.shape)
    for a in axes:
        dims.insert(a, 1)
    return [imp.b.reshape(x, tuple(dims))]


@converts("Concat")
def _concat(imp, node):
    values = [imp.env[n] for n in node.input if n]
    values = [v for v in values if not (is_const(v) and v.size == 0)] or values[:1]
    like = next((v for v in values if isinstance(v, Value)), None)
    values = [v if isinstance(v, Value) else imp.materialize(v, like) for v in values]
    values = [v for v in values if v.shape[imp.attr(node, "axis") % v.rank] != 0] or values[:1]
    axis = imp.attr(node, "axis") % values[0].rank
    return [values[0] if len(values) == 1 else imp.b.op("concat", *values, axis=axis)]


def _clamp(index: int, size, what: str, imp) -> object:
    if isinstance(size, int):
        if index < 0:
            index += size
        return max(0, min(size, index))
    if index >= 2**31 - 1:
        return size
    if index < 0:
        return size + index
    return index


@converts("Slice")
def _slice(imp, node):
    x = imp.value(node.input[0])
    starts = [int(v) for v in imp.const(node.input[1], "the starts").reshape(-1)]
    ends = [int(v) for v in imp.const(node.input[2], "the ends").reshape(-1)]
    axes = axes_input(imp, node, 3, x.rank) or list(range(len(starts)))
    steps_name = imp.optional(node, 4)
    steps = [int(v) for v in imp.const(steps_name, "the steps").reshape(-1)] if steps_name else [1] * len(starts)
    y = x
    for s, e, axis, step in zip(starts, ends, axes, steps):
        if step == 0:
            imp.fail("a step of 0")
        if step != 1:
            from ..windows import stepped_slice
            y = stepped_slice(imp, y, axis, s, e, step)
            continue
        size = y.shape[axis]
        start, stop = _clamp(s, size, "start", imp), _clamp(e, size, "end", imp)
        if start == 0 and stop == size:
            continue
        y = imp.b.op("slice", y, axis=axis, start=start, stop=stop)
    return [y]


@converts("Split")
def _split(imp, node):
    x = imp.value(node.input[0])
    axis = imp.attr(node, "axis", 0) % x.rank
    name = imp.optional(node, 1)
    size = x.shape[axis]
    if name is not None:
        parts = [int(v) for v in imp.const(name, "the split sizes").reshape(-1)]
    else:
        count = imp.attr(node, "num_outputs", len(node.output))
        if not isinstance(size, int):
            imp.fail("an even split of a symbolic dimension")
        chunk = -(-size // count)
        parts = [min(chunk, size - i * chunk) for i in range(count)]
    outs, start = [], 0
    for p in parts:
        # the graph has no empty tensor: an empty part of known shape is an empty constant, which
        # Concat drops (a rotary embedding's split with nothing left unrotated); else uncomputed,
        # an error only where read
        if p:
            outs.append(imp.b.op("slice", x, axis=axis, start=start, stop=start + p))
        elif all(isinstance(d, int) for d in x.shape) and x.dtype in NUMPY:
            outs.append(np.zeros(tuple(0 if i == axis else d for i, d in enumerate(x.shape)), NUMPY[x.dtype]))
        else:
            outs.append(None)
        start += p
    return outs


@converts("Gather")
def _gather(imp, node):
    data = imp.env[node.input[0]]
    indices = imp.env[node.input[1]]
    x = data if isinstance(data, Value) else None
    axis = imp.attr(node, "axis", 0)
    b = imp.b
    rank = x.rank if x is not None else np.ndim(data)
    if not -rank <= axis < rank:                  # a scalar has no axis at all
        imp.fail(f"axis {axis} of an input of rank {rank}")
    if is_const(indices):
        x = x if x is not None else imp.materialize(data)
        axis %= x.rank
        idx = np.asarray(indices).astype(np.int64)
        size = x.shape[axis]
        if not isinstance(size, int) and (idx < 0).any():
            imp.fail("a negative index into a symbolic dimension")
        flat = [int(i) + (size if i < 0 else 0) for i in idx.reshape(-1)]
        pieces = [b.op("slice", x, axis=axis, start=i, stop=i + 1) for i in flat]
        y = pieces[0] if len(pieces) == 1 else b.op("concat", *pieces, axis=axis)
        shape = tuple(x.shape[:axis]) + tuple(idx.shape) + tuple(x.shape[axis + 1:])
        return [b.reshape(y, shape)]
    table = x if x is not None else imp.materialize(data)
    axis %= table.rank
    size = table.shape[axis]
    if isinstance(size, int) and indices.dtype in ("int32", "int64"):
        # a negative index counts from the end: size added where it is below 0 (in float64, exact
        # for any index of a table that fits in memory)
        wide = b.op("cast", indices, dtype="float64")
        below = b.sub(b.scalar(1.0, "float64"), b.op("ge_mask", wide, b.scalar(0.0, "float64")))
        indices = b.op("cast", b.add(wide, b.scale(below, float(size))), dtype=indices.dtype)
    if axis != 0:
        # the axis read brought to the front, its rows gathered, the other axes put back around
        # the indices' own
        rest = [i for i in range(table.rank) if i != axis]
        moved = b.op("transpose", table, perm=tuple([axis] + rest))
        flat = b.reshape(moved, (size, math.prod(table.shape[i] for i in rest)))
        rows = b.op("embedding", flat, indices, layer=imp.b.scope)
        r = indices.rank
        rows = b.reshape(rows, tuple(indices.shape) + tuple(table.shape[i] for i in rest))
        perm = [r + i for i in range(axis)] + list(range(r)) + [r + i for i in range(axis, table.rank - 1)]
        return [b.op("transpose", rows, perm=tuple(perm))]
    if table.rank != 2:
        flat = b.reshape(table, (table.shape[0], math.prod(table.shape[1:])))
        rows = b.op("embedding", flat, indices, layer=imp.b.scope)
        return [b.reshape(rows, tuple(indices.shape) + tuple(table.shape[1:]))]
    return [b.op("embedding", table, indices, layer=imp.b.scope)]


@converts("Expand")
def _expand(imp, node):
    from toolkit.ops.rules import broadcast_shapes
    x = imp.value(node.input[0])
    shape = dims_of(imp.const(node.input[1], "the shape"))
    target = broadcast_shapes(tuple(x.shape), shape)
    return [x if target == tuple(x.shape) else imp.b.op("broadcast_to", x, shape=target)]


@converts("Tile")
def _tile(imp, node):
    x = imp.value(node.input[0])
    repeats = [int(r) for r in imp.const(node.input[1], "the repeats").reshape(-1)]
    if len(repeats) != x.rank or any(r < 1 for r in repeats):
        imp.fail(f"repeats {repeats} for a rank-{x.rank} input (one repeat of at least 1 per axis)")
    if all(isinstance(d, int) for d in x.shape):
        from toolkit.hostmem import human_bytes, too_big
        nbytes = math.prod(x.shape) * math.prod(repeats) * 8
        why = too_big(nbytes)
        if why:
            imp.fail(f"repeats {repeats} make a tensor of {human_bytes(nbytes)}, {why}")
    b = imp.b
    for axis, r in enumerate(repeats):
        if r != 1:
            # r copies side by side: a new axis of r in front of this one, broadcast, folded in
            shape = tuple(x.shape)
            spread = b.op("broadcast_to", b.reshape(x, shape[:axis] + (1,) + shape[axis:]),
                          shape=shape[:axis] + (r,) + shape[axis:])
            x = b.reshape(spread, shape[:axis] + (r * shape[axis],) + shape[axis + 1:])
    return [x]


@converts("Pad")
def _pad(imp, node):
    x = imp.value(node.input[0])
    mode = imp.attr(node, "mode", "constant")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if mode not in ("constant", "edge", "reflect", "wrap"):
        imp.fail(f"mode {mode} has no counterpart here")
    pads = [int(p) for p in imp.const(node.input[1], "the pads").reshape(-1)]
    if mode != "constant":
        from ..windows import pad_mode
        axes = axes_input(imp, node, 3, x.rank) or list(range(x.rank))
        half = len(pads) // 2
        for axis, lo, hi in zip(axes, pads[:half], pads[half:]):
            if lo < 0 or hi < 0:
                imp.fail(f"mode {mode} with a negative padding has no counterpart here")
            if lo or hi:
                x = pad_mode(imp, x, axis, lo, hi, mode)
        return [x]
    value = imp.optional(node, 2)
    fill = float(np.asarray(imp.const(value, "the value")).reshape(-1)[0]) if value is not None else 0.0
    if fill and x.dtype not in FLOAT_DTYPES:
        imp.fail(f"a padding value other than 0 for {x.dtype} values")
    if fill:                         # pad x - v with zeros, then add v back: v in the padding
        x = imp.b.sub(x, imp.b.scalar(fill, x.dtype))
    axes = axes_input(imp, node, 3, x.rank) or list(range(x.rank))
    half = len(pads) // 2
    for axis, lo, hi in zip(axes, pads[:half], pads[half:]):
        if lo < 0 or hi < 0:
            x = imp.b.op("slice", x, axis=axis, start=max(0, -lo), stop=x.shape[axis] - max(0, -hi))
            lo, hi = max(0, lo), max(0, hi)
        if lo or hi:
            x = imp.b.op("pad_axis", x, axis=axis, before=lo, after=hi)
    return [imp.b.add(x, imp.b.scalar(fill, x.dtype)) if fill else x]


@converts("ConstantOfShape")
def _constant_of_shape(imp, node):
    from ..fold import _fill
    return [_fill(imp, node, np.asarray(imp.const(node.input[0], "the shape"), dtype=object))]
