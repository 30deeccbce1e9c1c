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

import re
from typing import Any, Mapping

import numpy as np

from .torch_builders import LayerBuilders
from .torch_modules import torch_classes, torch_dtype

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


def _lr_mult(layer, index: int) -> float:
    values = getattr(layer, "lr_mult", None)
    if values is None:
        return 1.0
    if isinstance(values, (int, float)):
        return float(values)
    return float(values[index]) if index < len(values) else 1.0


class TorchNet(LayerBuilders):
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
        self.torch_dtype = torch_dtype(self.dtype)
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
                weights = (layer.loss_weight if isinstance(layer.loss_weight, list)
                           else [layer.loss_weight] * len(layer.tops))
                for top, lw in zip(layer.tops, weights):
                    self.loss_weights[top] = 1.0 if lw is None else float(lw)
        self.module = torch_classes().NetModule(steps)
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
