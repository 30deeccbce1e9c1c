"""3x3 convolutions of stride 1 by Winograd's F(2x2, 3x3): each 2x2 block of outputs from a 4x4
block of inputs with 16 multiplications per channel pair instead of 36, the multiplications
being 16 GEMMs [O, C] x [C, tiles] through the BLAS library.

    U_k = (G g G^T)_k     the weight of every (o, c) pair, 4x4 (k = 0..15), once as the plan is built
    V_k = (B^T d B)_k     every 4x4 input block d (stride 2), from a zero-padded copy of the image
    M_k = U_k @ V_k       16 GEMMs
    y   = A^T m A         every 2x2 output block from the 16 values m of its tile

The GEMMs are 2.25x fewer multiply-adds than im2col's one GEMM; the transforms are vectorised
loops over a row of tiles. Measured per layer on ResNet-50 (batch 1, two threads): 0.55x to
0.59x of im2col's time on the 64- and 128-channel layers, 0.68x to 0.73x on the 256-channel ones
(49 tiles); below about 32 tiles (a 7x7 output: 16) the small GEMMs lose and im2col stays. A
frozen weight (inference) is transformed once as the plan is built; a weight fed each run (the
train step) is transformed in the kernel, which still wins (ResNet-50's train step at batch 8:
0.88x). Rounding: the transforms add and halve, which float32
carries to about 1e-6 relative for these sizes (tests/kernels/test_native.py holds it to the
reference).
"""
from __future__ import annotations

import numpy as np

from ...codegen import microkernel
from ...codegen.loops import Buf, For, Gemm, If, Let, Names, PackedGemm, Store, ThreadIndex, lift, select
from .conv_parts import ConvShape, i64

MIN_TILES = 32          # below this many 2x2 output blocks per image the 16 small GEMMs lose
MIN_CHANNELS = 64       # below this the transforms cost more than the GEMM saves (ResNet-50's 64)
G = ((1.0, 0.0, 0.0), (0.5, 0.5, 0.5), (0.5, -0.5, 0.5), (0.0, 0.0, 1.0))


def chosen(ctx, s: ConvShape, pool: bool) -> bool:
    """Winograd for this convolution: a shape where it wins (a frozen weight or not)."""
    return applies(s, pool)


def applies(s: ConvShape, pool: bool) -> bool:
    tiles = -(-s.oh // 2) * -(-s.ow // 2)
    return (not pool and s.g == 1 and (s.kh, s.kw, s.sh, s.sw, s.dh, s.dw) == (3, 3, 1, 1, 1, 1)
            and s.ph == s.pw and s.ph in (0, 1) and tiles >= MIN_TILES and s.c >= MIN_CHANNELS
            and s.o >= MIN_CHANNELS)


def constant_weight(ctx) -> np.ndarray | None:
    """The convolution's weight where the plan holds it as a constant (frozen for inference)."""
    producer = ctx.node.inputs[1].producer if len(ctx.node.inputs) > 1 else None
    if producer is not None and producer.op == "constant":
        return np.asarray(producer.attrs["value"])
    return None


def transformed(weight: np.ndarray) -> np.ndarray:
    """U [16, O, C] = G g G^T of every [3, 3] kernel g, in float64 then rounded once."""
    g = np.asarray(G)
    u = np.einsum("ai,ocij,bj->aboc", g, weight.astype(np.float64), g)
    return u.reshape(16, weight.shape[0], weight.shape[1])


def _weight_transform(names: Names, s: ConvShape, w: Buf, u: Buf, dtype: str) -> list:
    """u[(k*O + o)*C + c] = (G g G^T)[k] for every (o, c), in parallel over o."""
    o, c = names.var("o"), names.var("c")
    g = [[names.var(f"g{i}{j}", dtype) for j in range(3)] for i in range(3)]
    t = [[names.var(f"t{a}{j}", dtype) for j in range(3)] for a in range(4)]
    body = [Let(g[i][j], w[(o * s.c + c) * 9 + i * 3 + j]) for i in range(3) for j in range(3)]
    for a in range(4):                    # t = G g (4 x 3)
        for j in range(3):
            terms = [lift(G[a][i], dtype) * g[i][j] for i in range(3) if G[a][i]]
            body.append(Let(t[a][j], _sum(terms)))
    for a in range(4):                    # u = t G^T (4 x 4)
        for bcol in range(4):
            terms = [lift(G[bcol][j], dtype) * t[a][j] for j in range(3) if G[bcol][j]]
            body.append(Store(u, ((a * 4 + bcol) * s.o + o) * s.c + c, _sum(terms)))
    return [For(o, i64(0), i64(s.o), [For(c, i64(0), i64(s.c), body, vector=True)], parallel=True)]


def _sum(terms):
    total = terms[0]
    for term in terms[1:]:
        total = total + term
    return total


def forward_body(ctx, names: Names, s: ConvShape, x: Buf, w: Buf, y: Buf, finish, threads: int, per_image: bool,
                 packed: bool = False):
    """(extra params with their arrays, the kernel body) of the Winograd path, or None; ``finish(n,
    slot, o_lo, o_hi)`` adds the bias and the fused epilogue over channels [o_lo, o_hi) of image n.
    ``packed``: a frozen weight's 16 transformed [O, C] matrices are stored in the panels of the
    toolkit's own GEMM (codegen/microkernel.py), which then runs the 16 products."""
    dtype = ctx.dtype
    th, tw = -(-s.oh // 2), -(-s.ow // 2)
    tiles = th * tw
    ph, pw = 2 * th + 2, 2 * tw + 2                       # the padded copy holds every 4x4 block
    workers = threads if per_image else 1
    frozen = constant_weight(ctx)
    packed = packed and frozen is not None
    u_size = microkernel.packed_size(s.o, s.c) if packed else s.o * s.c      # one of the 16
    u = Buf("wino_u", dtype, 16 * u_size, const=frozen is not None)
    v = Buf("wino_v", dtype, workers * 16 * s.c * tiles, const=False)
    m = Buf("wino_m", dtype, workers * 16 * s.o * tiles, const=False)
    xp = Buf("wino_x", dtype, workers * s.c * ph * pw, const=False)
    if packed:
        u_array = np.concatenate([microkernel.pack_panels(uk) for uk in transformed(frozen).astype(np.float32)])
    else:
        u_array = (transformed(frozen).astype(dtype) if frozen is not None else np.zeros(u.size, dtype)).reshape(-1)
    extra = [(u, u_array), (v, np.zeros(v.size, dtype)), (m, np.zeros(m.size, dtype)),
             (xp, np.zeros(xp.size, dtype))]
    zero = lift(0.0, dtype)

    def pad_copy(n, slot, c_lo, c_hi, parallel):
        """xp[slot] = image n's channels, zero-padded by s.ph on the top and left."""
        c, r, q = names.var("c"), names.var("r"), names.var("q")
        base = slot * (s.c * ph * pw) + c * (ph * pw)
        src = names.var("src")
        body = [For(q, i64(0), i64(ph * pw), [Store(xp, base + q, zero)], vector=True),
                For(r, i64(0), i64(s.h), [Let(src, ((n * s.c + c) * s.h + r) * s.w), For(q, i64(0), i64(s.w), [
                    Store(xp, base + (r + s.ph) * pw + s.ph + q, x[src + q])], vector=True)])]
        return [For(c, c_lo, c_hi, body, parallel=parallel)]

    def input_transform(slot, parallel):
        """v[slot][k][c][t] = (B^T d B)[k] for the 4x4 block d of tile t."""
        c, ty, tx = names.var("c"), names.var("ty"), names.var("tx")
        base = slot * (s.c * ph * pw) + c * (ph * pw)
        d = [[names.var(f"d{r}{q}", dtype) for q in range(4)] for r in range(4)]
        t = [[names.var(f"e{r}{q}", dtype) for q in range(4)] for r in range(4)]
        body = [Let(d[r][q], xp[base + (ty * 2 + r) * pw + tx * 2 + q]) for r in range(4) for q in range(4)]
        for q in range(4):                                 # t = B^T d
            body += [Let(t[0][q], d[0][q] - d[2][q]), Let(t[1][q], d[1][q] + d[2][q]),
                     Let(t[2][q], d[2][q] - d[1][q]), Let(t[3][q], d[1][q] - d[3][q])]
        out = slot * (16 * s.c * tiles) + c * tiles + ty * tw + tx
        for a in range(4):                                 # v = t B
            row = (t[a][0] - t[a][2], t[a][1] + t[a][2], t[a][2] - t[a][1], t[a][1] - t[a][3])
            body += [Store(v, out + (a * 4 + bcol) * (s.c * tiles), row[bcol]) for bcol in range(4)]
        return [For(c, i64(0), i64(s.c), [For(ty, i64(0), i64(th), [For(tx, i64(0), i64(tw), body, vector=True)])],
                    parallel=parallel)]

    def gemms(slot, parallel):
        k = names.var("k")
        v_off, m_off = slot * (16 * s.c * tiles) + k * (s.c * tiles), slot * (16 * s.o * tiles) + k * (s.o * tiles)
        if packed:
            product = PackedGemm(i64(s.o), i64(tiles), i64(s.c), u, k * u_size, v, v_off, tiles, m, m_off, tiles)
        else:
            product = Gemm(False, False, i64(s.o), i64(tiles), i64(s.c), u, k * u_size, s.c, v, v_off, tiles,
                           m, m_off, tiles)
        return [For(k, i64(0), i64(16), [product], parallel=parallel)]

    def output_transform(n, slot, o_lo, o_hi, parallel):
        """y[n][o] from every tile's 16 products: A^T m A, the blocks at the edge cut."""
        o, ty, tx = names.var("o"), names.var("ty"), names.var("tx")
        at = [[names.var(f"m{a}{bcol}", dtype) for bcol in range(4)] for a in range(4)]
        src = slot * (16 * s.o * tiles) + o * tiles + ty * tw + tx
        body = [Let(at[a][bcol], m[src + (a * 4 + bcol) * (s.o * tiles)]) for a in range(4) for bcol in range(4)]
        t = [[names.var(f"f{i}{bcol}", dtype) for bcol in range(4)] for i in range(2)]
        for bcol in range(4):                              # t = A^T m
            body += [Let(t[0][bcol], at[0][bcol] + at[1][bcol] + at[2][bcol]),
                     Let(t[1][bcol], at[1][bcol] - at[2][bcol] - at[3][bcol])]
        oy = [names.var(f"oy{i}") for i in range(2)]
        ox = [names.var(f"ox{j}") for j in range(2)]
        body += [Let(oy[i], ty * 2 + i) for i in range(2)] + [Let(ox[j], tx * 2 + j) for j in range(2)]
        for i in range(2):
            for j in range(2):
                value = (t[i][0] + t[i][1] + t[i][2]) if j == 0 else (t[i][1] - t[i][2] - t[i][3])
                guard = Store(y, ((n * s.o + o) * s.oh + oy[i]) * s.ow + ox[j], value)
                if s.oh % 2 and i == 1:            # an odd output: the last row of blocks is half outside
                    guard = If(oy[i].lt(s.oh), [guard])
                if s.ow % 2 and j == 1:
                    guard = If(ox[j].lt(s.ow), [guard])
                body.append(guard)
        return [For(o, o_lo, o_hi, [For(ty, i64(0), i64(th), [For(tx, i64(0), i64(tw), body, vector=True)])],
                    parallel=parallel)]

    # a frozen weight (inference) is transformed once, here; a trained one on every run
    body = _weight_transform(names, s, w, u, dtype) if frozen is None else []
    n = names.var("n")
    if per_image:
        slot = names.var("slot")
        tail = finish(n, slot, i64(0), i64(s.o))
        if tail is None:
            return None
        loop = [Let(slot, ThreadIndex())] + pad_copy(n, slot, i64(0), i64(s.c), False) + \
            input_transform(slot, False) + gemms(slot, False) + \
            output_transform(n, slot, i64(0), i64(s.o), False) + tail
        body.append(For(n, i64(0), i64(s.n), loop, parallel=threads > 1))
    else:                                                  # fewer images than threads: split each stage
        chunk, lo, cnt = names.var("chunk"), names.var("lo"), names.var("cnt")
        per = -(-s.o // threads)
        tail = finish(n, i64(0), lo, lo + cnt)
        if tail is None:
            return None
        split = For(chunk, i64(0), i64(threads), [
            Let(lo, chunk * per), Let(cnt, select((s.o - lo).lt(per), s.o - lo, per)),
            If(cnt.gt(0), output_transform(n, i64(0), lo, lo + cnt, False) + tail)], parallel=True)
        body.append(For(n, i64(0), i64(s.n), pad_copy(n, i64(0), i64(0), i64(s.c), True) + input_transform(i64(0), True)
                        + gemms(i64(0), True) + [split]))
    return extra, body
