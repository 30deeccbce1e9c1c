"""A loaded ``Net`` translated to an equivalent PyTorch module for one phase.

The translation reads the net's spec (inputs, layers with their parameters and phases) and builds
one torch module per layer from PyTorch's own building blocks (``nn.Conv2d``, ``nn.MaxPool2d``,
``F.batch_norm``, ``F.cross_entropy``, ...), with the semantics of docs/spec.md section 1: Pooling's
stride defaults to 1, BatchNorm uses batch statistics in phase train (and updates its running
statistics there) and running statistics elsewhere unless ``use_global_stats`` says otherwise,
Dropout is the identity outside train, losses reduce as the catalog says. Tops replace blobs of
the same name, so in-place layers behave as in the toolkit.

It is a test and benchmark oracle: torch is imported inside functions only and is never a
runtime dependency of the toolkit.

    peer = TorchNet(net, "train", dtype="float64")
    peer.load(weights)                          # {LAYER.PARAM: ndarray}, the toolkit's keys
    objective, blobs = peer.train_step(inputs)  # forward + backward of sum(loss_weight * loss)
    peer.grads(), peer.input_grads(), peer.state()
"""
from __future__ import annotations

import functools
import math
import re
from types import SimpleNamespace
from typing import Any, Mapping

import numpy as np

FLOAT_DTYPES = ("float32", "float64")

# every catalog layer type this translator knows (tests assert it covers layers.LAYERS)
SUPPORTED = frozenset({
    "Convolution", "Pooling", "InnerProduct", "ReLU", "Sigmoid", "TanH", "ELU", "Softplus", "AbsVal",
    "Exp", "Log", "GELU", "Softmax", "LogSoftmax", "Dropout", "BatchNorm", "Concat", "Slice",
    "Eltwise", "Flatten", "Reshape", "SoftmaxWithLoss", "EuclideanLoss", "SigmoidCrossEntropyLoss",
    "Accuracy", "Scale", "MatMul", "Permute", "Tile", "Crop", "Pad", "Reduction", "ArgMax", "Power", "Embed",
    "LayerNorm", "LRN", "Deconvolution", "RNN", "LSTM", "GRU", "MultiHeadAttention",
    "PReLU", "Bias", "Threshold", "Clip", "Swish", "MVN",
    "MultinomialLogisticLoss", "InfogainLoss", "HingeLoss", "ContrastiveLoss", "SPP", "LSTMUnit",
    "CaffeLSTM", "CaffeRNN",
})


def _pair(v) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else (int(v[0]), int(v[1]))


def _torch_dtype(name: str):
    import torch
    return {"float32": torch.float32, "float64": torch.float64,
            "int32": torch.int32, "int64": torch.int64}[name]


@functools.lru_cache(maxsize=None)
def _classes() -> SimpleNamespace:
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


def _lr_mult(layer, index: int) -> float:
    values = getattr(layer, "lr_mult", None)
    if values is None:
        return 1.0
    if isinstance(values, (int, float)):
        return float(values)
    return float(values[index]) if index < len(values) else 1.0


class TorchNet:
    """``net`` in phase ``phase`` as a torch module (``.module``), loaded and read by the
    toolkit's weight keys (LAYER.PARAM).

    dtype: the float dtype of parameters and float inputs (default float32).
    dropout_rng: a numpy Generator to draw Dropout masks exactly as the toolkit does (for
        comparing train steps); without one, train-phase Dropout is torch's own.
    """

    def __init__(self, net, phase: str = "infer", dtype: str | None = None,
                 dropout_rng: np.random.Generator | None = None):
        import torch

        self.net = net
        self.spec = net.spec
        self.phase = phase
        self.dtype = dtype or "float32"
        if self.dtype not in FLOAT_DTYPES:
            raise ValueError(f"dtype must be float32 or float64, got {self.dtype}")
        self.torch_dtype = _torch_dtype(self.dtype)
        self._dropout_rng = dropout_rng
        self.params: dict[str, Any] = {}        # LAYER.PARAM -> nn.Parameter
        self.buffers: dict[str, Any] = {}       # LAYER.PARAM -> state tensor (running statistics)
        self._owners: dict[str, tuple] = {}     # key -> (module, attribute path)
        self._inputs: dict[str, Any] = {}

        loss_layers = set(self.spec.train.losses) if self.spec.train and self.spec.train.losses else None
        self.loss_weights: dict[str, float] = {}
        steps = []
        used_keys: set[str] = set()
        for i, layer in enumerate(self.spec.layers):
            if phase not in layer.phases:
                continue
            if layer.type not in SUPPORTED:
                raise NotImplementedError(f"layer '{layer.name}': type {layer.type} has no torch translation")
            mod, params, buffers = getattr(self, f"_build_{layer.type}")(layer)
            mod = mod.to(self.torch_dtype)
            self._bind(layer, mod, params, buffers)
            key = re.sub(r"[^A-Za-z0-9_]", "_", layer.name)
            while key in used_keys:
                key = f"{key}_{i}"
            used_keys.add(key)
            steps.append((key, layer, mod))
            is_loss = layer.name in loss_layers if loss_layers is not None else layer.type.endswith("Loss")
            if is_loss:
                weights = layer.loss_weight if isinstance(layer.loss_weight, list) else [layer.loss_weight] * len(layer.tops)
                for top, lw in zip(layer.tops, weights):
                    self.loss_weights[top] = 1.0 if lw is None else float(lw)
        self.module = _classes().NetModule(steps)
        self.module.train(phase == "train")
        self._torch = torch

    # -- building ---------------------------------------------------------------------------
    def _owner(self, layer, pname: str = "weight") -> str:
        from schemas.base import weight_owner
        return weight_owner(layer, pname)

    def _declared_shape(self, layer, pname: str) -> tuple:
        key = f"{self._owner(layer, pname)}.{pname}"
        if key not in self.net.declared:
            raise KeyError(f"layer '{layer.name}': the net declares no weight '{key}'")
        return tuple(self.net.declared[key][0])

    def _bind(self, layer, mod, params: dict[str, str], buffers: dict[str, str]) -> None:
        """Register the module's parameters under LAYER.PARAM, or point them at the shared owner's."""
        for index, (pname, path) in enumerate(params.items()):
            owner = self._owner(layer, pname)
            key = f"{owner}.{pname}"
            if owner != layer.name:
                if key not in self.params:
                    raise KeyError(f"layer '{layer.name}': share: '{owner}' above has no parameter '{pname}' "
                                   f"in phase {self.phase}")
                _set_attr(mod, path, self.params[key])
                continue
            p = _get_attr(mod, path)
            p.requires_grad_(_lr_mult(layer, index) != 0)
            self.params[key] = p
            self._owners[key] = (mod, path)
        for pname, path in buffers.items():
            key = f"{self._owner(layer, pname)}.{pname}"
            if key in self.buffers:
                _set_attr(mod, path, self.buffers[key])
            else:
                self.buffers[key] = _get_attr(mod, path)
                self._owners[key] = (mod, path)

    def _build_Convolution(self, p):
        from torch import nn
        o, cg, kh, kw = self._declared_shape(p, "weight")
        mod = nn.Conv2d(cg * p.group, o, (kh, kw), stride=_pair(p.stride), padding=_pair(p.pad),
                        dilation=_pair(p.dilation), groups=p.group, bias=p.bias_term)
        return self._on_channel_axis(p, mod)

    @staticmethod
    def _on_channel_axis(p, mod):
        params = {"weight": "weight", "bias": "bias"} if p.bias_term else {"weight": "weight"}
        if p.axis == 1:
            return mod, params, {}
        return _classes().ChannelAxis(mod, p.axis), {k: f"inner.{v}" for k, v in params.items()}, {}

    def _build_Pooling(self, p):
        from torch import nn
        if p.global_pooling:
            mod = nn.AdaptiveMaxPool2d(1) if p.pool == "max" else nn.AdaptiveAvgPool2d(1)
            return mod, {}, {}
        k, s, pad = _pair(p.kernel_size), _pair(p.stride), _pair(p.pad)   # stride 1 by default (docs/spec.md)
        if p.pool == "max":
            return nn.MaxPool2d(k, s, pad, ceil_mode=p.ceil_mode), {}, {}
        return nn.AvgPool2d(k, s, pad, ceil_mode=p.ceil_mode, count_include_pad=p.count_include_pad), {}, {}

    def _build_InnerProduct(self, p):
        if p.transpose:
            i, o = self._declared_shape(p, "weight")
            mod = _classes().InnerProductT(p.axis, i, o, p.bias_term)
            return mod, ({"weight": "weight", "bias": "bias"} if p.bias_term else {"weight": "weight"}), {}
        o, i = self._declared_shape(p, "weight")
        mod = _classes().InnerProduct(p.axis, i, o, p.bias_term)
        params = {"weight": "linear.weight"}
        if p.bias_term:
            params["bias"] = "linear.bias"
        return mod, params, {}

    def _build_ReLU(self, p):
        from torch import nn
        return (nn.ReLU() if p.negative_slope == 0 else nn.LeakyReLU(float(p.negative_slope))), {}, {}

    def _build_Sigmoid(self, p):
        from torch import nn
        return nn.Sigmoid(), {}, {}

    def _build_TanH(self, p):
        from torch import nn
        return nn.Tanh(), {}, {}

    def _build_ELU(self, p):
        from torch import nn
        return nn.ELU(alpha=float(p.alpha)), {}, {}

    def _build_Softplus(self, p):
        from torch import nn
        return nn.Softplus(beta=1.0, threshold=20.0), {}, {}

    def _build_AbsVal(self, p):
        import torch
        return _classes().Lambda(torch.abs, "abs"), {}, {}

    def _build_Exp(self, p):
        import math

        import torch
        base = math.e if p.base == -1 else float(p.base)
        scale, shift = float(p.scale), float(p.shift)
        return _classes().Lambda(lambda x: torch.pow(torch.tensor(base, dtype=x.dtype), shift + scale * x), "exp"), {}, {}

    def _build_Log(self, p):
        import math

        import torch
        ln = 1.0 if p.base == -1 else math.log(float(p.base))
        scale, shift = float(p.scale), float(p.shift)
        return _classes().Lambda(lambda x: torch.log(shift + scale * x) / ln, "log"), {}, {}

    def _build_GELU(self, p):
        from torch import nn
        return nn.GELU(approximate=p.approximate), {}, {}

    def _build_Softmax(self, p):
        from torch import nn
        return nn.Softmax(dim=p.axis), {}, {}

    def _build_LogSoftmax(self, p):
        from torch import nn
        return nn.LogSoftmax(dim=p.axis), {}, {}

    def _build_Dropout(self, p):
        from torch import nn
        if self.phase != "train" or p.dropout_ratio == 0:
            return nn.Identity(), {}, {}
        if self._dropout_rng is not None:
            return _classes().NumpyDropout(float(p.dropout_ratio), self._dropout_rng), {}, {}
        return nn.Dropout(float(p.dropout_ratio)), {}, {}

    def _build_BatchNorm(self, p):
        channels, = self._declared_shape(p, "running_mean")
        use_global = p.use_global_stats if p.use_global_stats is not None else self.phase != "train"
        mod = _classes().BatchNorm(channels, float(p.eps), float(p.momentum), p.affine,
                                   batch_stats=not use_global, update_running=self.phase == "train")
        params = {"weight": "weight", "bias": "bias"} if p.affine else {}
        return mod, params, {"running_mean": "running_mean", "running_var": "running_var"}

    def _build_Concat(self, p):
        return _classes().Concat(p.axis), {}, {}

    def _build_Slice(self, p):
        return _classes().Slice(p.axis, p.slice_point, len(p.tops)), {}, {}

    def _build_Eltwise(self, p):
        coeff = [float(c) for c in p.coeff] if p.coeff is not None else None
        return _classes().Eltwise(p.operation, coeff), {}, {}

    def _build_Flatten(self, p):
        return _classes().Flatten(p.axis, p.end_axis), {}, {}

    def _build_Reshape(self, p):
        return _classes().Reshape(p.shape, p.axis, p.num_axes), {}, {}

    def _build_Scale(self, p):
        learned = len(p.bottoms) == 1
        weight_shape = self._declared_shape(p, "weight") if learned else None
        bias_shape = self._declared_shape(p, "bias") if p.bias_term else None
        mod = _classes().Scale(p.axis, weight_shape, bias_shape)
        params = {"weight": "weight"} if learned else {}
        if p.bias_term:
            params["bias"] = "bias"
        return mod, params, {}

    # -- the extended catalog -------------------------------------------------------------------
    def _build_MatMul(self, p):
        import torch

        def matmul(a, b):
            return torch.matmul(a.mT if p.transpose_a else a, b.mT if p.transpose_b else b)
        return _classes().Lambda(matmul, "matmul"), {}, {}

    def _build_Permute(self, p):
        order = tuple(p.order)
        return _classes().Lambda(lambda x: x.permute(order), f"permute{order}"), {}, {}

    def _build_Tile(self, p):
        import torch
        return _classes().Lambda(lambda x: torch.cat([x] * p.tiles, dim=p.axis), "tile"), {}, {}

    def _build_Crop(self, p):
        def crop(x, ref):
            axis = p.axis % x.dim()
            offsets = p.offset if isinstance(p.offset, list) else [p.offset] * (x.dim() - axis)
            for a, off in zip(range(axis, x.dim()), offsets):
                x = x.narrow(a, off, ref.shape[a])
            return x
        return _classes().Lambda(crop, "crop"), {}, {}

    def _build_Pad(self, p):
        import torch.nn.functional as F
        flat = [v for pair in reversed(p.pads) for v in pair]        # F.pad: the last axis first
        if p.mode == "constant":
            return _classes().Lambda(lambda x: F.pad(x, flat, value=float(p.value)), "pad"), {}, {}
        return _classes().Lambda(lambda x: F.pad(x, flat, mode=p.mode), f"pad {p.mode}"), {}, {}

    def _build_Reduction(self, p):
        def reduce(x):
            dims = tuple(range(p.axis % x.dim(), x.dim())) if x.dim() else ()
            source = {"sum": x, "mean": x, "asum": x.abs(), "sumsq": x * x}[p.operation]
            if not dims:
                return source * p.coeff
            return (source.mean(dim=dims) if p.operation == "mean" else source.sum(dim=dims)) * p.coeff
        return _classes().Lambda(reduce, f"reduce {p.operation}"), {}, {}

    def _build_ArgMax(self, p):
        import torch

        def argmax(x):
            top = torch.topk(x, p.top_k, dim=p.axis)
            return top.values if p.out_max_val else top.indices.to(x.dtype)
        return _classes().Lambda(argmax, "argmax"), {}, {}

    def _build_Power(self, p):
        import torch
        return _classes().Lambda(lambda x: torch.pow(p.shift + p.scale * x, p.power), "power"), {}, {}

    def _build_Embed(self, p):
        from torch import nn
        rows, width = self._declared_shape(p, "weight")
        return _classes().Embed(nn.Embedding(rows, width), width if p.bias_term else None), \
            ({"weight": "table.weight", "bias": "bias"} if p.bias_term else {"weight": "table.weight"}), {}

    def _build_recurrent(self, p, cls, **extra):
        width = self._declared_shape(p, "weight_ih_l0")[1]
        rnn = cls(width, p.num_output, num_layers=p.num_layers, bias=True, batch_first=True,
                  dropout=float(p.dropout), bidirectional=bool(p.bidirectional), **extra)
        names = [n for n, _ in rnn.named_parameters()]
        return _classes().Recurrent(rnn, bool(p.return_sequence), len(p.tops)), {n: f"rnn.{n}" for n in names}, {}

    def _build_RNN(self, p):
        from torch import nn
        return self._build_recurrent(p, nn.RNN, nonlinearity=p.nonlinearity)

    def _build_LSTM(self, p):
        from torch import nn
        return self._build_recurrent(p, nn.LSTM)

    def _build_GRU(self, p):
        from torch import nn
        return self._build_recurrent(p, nn.GRU)

    def _build_LayerNorm(self, p):
        from torch import nn
        if p.affine:
            shape = self._declared_shape(p, "weight")
            mod = nn.LayerNorm(shape, eps=float(p.eps))
            return mod, {"weight": "weight", "bias": "bias"}, {}
        return _classes().Lambda(
            lambda x: nn.functional.layer_norm(x, x.shape[p.axis % x.dim():], eps=float(p.eps)), "layer_norm"), {}, {}

    def _build_LRN(self, p):
        from torch import nn
        if p.norm_region == "within_channel":
            import torch.nn.functional as F
            n, alpha, beta, k = p.local_size, float(p.alpha), float(p.beta), float(p.k)

            def within(x):
                # Caffe: the average of x^2 over the n x n window (pad (n-1)/2, divided by n^2)
                mean = F.avg_pool2d(x * x, n, stride=1, padding=(n - 1) // 2, count_include_pad=True)
                return x * (k + alpha * mean) ** -beta
            return _classes().Lambda(within, "lrn_within_channel"), {}, {}
        return nn.LocalResponseNorm(p.local_size, float(p.alpha), float(p.beta), float(p.k)), {}, {}

    def _build_PReLU(self, p):
        from torch import nn
        (channels,) = self._declared_shape(p, "weight")
        return nn.PReLU(num_parameters=channels, init=0.25), {"weight": "weight"}, {}

    def _build_Bias(self, p):
        learned = len(p.bottoms) == 1
        return _classes().Bias(p.axis, self._declared_shape(p, "bias") if learned else None), \
            ({"bias": "bias"} if learned else {}), {}

    def _build_Threshold(self, p):
        t = float(p.threshold)
        return _classes().Lambda(lambda x: (x > t).to(x.dtype), "threshold"), {}, {}

    def _build_Clip(self, p):
        import torch
        lo, hi = float(p.min), float(p.max)
        return _classes().Lambda(lambda x: torch.clamp(x, lo, hi), "clip"), {}, {}

    def _build_Swish(self, p):
        import torch
        beta = float(p.beta)
        return _classes().Lambda(lambda x: x * torch.sigmoid(beta * x), "swish"), {}, {}

    def _build_MultinomialLogisticLoss(self, p):
        import torch

        def loss(prob, label):
            picked = prob[torch.arange(prob.shape[0]), label.long()]
            return -torch.log(torch.clamp(picked, min=1e-20)).mean()
        return _classes().Lambda(loss, "multinomial_logistic_loss"), {}, {}

    def _build_InfogainLoss(self, p):
        import torch

        def loss(scores, label, infogain):
            logp = torch.log(torch.clamp(torch.softmax(scores, dim=1), min=1e-20))
            return -(infogain[label.long()] * logp).sum(dim=1).mean()
        if len(p.bottoms) == 3:
            return _classes().Lambda(loss, "infogain_loss"), {}, {}
        # H is the layer's own fixed weight: a buffer, so no gradient reaches it
        mod = _classes().Lambda(lambda scores, label: loss(scores, label, mod.infogain), "infogain_loss")
        mod.register_buffer("infogain", torch.eye(self._declared_shape(p, "infogain")[0]))
        return mod, {}, {"infogain": "infogain"}

    def _build_HingeLoss(self, p):
        import torch
        power = 2 if p.norm == "l2" else 1

        def loss(scores, label):
            t = 2 * torch.nn.functional.one_hot(label.long(), scores.shape[1]).to(scores.dtype) - 1
            return (torch.relu(1 - t * scores) ** power).sum(dim=1).mean()
        return _classes().Lambda(loss, "hinge_loss"), {}, {}

    def _build_ContrastiveLoss(self, p):
        import torch
        margin, legacy = float(p.margin), p.legacy_version

        def loss(a, b, similar):
            y = similar.reshape(-1).to(a.dtype)
            d2 = ((a - b) ** 2).sum(dim=1)
            far = torch.relu(margin - d2) if legacy else torch.relu(margin - d2.sqrt()) ** 2
            return 0.5 * (y * d2 + (1 - y) * far).mean()
        return _classes().Lambda(loss, "contrastive_loss"), {}, {}

    def _build_CaffeLSTM(self, p):
        return self._caffe_recurrent(p, "lstm", ("weight_x", "bias", "weight_static", "weight_h"))

    def _build_CaffeRNN(self, p):
        return self._caffe_recurrent(p, "rnn", ("weight_x", "bias", "weight_static", "weight_h", "weight_out",
                                                "bias_out"))

    def _caffe_recurrent(self, p, kind: str, names):
        shapes = {}
        for name in names:
            key = f"{self._owner(p, name)}.{name}"
            if key in self.net.declared:
                shapes[name] = self._declared_shape(p, name)
        mod = _classes().CaffeRecurrent(kind, shapes, p.expose_hidden)
        return mod, {name: name for name in shapes}, {}

    def _build_SPP(self, p):
        import torch
        import torch.nn.functional as F

        def spp(x):
            h, w = x.shape[2], x.shape[3]
            levels = []
            for level in range(p.pyramid_height):
                bins = 2 ** level
                k = (math.ceil(h / bins), math.ceil(w / bins))
                pad = ((k[0] * bins - h + 1) // 2, (k[1] * bins - w + 1) // 2)
                pooled = (F.max_pool2d(x, k, k, pad, ceil_mode=True) if p.pool == "max"
                          else F.avg_pool2d(x, k, k, pad, ceil_mode=True, count_include_pad=True))
                levels.append(pooled.flatten(1))
            return torch.cat(levels, dim=1)
        return _classes().Lambda(spp, "spp"), {}, {}

    def _build_LSTMUnit(self, p):
        import torch

        def step(c_prev, x, cont):
            i, f, o, g = x.chunk(4, dim=-1)
            c = cont.to(c_prev.dtype).unsqueeze(-1) * torch.sigmoid(f) * c_prev + torch.sigmoid(i) * torch.tanh(g)
            return c, torch.sigmoid(o) * torch.tanh(c)
        return _classes().Lambda(step, "lstm_unit"), {}, {}

    def _build_MVN(self, p):
        axes = tuple(range(1 if p.across_channels else 2, 4))
        eps, scale = float(p.eps), p.normalize_variance

        def mvn(x):
            dims = tuple(a for a in axes if a < x.dim())
            centred = x - x.mean(dim=dims, keepdim=True)
            if not scale:
                return centred
            return centred / ((centred * centred).mean(dim=dims, keepdim=True).sqrt() + eps)
        return _classes().Lambda(mvn, "mvn"), {}, {}

    def _build_Deconvolution(self, p):
        from torch import nn
        i, og, kh, kw = self._declared_shape(p, "weight")
        mod = nn.ConvTranspose2d(i, og * p.group, (kh, kw), stride=_pair(p.stride), padding=_pair(p.pad),
                                 dilation=_pair(p.dilation), groups=p.group, bias=p.bias_term)
        return self._on_channel_axis(p, mod)

    def _build_MultiHeadAttention(self, p):
        _, embed = self._declared_shape(p, "in_proj_weight")
        rng = self._dropout_rng if self.phase == "train" else None
        mod = _classes().MultiHeadAttention(embed, p.num_heads, float(p.dropout), p.bias_term, p.causal, rng)
        params = {"in_proj_weight": "attn.in_proj_weight", "in_proj_bias": "attn.in_proj_bias",
                  "out_proj.weight": "attn.out_proj.weight", "out_proj.bias": "attn.out_proj.bias"}
        if not p.bias_term:
            params = {k: path for k, path in params.items() if "bias" not in k}
        return mod, params, {}

    def _build_SoftmaxWithLoss(self, p):
        return _classes().SoftmaxWithLoss(p.axis, p.ignore_label, p.normalization), {}, {}

    def _build_EuclideanLoss(self, p):
        return _classes().EuclideanLoss(), {}, {}

    def _build_SigmoidCrossEntropyLoss(self, p):
        return _classes().SigmoidCrossEntropyLoss(), {}, {}

    def _build_Accuracy(self, p):
        return _classes().Accuracy(p.axis, p.top_k, p.ignore_label), {}, {}

    # -- weights ----------------------------------------------------------------------------
    @property
    def keys(self) -> list[str]:
        """Every LAYER.PARAM this phase uses: parameters, then state buffers."""
        return list(self.params) + list(self.buffers)

    def load(self, weights: Mapping[str, np.ndarray], strict: bool = True) -> None:
        """Copy the toolkit's arrays into the module. Keys of layers outside this phase are
        ignored; with ``strict`` a key this phase needs and ``weights`` lacks is an error."""
        torch = self._torch
        missing = [k for k in self.keys if k not in weights]
        if missing and strict:
            raise KeyError(f"weights lack {', '.join(missing)}")
        unknown = [k for k in weights if k not in self.net.declared]
        if unknown:
            raise KeyError(f"weights have keys the net does not declare: {', '.join(unknown)}")
        with torch.no_grad():
            for key in self.keys:
                if key not in weights:
                    continue
                target = self.params.get(key, self.buffers.get(key))
                arr = np.asarray(weights[key])
                if tuple(arr.shape) != tuple(target.shape):
                    raise ValueError(f"weight '{key}' has shape {list(arr.shape)}, the module needs "
                                     f"{list(target.shape)}")
                # asarray(order="C"), not ascontiguousarray: that one makes a 0-d weight [1]
                target.copy_(torch.from_numpy(np.asarray(arr, order="C")).to(self.torch_dtype))

    def state(self) -> dict[str, np.ndarray]:
        """Current parameters and buffers (running statistics) by LAYER.PARAM."""
        return {k: t.detach().cpu().numpy().copy() for k, t in {**self.params, **self.buffers}.items()}

    def grads(self) -> dict[str, np.ndarray]:
        """The accumulated gradient of every parameter that has one, by LAYER.PARAM."""
        return {k: p.grad.detach().cpu().numpy().copy() for k, p in self.params.items() if p.grad is not None}

    def input_grads(self) -> dict[str, np.ndarray]:
        """Gradients of the float inputs of the last ``forward(..., requires_grad=True)``."""
        return {k: t.grad.detach().cpu().numpy().copy() for k, t in self._inputs.items()
                if t.requires_grad and t.grad is not None}

    def zero_grad(self) -> None:
        for p in self.params.values():
            p.grad = None

    # -- running ----------------------------------------------------------------------------
    def _input_tensors(self, inputs: Mapping[str, np.ndarray], requires_grad: bool) -> dict:
        torch = self._torch
        out = {}
        for name, decl in self.spec.inputs.items():
            if name not in inputs:
                continue
            if decl.dtype in FLOAT_DTYPES:
                t = torch.tensor(np.asarray(inputs[name]), dtype=self.torch_dtype)
                if requires_grad:
                    t.requires_grad_(True)
            else:
                t = torch.from_numpy(np.asarray(inputs[name], dtype=decl.dtype, order="C"))
            out[name] = t
        return out

    def forward(self, inputs: Mapping[str, np.ndarray], requires_grad: bool = False) -> dict[str, Any]:
        """Every blob of the phase by name (inputs included; in-place tops hold their last value).
        ``requires_grad`` makes the float inputs leaves whose gradients ``input_grads`` reads."""
        torch = self._torch
        self._inputs = self._input_tensors(inputs, requires_grad)
        if requires_grad or self.phase == "train":
            return self.module(self._inputs)
        with torch.no_grad():
            return self.module(self._inputs)

    __call__ = forward

    @property
    def output_names(self) -> list[str]:
        """What the toolkit's graph of this phase outputs: the net's ``outputs`` in phase infer,
        else every top that no later layer consumes (each loss top in phase train)."""
        if self.phase == "infer" and self.spec.outputs:
            return list(self.spec.outputs)
        version: dict[str, int] = {}
        consumed: set[tuple[str, int]] = set()
        counter = 0
        for layer in self.spec.layers:
            if self.phase not in layer.phases:
                continue
            for b in layer.bottoms:
                consumed.add((b, version.get(b, -1)))
            for t in layer.tops:
                counter += 1
                version[t] = counter
        names = [n for n, v in version.items() if (n, v) not in consumed]
        return names + [t for t in self.loss_weights if t not in names]

    def objective(self, blobs: Mapping[str, Any]):
        """The train objective: sum of loss_weight * loss top (as the toolkit's OBJECTIVE)."""
        if not self.loss_weights:
            raise ValueError(f"phase {self.phase} has no loss layer")
        total = None
        for top, w in self.loss_weights.items():
            term = blobs[top] * w if w != 1.0 else blobs[top]
            total = term if total is None else total + term
        return total

    def train_step(self, inputs: Mapping[str, np.ndarray]):
        """Forward and backward of the objective; returns (objective, blobs). Gradients are then
        in ``grads()`` and ``input_grads()``, updated running statistics in ``state()``."""
        self.zero_grad()
        blobs = self.forward(inputs, requires_grad=True)
        total = self.objective(blobs)
        total.backward()
        return total.detach(), blobs


def _get_attr(mod, path: str):
    for part in path.split("."):
        mod = getattr(mod, part)
    return mod


def _set_attr(mod, path: str, value) -> None:
    *parents, last = path.split(".")
    for part in parents:
        mod = getattr(mod, part)
    setattr(mod, last, value)


def to_numpy(blobs: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Detached numpy copies of a dict of tensors."""
    return {k: v.detach().cpu().numpy().copy() for k, v in blobs.items()}
