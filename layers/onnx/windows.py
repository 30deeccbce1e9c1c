"""Strided and reversed reads of an axis, and what they write: Slice with any step, pooling with
dilations, unequal padding, ceil_mode or three image axes (one strided view per kernel offset,
combined by maximum or by sum over a divisor computed at import), Pad's edge, reflect and wrap
modes, and ArgMax/ArgMin's select_last_index. Each needs the sizes of the axes it reads known at
import. Also the padding (auto_pad resolved) and window counts that every convolution and pooling
converter shares."""
from __future__ import annotations

import itertools
import math

import numpy as np

from toolkit.ir.graph import Value

# a reversal or a padding mode writes one slice per element, a pooling one view per kernel offset:
# past these the graph would grow with the data, so larger ones are refused in one line
MAX_SLICES = 1024
MAX_KERNEL_OFFSETS = 512


def _known(imp, x: Value, axis: int, what: str) -> int:
    size = x.shape[axis]
    if not isinstance(size, int):
        imp.fail(f"{what} over the symbolic axis {axis} has no counterpart here")
    return size


def strided(imp, x: Value, axis: int, start: int, count: int, step: int) -> Value:
    """Elements start, start + step, ... (count of them, step >= 1) along ``axis``: the run cut
    out, padded to count * step, folded to [count, step] and its first column kept."""
    b = imp.b
    if step == 1:
        return b.op("slice", x, axis=axis, start=start, stop=start + count) \
            if (start, start + count) != (0, x.shape[axis]) else x
    size = _known(imp, x, axis, "a strided read")
    stop = min(size, start + count * step)
    y = b.op("slice", x, axis=axis, start=start, stop=stop) if (start, stop) != (0, size) else x
    if stop - start < count * step:
        y = b.op("pad_axis", y, axis=axis, before=0, after=count * step - (stop - start))
    shape = list(y.shape)
    y = b.reshape(y, tuple(shape[:axis]) + (count, step) + tuple(shape[axis + 1:]))
    y = b.op("slice", y, axis=axis + 1, start=0, stop=1)
    return b.reshape(y, tuple(shape[:axis]) + (count,) + tuple(shape[axis + 1:]))


def reverse(imp, x: Value, axis: int) -> Value:
    """``x`` with ``axis`` in reverse order: its one-element slices concatenated backwards."""
    size = _known(imp, x, axis, "a reversal")
    if size == 1:
        return x
    if size > MAX_SLICES:
        imp.fail(f"reversing an axis of {size} elements (more than {MAX_SLICES}) has no counterpart here")
    pieces = [imp.b.op("slice", x, axis=axis, start=i, stop=i + 1) for i in range(size - 1, -1, -1)]
    return imp.b.op("concat", *pieces, axis=axis)


def stepped_slice(imp, x: Value, axis: int, start: int, end: int, step: int) -> Value:
    """ONNX Slice of one axis with a step other than 1 (negative: read backwards)."""
    size = _known(imp, x, axis, "a slice with a step")
    if step > 0:
        start = max(0, min(size, start + size if start < 0 else start))
        end = max(0, min(size, end + size if end < 0 else end))
        count = max(0, -(-(end - start) // step))
    else:
        start = max(-1, min(size - 1, start + size if start < 0 else start))
        end = max(-1, min(size - 1, end + size if end < 0 else end))
        count = max(0, -(-(start - end) // -step))
    if count == 0:
        imp.fail(f"the slice of axis {axis} is empty; an empty tensor has no counterpart here")
    if step > 0:
        return strided(imp, x, axis, start, count, step)
    return strided(imp, reverse(imp, x, axis), axis, size - 1 - start, count, -step)


def window_pool(imp, node, x: Value, kernel, strides, dilations, begin, end, ceil: bool, include: bool) -> Value:
    """MaxPool or AveragePool of [N, C, *spatial] with every attribute ONNX gives: each output is
    the maximum (or the sum over a divisor) of the kernel's offsets, each offset a strided view
    of the input padded to the windows' reach."""
    b = imp.b
    spatial = [_known(imp, x, axis, node.op_type) for axis in range(2, x.rank)]
    offsets = math.prod(kernel)
    # a stride that is a multiple of the dilation reads only every dilation-th padded position:
    # those taken first, the windows are undilated ones the pooling primitive computes
    on_grid = x.rank == 4 and node.op_type == "MaxPool" and all(s % d == 0 for s, d in zip(strides, dilations))
    if offsets > MAX_KERNEL_OFFSETS and not on_grid:
        imp.fail(f"{node.op_type} with dilations, unequal padding or three image axes and a kernel of {offsets} "
                 f"elements (more than {MAX_KERNEL_OFFSETS}) has no counterpart here")
    reach = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    outs = [pool_size(n, r, s, lo, hi, ceil) for n, r, s, lo, hi in zip(spatial, reach, strides, begin, end)]
    if any(o is None or o < 1 for o in outs):
        imp.fail(f"{node.op_type}: the kernel does not fit the padded input")
    # the padded input: begin padding, then to the last window's reach (cut where it ends sooner)
    need = [(o - 1) * s + r for o, s, r in zip(outs, strides, reach)]
    padded = x
    for axis, (lo, n, want) in enumerate(zip(begin, spatial, need), start=2):
        after = want - lo - n
        if after < 0:
            padded = b.op("slice", padded, axis=axis, start=0, stop=n + after)
        if lo or after > 0:
            padded = b.op("pad_axis", padded, axis=axis, before=lo, after=max(0, after))
    inside = _region(need, begin, spatial, end, with_padding=False)
    if node.op_type == "MaxPool" and inside.min() == 0:
        padded = b.op("select", imp.materialize(inside.astype(x.dtype)), padded, b.scalar(float("-inf"), x.dtype))
    if on_grid:
        for axis, (o, s, d, k) in enumerate(zip(outs, strides, dilations, kernel), start=2):
            padded = strided(imp, padded, axis, 0, (o - 1) * (s // d) + k, d)
        steps = tuple(s // d for s, d in zip(strides, dilations))
        return b.op("max_pool2d", padded, kernel=tuple(kernel), stride=steps, pad=(0, 0), ceil_mode=False)
    result = None
    for offset in itertools.product(*[range(k) for k in kernel]):
        view = padded
        for axis, (j, d, o, s) in enumerate(zip(offset, dilations, outs, strides), start=2):
            view = strided(imp, view, axis, j * d, o, s)
        if result is None:
            result = view
        else:
            result = b.op("maximum", result, view) if node.op_type == "MaxPool" else b.add(result, view)
    if node.op_type == "MaxPool":
        return result
    # the divisor: the window's elements inside the input, or inside the input and its explicit
    # padding with count_include_pad (never those past the padding that ceil_mode adds)
    counted = _region(need, begin, spatial, end, with_padding=True) if include else inside
    divisor = np.zeros([1, 1] + outs, dtype=np.float64)
    for offset in itertools.product(*[range(k) for k in kernel]):
        divisor += counted[tuple([slice(None)] * 2 + [slice(j * d, j * d + (o - 1) * s + 1, s)
                                                      for j, d, o, s in zip(offset, dilations, outs, strides)])]
    return b.div(result, imp.materialize(np.maximum(divisor, 1).astype(x.dtype)))


def _region(lengths, begin, sizes, end, with_padding: bool) -> np.ndarray:
    """[1, 1, *lengths] of 1 where a position of the padded input (the input starting at
    ``begin``) lies in the input, or ``with_padding`` in the input or its explicit padding; else 0."""
    out = np.ones([1, 1], dtype=np.float64)
    for length, lo, n, hi in zip(lengths, begin, sizes, end):
        p = np.arange(length) - lo
        keep = ((p >= -lo) & (p < n + hi)) if with_padding else ((p >= 0) & (p < n))
        out = np.multiply.outer(out, keep.astype(np.float64)).reshape(out.shape + (length,))
    return out


def pad_mode(imp, x: Value, axis: int, lo: int, hi: int, mode: str) -> Value:
    """Pad's edge (the end element repeated), reflect (mirrored, the end element once) and wrap
    (the other end's elements) along one axis, as slices concatenated around ``x``."""
    size = _known(imp, x, axis, f"Pad mode {mode}")
    if lo + hi > MAX_SLICES:
        imp.fail(f"Pad mode {mode} of {lo + hi} elements (more than {MAX_SLICES}) has no counterpart here")
    if mode == "reflect" and (lo >= size or hi >= size):
        imp.fail(f"Pad mode reflect of {max(lo, hi)} elements along an axis of {size}: more than the axis holds")
    if mode == "wrap" and (lo > size or hi > size):
        imp.fail(f"Pad mode wrap of {max(lo, hi)} elements along an axis of {size}: more than the axis holds")

    def at(i):
        return imp.b.op("slice", x, axis=axis, start=i, stop=i + 1)
    if mode == "edge":
        before, after = [at(0)] * lo, [at(size - 1)] * hi
    elif mode == "reflect":
        before, after = [at(i) for i in range(lo, 0, -1)], [at(size - 2 - i) for i in range(hi)]
    else:
        before, after = [at(i) for i in range(size - lo, size)], [at(i) for i in range(hi)]
    pieces = before + [x] + after
    return pieces[0] if len(pieces) == 1 else imp.b.op("concat", *pieces, axis=axis)


def last_index_arg(imp, x: Value, axis: int, largest: bool) -> Value:
    """ArgMax/ArgMin with select_last_index: the first index of the reversed axis, counted from
    the end (int64, the axis kept)."""
    b = imp.b
    size = _known(imp, x, axis, "select_last_index")
    flipped = reverse(imp, x if largest else b.op("neg", x), axis)
    first = b.op("cast", b.op("topk", flipped, axis=axis, k=1, values=False), dtype="int64")
    return b.sub(imp.materialize(np.array(size - 1, dtype=np.int64)), first)


def conv3d(imp, node, x: Value) -> Value:
    """Conv of [N, C, D, H, W]: the depth padded, then for each kernel depth offset the strided
    depth slices as a batch of 2-d images through conv2d with that depth's kernel, summed."""
    b = imp.b
    w = imp.value(node.input[1], x)
    kernel = [int(k) for k in w.shape[2:]]
    strides = [int(s) for s in imp.attr(node, "strides", [1, 1, 1])]
    dilations = [int(d) for d in imp.attr(node, "dilations", [1, 1, 1])]
    begin, end = spatial_pads(imp, node, x, kernel, strides, dilations)
    group = int(imp.attr(node, "group", 1))
    depth = _known(imp, x, 2, "a 3-d convolution")
    if begin[0] or end[0]:
        x = b.op("pad_axis", x, axis=2, before=begin[0], after=end[0])
    reach = (kernel[0] - 1) * dilations[0] + 1
    out_depth = (depth + begin[0] + end[0] - reach) // strides[0] + 1
    if out_depth < 1:
        imp.fail("the kernel is deeper than the padded input")
    symmetric = [lo if lo == hi else 0 for lo, hi in zip(begin[1:], end[1:])]
    x = pad_explicit(imp, x, [0] + [lo - s for lo, s in zip(begin[1:], symmetric)],
                      [0] + [hi - s for hi, s in zip(end[1:], symmetric)])
    n, c = x.shape[0], x.shape[1]
    total = None
    for k in range(kernel[0]):
        planes = strided(imp, x, 2, k * dilations[0], out_depth, strides[0])         # [N, C, Do, H, W]
        planes = b.op("transpose", planes, perm=(0, 2, 1, 3, 4))
        planes = b.reshape(planes, (n * out_depth, c) + tuple(planes.shape[3:]))
        wk = b.reshape(b.op("slice", w, axis=2, start=k, stop=k + 1), (w.shape[0], w.shape[1]) + tuple(w.shape[3:]))
        y = b.op("conv2d", planes, wk, stride=tuple(strides[1:]), pad=tuple(symmetric), dilation=tuple(dilations[1:]),
                 group=group)
        total = y if total is None else b.add(total, y)
    bias = imp.optional(node, 2)
    if bias is not None:
        bv = imp.value(bias, total)
        total = b.add(total, b.reshape(bv, (bv.shape[0], 1, 1)))
    total = b.reshape(total, (n, out_depth) + tuple(total.shape[1:]))
    return b.op("transpose", total, perm=(0, 2, 1, 3, 4))


# -- the padding and window counts every convolution and pooling converter shares --------------
def spatial_pads(imp, node, x: Value, kernel, strides, dilations) -> tuple[list[int], list[int]]:
    """(begin, end) padding of the two image axes, auto_pad resolved against the input's size."""
    auto = imp.attr(node, "auto_pad", "NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    rank = len(kernel)
    if auto not in ("NOTSET", "", "VALID", "SAME_UPPER", "SAME_LOWER"):
        imp.fail(f"auto_pad {auto!r} is none of NOTSET, VALID, SAME_UPPER and SAME_LOWER")
    if auto in ("NOTSET", ""):
        pads = list(imp.attr(node, "pads", [0] * 2 * rank))
        if len(pads) != 2 * rank:
            imp.fail(f"pads has {len(pads)} values, the image's {rank} axes take {2 * rank}")
        return pads[:rank], pads[rank:]
    if auto == "VALID":
        return [0] * rank, [0] * rank
    begin, end = [], []
    for size, k, s, d in zip(x.shape[2:], kernel, strides, dilations):
        if not isinstance(size, int):
            imp.fail(f"auto_pad {auto} over a symbolic image size")
        out = -(-size // s)
        total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
        small, big = total // 2, total - total // 2
        begin.append(big if auto == "SAME_LOWER" else small)
        end.append(small if auto == "SAME_LOWER" else big)
    return begin, end


def pad_explicit(imp, x: Value, begin: list[int], end: list[int]) -> Value:
    for axis, (lo, hi) in enumerate(zip(begin, end), start=2):
        if lo or hi:
            x = imp.b.op("pad_axis", x, axis=axis, before=lo, after=hi)
    return x


def pool_size(size, kernel: int, stride: int, begin: int, end: int, ceil: bool):
    """Pooling windows along an axis padded by (begin, end): PyTorch's rule, which drops a last
    window that would start in the end padding."""
    if not isinstance(size, int):
        if begin == end:
            return (size + 2 * begin - kernel) // stride + 1 if not ceil else None
        return None
    span = size + begin + end - kernel
    out = (-(-span // stride) if ceil else span // stride) + 1
    if ceil and (out - 1) * stride >= size + begin:
        out -= 1
    return out
