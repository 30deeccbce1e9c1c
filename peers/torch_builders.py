"""One builder per catalog layer type: the torch module a layer becomes, the parameters it binds
under LAYER.PARAM and its state buffers. Mixed into ``peers.torch_net.TorchNet``, which calls
``_build_<type>(layer)`` for each layer of the phase.
"""
from __future__ import annotations

import math

from .torch_modules import pair, torch_classes


class LayerBuilders:
    """``_build_<type>(layer) -> (module, {param: attribute path}, {buffer: attribute path})``;
    the host class supplies ``_declared_shape``, ``phase`` and ``_dropout_rng``."""

    def _build_Convolution(self, p):
        from torch import nn
        o, cg, kh, kw = self._declared_shape(p, "weight")
        mod = nn.Conv2d(cg * p.group, o, (kh, kw), stride=pair(p.stride), padding=pair(p.pad),
                        dilation=pair(p.dilation), groups=p.group, bias=p.bias_term)
        return self._on_channel_axis(p, mod)

    @staticmethod
    def _on_channel_axis(p, mod):
        params = {"weight": "weight", "bias": "bias"} if p.bias_term else {"weight": "weight"}
        if p.axis == 1:
            return mod, params, {}
        return torch_classes().ChannelAxis(mod, p.axis), {k: f"inner.{v}" for k, v in params.items()}, {}

    def _build_Pooling(self, p):
        from torch import nn
        if p.global_pooling:
            mod = nn.AdaptiveMaxPool2d(1) if p.pool == "max" else nn.AdaptiveAvgPool2d(1)
            return mod, {}, {}
        k, s, pad = pair(p.kernel_size), pair(p.stride), pair(p.pad)   # stride 1 by default (docs/spec.md)
        if p.pool == "max":
            return nn.MaxPool2d(k, s, pad, ceil_mode=p.ceil_mode), {}, {}
        return nn.AvgPool2d(k, s, pad, ceil_mode=p.ceil_mode, count_include_pad=p.count_include_pad), {}, {}

    def _build_InnerProduct(self, p):
        if p.transpose:
            i, o = self._declared_shape(p, "weight")
            mod = torch_classes().InnerProductT(p.axis, i, o, p.bias_term)
            return mod, ({"weight": "weight", "bias": "bias"} if p.bias_term else {"weight": "weight"}), {}
        o, i = self._declared_shape(p, "weight")
        mod = torch_classes().InnerProduct(p.axis, i, o, p.bias_term)
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
        return torch_classes().Lambda(torch.abs, "abs"), {}, {}

    def _build_Exp(self, p):
        import math

        import torch
        base = math.e if p.base == -1 else float(p.base)
        scale, shift = float(p.scale), float(p.shift)
        return torch_classes().Lambda(lambda x: torch.pow(torch.tensor(base, dtype=x.dtype), shift + scale * x),
                                      "exp"), {}, {}

    def _build_Log(self, p):
        import math

        import torch
        ln = 1.0 if p.base == -1 else math.log(float(p.base))
        scale, shift = float(p.scale), float(p.shift)
        return torch_classes().Lambda(lambda x: torch.log(shift + scale * x) / ln, "log"), {}, {}

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
            return torch_classes().NumpyDropout(float(p.dropout_ratio), self._dropout_rng), {}, {}
        return nn.Dropout(float(p.dropout_ratio)), {}, {}

    def _build_BatchNorm(self, p):
        channels, = self._declared_shape(p, "running_mean")
        use_global = p.use_global_stats if p.use_global_stats is not None else self.phase != "train"
        mod = torch_classes().BatchNorm(channels, float(p.eps), float(p.momentum), p.affine,
                                   batch_stats=not use_global, update_running=self.phase == "train")
        params = {"weight": "weight", "bias": "bias"} if p.affine else {}
        return mod, params, {"running_mean": "running_mean", "running_var": "running_var"}

    def _build_Concat(self, p):
        return torch_classes().Concat(p.axis), {}, {}

    def _build_Slice(self, p):
        return torch_classes().Slice(p.axis, p.slice_point, len(p.tops)), {}, {}

    def _build_Eltwise(self, p):
        coeff = [float(c) for c in p.coeff] if p.coeff is not None else None
        return torch_classes().Eltwise(p.operation, coeff), {}, {}

    def _build_Flatten(self, p):
        return torch_classes().Flatten(p.axis, p.end_axis), {}, {}

    def _build_Reshape(self, p):
        return torch_classes().Reshape(p.shape, p.axis, p.num_axes), {}, {}

    def _build_Scale(self, p):
        learned = len(p.bottoms) == 1
        weight_shape = self._declared_shape(p, "weight") if learned else None
        bias_shape = self._declared_shape(p, "bias") if p.bias_term else None
        mod = torch_classes().Scale(p.axis, weight_shape, bias_shape)
        params = {"weight": "weight"} if learned else {}
        if p.bias_term:
            params["bias"] = "bias"
        return mod, params, {}

    # -- the extended catalog -------------------------------------------------------------------
    def _build_MatMul(self, p):
        import torch

        def matmul(a, b):
            return torch.matmul(a.mT if p.transpose_a else a, b.mT if p.transpose_b else b)
        return torch_classes().Lambda(matmul, "matmul"), {}, {}

    def _build_Permute(self, p):
        order = tuple(p.order)
        return torch_classes().Lambda(lambda x: x.permute(order), f"permute{order}"), {}, {}

    def _build_Tile(self, p):
        import torch
        return torch_classes().Lambda(lambda x: torch.cat([x] * p.tiles, dim=p.axis), "tile"), {}, {}

    def _build_Crop(self, p):
        def crop(x, ref):
            axis = p.axis % x.dim()
            offsets = p.offset if isinstance(p.offset, list) else [p.offset] * (x.dim() - axis)
            for a, off in zip(range(axis, x.dim()), offsets):
                x = x.narrow(a, off, ref.shape[a])
            return x
        return torch_classes().Lambda(crop, "crop"), {}, {}

    def _build_Pad(self, p):
        import torch.nn.functional as F
        flat = [v for pair in reversed(p.pads) for v in pair]        # F.pad: the last axis first
        if p.mode == "constant":
            return torch_classes().Lambda(lambda x: F.pad(x, flat, value=float(p.value)), "pad"), {}, {}
        return torch_classes().Lambda(lambda x: F.pad(x, flat, mode=p.mode), f"pad {p.mode}"), {}, {}

    def _build_Reduction(self, p):
        def reduce(x):
            dims = tuple(range(p.axis % x.dim(), x.dim())) if x.dim() else ()
            source = {"sum": x, "mean": x, "asum": x.abs(), "sumsq": x * x}[p.operation]
            if not dims:
                return source * p.coeff
            return (source.mean(dim=dims) if p.operation == "mean" else source.sum(dim=dims)) * p.coeff
        return torch_classes().Lambda(reduce, f"reduce {p.operation}"), {}, {}

    def _build_ArgMax(self, p):
        import torch

        def argmax(x):
            top = torch.topk(x, p.top_k, dim=p.axis)
            return top.values if p.out_max_val else top.indices.to(x.dtype)
        return torch_classes().Lambda(argmax, "argmax"), {}, {}

    def _build_Power(self, p):
        import torch
        return torch_classes().Lambda(lambda x: torch.pow(p.shift + p.scale * x, p.power), "power"), {}, {}

    def _build_Embed(self, p):
        from torch import nn
        rows, width = self._declared_shape(p, "weight")
        return torch_classes().Embed(nn.Embedding(rows, width), width if p.bias_term else None), \
            ({"weight": "table.weight", "bias": "bias"} if p.bias_term else {"weight": "table.weight"}), {}

    def _build_recurrent(self, p, cls, **extra):
        width = self._declared_shape(p, "weight_ih_l0")[1]
        rnn = cls(width, p.num_output, num_layers=p.num_layers, bias=True, batch_first=True,
                  dropout=float(p.dropout), bidirectional=bool(p.bidirectional), **extra)
        names = [n for n, _ in rnn.named_parameters()]
        return torch_classes().Recurrent(rnn, bool(p.return_sequence), len(p.tops)), {n: f"rnn.{n}" for n in names}, {}

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
        return torch_classes().Lambda(
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
            return torch_classes().Lambda(within, "lrn_within_channel"), {}, {}
        return nn.LocalResponseNorm(p.local_size, float(p.alpha), float(p.beta), float(p.k)), {}, {}

    def _build_PReLU(self, p):
        from torch import nn
        (channels,) = self._declared_shape(p, "weight")
        return nn.PReLU(num_parameters=channels, init=0.25), {"weight": "weight"}, {}

    def _build_Bias(self, p):
        learned = len(p.bottoms) == 1
        return torch_classes().Bias(p.axis, self._declared_shape(p, "bias") if learned else None), \
            ({"bias": "bias"} if learned else {}), {}

    def _build_Threshold(self, p):
        t = float(p.threshold)
        return torch_classes().Lambda(lambda x: (x > t).to(x.dtype), "threshold"), {}, {}

    def _build_Clip(self, p):
        import torch
        lo, hi = float(p.min), float(p.max)
        return torch_classes().Lambda(lambda x: torch.clamp(x, lo, hi), "clip"), {}, {}

    def _build_Swish(self, p):
        import torch
        beta = float(p.beta)
        return torch_classes().Lambda(lambda x: x * torch.sigmoid(beta * x), "swish"), {}, {}

    def _build_MultinomialLogisticLoss(self, p):
        import torch

        def loss(prob, label):
            picked = prob[torch.arange(prob.shape[0]), label.long()]
            return -torch.log(torch.clamp(picked, min=1e-20)).mean()
        return torch_classes().Lambda(loss, "multinomial_logistic_loss"), {}, {}

    def _build_InfogainLoss(self, p):
        import torch

        def loss(scores, label, infogain):
            logp = torch.log(torch.clamp(torch.softmax(scores, dim=1), min=1e-20))
            return -(infogain[label.long()] * logp).sum(dim=1).mean()
        if len(p.bottoms) == 3:
            return torch_classes().Lambda(loss, "infogain_loss"), {}, {}
        # H is the layer's own fixed weight: a buffer, so no gradient reaches it
        mod = torch_classes().Lambda(lambda scores, label: loss(scores, label, mod.infogain), "infogain_loss")
        mod.register_buffer("infogain", torch.eye(self._declared_shape(p, "infogain")[0]))
        return mod, {}, {"infogain": "infogain"}

    def _build_HingeLoss(self, p):
        import torch
        power = 2 if p.norm == "l2" else 1

        def loss(scores, label):
            t = 2 * torch.nn.functional.one_hot(label.long(), scores.shape[1]).to(scores.dtype) - 1
            return (torch.relu(1 - t * scores) ** power).sum(dim=1).mean()
        return torch_classes().Lambda(loss, "hinge_loss"), {}, {}

    def _build_ContrastiveLoss(self, p):
        import torch
        margin, legacy = float(p.margin), p.legacy_version

        def loss(a, b, similar):
            y = similar.reshape(-1).to(a.dtype)
            d2 = ((a - b) ** 2).sum(dim=1)
            far = torch.relu(margin - d2) if legacy else torch.relu(margin - d2.sqrt()) ** 2
            return 0.5 * (y * d2 + (1 - y) * far).mean()
        return torch_classes().Lambda(loss, "contrastive_loss"), {}, {}

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
        mod = torch_classes().CaffeRecurrent(kind, shapes, p.expose_hidden)
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
        return torch_classes().Lambda(spp, "spp"), {}, {}

    def _build_LSTMUnit(self, p):
        import torch

        def step(c_prev, x, cont):
            i, f, o, g = x.chunk(4, dim=-1)
            c = cont.to(c_prev.dtype).unsqueeze(-1) * torch.sigmoid(f) * c_prev + torch.sigmoid(i) * torch.tanh(g)
            return c, torch.sigmoid(o) * torch.tanh(c)
        return torch_classes().Lambda(step, "lstm_unit"), {}, {}

    def _build_MVN(self, p):
        axes = tuple(range(1 if p.across_channels else 2, 4))
        eps, scale = float(p.eps), p.normalize_variance

        def mvn(x):
            dims = tuple(a for a in axes if a < x.dim())
            centred = x - x.mean(dim=dims, keepdim=True)
            if not scale:
                return centred
            return centred / ((centred * centred).mean(dim=dims, keepdim=True).sqrt() + eps)
        return torch_classes().Lambda(mvn, "mvn"), {}, {}

    def _build_Deconvolution(self, p):
        from torch import nn
        i, og, kh, kw = self._declared_shape(p, "weight")
        mod = nn.ConvTranspose2d(i, og * p.group, (kh, kw), stride=pair(p.stride), padding=pair(p.pad),
                                 dilation=pair(p.dilation), groups=p.group, bias=p.bias_term)
        return self._on_channel_axis(p, mod)

    def _build_MultiHeadAttention(self, p):
        _, embed = self._declared_shape(p, "in_proj_weight")
        rng = self._dropout_rng if self.phase == "train" else None
        mod = torch_classes().MultiHeadAttention(embed, p.num_heads, float(p.dropout), p.bias_term, p.causal, rng)
        params = {"in_proj_weight": "attn.in_proj_weight", "in_proj_bias": "attn.in_proj_bias",
                  "out_proj.weight": "attn.out_proj.weight", "out_proj.bias": "attn.out_proj.bias"}
        if not p.bias_term:
            params = {k: path for k, path in params.items() if "bias" not in k}
        return mod, params, {}

    def _build_SoftmaxWithLoss(self, p):
        return torch_classes().SoftmaxWithLoss(p.axis, p.ignore_label, p.normalization), {}, {}

    def _build_EuclideanLoss(self, p):
        return torch_classes().EuclideanLoss(), {}, {}

    def _build_SigmoidCrossEntropyLoss(self, p):
        return torch_classes().SigmoidCrossEntropyLoss(), {}, {}

    def _build_Accuracy(self, p):
        return torch_classes().Accuracy(p.axis, p.top_k, p.ignore_label), {}, {}

    # -- weights ----------------------------------------------------------------------------
