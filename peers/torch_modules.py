"""The torch modules a net's layers translate to (peers/torch_net.py builds a ``TorchNet`` of them):
PyTorch's own building blocks wrapped where the catalog's semantics differ from PyTorch's defaults
(a channel axis other than 1, Caffe's recurrent layers, the losses' reductions). torch is imported
inside ``torch_classes`` only, on first use.
"""
from __future__ import annotations

import functools
import math
from types import SimpleNamespace

import numpy as np


def pair(v) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else (int(v[0]), int(v[1]))


def torch_dtype(name: str):
    import torch
    return {"float32": torch.float32, "float64": torch.float64,
            "int32": torch.int32, "int64": torch.int64}[name]


@functools.lru_cache(maxsize=None)
def torch_classes() -> SimpleNamespace:
    """The torch module classes of the translation (defined on first use: torch is imported here)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Lambda(nn.Module):
        def __init__(self, fn, name: str):
            super().__init__()
            self.fn = fn
            self.label = name

        def forward(self, *xs):
            return self.fn(*xs)

        def extra_repr(self) -> str:
            return self.label

    class ChannelAxis(nn.Module):
        """A 4-d module run on an input whose channel axis is ``axis`` (Caffe's Convolution.axis):
        the axes before it merged into one batch axis, and split back after."""

        def __init__(self, inner, axis: int):
            super().__init__()
            self.inner, self.axis = inner, axis

        def forward(self, x):
            axis = self.axis % x.dim()
            lead = tuple(x.shape[:axis])
            y = self.inner(x.reshape((math.prod(lead),) + tuple(x.shape[axis:])))
            return y.reshape(lead + tuple(y.shape[1:]))

    class InnerProduct(nn.Module):
        """nn.Linear on the input flattened from ``axis``: [d0..d(axis-1), O]."""

        def __init__(self, axis: int, in_features: int, out_features: int, bias: bool):
            super().__init__()
            self.axis = axis
            self.linear = nn.Linear(in_features, out_features, bias=bias)

        def forward(self, x):
            return self.linear(torch.flatten(x, self.axis % x.dim()))

    class InnerProductT(nn.Module):
        """Caffe's transposed InnerProduct: y = x W + b with W [in, out]."""

        def __init__(self, axis: int, in_features: int, out_features: int, bias: bool):
            super().__init__()
            self.axis = axis
            self.weight = nn.Parameter(torch.zeros(in_features, out_features))
            self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None

        def forward(self, x):
            y = torch.flatten(x, self.axis % x.dim()) @ self.weight
            return y if self.bias is None else y + self.bias

    class BatchNorm(nn.Module):
        """F.batch_norm with explicit modes: batch statistics or running ones, and whether the
        running statistics are updated (momentum, unbiased variance: PyTorch's rule)."""

        def __init__(self, channels: int, eps: float, momentum: float, affine: bool,
                     batch_stats: bool, update_running: bool):
            super().__init__()
            self.eps, self.momentum = eps, momentum
            self.batch_stats, self.update_running = batch_stats, update_running
            if affine:
                self.weight = nn.Parameter(torch.ones(channels))
                self.bias = nn.Parameter(torch.zeros(channels))
            else:
                self.weight = self.bias = None
            self.register_buffer("running_mean", torch.zeros(channels))
            self.register_buffer("running_var", torch.ones(channels))

        def forward(self, x):
            if self.batch_stats:
                rm, rv = (self.running_mean, self.running_var) if self.update_running else (None, None)
                return F.batch_norm(x, rm, rv, self.weight, self.bias, True, self.momentum, self.eps)
            return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, False,
                                0.0, self.eps)

    class NumpyDropout(nn.Module):
        """Inverted dropout whose keep mask is drawn exactly as the toolkit's dropout_mask op
        draws it (``rng.random(shape) >= ratio``, scaled by 1/(1-ratio)), so that a train step
        can be compared number for number when both sides start from the same numpy generator."""

        def __init__(self, ratio: float, rng: np.random.Generator):
            super().__init__()
            self.ratio, self.rng = ratio, rng

        def forward(self, x):
            np_dtype = np.float64 if x.dtype == torch.float64 else np.float32
            keep = self.rng.random(tuple(x.shape), dtype=np_dtype) >= self.ratio
            mask = np.empty(keep.shape, np_dtype)
            np.multiply(keep, 1.0 / (1.0 - self.ratio), out=mask)
            return x * torch.from_numpy(mask)

    class Concat(nn.Module):
        def __init__(self, axis: int):
            super().__init__()
            self.axis = axis

        def forward(self, *xs):
            return torch.cat(xs, dim=self.axis)

    class Slice(nn.Module):
        def __init__(self, axis: int, points, pieces: int):
            super().__init__()
            self.axis, self.points, self.pieces = axis, points, pieces

        def forward(self, x):
            size = x.shape[self.axis]
            if self.points is not None:
                bounds = [0] + list(self.points) + [size]
                sizes = [hi - lo for lo, hi in zip(bounds, bounds[1:])]
            else:
                sizes = [size // self.pieces] * self.pieces
            return tuple(torch.split(x, sizes, dim=self.axis))

    class Eltwise(nn.Module):
        def __init__(self, operation: str, coeff):
            super().__init__()
            self.operation, self.coeff = operation, coeff

        def forward(self, *xs):
            if self.operation == "sum":
                coeff = self.coeff or [1.0] * len(xs)
                out = xs[0] * coeff[0] if coeff[0] != 1 else xs[0]
                for x, c in zip(xs[1:], coeff[1:]):
                    out = out + (x * c if c != 1 else x)
                return out
            out = xs[0]
            for x in xs[1:]:
                if self.operation == "prod":
                    out = out * x
                else:
                    # Caffe's max: ties route the gradient to the first bottom (torch.maximum
                    # would split it), the values are torch.maximum's
                    out = torch.where(out >= x, out, x)
            return out

    class Flatten(nn.Module):
        def __init__(self, axis: int, end_axis: int):
            super().__init__()
            self.axis, self.end_axis = axis, end_axis

        def forward(self, x):
            return torch.flatten(x, self.axis, self.end_axis)

    class Reshape(nn.Module):
        """Caffe's reshape of the axes [axis, axis + num_axes): 0 copies the input's dimension,
        -1 is inferred."""

        def __init__(self, shape, axis: int = 0, num_axes: int = -1):
            super().__init__()
            self.shape, self.axis, self.num_axes = list(shape), axis, num_axes

        def forward(self, x):
            start = self.axis if self.axis >= 0 else x.dim() + 1 + self.axis
            end = x.dim() if self.num_axes == -1 else start + self.num_axes
            target = [x.shape[start + i] if d == 0 else d for i, d in enumerate(self.shape)]
            return x.reshape(list(x.shape[:start]) + target + list(x.shape[end:]))

    class Scale(nn.Module):
        """Caffe's Scale: x times a scale spanning x's axes [axis, axis + scale.dim()), plus an
        optional bias of the scale's shape. The scale is the learned ``weight`` (one bottom) or
        the second bottom; a 0-d second bottom ignores axis, as in Caffe."""

        def __init__(self, axis: int, weight_shape, bias_shape):
            super().__init__()
            self.axis = axis
            self.weight = None if weight_shape is None else nn.Parameter(torch.ones(weight_shape))
            self.bias = None if bias_shape is None else nn.Parameter(torch.zeros(bias_shape))

        def forward(self, x, *given):
            scale = given[0] if given else self.weight
            axis = x.dim() if scale.dim() == 0 else self.axis % x.dim()
            trailing = (1,) * (x.dim() - axis - scale.dim())
            y = x * scale.reshape(tuple(scale.shape) + trailing)
            if self.bias is not None:
                y = y + self.bias.reshape(tuple(self.bias.shape) + trailing)
            return y

    class Bias(nn.Module):
        """Caffe's Bias: x plus a bias spanning x's axes [axis, axis + bias.dim()), learned or
        the second bottom."""

        def __init__(self, axis: int, bias_shape):
            super().__init__()
            self.axis = axis
            self.bias = None if bias_shape is None else nn.Parameter(torch.zeros(bias_shape))

        def forward(self, x, *given):
            bias = given[0] if given else self.bias
            axis = x.dim() if bias.dim() == 0 else self.axis % x.dim()
            return x + bias.reshape(tuple(bias.shape) + (1,) * (x.dim() - axis - bias.dim()))

    class CaffeRecurrent(nn.Module):
        """Caffe's LSTM (gates i f o g) or RNN, time-major, the state carried in multiplied by cont,
        written step by step from Caffe's recurrent layers' definitions."""

        def __init__(self, kind: str, shapes: dict, expose: bool):
            super().__init__()
            self.kind, self.expose = kind, expose
            for name, shape in shapes.items():
                setattr(self, name, nn.Parameter(torch.zeros(shape)))
            self.has_static = "weight_static" in shapes

        def forward(self, x, cont, *rest):
            rest = list(rest)
            states = (2 if self.kind == "lstm" else 1) if self.expose else 0
            initial = rest[len(rest) - states:] if states else []
            static = rest[0] if self.has_static else None
            t_steps, n = x.shape[0], x.shape[1]
            xs = x.reshape(t_steps, n, -1)
            d = self.weight_h.shape[1]
            proj = xs @ self.weight_x.T + self.bias
            if static is not None:
                proj = proj + (static.reshape(n, -1) @ self.weight_static.T)
            h = initial[0].reshape(n, d) if initial else x.new_zeros(n, d)
            c = initial[1].reshape(n, d) if len(initial) > 1 else x.new_zeros(n, d)
            outs = []
            for t in range(t_steps):
                keep = cont[t].to(x.dtype).reshape(n, 1)
                pre = proj[t] + (h * keep) @ self.weight_h.T
                if self.kind == "lstm":
                    i, f, o, g = pre.chunk(4, dim=1)
                    c = keep * torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
                    h = torch.sigmoid(o) * torch.tanh(c)
                    outs.append(h)
                else:
                    h = torch.tanh(pre)
                    outs.append(torch.tanh(h @ self.weight_out.T + self.bias_out))
            seq = torch.stack(outs)
            if not self.expose:
                return seq
            return (seq, h.unsqueeze(0), c.unsqueeze(0)) if self.kind == "lstm" else (seq, h.unsqueeze(0))

    class SoftmaxWithLoss(nn.Module):
        def __init__(self, axis: int, ignore_label, normalization: str = "valid"):
            super().__init__()
            self.axis = axis
            self.ignore = -100 if ignore_label is None else int(ignore_label)
            self.normalization = normalization

        def forward(self, logits, label):
            axis = self.axis % logits.dim()
            if logits.dim() > 1 and axis != 1:
                logits = logits.movedim(axis, 1)       # cross_entropy's class axis; others keep order
            if self.normalization == "valid":
                return F.cross_entropy(logits, label.long(), ignore_index=self.ignore, reduction="mean")
            total = F.cross_entropy(logits, label.long(), ignore_index=self.ignore, reduction="sum")
            if self.normalization == "none":
                return total
            # Caffe's batch_size: the dimensions before the class axis
            count = label.numel() if self.normalization == "full" else math.prod(label.shape[:axis])
            return total / count

    class EuclideanLoss(nn.Module):
        def forward(self, a, b):
            return F.mse_loss(a, b, reduction="sum") / (2 * a.shape[0])

    class SigmoidCrossEntropyLoss(nn.Module):
        def forward(self, x, t):
            return F.binary_cross_entropy_with_logits(x, t.to(x.dtype), reduction="mean")

    class Accuracy(nn.Module):
        def __init__(self, axis: int, top_k: int, ignore_label=None):
            super().__init__()
            self.axis, self.top_k, self.ignore = axis, top_k, ignore_label

        def forward(self, scores, label):
            moved = scores.movedim(self.axis % scores.dim(), -1)
            flat = moved.reshape(-1, moved.shape[-1])
            top = torch.topk(flat, self.top_k, dim=1).indices
            lab = label.reshape(-1).long()
            hit = (top == lab.reshape(-1, 1)).any(dim=1).to(scores.dtype)
            if self.ignore is None:
                return hit.mean()
            keep = (lab != self.ignore).to(scores.dtype)
            return (hit * keep).sum() / keep.sum()

    class Embed(nn.Module):
        """nn.Embedding over integer indices of any integer dtype, plus a bias row (Caffe's
        bias_term) when given one's width."""

        def __init__(self, table, bias: int | None = None):
            super().__init__()
            self.table = table
            self.bias = nn.Parameter(torch.zeros(bias)) if bias else None

        def forward(self, index):
            rows = self.table(index.long())
            return rows if self.bias is None else rows + self.bias

    class MultiHeadAttention(nn.Module):
        """nn.MultiheadAttention(batch_first=True) called with need_weights=False on [x] or
        [q, k, v], a last bool bottom being key_padding_mask; ``causal`` passes the mask of
        nn.Transformer.generate_square_subsequent_mask (as bool, the key padding mask's type).
        In train mode with dropout and a numpy generator, the same computation is written out
        from the module's weights with the keep mask drawn as the toolkit's dropout_mask op
        draws it (``NumpyDropout``), so a train step can be compared number for number."""

        def __init__(self, embed: int, heads: int, dropout: float, bias: bool, causal: bool,
                     rng: np.random.Generator | None):
            super().__init__()
            self.attn = nn.MultiheadAttention(embed, heads, dropout=dropout, bias=bias, batch_first=True)
            self.causal, self.dropout, self.rng = causal, dropout, rng

        def forward(self, *xs):
            mask = xs[-1] if xs[-1].dtype == torch.bool else None
            data = xs[:-1] if mask is not None else xs
            q, k, v = data if len(data) == 3 else data * 3
            causal = None
            if self.causal:
                causal = nn.Transformer.generate_square_subsequent_mask(q.shape[1], dtype=q.dtype) == float("-inf")
            if self.training and self.dropout > 0 and self.rng is not None:
                return self._numpy_dropout(q, k, v, mask, causal)
            return self.attn(q, k, v, key_padding_mask=mask, attn_mask=causal, need_weights=False)[0]

        def _numpy_dropout(self, q, k, v, mask, causal):
            a = self.attn
            n, t, e = q.shape
            h = a.num_heads
            d = e // h
            w = a.in_proj_weight.split(e)
            bias = a.in_proj_bias.split(e) if a.in_proj_bias is not None else (None,) * 3

            def heads(x, i):
                return F.linear(x, w[i], bias[i]).reshape(x.shape[0], x.shape[1], h, d).transpose(1, 2)
            scores = heads(q, 0) @ heads(k, 1).transpose(-1, -2) / d ** 0.5
            if mask is not None:
                scores = scores.masked_fill(mask[:, None, None, :], float("-inf"))
            if causal is not None:
                scores = scores.masked_fill(causal, float("-inf"))
            weights = NumpyDropout(self.dropout, self.rng)(torch.softmax(scores, dim=-1))
            out = (weights @ heads(v, 2)).transpose(1, 2).reshape(n, t, e)
            return a.out_proj(out)

    class Recurrent(nn.Module):
        """nn.RNN / nn.LSTM / nn.GRU (batch-first) with the layer's tops: the sequence (or the
        last layer's final state of each direction, as Keras's Bidirectional gives it), then h_n,
        then c_n."""

        def __init__(self, rnn, return_sequence: bool, tops: int):
            super().__init__()
            self.rnn = rnn
            self.return_sequence = return_sequence
            self.tops = tops

        def forward(self, x, *states):
            lstm = isinstance(self.rnn, nn.LSTM)
            given = (tuple(states) if lstm else states[0]) if states else None
            out, final = self.rnn(x, given)
            h_n, c_n = final if lstm else (final, None)
            # without the sequence: each direction's final state of the last layer, side by side
            y = out if self.return_sequence else h_n[-(2 if self.rnn.bidirectional else 1):].transpose(0, 1).flatten(1)
            return (y, h_n, c_n)[:self.tops]

    class NetModule(nn.Module):
        """The whole phase: layer modules in order over a dict of named blobs."""

        def __init__(self, steps):
            super().__init__()
            self.layers = nn.ModuleDict({key: mod for key, _layer, mod in steps})
            self._steps = [(key, layer) for key, layer, _mod in steps]

        def forward(self, blobs: dict) -> dict:
            env = dict(blobs)
            for key, layer in self._steps:
                missing = [b for b in layer.bottoms if b not in env]
                if missing:
                    raise KeyError(f"layer '{layer.name}': no blob or input named {', '.join(missing)}")
                outs = self.layers[key](*[env[b] for b in layer.bottoms])
                if isinstance(outs, torch.Tensor):
                    outs = (outs,)
                for name, value in zip(layer.tops, outs):
                    env[name] = value
            return env

    return SimpleNamespace(**{k: v for k, v in locals().items() if isinstance(v, type)})
