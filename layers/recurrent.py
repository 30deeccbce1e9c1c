"""RNN, LSTM and GRU: PyTorch's layers (batch-first, its weight names and gate order), lowered
to primitive ops either as a ``loop`` node (any sequence length, T symbolic) or unrolled into
one copy of the step per time step (T fixed).

Both forms share the work outside the recurrence: the input projection of every time step of a
layer and direction is ONE matmul ([T*N, C] @ W_ih^T), and a step's gates come from one matmul
(h @ W_hh^T, G*H wide). Inside, everything runs time-major [T, N, ...], so a time step is a
contiguous block; the result is turned batch-first once at the end.
"""
from __future__ import annotations

import math
from typing import Annotated, ClassVar, Literal, Optional

from pydantic import Field

from schemas.base import Bool, ParamLayerBase, PositiveInt
from toolkit.ops.control import loop

from .registry import LayerError, layer, need_float_input, static_dim

GATES = {"RNN": 1, "LSTM": 4, "GRU": 3}

# The unrolled form is the default up to this many steps (a fixed T): per step it saves the
# loop's copies of carries and the body plan's call overhead, and its steps are scheduled,
# fused and planned with the rest of the graph. Above it the loop's one body keeps the graph,
# compile time and the plan small. Measured on a 2-core EPYC, README "Recurrent layers".
UNROLL_UP_TO = 64
# each stacked layer and each unrolled step is a section of the graph, built when the net is
# read: bounded so that a num_layers or a T of 1e9 is one line, not a graph that never finishes
MAX_STACKED = 1_000
MAX_UNROLLED = 4_096


class _RecurrentBase(ParamLayerBase):
    num_output: PositiveInt
    num_layers: Annotated[int, Field(strict=True, gt=0, le=MAX_STACKED)] = 1
    bidirectional: Bool = False
    dropout: Annotated[float, Field(ge=0, lt=1)] = 0.0
    return_sequence: Bool = True
    # an extension: true unrolls the steps (needs a fixed T), false keeps one loop node;
    # unset: unrolled for a fixed T up to UNROLL_UP_TO steps, else the loop
    unroll: Optional[Bool] = None

    BOTTOMS: ClassVar[tuple[int, Optional[int]]] = (1, 2)
    TOPS: ClassVar[tuple[int, Optional[int]]] = (1, 2)


class RNNParams(_RecurrentBase):
    type: Literal["RNN"]
    nonlinearity: Literal["tanh", "relu"] = "tanh"


class GRUParams(_RecurrentBase):
    type: Literal["GRU"]


class LSTMParams(_RecurrentBase):
    type: Literal["LSTM"]
    BOTTOMS: ClassVar[tuple[int, Optional[int]]] = (1, 3)
    TOPS: ClassVar[tuple[int, Optional[int]]] = (1, 3)


def _cell(kind: str, p, b, xw, h, c, w_hh, b_hh):
    """One step: ``xw`` is x_t @ W_ih^T + b_ih [N, G*H]; returns (h', c')."""
    hidden = p.num_output
    hw = b.add(b.op("matmul", h, w_hh, trans_a=False, trans_b=True), b_hh)

    def gate(v, i):
        return b.op("slice", v, axis=1, start=i * hidden, stop=(i + 1) * hidden)
    if kind == "RNN":
        return b.op(p.nonlinearity, b.add(xw, hw)), None
    if kind == "LSTM":
        z = b.add(xw, hw)
        i, f, o = (b.op("sigmoid", gate(z, j)) for j in (0, 1, 3))
        g = b.op("tanh", gate(z, 2))
        c_new = b.add(b.mul(f, c), b.mul(i, g))
        return b.mul(o, b.op("tanh", c_new)), c_new
    r = b.op("sigmoid", b.add(gate(xw, 0), gate(hw, 0)))
    z = b.op("sigmoid", b.add(gate(xw, 1), gate(hw, 1)))
    n = b.op("tanh", b.add(gate(xw, 2), b.mul(r, gate(hw, 2))))
    return b.add(n, b.mul(z, b.sub(h, n))), None          # (1 - z) * n + z * h


def _masked_step(kind, p, b, xw, h, c, w_hh, b_hh, real):
    """One step; with ``real`` ([N, 1], 1 where this step lies within the example's length), a
    padded step leaves the state as it was and outputs zeros (PyTorch's packed sequences): a
    reverse pass then starts each example from h0 at its own last token."""
    h_new, c_new = _cell(kind, p, b, xw, h, c, w_hh, b_hh)
    if real is None:
        return h_new, c_new, h_new
    zero = b.scalar(0.0, h_new.dtype)
    kept_c = b.op("select", real, c_new, c) if c_new is not None else None
    return b.op("select", real, h_new, h), kept_c, b.op("select", real, h_new, zero)


def _direction(kind, p, ctx, proj, h, c, weights, reverse: bool, unroll: bool, real=None):
    """Run one layer in one direction over ``proj`` [T, N, G*H] (``real``: [T, N, 1], 1 at each
    example's real steps, for a padded T); returns (outputs [T, N, H], h_T, c_T)."""
    b = ctx.b
    w_hh, b_hh = weights
    has_c = kind == "LSTM"
    if unroll:
        steps = static_dim(proj.shape[0], "the sequence length T of an unrolled layer", "unroll")
        outs = [None] * steps
        for t in (range(steps - 1, -1, -1) if reverse else range(steps)):
            xw = b.reshape(b.op("slice", proj, axis=0, start=t, stop=t + 1), proj.shape[1:])
            real_t = None if real is None else b.reshape(b.op("slice", real, axis=0, start=t, stop=t + 1),
                                                         real.shape[1:])
            h, c, y = _masked_step(kind, p, b, xw, h, c, w_hh, b_hh, real_t)
            outs[t] = b.reshape(y, (1,) + tuple(y.shape))
        return b.op("concat", *outs, axis=0) if steps > 1 else outs[0], h, c

    def step(bb, carries, xs):
        h_t, c_t = carries[0], carries[1] if has_c else None
        h_new, c_new, y = _masked_step(kind, p, bb, xs[0], h_t, c_t, w_hh, b_hh, xs[1] if real is not None else None)
        return ([h_new, c_new] if has_c else [h_new]), [y]
    outs = loop(b, [h, c] if has_c else [h], [proj] + ([real] if real is not None else []), step, reverse=reverse)
    return outs[-1], outs[0], (outs[1] if has_c else None)


def _lower(kind: str, p, ctx, bottoms):
    x, states = bottoms[0], bottoms[1:]
    need_float_input(x, kind)
    if x.rank != 3:
        raise LayerError(f"{kind} needs a batch-first input [N, T, C], got {ctx.fmt(x)}", "bottom")
    if kind == "LSTM" and len(states) == 1:
        raise LayerError("LSTM takes bottoms [x] or [x, h0, c0]: c0 is missing", "bottom")
    b = ctx.b
    n, steps, features = x.shape
    features = static_dim(features, "the input's feature dimension C", "bottom")
    hidden, gates, layers = p.num_output, GATES[kind], p.num_layers
    dirs = 2 if p.bidirectional else 1
    unroll = p.unroll if p.unroll is not None else (isinstance(steps, int) and steps <= UNROLL_UP_TO)
    if unroll and not isinstance(steps, int):
        raise LayerError(f"unroll: true needs a fixed sequence length, but T is {steps}", "unroll")
    if unroll and steps > MAX_UNROLLED:
        raise LayerError(f"unroll: true over T={steps:,} steps: at most {MAX_UNROLLED:,} unroll; leave unroll out "
                         "to run the steps as one loop", "unroll")
    state_shape = (layers * dirs, n, hidden)
    for s, what in zip(states, ("h0", "c0")):
        need_float_input(s, kind)
        if tuple(s.shape) != state_shape or s.dtype != x.dtype:
            raise LayerError(f"{what} must be [num_layers*directions, N, H] = "
                             f"[{', '.join(map(str, state_shape))}] {x.dtype}, got {ctx.fmt(s)} {s.dtype}", "bottom")

    bound = 1.0 / math.sqrt(hidden)
    filler = {"type": "uniform", "min": -bound, "max": bound}

    def param(name, shape, key):
        return ctx.param(name, shape, fan_in=shape[-1], fan_out=shape[0], default_filler=filler, filler_key=key)

    def initial(state, index):
        if state is None:                 # zeros; the loop's carried type settles on [N, H]
            return b.op("broadcast_to", b.scalar(0.0, x.dtype), shape=(1, hidden))
        return b.reshape(b.op("slice", state, axis=0, start=index, stop=index + 1), (n, hidden))

    h0 = states[0] if states else None
    c0 = states[1] if len(states) > 1 else None
    seq = b.op("transpose", x, perm=(1, 0, 2))                   # time-major [T, N, C]
    padded = ctx.bucketed_symbol(steps)      # a padded T: each example stops at its length
    real = ctx.valid_positions(padded, 3, 0, 1) if padded is not None else None      # [T, N, 1]
    finals_h, finals_c = [], []
    for layer_index in range(layers):
        width = features if layer_index == 0 else hidden * dirs
        rows = b.reshape(seq, (steps * n, width))
        outs = []
        for d in range(dirs):
            suffix = f"_l{layer_index}" + ("_reverse" if d else "")
            w_ih = param("weight_ih" + suffix, (gates * hidden, width), "weight_filler")
            w_hh = param("weight_hh" + suffix, (gates * hidden, hidden), "weight_filler")
            b_ih = param("bias_ih" + suffix, (gates * hidden,), "bias_filler")
            b_hh = param("bias_hh" + suffix, (gates * hidden,), "bias_filler")
            proj = b.add(b.op("matmul", rows, w_ih, trans_a=False, trans_b=True), b_ih)
            proj = b.reshape(proj, (steps, n, gates * hidden))
            index = layer_index * dirs + d
            h = initial(h0, index)
            c = initial(c0, index) if kind == "LSTM" else None
            if unroll and h0 is None:     # the first step's h is zeros: broadcast it to [N, H]
                h = b.op("broadcast_to", h, shape=(n, hidden))
                c = b.op("broadcast_to", c, shape=(n, hidden)) if c is not None else None
            ys, h_t, c_t = _direction(kind, p, ctx, proj, h, c, (w_hh, b_hh), reverse=d == 1, unroll=unroll,
                                      real=real)
            outs.append(ys)
            finals_h.append(b.reshape(h_t, (1, n, hidden)))
            if c_t is not None:
                finals_c.append(b.reshape(c_t, (1, n, hidden)))
        seq = b.op("concat", *outs, axis=2) if dirs > 1 else outs[0]
        if p.dropout and ctx.phase == "train" and layer_index < layers - 1:
            seq = b.mul(seq, b.op("dropout_mask", seq, ratio=float(p.dropout)))
    if p.return_sequence:
        y = b.op("transpose", seq, perm=(1, 0, 2))
    else:
        # PyTorch's h_n of the last layer, directions side by side: the reverse direction's final
        # state is its step over the first token, after it has read the whole sequence (the
        # sequence output's last step would give that direction's output after one token)
        last = [b.reshape(h_t, (n, hidden)) for h_t in finals_h[-dirs:]]
        y = b.op("concat", *last, axis=1) if dirs > 1 else last[0]
    tops = [y]
    extra = len(ctx.layer.tops) - 1
    if extra >= 1:
        tops.append(b.op("concat", *finals_h, axis=0) if len(finals_h) > 1 else finals_h[0])
    if extra >= 2:
        tops.append(b.op("concat", *finals_c, axis=0) if len(finals_c) > 1 else finals_c[0])
    return tops


@layer(RNNParams)
def lower_rnn(p: RNNParams, ctx, bottoms):
    """Elman RNN: h' = act(x W_ih^T + b_ih + h W_hh^T + b_hh)."""
    return _lower("RNN", p, ctx, bottoms)


@layer(LSTMParams)
def lower_lstm(p: LSTMParams, ctx, bottoms):
    """LSTM, gates i, f, g, o: c' = f c + i g, h' = o tanh(c')."""
    return _lower("LSTM", p, ctx, bottoms)


@layer(GRUParams)
def lower_gru(p: GRUParams, ctx, bottoms):
    """GRU, gates r, z, n: n = tanh(x_n + r (h W_hn^T + b_hn)), h' = (1 - z) n + z h."""
    return _lower("GRU", p, ctx, bottoms)
