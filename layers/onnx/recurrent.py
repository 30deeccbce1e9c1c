"""ONNX's RNN, GRU and LSTM as the graph's loop: the input projection of every step computed at
once, then one loop per direction over the time axis carrying the hidden (and cell) state.

Defaults only where ONNX allows a choice: the default activations (written out or not), no
``clip``, no peepholes, ``input_forget`` 0, and every sequence running the whole length (no
``sequence_lens``, or one that is known and full). ``layout`` 1 (batch first) is transposed in
and out."""
from __future__ import annotations

import numpy as np

from toolkit.ir.graph import Value
from toolkit.ops.control import loop

from .convert import Importer, is_const
from .ops import converts, float_input

GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
DEFAULT_ACTIVATIONS = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}


def _gate(b, x: Value, index: int, hidden) -> Value:
    return b.op("slice", x, axis=x.rank - 1, start=index * hidden, stop=(index + 1) * hidden)


def _direction(imp: Importer, d: int) -> tuple[Value, Value, Value | None]:
    """Direction d's W [G*H, I], R [G*H, H] and B [2*G*H] (None without one)."""
    b = imp.b
    node = imp.node
    parts = []
    for index in (1, 2, 3):
        name = imp.optional(node, index)
        if name is None:
            parts.append(None)
            continue
        v = imp.value(name)
        parts.append(b.reshape(b.op("slice", v, axis=0, start=d, stop=d + 1), tuple(v.shape[1:])))
    return parts[0], parts[1], parts[2]


def _check(imp: Importer, node, kind: str, length) -> None:
    acts = imp.attr(node, "activations")
    if acts is not None:
        acts = [a.decode() if isinstance(a, bytes) else a for a in acts]
        want = DEFAULT_ACTIVATIONS[kind]
        if [a.lower() for a in acts] not in ([w.lower() for w in want], [w.lower() for w in want * 2]):
            imp.fail(f"activations {acts} (only the defaults, {want}, have a counterpart here)")
    if imp.attr(node, "clip") is not None:
        imp.fail("clip has no counterpart here")
    if imp.attr(node, "input_forget", 0):
        imp.fail("input_forget 1 has no counterpart here")
    lens = imp.optional(node, 4)
    if lens is not None:
        given = imp.env[lens]
        if not is_const(given) or not isinstance(length, int) or (np.asarray(given) != length).any():
            imp.fail("sequence_lens shorter than the input's length have no counterpart here (every "
                     "sequence runs the whole length)")
    if kind == "LSTM" and imp.optional(node, 7) is not None:
        peep = imp.env[imp.optional(node, 7)]
        if not is_const(peep) or np.any(np.asarray(peep)):
            imp.fail("peepholes have no counterpart here")


@converts("RNN", "GRU", "LSTM")
def _recurrent(imp: Importer, node):
    kind = node.op_type
    x = float_input(imp, node.input[0])
    b = imp.b
    batch_first = bool(imp.attr(node, "layout", 0))
    if batch_first:
        x = b.op("transpose", x, perm=(1, 0, 2))
    steps, n, _ = x.shape
    _check(imp, node, kind, steps)
    hidden = imp.attr(node, "hidden_size")
    if hidden is None:
        imp.fail("attribute 'hidden_size' is missing (the size of the state is read from it)")
    hidden = int(hidden)
    gates = GATES[kind]
    direction = imp.attr(node, "direction", "forward")
    direction = direction.decode("utf-8", "replace") if isinstance(direction, bytes) else direction
    runs = {"forward": [False], "reverse": [True], "bidirectional": [False, True]}.get(direction)
    if runs is None:
        imp.fail(f"direction {direction!r} is none of forward, reverse and bidirectional")
    before_reset = bool(imp.attr(node, "linear_before_reset", 0))
    ys, finals_h, finals_c = [], [], []
    for d, reverse in enumerate(runs):
        w, r, bias = _direction(imp, d)
        # every step's input projection at once: [T*N, I] @ W^T -> [T, N, G*H]
        proj = b.reshape(b.op("matmul", b.reshape(x, (steps * n, x.shape[2])), w, trans_a=False, trans_b=True),
                         (steps, n, gates * hidden))
        wb = rb = None
        if bias is not None:
            wb = b.op("slice", bias, axis=0, start=0, stop=gates * hidden)
            rb = b.op("slice", bias, axis=0, start=gates * hidden, stop=2 * gates * hidden)
            if kind != "GRU":
                proj = b.add(proj, b.add(wb, rb))
            else:
                proj = b.add(proj, wb)
        h0 = _initial(imp, node, 5, d, n, hidden, x.dtype)
        c0 = _initial(imp, node, 6, d, n, hidden, x.dtype) if kind == "LSTM" else None

        def step(bb, carries, xs, r=r, rb=rb):
            h = carries[0]
            xp = xs[0]
            if kind == "RNN":
                h_new = bb.op("tanh", bb.add(xp, bb.op("matmul", h, r, trans_a=False, trans_b=True)))
                return [h_new], [h_new]
            if kind == "LSTM":
                c = carries[1]
                g = bb.add(xp, bb.op("matmul", h, r, trans_a=False, trans_b=True))
                i, o, f, cand = (_gate(bb, g, k, hidden) for k in range(4))
                c_new = bb.add(bb.mul(bb.op("sigmoid", f), c), bb.mul(bb.op("sigmoid", i), bb.op("tanh", cand)))
                h_new = bb.mul(bb.op("sigmoid", o), bb.op("tanh", c_new))
                return [h_new, c_new], [h_new]
            # GRU: gates z, r, h
            hr = bb.op("matmul", h, r, trans_a=False, trans_b=True)          # [N, 3H]
            if rb is not None:
                hr_zr = bb.add(_gate(bb, hr, 0, 2 * hidden), _gate(bb, rb, 0, 2 * hidden))
            else:
                hr_zr = _gate(bb, hr, 0, 2 * hidden)
            zr = bb.add(_gate(bb, xp, 0, 2 * hidden), hr_zr)
            z = bb.op("sigmoid", _gate(bb, zr, 0, hidden))
            reset = bb.op("sigmoid", _gate(bb, zr, 1, hidden))
            r_n = bb.op("slice", r, axis=0, start=2 * hidden, stop=3 * hidden)
            rb_n = bb.op("slice", rb, axis=0, start=2 * hidden, stop=3 * hidden) if rb is not None else None
            if before_reset:
                hn = bb.op("matmul", h, r_n, trans_a=False, trans_b=True)
                if rb_n is not None:
                    hn = bb.add(hn, rb_n)
                inner = bb.mul(reset, hn)
            else:
                inner = bb.op("matmul", bb.mul(reset, h), r_n, trans_a=False, trans_b=True)
                if rb_n is not None:
                    inner = bb.add(inner, rb_n)
            cand = bb.op("tanh", bb.add(_gate(bb, xp, 2, hidden), inner))
            one = bb.scalar(1.0, h.dtype)
            h_new = bb.add(bb.mul(bb.sub(one, z), cand), bb.mul(z, h))
            return [h_new], [h_new]

        init = [h0, c0] if kind == "LSTM" else [h0]
        outs = loop(b, init, [proj], step, reverse=reverse)
        finals_h.append(outs[0])
        if kind == "LSTM":
            finals_c.append(outs[1])
        ys.append(outs[-1])                                       # [T, N, H]
    y = b.op("concat", *[b.reshape(v, (steps, 1, n, hidden)) for v in ys], axis=1) if len(ys) > 1 else \
        b.reshape(ys[0], (steps, 1, n, hidden))
    y_h = b.op("concat", *[b.reshape(v, (1, n, hidden)) for v in finals_h], axis=0) if len(finals_h) > 1 else \
        b.reshape(finals_h[0], (1, n, hidden))
    outs = [y, y_h]
    if kind == "LSTM":
        outs.append(b.op("concat", *[b.reshape(v, (1, n, hidden)) for v in finals_c], axis=0)
                    if len(finals_c) > 1 else b.reshape(finals_c[0], (1, n, hidden)))
    if batch_first:           # Y [N, T, D, H], Y_h and Y_c [N, D, H]
        outs = [b.op("transpose", outs[0], perm=(2, 0, 1, 3))] + [b.op("transpose", v, perm=(1, 0, 2))
                                                                   for v in outs[1:]]
    return outs


def _initial(imp: Importer, node, index: int, d: int, n, hidden: int, dtype: str) -> Value:
    name = imp.optional(node, index)
    b = imp.b
    if name is None:
        return b.op("broadcast_to", b.scalar(0.0, dtype), shape=(n, hidden))
    v = imp.value(name)
    if imp.attr(node, "layout", 0):
        v = b.op("transpose", v, perm=(1, 0, 2))
    return b.reshape(b.op("slice", v, axis=0, start=d, stop=d + 1), tuple(v.shape[1:]))
