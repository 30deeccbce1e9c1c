"""Generated kernels of the blocked channel layout (ops/layout.py): the reorders, and the dense
and depthwise convolutions calling codegen/blocked.py's tiles.

A convolution kernel builds, once per plan: the packed weight (frozen weights only: the layout
pass blocks a convolution only where its weight is a constant, so a fed weight declines here
and the numpy kernel runs it) and the table of each tap's offset. The dense kernel also takes a
table of each output position's window origin and, where it pads, a zeroed padded copy of the
input whose interior it refreshes on every run (the border stays zero); the depthwise kernel
reads the unpadded plane and tests only the border's windows. The work is split over (image,
group of four output blocks, range of positions) for the dense kernel and (image, channel
block) for the depthwise one, so batch 1 on two threads keeps both busy.
"""
from __future__ import annotations

import numpy as np

from ...backend.registry import register_native
from ...codegen import blocked, microkernel
from ...codegen.loops import Buf, Extern, For, Kernel, Let, Names, Store, lift, maximum, select
from ...codegen.native import NativeCall
from .conv import store_epilogue
from .conv_parts import ConvShape, i64
from .winograd import constant_weight

BLOCK = blocked.BLOCK


def _reorder(ctx, ins, outs, to_blocked: bool):
    if ctx.dtype not in ("float32", "float64"):
        return None
    plain = ctx.in_shapes[0] if to_blocked else ctx.out_shapes[0]
    n, c, h, w = (int(d) for d in plain)
    block = int(ctx.attrs["block"])
    cb, hw = -(-c // block), h * w
    names = Names()
    # to_blocked may write a gathered concatenation's part: its images an output image apart
    image_out = output_image_stride(outs[0], cb * block * hw) if to_blocked else c * hw
    x = Buf("x", ctx.dtype, n * (c if to_blocked else cb * block) * hw)
    y_size = (n - 1) * image_out + (cb * block if to_blocked else c) * hw
    y = Buf("y", ctx.dtype, y_size, const=False)
    y_array = outs[0] if outs[0].flags.c_contiguous else \
        np.lib.stride_tricks.as_strided(outs[0], shape=(y_size,), strides=(outs[0].itemsize,))
    i, q, lane = names.var("i"), names.var("q"), names.var("lane")
    parallel = ctx.threads > 1 and n * c * hw >= 1 << 15
    # block i (image i // cb, channel block i % cb) of the blocked side starts here
    blocked_at = (i // cb) * image_out + (i % cb) * (hw * block) if to_blocked else i * (hw * block)
    if c % block == 0:
        # i: (image, channel block); the NCHW side's index of (lane, q) is (i * block + lane) * hw + q
        nchw = (i * block + lane) * hw + q
        nchwc = blocked_at + q * block + lane
        src, dst = (nchw, nchwc) if to_blocked else (nchwc, nchw)
        inner = For(lane, i64(0), i64(block), [Store(y, dst, x[src])], vector=to_blocked)
        outer = For(q, i64(0), i64(hw), [inner], vector=not to_blocked) if to_blocked else \
            For(lane, i64(0), i64(block), [For(q, i64(0), i64(hw), [Store(y, dst, x[src])], vector=True)])
        body = [For(i, i64(0), i64(n * cb), [outer], parallel=parallel)]
    else:
        # a padded last block: channel ch = blk * block + lane of image img exists while ch < c
        img, ch = names.var("img"), names.var("ch")
        if to_blocked:
            real = select(ch.lt(c), ch, i64(c - 1))         # an index inside x for the lanes past c
            take = select(ch.lt(c), x[(img * c + real) * hw + q], lift(0.0, ctx.dtype))
            body = [For(i, i64(0), i64(n * cb), [Let(img, i // cb), For(q, i64(0), i64(hw), [
                For(lane, i64(0), i64(block), [Let(ch, (i % cb) * block + lane),
                                               Store(y, blocked_at + q * block + lane, take)])])],
                parallel=parallel)]
        else:
            body = [For(i, i64(0), i64(n * c), [Let(img, i // c), Let(ch, i % c), For(q, i64(0), i64(hw), [
                Store(y, i * hw + q, x[((img * cb + ch // block) * hw + q) * block + ch % block])],
                vector=True)], parallel=parallel)]
    return NativeCall(Kernel("to_blocked" if to_blocked else "from_blocked", [x, y], body, ctx.threads),
                      [ins[0], y_array])


@register_native("to_blocked", "cpu")
def to_blocked_native(ctx, ins, outs):
    return _reorder(ctx, ins, outs, True)


@register_native("from_blocked", "cpu")
def from_blocked_native(ctx, ins, outs):
    return _reorder(ctx, ins, outs, False)


def pack_dense(weight: np.ndarray, lanes: int = BLOCK) -> np.ndarray:
    """[O, C, kH, kW] as [O/16][C/lanes][taps][lanes in][16 out]: block ob's rows contiguous
    (lanes: the input's channels side by side, 16 blocked, 1 for an NCHW input)."""
    o, c, kh, kw = weight.shape
    w = weight.astype(np.float32).reshape(o // BLOCK, BLOCK, c // lanes, lanes, kh * kw)
    return np.ascontiguousarray(w.transpose(0, 2, 4, 3, 1)).reshape(-1)


def pack_depthwise(weight: np.ndarray) -> np.ndarray:
    """[C, 1, kH, kW] as [C/16][taps][16]."""
    c, _, kh, kw = weight.shape
    w = weight.astype(np.float32).reshape(c // BLOCK, BLOCK, kh * kw)
    return np.ascontiguousarray(w.transpose(0, 2, 1)).reshape(-1)


def output_image_stride(out, image_size: int) -> int:
    """Floats from one image of ``out`` to the next: its own size for a contiguous array, more
    for a strided view whose images are otherwise contiguous (a gathered concatenation's part,
    passed to the kernel as the one flat run from its first image's start to its last's end)."""
    if not isinstance(out, np.ndarray) or out.ndim < 2 or out.flags.c_contiguous:
        return image_size
    if not out[0].flags.c_contiguous or out.strides[0] % out.itemsize:
        raise ValueError("an output view must keep each image contiguous")
    return out.strides[0] // out.itemsize


def blocked_convolution(ctx, ins, outs, program=None):
    """conv2d_blocked [+ an epilogue the tiles apply as they store]; None where unsupported."""
    attrs = ctx.attrs if program is None else dict(ctx.attrs["head_attrs"])
    head_ins = ctx.attrs.get("head_inputs", len(ins))
    if ctx.dtype != "float32" or int(attrs["block"]) != BLOCK or not microkernel.available():
        return None
    weight = constant_weight(ctx)
    if weight is None:
        return None
    out_shape = tuple(int(d) for d in ctx.out_shapes[0])
    in_store = store_epilogue(program, ctx, out_shape)
    if in_store is None:
        return None
    res_at, relu = in_store
    if len(ctx.in_shapes[0]) == 4:          # an NCHW input: blocks of one channel, its planes
        n, cb, h, w_ = (int(d) for d in ctx.in_shapes[0])
        lanes = 1
    else:
        n, cb, h, w_, _ = (int(d) for d in ctx.in_shapes[0])
        lanes = BLOCK
    _, ob, oh, ow, _ = out_shape
    s = ConvShape((n, cb * lanes, h, w_), weight.shape, (oh, ow), attrs)
    depthwise = s.g > 1 and s.cg == 1 and s.og == 1
    # a grouped dense convolution (AlexNet's): each group's input and output blocks are its own,
    # the packed weight's rows per output block span the group's input blocks only
    cbg, obg = (cb // s.g, ob // s.g) if not depthwise else (cb, ob)
    hp, wp = h + 2 * s.ph, w_ + 2 * s.pw
    plane_in, plane_pad, plane_out = h * w_ * lanes, hp * wp * lanes, s.p * BLOCK
    row = w_ if depthwise else wp           # the depthwise kernel reads the unpadded plane
    taps = np.array([((i * s.dh) * row + j * s.dw) * lanes for i in range(s.kh) for j in range(s.kw)], np.int64)
    packed = pack_depthwise(weight) if depthwise else pack_dense(weight, lanes)
    names = Names()
    # the output's images may lie further apart than its own size: a part of a concatenation
    # that the memory plan gathers in place (runtime/memory.py), written into its slot of each
    # image of the concatenation's output
    image_out = output_image_stride(outs[0], ob * plane_out)
    x = Buf("x", "float32", n * cb * plane_in)
    y = Buf("y", "float32", (n - 1) * image_out + ob * plane_out, const=False)
    wpk = Buf("wp", "float32", packed.size)
    taps_b = Buf("taps", "int64", taps.size)
    y_array = outs[0] if image_out == ob * plane_out else \
        np.lib.stride_tricks.as_strided(outs[0], shape=(y.size,), strides=(outs[0].itemsize,))
    params, arrays = [x, y, wpk, taps_b], [ins[0], y_array, packed, taps]
    if not depthwise:                       # each output position's window origin
        pos = np.array([((oy_ * s.sh) * wp + ox_ * s.sw) * lanes for oy_ in range(oh) for ox_ in range(ow)],
                       np.int64)
        pos_b = Buf("pos", "int64", pos.size)
        params.append(pos_b)
        arrays.append(pos)
    bias = None
    if head_ins == 3:
        bias = Buf("bias", "float32", ob * BLOCK)
        params.append(bias)
        arrays.append(ins[2])
    res = None
    if res_at is not None:
        res = Buf("res", "float32", n * ob * plane_out)
        params.append(res)
        arrays.append(ins[res_at])
    body = []
    threads = ctx.threads
    i, r, q = names.var("i"), names.var("r"), names.var("q")

    def copy_interior(dst: Buf, dst_plane, src_plane) -> For:
        """Rows of one block's plane into the interior of its zero-bordered padded copy."""
        return For(r, i64(0), i64(h), [For(q, i64(0), i64(w_ * lanes), [
            Store(dst, dst_plane + ((r + s.ph) * wp + s.pw) * lanes + q, x[src_plane + r * w_ * lanes + q])],
            vector=True)])
    if s.padded and not depthwise:          # dense: the image's padded copy, read by every tap
        src = Buf("xpad", "float32", n * cb * plane_pad, const=False)
        params.append(src)
        arrays.append(np.zeros(src.size, np.float32))
        body.append(For(i, i64(0), i64(n * cb), [copy_interior(src, i * plane_pad, i * plane_in)],
                        parallel=threads > 1 and n * cb * plane_in >= 1 << 15))
        plane = plane_pad
    else:
        src, plane = x, plane_in
    item = names.var("item")
    if depthwise:
        img, blk = names.var("img"), names.var("blk")
        plane_at = img * cb + blk
        steps = [Let(img, item // cb), Let(blk, item % cb)]

        # straight from the unpadded plane, the border's windows tested tap by tap (a padded copy
        # of the plane, whole or by bands of rows, cost its own pass over memory: MobileNet's
        # first depthwise layer, 32 x 112 x 112, 0.27 ms that way, 0.14 direct, 0.17-0.20 NCHW)
        steps.append(Extern("tk_bdw_direct", (
            (x, plane_at * plane_in), i64(h), i64(w_), i64(oh), i64(ow), i64(s.sh), i64(s.sw), i64(s.ph),
            i64(s.pw), i64(s.kh), i64(s.kw), i64(s.dh), i64(s.dw), (taps_b, i64(0)),
            (wpk, blk * (taps.size * BLOCK)), (y, img * image_out + blk * plane_out),
            (bias, blk * BLOCK) if bias else None,
            (res, plane_at * plane_out) if res else None, i64(int(relu))), blocked.C_SOURCE))
        body.append(For(item, i64(0), i64(n * cb), steps, parallel=threads > 1))
    else:
        per_group = -(-obg // blocked.TILE_BLOCKS)      # tiles of output blocks in a group
        groups = s.g * per_group
        tiles = -(-s.p // blocked.TILE_POSITIONS)
        # enough items for every thread, each a whole number of position tiles
        chunks = 1 if n * groups >= 2 * threads or threads == 1 else min(tiles, -(-2 * threads // (n * groups)))
        per_chunk = -(-tiles // chunks) * blocked.TILE_POSITIONS
        chunks = -(-s.p // per_chunk)
        img, grp, chunk = names.var("img"), names.var("grp"), names.var("chunk")
        p_lo, p_hi, ob_lo, ob_hi = names.var("p_lo"), names.var("p_hi"), names.var("ob_lo"), names.var("ob_hi")
        g, g_end = names.var("g"), names.var("g_end")
        # the group's input blocks: the tile reads blocks [0, cbg) from there
        call = Extern("tk_bconv", ((src, img * (cb * plane) + g * (cbg * plane)), (pos_b, i64(0)), p_lo, p_hi,
                                   i64(cbg), i64(plane),
                                   i64(lanes), i64(taps.size), (taps_b, i64(0)), (wpk, i64(0)), ob_lo, ob_hi,
                                   (y, img * image_out), i64(plane_out), (bias, i64(0)) if bias else None,
                                   (res, img * (ob * plane_out)) if res else None, i64(int(relu))), blocked.C_SOURCE)
        body.append(For(item, i64(0), i64(n * groups * chunks), [
            Let(img, item // (groups * chunks)), Let(grp, (item // chunks) % groups), Let(chunk, item % chunks),
            Let(p_lo, chunk * per_chunk),
            Let(p_hi, select((p_lo + per_chunk).gt(s.p), i64(s.p), p_lo + per_chunk)),
            Let(g, grp // per_group), Let(g_end, (g + 1) * obg),
            Let(ob_lo, g * obg + (grp % per_group) * blocked.TILE_BLOCKS),
            Let(ob_hi, select((ob_lo + blocked.TILE_BLOCKS).gt(g_end), g_end, ob_lo + blocked.TILE_BLOCKS)),
            call], parallel=threads > 1))
    return NativeCall(Kernel("conv_blocked", params, body, threads), arrays)


@register_native("conv2d_blocked", "cpu")
def conv2d_blocked_native(ctx, ins, outs):
    return blocked_convolution(ctx, ins, outs)


@register_native("max_pool2d_blocked", "cpu")
def max_pool2d_blocked_native(ctx, ins, outs):
    """Each (image, channel block) plane, an output row at a time: the row starts at -inf, then
    for each of the window's input rows, every output position takes in its taps on that row
    with numpy's maximum (NaN kept), 16 channels a vector; a window's taps outside the input
    (padding, the ceil-mode edge) are skipped, as the NCHW kernel counts padding -inf. Input
    row by input row rather than window by window: SqueezeNet's pool3 (8 x 128 x 55 x 55, 3x3
    stride 2) 0.57-0.83 ms against 1.48-1.52, one thread."""
    if ctx.dtype not in ("float32", "float64"):
        return None
    dtype = ctx.dtype
    n, cb, h, w, block = (int(d) for d in ctx.in_shapes[0])
    _, _, oh, ow, _ = (int(d) for d in ctx.out_shapes[0])
    (kh, kw), (sh, sw), (ph, pw) = ctx.attrs["kernel"], ctx.attrs["stride"], ctx.attrs["pad"]
    names = Names()
    x = Buf("x", dtype, n * cb * h * w * block)
    y = Buf("y", dtype, n * cb * oh * ow * block, const=False)
    item, oy, ox, ky, kx, lane = (names.var(v) for v in ("item", "oy", "ox", "ky", "kx", "lane"))
    y0, x0, ky_lo, ky_hi, kx_lo, kx_hi = (names.var(v) for v in ("y0", "x0", "ky_lo", "ky_hi", "kx_lo", "kx_hi"))
    out_at = names.var("out_at")

    def span(lo, hi, origin, size, k):
        # taps t of [0, k) with 0 <= origin + t < size
        return [Let(lo, select(origin.lt(0), i64(0) - origin, i64(0))),
                Let(hi, select((origin + k).gt(size), i64(size) - origin, i64(k)))]
    take = Store(y, out_at + lane, maximum(y[out_at + lane], x[((item * h + y0 + ky) * w + x0 + kx) * block + lane]))
    body = [For(item, i64(0), i64(n * cb), [
        For(oy, i64(0), i64(oh), [Let(y0, oy * sh - ph)] + span(ky_lo, ky_hi, y0, h, kh) + [
            For(ox, i64(0), i64(ow), [Let(out_at, ((item * oh + oy) * ow + ox) * block),
                For(lane, i64(0), i64(block), [Store(y, out_at + lane, lift(float("-inf"), dtype))], vector=True)]),
            For(ky, ky_lo, ky_hi, [
                For(ox, i64(0), i64(ow), [
                    Let(x0, ox * sw - pw), Let(out_at, ((item * oh + oy) * ow + ox) * block)]
                    + span(kx_lo, kx_hi, x0, w, kw) + [
                    For(kx, kx_lo, kx_hi, [For(lane, i64(0), i64(block), [take], vector=True)])])])])],
        parallel=ctx.threads > 1 and n * cb * oh * ow * block >= 1 << 15)]
    return NativeCall(Kernel("max_pool_blocked", [x, y], body, ctx.threads), [ins[0], outs[0]])
