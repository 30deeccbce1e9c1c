"""ONNX's Conv (1-d, 2-d and 3-d images) and ConvTranspose (1-d and 2-d)."""
from __future__ import annotations

from ..windows import pad_explicit, spatial_pads
from .base import converts, float_input, image_input, two_axes


@converts("Conv")
def _conv(imp, node):
    from .quantized import qdq_conv
    fused = qdq_conv(imp, node)          # a dequantized input and int8 weight: one qconv2d
    if fused is not None:
        return fused
    if float_input(imp, node.input[0]).rank == 5:
        from ..windows import conv3d
        return [conv3d(imp, node, imp.value(node.input[0]))]
    x, one_d = image_input(imp, node, node.input[0])
    w = imp.value(node.input[1], x)
    if one_d:
        w = imp.b.reshape(w, (w.shape[0], w.shape[1], 1, w.shape[2]))
    kernel = [int(k) for k in w.shape[2:]]
    strides = two_axes(imp.attr(node, "strides", [1] * (2 - one_d)), one_d, 1)
    dilations = two_axes(imp.attr(node, "dilations", [1] * (2 - one_d)), one_d, 1)
    if one_d and imp.attr(node, "pads") is not None:
        p = list(imp.attr(node, "pads"))
        node_pads = [0, p[0], 0, p[1]]
    else:
        node_pads = None
    begin, end = ([node_pads[0], node_pads[1]], [node_pads[2], node_pads[3]]) if node_pads else \
        spatial_pads(imp, node, x, kernel, strides, dilations)
    symmetric = [lo if lo == hi else 0 for lo, hi in zip(begin, end)]
    x = pad_explicit(imp, x, [lo - s for lo, s in zip(begin, symmetric)], [hi - s for hi, s in zip(end, symmetric)])
    inputs = [x, w]
    bias = imp.optional(node, 2)
    if bias is not None:
        inputs.append(imp.value(bias, x))
    y = imp.b.op("conv2d", *inputs, stride=tuple(strides), pad=tuple(symmetric), dilation=tuple(dilations),
                 group=int(imp.attr(node, "group", 1)))
    return [imp.b.reshape(y, (y.shape[0], y.shape[1], y.shape[3])) if one_d else y]


@converts("ConvTranspose")
def _conv_transpose(imp, node):
    x, one_d = image_input(imp, node, node.input[0])
    w = imp.value(node.input[1], x)
    if one_d:                       # a 1-d signal as an image one row high, its attributes so too
        w = imp.b.reshape(w, (w.shape[0], w.shape[1], 1, w.shape[2]))
    kernel = [int(k) for k in w.shape[2:]]
    strides = two_axes(imp.attr(node, "strides", [1] * (2 - one_d)), one_d, 1)
    dilations = two_axes(imp.attr(node, "dilations", [1] * (2 - one_d)), one_d, 1)
    extra = two_axes(imp.attr(node, "output_padding", [0] * (2 - one_d)), one_d, 0)
    group = int(imp.attr(node, "group", 1))
    sizes = [d for d in x.shape[2:]]
    if not all(isinstance(d, int) for d in sizes):
        imp.fail("a transposed convolution over a symbolic image size")
    natural = [(n - 1) * s + (k - 1) * d + 1 + e for n, s, k, d, e in zip(sizes, strides, kernel, dilations, extra)]
    wanted = imp.attr(node, "output_shape")
    auto = imp.attr(node, "auto_pad", "NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    if wanted is not None or auto in ("SAME_UPPER", "SAME_LOWER"):
        target = two_axes(list(wanted)[-(2 - one_d):], one_d, 1) if wanted is not None else \
            [n * s for n, s in zip(sizes, strides)]
        total = [nat - t for nat, t in zip(natural, target)]
        if auto in ("SAME_UPPER", "SAME_LOWER"):
            begin = [t - t // 2 if auto == "SAME_LOWER" else t // 2 for t in total]
        else:                       # output_shape alone: the convolution's output from the start, cut or
            begin = [0] * len(total)    # zero-filled at the end (ONNX's reference)
        end = [t - b for t, b in zip(total, begin)]
    else:
        pads = [int(p) for p in imp.attr(node, "pads", [0] * 2 * (2 - one_d))]
        begin, end = two_axes(pads[:len(pads) // 2], one_d, 0), two_axes(pads[len(pads) // 2:], one_d, 0)
    # the toolkit's transposed convolution crops pad on both sides: crop the difference after; a
    # negative padding (an output_shape larger than the convolution gives) is zeros added after
    pad = [max(0, min(b, e)) for b, e in zip(begin, end)]
    out_hw = tuple(nat - 2 * p for nat, p in zip(natural, pad))
    y = imp.b.op("conv2d_grad_input", x, w, stride=tuple(strides), pad=tuple(pad), dilation=tuple(dilations),
                 group=group, input_hw=out_hw)
    for axis, (b_, e_, p) in enumerate(zip(begin, end, pad), start=2):
        crop_lo, crop_hi = max(0, b_ - p), max(0, e_ - p)
        if crop_lo or crop_hi:
            y = imp.b.op("slice", y, axis=axis, start=crop_lo, stop=y.shape[axis] - crop_hi)
        if b_ < 0 or e_ < 0:
            y = imp.b.op("pad_axis", y, axis=axis, before=max(0, -b_), after=max(0, -e_))
    bias = imp.optional(node, 2)
    if bias is not None:
        bv = imp.value(bias, y)
        y = imp.b.add(y, imp.b.reshape(bv, (bv.shape[0], 1, 1)))
    return [imp.b.reshape(y, (y.shape[0], y.shape[1], y.shape[3])) if one_d else y]
