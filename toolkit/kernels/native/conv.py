"""Generated convolution kernels: im2col + BLAS GEMM one image at a time, epilogues in cache.

Every thread takes whole images. For each it copies the image's windows into its own columns
buffer (K x OH*OW, small enough to stay in the core's L2), multiplies by the weight through the
BLAS library (single-threaded inside the loop), and finishes the image while it is hot: the
bias, a fused max pooling, a fused elementwise epilogue. The GEMM of one image writes [O, OH*OW],
which is that image's NCHW output as it stands: no layout change back. With fewer images than
threads (batch 1), the columns are built by all threads and the GEMM is split by output
channels instead.

The gradients follow the same pattern: the input gradient of a stride-1 convolution is the
convolution of g with the flipped weight (im2col of g, then one GEMM into dx); other strides
take W^T g per image scattered back by col2im; the weight gradient accumulates g_n cols_n^T per
thread, and the threads' partial sums are added at the end.
"""
from __future__ import annotations

import numpy as np

from ...backend.registry import register_native
from ...codegen import microkernel, rowdot
from ...codegen.loops import (
    Buf,
    Extern,
    For,
    Gemm,
    If,
    Kernel,
    Let,
    Names,
    PackedGemm,
    Set,
    Store,
    ThreadIndex,
    lift,
    maximum,
    select,
)
from ...codegen.native import NativeCall
from ...ops.conv import conv_out_size
from ...ops.fused import head_parts, split_attrs, store_program
from ...settings import current
from . import depthwise, winograd
from .conv_parts import ConvShape, epilogue_buffers, epilogue_statements, i64, valid_span
from .elementwise import FLOATS

# Two settings, read when a kernel is built (toolkit/settings.py): ``winograd``, 3x3 stride-1
# convolutions through Winograd's F(2x2, 3x3) where they have enough tiles (winograd.py), else
# im2col; ``packed_gemm``, forward GEMMs through the toolkit's own kernel on a weight packed ahead
# (codegen/microkernel.py) where the processor has AVX-512 (or AVX2 with FMA, for K under
# AVX2_PACKED_MAX_K), else the BLAS library's.
MIN_PACKED_COLUMNS = 48         # one tile of the packed kernel (3 vectors of 16)
# On AVX2 (no AVX-512) the packed kernel's 4 x 24 tile reads B's rows in place, where OpenBLAS
# packs them: measured hot on one thread of the AVX2 EPYC, it wins where K fits one block of 256
# (MobileNet v2's expansions and narrow projections, ResNet-50's K = 64 layers: 80-93 GFLOP/s
# against OpenBLAS's 59-89) and loses 5-15% above it (ResNet-50's and GoogLeNet's K = 256-4608
# over 49-784 columns: 62-83 against 69-92), so there it is taken below this K only.
AVX2_PACKED_MAX_K = 256
# im2col by blocks of output rows where an image's columns outgrow this (see block_rows)
COLS_BLOCK_BYTES = 384 << 10
MIN_BLOCK_POSITIONS = 192


def per_group(names: Names, s: ConvShape, statements) -> list:
    """``statements(g)`` for every group: as they are for one group, else inside a loop over the
    groups, so that the kernel's code does not grow with the group count."""
    if s.g == 1:
        return statements(0)
    g = names.var("g")
    return [For(g, i64(0), i64(s.g), statements(g))]


def _window_rows(names: Names, s: ConvShape, r):
    ci, ki, kj = names.var("ci"), names.var("ki"), names.var("kj")
    return [Let(ci, r // (s.kh * s.kw)), Let(ki, (r // s.kw) % s.kh), Let(kj, r % s.kw)], ci, ki, kj


def im2col(names: Names, s: ConvShape, x: Buf, cols: Buf, n, g, cols_base, rows=None, parallel=False) -> list:
    """cols[base + r*P + p] = x[n, g*Cg + c, ih, iw] (0 outside the image) for window row r."""
    r = names.var("r")
    oh, ow = names.var("oh"), names.var("ow")
    lets, ci, ki, kj = _window_rows(names, s, r)
    ih = names.var("ih")
    src_row = ((n * s.c + g * s.cg + ci) * s.h + ih) * s.w - s.pw + kj * s.dw
    dst_row = cols_base + r * s.p + oh * s.ow
    zero = lift(0.0, x.dtype)
    if not s.padded:
        row_body = lets + [For(oh, i64(0), i64(s.oh), [Let(ih, oh * s.sh + ki * s.dh), For(ow, i64(0), i64(s.ow), [
            Store(cols, dst_row + ow, x[src_row + ow * s.sw])], vector=True)])]
    else:
        span, lo, hi = valid_span(names, s.ow, s.w, s.sw, s.pw, kj * s.dw)
        rows_span, rlo, rhi = valid_span(names, s.oh, s.h, s.sh, s.ph, ki * s.dh)
        fill = For(ow, i64(0), i64(s.ow), [Store(cols, dst_row + ow, zero)], vector=True)
        copy = [For(ow, i64(0), lo, [Store(cols, dst_row + ow, zero)]),
                For(ow, lo, hi, [Store(cols, dst_row + ow, x[src_row + ow * s.sw])], vector=True),
                For(ow, hi, i64(s.ow), [Store(cols, dst_row + ow, zero)])]
        row_body = lets + span + rows_span + [
            For(oh, i64(0), rlo, [fill]),
            For(oh, rlo, rhi, [Let(ih, oh * s.sh - s.ph + ki * s.dh)] + copy),
            For(oh, rhi, i64(s.oh), [fill])]
    lo_r, hi_r = rows if rows else (i64(0), i64(s.k))
    return [For(r, lo_r, hi_r, row_body, parallel=parallel)]


def im2col_rows(names: Names, s: ConvShape, x: Buf, cols: Buf, n, g, cols_base, oh_lo, oh_hi, ld: int) -> list:
    """cols[base + r*ld + (oh - oh_lo)*OW + ow] = x[n, g*Cg + c, ih, iw] (0 outside the image) for
    window row r and the output rows [oh_lo, oh_hi): the columns of one block of positions."""
    r, oh, ow, ih = names.var("r"), names.var("oh"), names.var("ow"), names.var("ih")
    lets, ci, ki, kj = _window_rows(names, s, r)
    span, lo, hi = valid_span(names, s.ow, s.w, s.sw, s.pw, kj * s.dw)
    src_row = ((n * s.c + g * s.cg + ci) * s.h + ih) * s.w - s.pw + kj * s.dw
    dst_row = cols_base + r * ld + (oh - oh_lo) * s.ow
    zero = lift(0.0, x.dtype)
    inside = (select(ih.ge(0), 1, 0) * select(ih.lt(s.h), 1, 0)).gt(0)
    copy = [For(ow, i64(0), lo, [Store(cols, dst_row + ow, zero)]),
            For(ow, lo, hi, [Store(cols, dst_row + ow, x[src_row + ow * s.sw])], vector=True),
            For(ow, hi, i64(s.ow), [Store(cols, dst_row + ow, zero)])]
    fill = [For(ow, i64(0), i64(s.ow), [Store(cols, dst_row + ow, zero)], vector=True)]
    return [For(r, i64(0), i64(s.k), lets + span + [
        For(oh, oh_lo, oh_hi, [Let(ih, oh * s.sh - s.ph + ki * s.dh), If(inside, copy, fill)])])]


def block_rows(s: ConvShape) -> int:
    """Output rows per block of a blocked im2col: the block's columns (K x rows*OW) within
    COLS_BLOCK_BYTES, so that they and the block's output stay in the core's L2 between the
    copy, the GEMM and the epilogue, but at least MIN_BLOCK_POSITIONS wide for the GEMM."""
    per_row = s.k * s.ow * 4
    rows = max(COLS_BLOCK_BYTES // per_row, -(-MIN_BLOCK_POSITIONS // s.ow), 1)
    return min(rows, s.oh)


def col2im(names: Names, s: ConvShape, cols: Buf, dx: Buf, n, g, cols_base) -> list:
    """dx[n, g*Cg + c, ih, iw] += cols[base + r*P + p] over every window row r and position p."""
    r = names.var("r")
    oh, ow = names.var("oh"), names.var("ow")
    lets, ci, ki, kj = _window_rows(names, s, r)
    ih = names.var("ih")
    dst_row = ((n * s.c + g * s.cg + ci) * s.h + ih) * s.w - s.pw + kj * s.dw
    src_row = cols_base + r * s.p + oh * s.ow
    span, lo, hi = valid_span(names, s.ow, s.w, s.sw, s.pw, kj * s.dw)
    rows_span, rlo, rhi = valid_span(names, s.oh, s.h, s.sh, s.ph, ki * s.dh)
    # the positions of one row land on distinct input elements, so its adds may share vector
    # lanes (overlapping windows meet only across rows, which stay in order)
    add = For(ow, lo, hi, [Store(dx, dst_row + ow * s.sw, cols[src_row + ow], accumulate=True)], vector=True)
    return [For(r, i64(0), i64(s.k), lets + span + rows_span + [
        For(oh, rlo, rhi, [Let(ih, oh * s.sh - s.ph + ki * s.dh), add])])]


def store_epilogue(program, ctx, out_shape) -> tuple[int | None, bool] | None:
    """(the input position of a residual added, or None; whether a ReLU follows) where the
    fused program is one the GEMM tile applies as it stores (ops/fused.py's ``store_program``,
    the residual a plain array of the output's shape); (None, False) without a program."""
    if program is None:
        return None, False
    views = ctx.attrs.get("views", ())
    return store_program(*program, lambda i: tuple(ctx.in_shapes[i]) == tuple(out_shape)
                         and not (i < len(views) and views[i]))


def packed_weight(ctx, names: Names, s: ConvShape, w: Buf):
    """(the packed weight's buffer, its array, the kernel's prologue) for the forward GEMMs:
    each group's [O/g, K] weight in microkernel panels, one group after another. A frozen weight
    is packed here, once; one fed at run time is packed by the prologue on every run."""
    group_size = microkernel.packed_size(s.og, s.k)
    frozen = winograd.constant_weight(ctx)
    wp = Buf("w_packed", "float32", s.g * group_size, const=frozen is not None)
    if frozen is not None:
        flat = frozen.reshape(s.g, s.og, s.k).astype(np.float32)
        return wp, np.concatenate([microkernel.pack_panels(flat[g]) for g in range(s.g)]), []
    mr = microkernel.MR
    o, k = names.var("o"), names.var("k")
    # o runs over all O rows (group-major); row j of group g sits in panel j // MR, lane j % MR
    dst = (o // s.og) * group_size + ((o % s.og) // mr) * (s.k * mr) + k * mr + (o % s.og) % mr
    prologue = [For(o, i64(0), i64(s.o), [For(k, i64(0), i64(s.k), [Store(wp, dst, w[o * s.k + k])])],
                    parallel=s.o * s.k >= 1 << 15)]
    # the padding rows of each group's last panel stay 0 from the array's allocation
    return wp, np.zeros(wp.size, np.float32), prologue


def _forward(ctx, ins, outs, pool, program=None):
    """conv2d (+bias) [+max pool] [+elementwise program] as one kernel; None where unsupported."""
    dtype = ctx.dtype
    head_ins = ctx.attrs.get("head_inputs", len(ins))
    conv_attrs = ctx.attrs if program is None else dict(ctx.attrs["head_attrs"])
    if pool:
        conv_attrs, pool_attrs = split_attrs(conv_attrs)
        if any(pool_attrs["pad"]) or tuple(pool_attrs.get("dilation", (1, 1))) != (1, 1):
            return None
    x_shape, w_shape = ctx.in_shapes[0], ctx.in_shapes[1]
    has_bias = head_ins == 3
    out_shape = tuple(ctx.out_shapes[0])
    if pool:
        hw = [conv_out_size(x_shape[2 + a], w_shape[2 + a], conv_attrs["stride"][a], conv_attrs["pad"][a],
                            conv_attrs["dilation"][a]) for a in (0, 1)]
    else:
        hw = out_shape[2:]
    s = ConvShape(x_shape, w_shape, hw, conv_attrs)
    if depthwise.is_depthwise(s) and not pool:
        return depthwise.forward(ctx, ins, outs, s, has_bias, out_shape, program)
    threads = ctx.threads
    images_fill_threads = s.n >= threads or threads == 1
    # fewer images than threads: a grouped convolution runs its groups side by side (AlexNet's
    # at batch 1 on two threads: conv2 5.1 ms on one thread's speed); an ungrouped one splits
    # each image's GEMM by output rows, or its blocks of output rows
    per_image = images_fill_threads or s.g > 1
    # a 1x1 convolution of stride 1 without padding: the image [C, H*W] is its own columns, so
    # the GEMM reads it in place (no im2col copy)
    pointwise = (s.kh, s.kw, s.sh, s.sw, s.dh, s.dw) == (1, 1, 1, 1, 1, 1) and not s.padded
    knobs = current()
    wino = knobs.winograd and winograd.chosen(ctx, s, pool)
    names = Names()
    x = Buf("x", dtype, s.n * s.c * s.h * s.w)
    w = Buf("w", dtype, s.o * s.k)
    b = Buf("bias", dtype, s.o) if has_bias else None
    y = Buf("y", dtype, int(np.prod(out_shape)), const=False)
    # an image's columns larger than a block: im2col and GEMM by blocks of output rows, each
    # block finished (bias, epilogue) while it is in cache; at batch 1 the threads take blocks
    rows_per_block = block_rows(s)
    blocks = -(-s.oh // rows_per_block)
    blocked = (not (pointwise or wino or pool) and s.k * s.p * 4 > COLS_BLOCK_BYTES and blocks > 1
               and (per_image or blocks >= 2 * threads))
    block_ld = rows_per_block * s.ow
    cols_size = 1 if pointwise or wino else (s.k * block_ld if blocked else s.k * s.p)
    workers = threads if per_image or blocked else 1
    cols = Buf("cols", dtype, workers * cols_size, const=False)
    tmp = Buf("tmp", dtype, workers * s.o * s.p, const=False) if pool else None
    params = [x, w] + ([b] if b else []) + [y, cols] + ([tmp] if tmp else [])
    arrays = [ins[0], ins[1]] + ([ins[2]] if b else []) + [outs[0], np.zeros(cols.size, dtype)] + \
             ([np.zeros(tmp.size, dtype)] if tmp else [])
    # below a tile's 48 columns the packed kernel's wasted lanes and fixed costs lose (the zoo's
    # LeNet on 8x8 digits: 2% slower at batch 64), as it does ahead of a fused max pooling there;
    # one column (a classifier) goes to dot products over the weight's rows (weight_gemm)
    packed = (knobs.packed_gemm and dtype == "float32" and not wino and microkernel.gemm_available()
              and (microkernel.available() or s.k < AVX2_PACKED_MAX_K)
              and (block_ld if blocked else s.p) >= MIN_PACKED_COLUMNS and not pool)
    prologue = []
    if packed:
        wp, wp_array, prologue = packed_weight(ctx, names, s, w)
        params.append(wp)
        arrays.append(wp_array)
        group_panels = microkernel.packed_size(s.og, s.k)
    # the bias and a simple epilogue (ReLU, a residual add) applied by the packed GEMM as it stores
    in_store = store_epilogue(program, ctx, out_shape) if packed else None
    x_bufs, out_bufs = epilogue_buffers(program, ctx, ins, outs, out_shape, params, arrays)

    def weight_gemm(g, o_lo, rows, n_cols, b_buf, b_off, ldb, c_buf, c_off, ldc):
        """C = W[group g, rows o_lo..] x B: the packed kernel (o_lo on a panel boundary) or BLAS;
        with one column (a classifier as a 1x1 convolution over one position), dot products
        over W's rows, which read the weight once where the BLAS GEMM packs all of it per call
        (MobileNet v2's 1280 x 1000 classifier: 0.71 ms)."""
        if s.p == 1 and not pool and dtype == "float32" and microkernel.gemm_available():
            # rows of W against the one column (codegen/rowdot.py: threads split the rows)
            first = (i64(g * s.og) if isinstance(g, int) else g * s.og) + o_lo
            return Extern("tk_rowdot", ((b_buf, b_off), (w, first * s.k), i64(s.k), rows, (c_buf, c_off)),
                          rowdot.C_SOURCE)
        if s.p == 1 and not pool:
            o, kk, acc = names.var("o"), names.var("k"), names.var("acc", dtype)
            row = g * s.og + o
            return For(o, o_lo, o_lo + rows, [
                Let(acc, lift(0.0, dtype)),
                For(kk, i64(0), i64(s.k), [Set(acc, acc + w[row * s.k + kk] * b_buf[b_off + kk * ldb])], reduction=acc),
                Store(c_buf, c_off + (o - o_lo) * ldc, acc)])
        if packed:
            group_start = i64(g * group_panels) if isinstance(g, int) else g * group_panels
            a_off = group_start + (o_lo // microkernel.MR) * (s.k * microkernel.MR)
            store = {}
            if in_store is not None:
                res_at, relu = in_store
                first_row = (i64(g * s.og) if isinstance(g, int) else g * s.og) + o_lo
                store = dict(bias=b, bias_off=first_row if b else None, relu=relu)
                if res_at is not None:           # the residual has the output's geometry
                    store.update(res=x_bufs[res_at], res_off=c_off, ldr=ldc)
            return PackedGemm(rows, n_cols, i64(s.k), wp, a_off, b_buf, b_off, ldb, c_buf, c_off, ldc, **store)
        return Gemm(False, False, rows, n_cols, i64(s.k), w, (g * s.og + o_lo) * s.k, s.k, b_buf, b_off, ldb,
                    c_buf, c_off, ldc)

    def finish(n, slot, o_lo, o_hi, positions=None) -> list | None:
        """Channels [o_lo, o_hi) of image n, whose GEMM result is in y (or tmp's slot); only
        the positions [q_lo, q_hi) where ``positions`` says so (None where the epilogue cannot
        take a range of positions)."""
        if in_store is not None:                # done by the packed GEMM as it stored
            return []
        stmts = []
        o, q = names.var("o"), names.var("q")
        q_lo, q_hi = positions if positions is not None else (i64(0), i64(s.p))
        if pool:
            pk, ps = pool_attrs["kernel"], pool_attrs["stride"]
            ph_, pw_ = out_shape[2], out_shape[3]
            py, px = names.var("py"), names.var("px")
            m = names.var("m", dtype)
            base = slot * (s.o * s.p) + o * s.p
            window = [Let(m, tmp[base + (py * ps[0]) * s.ow + px * ps[1]])]
            window += [Set(m, maximum(m, tmp[base + (py * ps[0] + di) * s.ow + px * ps[1] + dj]))
                       for di in range(pk[0]) for dj in range(pk[1]) if di or dj]
            value = m + b[o] if b else m
            window.append(Store(y, ((n * s.o + o) * ph_ + py) * pw_ + px, value))
            stmts.append(For(o, o_lo, o_hi, [For(py, i64(0), i64(ph_), [For(px, i64(0), i64(pw_), window)])]))
        elif b:
            stmts.append(For(o, o_lo, o_hi, [For(q, q_lo, q_hi, [
                Store(y, (n * s.o + o) * s.p + q, b[o], accumulate=True)], vector=True)]))
        if program is not None:
            ep = epilogue_statements(names, program[0], program[1], out_shape, ctx.in_shapes,
                                     ctx.attrs.get("views", ()), dtype, x_bufs, out_bufs, y, n, o_lo, o_hi,
                                     positions=positions)
            if ep is None:
                return None
            stmts += ep
        return stmts

    def gemm(n, g, slot, o_lo, rows):
        c_buf, c_off = (tmp, slot * (s.o * s.p) + (g * s.og + o_lo) * s.p) if pool else \
            (y, (n * s.o + g * s.og + o_lo) * s.p)
        b_buf, b_off = (x, (n * s.c + g * s.cg) * s.p) if pointwise else (cols, slot * cols_size)
        return weight_gemm(g, o_lo, rows, i64(s.p), b_buf, b_off, s.p, c_buf, c_off, s.p)

    def columns(n, g, slot, **kw) -> list:
        return [] if pointwise else im2col(names, s, x, cols, n, g, slot * cols_size if slot is not None else i64(0),
                                           **kw)

    if wino:
        built = winograd.forward_body(ctx, names, s, x, w, y, finish, threads, per_image,
                                      packed=knobs.packed_gemm and dtype == "float32" and microkernel.available())
        if built is None:
            return None
        extra, kernel_body = built
        params += [buf for buf, _ in extra]
        arrays += [arr for _, arr in extra]
        return NativeCall(Kernel("conv", params, kernel_body, threads), arrays)
    if blocked:
        n, slot, blk = names.var("n"), names.var("slot"), names.var("blk")
        oh_lo, oh_hi = names.var("oh_lo"), names.var("oh_hi")
        span = (oh_lo * s.ow, oh_hi * s.ow)

        def block_gemm(g):
            return weight_gemm(g, i64(0), i64(s.og), (oh_hi - oh_lo) * s.ow, cols, slot * cols_size, block_ld,
                               y, (n * s.o + g * s.og) * s.p + oh_lo * s.ow, s.p)
        per_block = finish(n, slot, i64(0), i64(s.o), positions=span)
        block = [Let(slot, ThreadIndex()), Let(oh_lo, blk * rows_per_block),
                 Let(oh_hi, select((oh_lo + rows_per_block).gt(s.oh), i64(s.oh), oh_lo + rows_per_block))]
        block += per_group(names, s, lambda g: im2col_rows(names, s, x, cols, n, g, slot * cols_size, oh_lo, oh_hi,
                                                           block_ld) + [block_gemm(g)])
        after = []
        if per_block is not None:
            block += per_block
        else:                                  # an epilogue over whole planes: after every block
            after = finish(n, slot, i64(0), i64(s.o))
            if after is None:
                return None
        if per_image and (images_fill_threads or blocks < 2 * threads):
            kernel_body = [For(n, i64(0), i64(s.n), [For(blk, i64(0), i64(blocks), block)] + after,
                               parallel=threads > 1)]
        else:
            kernel_body = [For(n, i64(0), i64(s.n), [For(blk, i64(0), i64(blocks), block, parallel=True)] + after)]
        return NativeCall(Kernel("conv", params, prologue + kernel_body, threads), arrays)
    if per_image and not images_fill_threads:      # grouped: (image, group) items side by side
        n, g, item, slot = names.var("n"), names.var("g"), names.var("item"), names.var("slot")
        tail = finish(n, slot, g * s.og, g * s.og + s.og)
        if tail is None:
            return None
        body = [Let(slot, ThreadIndex()), Let(n, item // s.g), Let(g, item % s.g)]
        body += columns(n, g, slot) + [gemm(n, g, slot, i64(0), i64(s.og))] + tail
        kernel_body = [For(item, i64(0), i64(s.n * s.g), body, parallel=True)]
    elif per_image:
        n = names.var("n")
        slot = names.var("slot")
        body = [Let(slot, ThreadIndex())]
        body += per_group(names, s, lambda g: columns(n, g, slot) + [gemm(n, g, slot, i64(0), i64(s.og))])
        tail = finish(n, slot, i64(0), i64(s.o))
        if tail is None:
            return None
        loop = For(n, i64(0), i64(s.n), body + tail, parallel=threads > 1)
        kernel_body = [loop]
    else:                                   # fewer images than threads: split inside each image
        n = names.var("n")
        chunk = names.var("chunk")
        per = -(-s.o // threads)
        if packed:                          # each thread's rows start on a panel boundary
            per = -(-per // microkernel.MR) * microkernel.MR
        lo, cnt = names.var("lo"), names.var("cnt")
        tail = finish(n, i64(0), lo, lo + cnt)
        if tail is None:
            return None
        split = For(chunk, i64(0), i64(threads), [
            Let(lo, chunk * per), Let(cnt, select((s.o - lo).lt(per), s.o - lo, per)),
            If(cnt.gt(0), [gemm(n, 0, i64(0), lo, cnt)] + tail)], parallel=True)
        kernel_body = [For(n, i64(0), i64(s.n), columns(n, 0, None, parallel=True) + [split])]
    return NativeCall(Kernel("conv", params, prologue + kernel_body, threads), arrays)


@register_native("conv2d", "cpu")
def conv2d_native(ctx, ins, outs):
    if ctx.dtype not in FLOATS:
        return None
    return _forward(ctx, ins, outs, pool=False)


@register_native("conv2d_max_pool2d", "cpu")
def conv2d_max_pool2d_native(ctx, ins, outs):
    if ctx.dtype not in FLOATS:
        return None
    return _forward(ctx, ins, outs, pool=True)


def _transposed_shape(s: ConvShape, g_shape) -> ConvShape | None:
    """The input gradient of a stride-1 convolution as a convolution of the output gradient
    (O channels at OH x OW) with the flipped, transposed weight ([C, O/g, kh, kw]) and padding
    k - 1 - pad: None where that form does not exist (strides, dilation, pad >= kernel)."""
    if (s.sh, s.sw, s.dh, s.dw) != (1, 1, 1, 1) or s.ph > s.kh - 1 or s.pw > s.kw - 1:
        return None
    attrs = {"stride": (1, 1), "pad": (s.kh - 1 - s.ph, s.kw - 1 - s.pw), "dilation": (1, 1), "group": s.g}
    return ConvShape(g_shape, (s.c, s.og, s.kh, s.kw), (s.h, s.w), attrs)


def _flipped_weight(names: Names, s: ConvShape, w: Buf, wt: Buf) -> list:
    """wt[c, o, kh-1-i, kw-1-j] = w[group(c)*O/g + o, c mod C/g, i, j] for every c, o, i, j."""
    c, o, i, j = names.var("c"), names.var("o"), names.var("i"), names.var("j")
    src = (((c // s.cg) * s.og + o) * s.cg + c % s.cg) * (s.kh * s.kw) + i * s.kw + j
    dst = ((c * s.og + o) * s.kh + (s.kh - 1 - i)) * s.kw + (s.kw - 1 - j)
    return [For(c, i64(0), i64(s.c), [For(o, i64(0), i64(s.og), [For(i, i64(0), i64(s.kh), [
        For(j, i64(0), i64(s.kw), [Store(wt, dst, w[src])])])])])]


def _grad_input(ctx, ins, outs, program=None):
    """dx per image, with its fused epilogue. Stride-1 convolutions gather: im2col of the output
    gradient times the flipped weight, a GEMM with the long O*kh*kw side inside and [C, H*W]
    out, written in place. Others scatter: W^T g ([C*kh*kw, OH*OW], an outer-product-shaped
    GEMM with only O inside) added back by col2im. On resnet's 3x3 layers at batch 64 the gather
    form made the input-gradient kernels 4% faster (1.23 against 1.28 ms, both forms timed
    interleaved in one process): the GEMM gains, the im2col of g costs most of it back."""
    dtype = ctx.dtype
    attrs = ctx.attrs if program is None else dict(ctx.attrs["head_attrs"])
    g_shape, w_shape = ctx.in_shapes[0], ctx.in_shapes[1]
    x_shape = tuple(ctx.out_shapes[0])
    s = ConvShape(x_shape, w_shape, g_shape[2:], attrs)
    if depthwise.is_depthwise(s):
        return depthwise.grad_input(ctx, ins, outs, s, x_shape, program)
    ts = _transposed_shape(s, g_shape)
    threads = ctx.threads
    names = Names()
    gy = Buf("gy", dtype, int(np.prod(g_shape)))
    w = Buf("w", dtype, s.o * s.k)
    dx = Buf("dx", dtype, int(np.prod(x_shape)), const=False)
    cols_size = s.k * s.p if ts is None else ts.k * ts.p
    cols = Buf("cols", dtype, threads * cols_size, const=False)
    params = [gy, w, dx, cols]
    arrays = [ins[0], ins[1], outs[0], np.zeros(cols.size, dtype)]
    if ts is not None:
        wt = Buf("wt", dtype, s.o * s.k, const=False)
        params.append(wt)
        arrays.append(np.zeros(wt.size, dtype))
    x_bufs, out_bufs = epilogue_buffers(program, ctx, ins, outs, x_shape, params, arrays)
    n, slot, e = names.var("n"), names.var("slot"), names.var("e")
    image = s.c * s.h * s.w
    body = [Let(slot, ThreadIndex())]
    if ts is None:
        body.append(For(e, i64(0), i64(image), [Store(dx, n * image + e, lift(0.0, dtype))]))
        body += per_group(names, s, lambda g: [
            Gemm(True, False, i64(s.k), i64(s.p), i64(s.og), w, lift(g * s.og * s.k, "int64"), s.k,
                 gy, (n * s.o + g * s.og) * s.p, s.p, cols, slot * cols_size, s.p)]
            + col2im(names, s, cols, dx, n, g, slot * cols_size))
    else:
        body += per_group(names, s, lambda g: im2col(names, ts, gy, cols, n, g, slot * cols_size) + [
            Gemm(False, False, i64(ts.og), i64(ts.p), i64(ts.k), wt, lift(g * ts.og * ts.k, "int64"), ts.k,
                 cols, slot * cols_size, ts.p, dx, (n * s.c + g * ts.og) * ts.p, ts.p)])
    if program is not None:
        ep = epilogue_statements(names, program[0], program[1], x_shape, ctx.in_shapes, ctx.attrs.get("views", ()),
                                 dtype, x_bufs, out_bufs, dx, n, i64(0), i64(s.c))
        if ep is None:
            return None
        body += ep
    loop = For(n, i64(0), i64(s.n), body, parallel=threads > 1)
    prologue = [] if ts is None else _flipped_weight(names, s, w, wt)
    return NativeCall(Kernel("conv_grad_input", params, prologue + [loop], threads), arrays)


@register_native("conv2d_grad_input", "cpu")
def conv2d_grad_input_native(ctx, ins, outs):
    if ctx.dtype not in FLOATS:
        return None
    return _grad_input(ctx, ins, outs)


@register_native("conv2d_grad_weight", "cpu")
def conv2d_grad_weight_native(ctx, ins, outs):
    """dW = sum over images of g_n cols_n^T, computed transposed: each thread sums
    cols_n g_n^T ([K, O]) into its own buffer, and the buffers are added and transposed into dW
    at the end. The transposed product has the long K side as its rows, which the BLAS library
    runs about 1.6x faster than [O, K] at these sizes (measured: 5.1 against 8.3 us for
    O=16, K=144, 64 positions)."""
    dtype = ctx.dtype
    if dtype not in FLOATS:
        return None
    g_shape, x_shape = ctx.in_shapes
    dw_shape = tuple(ctx.out_shapes[0])
    s = ConvShape(x_shape, dw_shape, g_shape[2:], ctx.attrs)
    if depthwise.is_depthwise(s):
        return depthwise.grad_weight(ctx, ins, outs, s)
    threads = max(1, min(ctx.threads, s.n))
    names = Names()
    gy = Buf("gy", dtype, int(np.prod(g_shape)))
    x = Buf("x", dtype, int(np.prod(x_shape)))
    dw = Buf("dw", dtype, s.o * s.k, const=False)
    cols_size = s.k * s.p
    cols = Buf("cols", dtype, threads * cols_size, const=False)
    sums = Buf("sums", dtype, threads * s.k * s.o, const=False)     # each thread's [K, O] sum
    t, n, o, k = names.var("t"), names.var("n"), names.var("o"), names.var("k")
    lo, hi = names.var("lo"), names.var("hi")
    body = [Let(lo, (t * s.n) // threads), Let(hi, ((t + 1) * s.n) // threads)]
    beta = select(n.gt(lo), 1.0, 0.0)              # each thread's first image overwrites its sum
    stmts = per_group(names, s, lambda g: im2col(names, s, x, cols, n, g, t * cols_size) + [
        Gemm(False, True, i64(s.k), i64(s.og), i64(s.p), cols, t * cols_size, s.p,
             gy, (n * s.o + g * s.og) * s.p, s.p, sums, t * (s.k * s.o) + g * s.og, s.o, beta=beta)])
    body.append(For(n, lo, hi, stmts))
    total = sums[k * s.o + o]
    for other in range(1, threads):
        total = total + sums[other * (s.k * s.o) + k * s.o + o]
    kernel_body = [For(t, i64(0), i64(threads), body, parallel=threads > 1),
                   For(o, i64(0), i64(s.o), [For(k, i64(0), i64(s.k), [Store(dw, o * s.k + k, total)])],
                       parallel=threads > 1 and s.o * s.k >= 1 << 14)]
    arrays = [ins[0], ins[1], outs[0], np.zeros(cols.size, dtype), np.zeros(sums.size, dtype)]
    return NativeCall(Kernel("conv_grad_weight", [gy, x, dw, cols, sums], kernel_body, ctx.threads), arrays)


def conv_epilogue_native(ctx, ins, outs):
    """fused_epilogue headed by a convolution (a matmul head is elementwise.py's; epilogue.py
    chooses)."""
    head, _head_attrs, _k = head_parts(ctx.attrs)
    if ctx.dtype not in FLOATS:
        return None
    program = (ctx.attrs["program"], ctx.attrs["outputs"])
    if head == "conv2d":
        return _forward(ctx, ins, outs, pool=False, program=program)
    if head == "conv2d_max_pool2d":
        return _forward(ctx, ins, outs, pool=True, program=program)
    if head == "conv2d_grad_input":
        return _grad_input(ctx, ins, outs, program=program)
    return None
