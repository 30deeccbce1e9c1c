"""A net's infer phase as an ONNX model, built with ``onnx.helper`` from the Net spec.

For benchmarks and cross-checks against ONNX Runtime; ``onnx`` is a bench extra, imported inside
functions only. The model is built layer by layer from the YAML spec (not from the toolkit's
lowered graph), so it is an independent reading of the layer semantics:

    model = build_onnx_model(net, weights, bindings={"N": 64})

Supported layer types are listed in ``SUPPORTED``; any other type on the path to an output raises
``UnsupportedLayer`` naming the layer. Layers that no output depends on (losses, Accuracy in
other phases, dead branches) are skipped, as the toolkit's dead-code pass does.
"""
from __future__ import annotations

from typing import Callable, Mapping

import numpy as np

from schemas.base import weight_owner
from toolkit.errors import UserError
from toolkit.ir.dims import Sym, evaluate, format_dim
from toolkit.onnxtypes import ONNX_TYPE_NUMBER

OPSET = 17
IR_VERSION = 8


class UnsupportedLayer(UserError):
    """The net uses a layer type (or a setting of one) the ONNX builder cannot express."""


class _Ctx:
    """What one layer's converter gets: the ONNX names of its bottoms, and helpers to add nodes."""

    def __init__(self, builder: "_Builder", layer, bottoms: list[str]):
        self.builder = builder
        self.layer = layer
        self.bottoms = bottoms

    def fresh(self, hint: str = "t") -> str:
        return self.builder.unique(f"{self.layer.name}/{hint}")

    def node(self, op: str, inputs: list[str], outputs: list[str] | None = None, **attrs) -> str:
        from onnx import helper
        outputs = outputs or [self.fresh(op.lower())]
        self.builder.nodes.append(helper.make_node(op, inputs, outputs, name=outputs[0], **attrs))
        return outputs[0]

    def weight(self, pname: str, transform: Callable[[np.ndarray], np.ndarray] | None = None) -> str:
        key = f"{weight_owner(self.layer, pname)}.{pname}"
        if key not in self.builder.weights:
            raise UserError(f"ONNX export: no weight '{key}' for layer '{self.layer.name}'")
        arr = self.builder.weights[key]
        return self.builder.initializer(key if transform is None else f"{key}/{transform.__name__}",
                                        arr if transform is None else transform(arr))

    def const(self, arr: np.ndarray, hint: str = "const") -> str:
        return self.builder.initializer(self.fresh(hint), np.asarray(arr))

    def unsupported(self, what: str):
        raise UnsupportedLayer(f"ONNX export: layer '{self.layer.name}' ({self.layer.type}): {what}")


class _Builder:
    def __init__(self, weights: Mapping[str, np.ndarray], dtype: str):
        self.weights = weights
        self.dtype = dtype
        self.nodes: list = []
        self.inits: dict[str, object] = {}
        self.names: set[str] = set()
        self.rank: dict[str, int] = {}              # onnx name -> rank, where known

    def unique(self, name: str) -> str:
        base, i = name, 1
        while name in self.names:
            i += 1
            name = f"{base}_{i}"
        self.names.add(name)
        return name

    def initializer(self, name: str, arr: np.ndarray) -> str:
        from onnx import numpy_helper
        if name not in self.inits:
            if arr.dtype.kind == "f":
                arr = arr.astype(self.dtype)
            self.inits[name] = numpy_helper.from_array(np.ascontiguousarray(arr), name)
            self.names.add(name)
        return name


def _pair(v) -> list[int]:
    return [v, v] if isinstance(v, int) else [int(v[0]), int(v[1])]


def _transpose(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a.T)


# -- converters: each returns the names of its tops, in order ---------------------------------
def _convolution(c: _Ctx, p) -> list[str]:
    (x,) = c.bottoms
    if p.axis != 1:
        c.unsupported(f"axis {p.axis} (the ONNX builder takes the channel axis 1 only)")
    kh, kw = _pair(p.kernel_size)
    ph, pw = _pair(p.pad)
    inputs = [x, c.weight("weight")] + ([c.weight("bias")] if p.bias_term else [])
    return [c.node("Conv", inputs, kernel_shape=[kh, kw], strides=_pair(p.stride), pads=[ph, pw, ph, pw],
                   dilations=_pair(p.dilation), group=int(p.group))]


def _pooling(c: _Ctx, p) -> list[str]:
    (x,) = c.bottoms
    if p.global_pooling:
        return [c.node("GlobalAveragePool" if p.pool == "ave" else "GlobalMaxPool", [x])]
    if p.kernel_size is None:
        c.unsupported("needs kernel_size or global_pooling")
    kh, kw = _pair(p.kernel_size)
    ph, pw = _pair(p.pad)
    attrs = dict(kernel_shape=[kh, kw], strides=_pair(p.stride), pads=[ph, pw, ph, pw],
                 ceil_mode=int(p.ceil_mode))
    # ceil_mode: the toolkit drops a last window that would start in the right padding, as
    # PyTorch does. ONNX Runtime's kernels do the same (its shape inference does not, and may
    # warn that the output shape differs from the declared one); the compare check guards it.
    if p.pool == "max":
        return [c.node("MaxPool", [x], **attrs)]
    if p.ceil_mode and p.count_include_pad and (ph or pw):
        # PyTorch (and the toolkit) clip the divisor of an overhanging last window to the padded
        # input; ONNX's AveragePool does not say so, and runtimes differ.
        c.unsupported("average pooling with ceil_mode, padding and count_include_pad has no "
                      "agreed ONNX meaning")
    return [c.node("AveragePool", [x], count_include_pad=int(p.count_include_pad), **attrs)]


def _inner_product(c: _Ctx, p) -> list[str]:
    (x,) = c.bottoms
    rank = c.builder.rank.get(x)
    axis = p.axis if p.axis >= 0 or rank is None else p.axis % rank
    if axis < 0:
        c.unsupported(f"negative axis {p.axis} on a bottom of unknown rank")
    if axis == 1:
        flat = x if rank == 2 else c.node("Flatten", [x], axis=1)
        inputs = [flat, c.weight("weight")] + ([c.weight("bias")] if p.bias_term else [])
        return [c.node("Gemm", inputs, transB=1)]
    # [d0 .. d(axis-1), features] @ W^T (+ b): MatMul broadcasts over the leading axes
    rows = c.node("Reshape", [x, c.const(np.array([0] * axis + [-1], np.int64), "shape")])
    y = c.node("MatMul", [rows, c.weight("weight", _transpose)])
    return [c.node("Add", [y, c.weight("bias")]) if p.bias_term else y]


def _relu(c: _Ctx, p) -> list[str]:
    if p.negative_slope == 0:
        return [c.node("Relu", c.bottoms)]
    return [c.node("LeakyRelu", c.bottoms, alpha=float(p.negative_slope))]


def _elu(c: _Ctx, p) -> list[str]:
    return [c.node("Elu", c.bottoms, alpha=float(p.alpha))]


def _gelu(c: _Ctx, p) -> list[str]:
    if p.approximate != "none":
        c.unsupported("only approximate: none is exported")
    (x,) = c.bottoms
    dt = c.builder.dtype
    e = c.node("Erf", [c.node("Div", [x, c.const(np.array(np.sqrt(2.0), dt))])])
    half_x = c.node("Mul", [x, c.const(np.array(0.5, dt))])
    return [c.node("Mul", [half_x, c.node("Add", [e, c.const(np.array(1.0, dt))])])]


def _simple(op: str):
    def convert(c: _Ctx, p) -> list[str]:
        return [c.node(op, c.bottoms)]
    return convert


def _softmax(op: str):
    def convert(c: _Ctx, p) -> list[str]:
        return [c.node(op, c.bottoms, axis=int(p.axis))]
    return convert


def _flatten(c: _Ctx, p) -> list[str]:
    (x,) = c.bottoms
    rank = c.builder.rank.get(x)
    if p.end_axis != -1 and (rank is None or p.end_axis % rank != rank - 1):
        c.unsupported("only end_axis: -1 is exported")
    axis = p.axis % rank if rank is not None else p.axis
    if axis < 0:
        c.unsupported(f"negative axis {p.axis} on a bottom of unknown rank")
    return [c.node("Reshape", [x, c.const(np.array([0] * axis + [-1], np.int64), "shape")])]


def _reshape(c: _Ctx, p) -> list[str]:
    # Caffe's 0 (copy) and -1 (infer) mean the same in ONNX Reshape with allowzero = 0
    return [c.node("Reshape", [c.bottoms[0], c.const(np.array(p.shape, np.int64), "shape")])]


def _concat(c: _Ctx, p) -> list[str]:
    if len(c.bottoms) == 1:
        return [c.node("Identity", c.bottoms)]
    return [c.node("Concat", c.bottoms, axis=int(p.axis))]


def _eltwise(c: _Ctx, p) -> list[str]:
    if p.operation == "prod":
        return [c.node("Mul", c.bottoms)] if len(c.bottoms) == 2 else _fold(c, "Mul")
    if p.operation == "max":
        return [c.node("Max", c.bottoms)]
    terms = c.bottoms
    if p.coeff is not None:
        dt = c.builder.dtype
        terms = [b if float(k) == 1.0 else c.node("Mul", [b, c.const(np.array(float(k), dt), "coeff")])
                 for b, k in zip(c.bottoms, p.coeff)]
    return [c.node("Sum", terms)]


def _fold(c: _Ctx, op: str) -> list[str]:
    out = c.bottoms[0]
    for b in c.bottoms[1:]:
        out = c.node(op, [out, b])
    return [out]


def _dropout(c: _Ctx, p) -> list[str]:
    return [c.node("Identity", c.bottoms)]          # inverted dropout: identity at inference


def _batch_norm(c: _Ctx, p) -> list[str]:
    if p.use_global_stats is False:
        c.unsupported("use_global_stats: false normalises with batch statistics at inference")
    (x,) = c.bottoms
    mean, var = c.weight("running_mean"), c.weight("running_var")
    if p.affine:
        scale, bias = c.weight("weight"), c.weight("bias")
    else:
        n = c.builder.weights[f"{weight_owner(p, 'running_mean')}.running_mean"].shape[0]
        scale = c.const(np.ones(n, c.builder.dtype), "scale")
        bias = c.const(np.zeros(n, c.builder.dtype), "bias")
    return [c.node("BatchNormalization", [x, scale, bias, mean, var], epsilon=float(p.eps))]


def _scale(c: _Ctx, p) -> list[str]:
    # ONNX's Mul/Add broadcast numpy-style from the right, so the scale gets trailing 1s that
    # line it up with axis: the learned weight and bias as reshaped initializers, a second
    # bottom through a Reshape (0 keeps its dimensions).
    x = c.bottoms[0]
    rank = c.builder.rank.get(x)
    if rank is None:
        c.unsupported("a bottom of unknown rank")
    if len(c.bottoms) == 2:
        scale = c.bottoms[1]
        k = c.builder.rank.get(scale)
        if k is None:
            c.unsupported("a scale bottom of unknown rank")
    else:
        learned = c.builder.weights.get(f"{weight_owner(p, 'weight')}.weight")
        if learned is None:
            c.weight("weight")                      # raises the missing-weight error
        k = learned.ndim
        scale = None
    axis = rank if k == 0 else p.axis % rank
    trailing = rank - axis - k

    def lined_up(a: np.ndarray) -> np.ndarray:
        return a.reshape(a.shape + (1,) * trailing)
    lined_up.__name__ = f"trailing{trailing}"       # the initializer's name: one per layout

    if scale is None:
        scale = c.weight("weight", lined_up)
    elif trailing:
        scale = c.node("Reshape", [scale, c.const(np.array([0] * k + [1] * trailing, np.int64), "shape")])
    y = c.node("Mul", [x, scale])
    return [c.node("Add", [y, c.weight("bias", lined_up)]) if p.bias_term else y]


CONVERTERS: dict[str, Callable[[_Ctx, object], list[str]]] = {
    "Convolution": _convolution,
    "Pooling": _pooling,
    "InnerProduct": _inner_product,
    "ReLU": _relu,
    "ELU": _elu,
    "GELU": _gelu,
    "Sigmoid": _simple("Sigmoid"),
    "TanH": _simple("Tanh"),
    "AbsVal": _simple("Abs"),
    "Exp": _simple("Exp"),
    "Log": _simple("Log"),
    "Softplus": _simple("Softplus"),
    "Softmax": _softmax("Softmax"),
    "LogSoftmax": _softmax("LogSoftmax"),
    "Flatten": _flatten,
    "Reshape": _reshape,
    "Concat": _concat,
    "Eltwise": _eltwise,
    "Dropout": _dropout,
    "BatchNorm": _batch_norm,
    "Scale": _scale,
}
SUPPORTED = tuple(sorted(CONVERTERS))

# output rank of each converter given its first bottom's rank (None: unknown), for axis handling
_RANK_RULES: dict[str, Callable[[object, int | None], int | None]] = {
    "InnerProduct": lambda p, r: None if r is None else (p.axis % r) + 1,
    "Flatten": lambda p, r: None if r is None else (p.axis % r) + 1,
    "Reshape": lambda p, r: len(p.shape),
    "Pooling": lambda p, r: 4,
    "Convolution": lambda p, r: 4,
}


def live_layers(layers, inputs, outputs) -> list[bool]:
    """Which layers of the phase an output depends on, following in-place tops as new versions."""
    version: dict[str, int] = {name: 0 for name in inputs}
    producer: dict[tuple[str, int], int] = {}
    uses: list[list[tuple[str, int]]] = []
    for i, layer in enumerate(layers):
        uses.append([(b, version.get(b, -1)) for b in layer.bottoms])
        for t in layer.tops:
            version[t] = version.get(t, 0) + 1
            producer[(t, version[t])] = i
    live = [False] * len(layers)
    todo = [(o, version.get(o, -1)) for o in outputs]
    while todo:
        key = todo.pop()
        i = producer.get(key)
        if i is None or live[i]:
            continue
        live[i] = True
        todo.extend(uses[i])
    return live


def _dims(shape, bindings: Mapping[str, int] | None) -> list:
    out = []
    for d in shape:
        if isinstance(d, Sym):
            if bindings is not None and d.symbols <= set(bindings):
                out.append(int(evaluate(d, bindings)))
            else:
                out.append(format_dim(d))
        else:
            out.append(int(d))
    return out


def build_onnx_model(net, weights: Mapping[str, np.ndarray], bindings: Mapping[str, int] | None = None,
                     phase: str = "infer", outputs: list[str] | None = None, dtype: str = "float32"):
    """The ONNX ModelProto of ``net``'s ``phase`` with ``weights`` as initializers.

    ``bindings`` fixes symbolic dimensions (e.g. ``{"N": 64}``); without them they stay named
    (``dim_param``). ``outputs`` defaults to the outputs of the toolkit's graph of the phase.
    """
    import onnx
    from onnx import helper

    if dtype != "float32":
        raise UnsupportedLayer(f"ONNX export: dtype {dtype} is not supported (float32 only)")
    graph = net.graph(phase, dtype, outputs)
    out_names = list(outputs or graph.outputs)

    layers = [layer for layer in net.spec.layers if phase in layer.phases]
    live = live_layers(layers, list(graph.inputs), out_names)
    b = _Builder(weights, dtype)
    current: dict[str, str] = {}                    # blob name -> onnx name of its latest version
    graph_inputs = []
    for name, v in graph.inputs.items():
        graph_inputs.append(helper.make_tensor_value_info(name, ONNX_TYPE_NUMBER[v.dtype], _dims(v.shape, bindings)))
        current[name] = b.unique(name)
        b.rank[name] = v.rank
    b.names.update(out_names)                       # keep the outputs' names free for them

    for layer, needed in zip(layers, live):
        if not needed:
            continue
        convert = CONVERTERS.get(layer.type)
        if convert is None:
            raise UnsupportedLayer(f"ONNX export: layer '{layer.name}' has type {layer.type}, which is not "
                                   f"supported (supported: {', '.join(SUPPORTED)})")
        ctx = _Ctx(b, layer, [current[x] for x in layer.bottoms])
        tops = convert(ctx, layer)
        in_rank = b.rank.get(ctx.bottoms[0]) if ctx.bottoms else None
        rule = _RANK_RULES.get(layer.type)
        out_rank = rule(layer, in_rank) if rule else in_rank
        for tname, onnx_name in zip(layer.tops, tops):
            current[tname] = onnx_name
            if out_rank is not None:
                b.rank[onnx_name] = out_rank

    graph_outputs = []
    for name in out_names:
        v = graph.outputs[name]
        src = current[name]
        if src != name:                             # give the output its blob's name
            b.nodes.append(helper.make_node("Identity", [src], [name], name=f"{name}/output"))
        graph_outputs.append(helper.make_tensor_value_info(name, ONNX_TYPE_NUMBER[v.dtype], _dims(v.shape, bindings)))

    g = helper.make_graph(b.nodes, net.name, graph_inputs, graph_outputs, list(b.inits.values()))
    model = helper.make_model(g, producer_name="toolkit", opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    return model
