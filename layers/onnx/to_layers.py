"""An ONNX graph written as the catalog's layers, where every node it runs maps to one: a Conv as a
Convolution, a Gemm as an InnerProduct, a BatchNormalization as a BatchNorm, and so on. The
import has been run first (``convert``), so what each ONNX value is, a constant or a computed
value with its shape, is known; nodes that compute constants only (shape arithmetic) are not
layers. ``to_layers`` gives the net file's data and its weights, or the nodes that kept it from
being a net of layers, each with the reason."""
from __future__ import annotations

import numpy as np

from toolkit.importers.onnx.netfile import blob_name, blob_names
from toolkit.ir.graph import Value


class NotALayer(Exception):
    """A node with no layer of the catalog (or a setting no layer has)."""


class Writer:
    def __init__(self, imp, model):
        self.imp = imp
        self.env = imp.env
        self.layers: list[dict] = []
        self.weights: dict[str, np.ndarray] = {}
        self.names: set[str] = set()
        self.alias: dict[str, str] = {}            # an Identity's output -> the blob it passes on
        self.derived: dict[str, np.ndarray] = {}
        self.consumers: dict[str, list] = {}
        self.absorbed: set[int] = set()            # ids of nodes folded into the layer before them
        for node in model.graph.node:
            for n in node.input:
                self.consumers.setdefault(n, []).append(node)
        self.outputs = {o.name for o in model.graph.output}
        # value names as blob names, one to one and as the net's inputs and the ONNX layer name them
        self.blobs = blob_names(model)[0]

    def _blob(self, raw: str) -> str:
        return self.blobs.get(raw) or blob_name(raw)

    def bias_after(self, node, channels: int, rank: int):
        """The bias an Add right after ``node`` adds (a constant of ``channels`` along axis 1 for a
        convolution, the last axis otherwise), absorbed into this node's layer; else None."""
        out = node.output[0]
        users = self.consumers.get(out, [])
        if len(users) != 1 or out in self.outputs or users[0].op_type != "Add":
            return None
        add = users[0]
        other = add.input[1] if add.input[0] == out else add.input[0]
        if self.computed(other):
            return None
        bias = self.const(other)
        squeezed = bias.reshape(-1) if bias.size == channels else None
        if squeezed is None:
            return None
        want = (channels,) + (1,) * (rank - 2) if rank == 4 else (channels,)
        if bias.shape not in (want, (1,) + want, (channels,)) or (rank == 4 and bias.shape == (channels,)):
            return None
        self.absorbed.add(id(add))
        self.alias[add.output[0]] = out
        return squeezed

    def blob(self, name: str) -> str:
        return self._blob(self.alias.get(name, name))

    def derive(self, nodes) -> None:
        """Values computed from weights and constants only (a transposed weight): evaluated here,
        so that they are a layer's weights rather than layers."""
        from onnx.reference import ReferenceEvaluator
        for node in nodes:
            names = [n for n in node.input if n]
            if not names or not any(self.computed(o) for o in node.output if o):
                continue
            if any(self.computed(n) for n in names) or node.op_type in ("If", "Loop", "Scan"):
                continue
            try:
                outs = ReferenceEvaluator(node).run(None, {n: self.const(n) for n in names})
            except Exception:            # left as a layer, which will say what it lacks
                continue
            for o, arr in zip(node.output, outs):
                self.derived[o] = np.asarray(arr)

    def const(self, name: str) -> np.ndarray:
        if name in self.derived:
            return self.derived[name]
        x = self.env.get(name)
        if isinstance(x, Value):
            if x.name in self.imp.weights:          # a weight: the initializer's array
                return np.asarray(self.imp.weights[x.name])
            raise NotALayer(f"'{name}' is computed, where a layer holds a weight")
        if x is None:
            raise NotALayer(f"'{name}' is not known")
        return np.asarray(x)

    def computed(self, name: str) -> bool:
        if name in self.derived:
            return False
        x = self.env.get(name)
        return isinstance(x, Value) and x.name not in self.imp.weights

    def add(self, node, kind: str, bottoms: list[str], params: dict, weights: dict | None = None) -> None:
        base = blob_name(node.name or node.output[0])
        name, i = base, 1
        while name in self.names:
            i += 1
            name = f"{base}_{i}"
        self.names.add(name)
        tops = [self._blob(o) for o in node.output if o][:1]
        entry = {"name": name, "type": kind, "bottom": bottoms[0] if len(bottoms) == 1 else bottoms,
                 "top": tops[0], **params}
        self.layers.append(entry)
        for pname, arr in (weights or {}).items():
            self.weights[f"{name}.{pname}"] = np.asarray(arr, dtype=np.float32)


def _attr(imp, node, name, default=None):
    return imp.attr(node, name, default)


def _pads_2d(imp, node) -> int | list[int]:
    auto = _attr(imp, node, "auto_pad", "NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    if auto not in ("NOTSET", "", "VALID"):
        raise NotALayer(f"auto_pad {auto}")
    pads = list(_attr(imp, node, "pads", [0, 0, 0, 0])) if auto != "VALID" else [0, 0, 0, 0]
    if len(pads) != 4 or pads[:2] != pads[2:]:
        raise NotALayer(f"pads {pads} (a layer pads both sides alike)")
    return pads[0] if pads[0] == pads[1] else pads[:2]


def _pair(values) -> int | list[int]:
    values = [int(v) for v in values]
    return values[0] if values[0] == values[1] else values


def _conv(w: Writer, node):
    imp = w.imp
    x = w.env[node.input[0]]
    if not isinstance(x, Value) or x.rank != 4:
        raise NotALayer("a convolution of a 4-d input only")
    weight = w.const(node.input[1])
    params = {"num_output": int(weight.shape[0]), "kernel_size": _pair(weight.shape[2:])}
    for key, onnx_key, default in (("stride", "strides", 1), ("dilation", "dilations", 1)):
        value = _pair(_attr(imp, node, onnx_key, [1, 1]))
        if value != default:
            params[key] = value
    pad = _pads_2d(imp, node)
    if pad != 0:
        params["pad"] = pad
    group = int(_attr(imp, node, "group", 1))
    if group != 1:
        params["group"] = group
    weights = {"weight": weight}
    if len(node.input) > 2 and node.input[2]:
        weights["bias"] = w.const(node.input[2])
    else:
        _following_bias(w, node, int(weight.shape[0]), 4, params, weights)
    w.add(node, "Convolution", [w.blob(node.input[0])], params, weights)


def _following_bias(w: Writer, node, channels: int, rank: int, params: dict, weights: dict) -> None:
    """The bias of an Add right after the node, taken into its layer; else no bias term."""
    bias = w.bias_after(node, channels, rank)
    if bias is not None:
        weights["bias"] = bias
    else:
        params["bias_term"] = False


def _gemm(w: Writer, node):
    imp = w.imp
    if _attr(imp, node, "transA", 0) or float(_attr(imp, node, "alpha", 1.0)) != 1.0:
        raise NotALayer("transA or alpha")
    weight = w.const(node.input[1])
    if not _attr(imp, node, "transB", 0):
        weight = weight.T
    params = {"num_output": int(weight.shape[0])}
    weights = {"weight": weight}
    if len(node.input) > 2 and node.input[2]:
        bias = w.const(node.input[2]) * float(_attr(imp, node, "beta", 1.0))
        weights["bias"] = np.broadcast_to(bias, (weight.shape[0],)).copy()
    else:
        _following_bias(w, node, int(weight.shape[0]), 2, params, weights)
    w.add(node, "InnerProduct", [w.blob(node.input[0])], params, weights)


def _matmul(w: Writer, node):
    x = w.env[node.input[0]]
    if not w.computed(node.input[0]) or w.computed(node.input[1]):
        if w.computed(node.input[0]) and w.computed(node.input[1]):
            w.add(node, "MatMul", [w.blob(n) for n in node.input], {})
            return
        raise NotALayer("a constant first operand")
    weight = w.const(node.input[1])
    if weight.ndim != 2:
        raise NotALayer("a weight of more than two axes")
    params = {"num_output": int(weight.shape[1])}
    if x.rank != 2:
        params["axis"] = x.rank - 1
    weights = {"weight": weight.T}
    _following_bias(w, node, int(weight.shape[1]), 2, params, weights)
    w.add(node, "InnerProduct", [w.blob(node.input[0])], params, weights)


def _pool(w: Writer, node):
    imp = w.imp
    kind = "max" if node.op_type == "MaxPool" else "ave"
    params = {"pool": kind, "kernel_size": _pair(_attr(imp, node, "kernel_shape"))}
    stride = _pair(_attr(imp, node, "strides", [1, 1]))
    params["stride"] = stride
    pad = _pads_2d(imp, node)
    if pad != 0:
        params["pad"] = pad
    if any(int(d) != 1 for d in _attr(imp, node, "dilations", [1, 1])):
        raise NotALayer("dilated pooling")
    if _attr(imp, node, "ceil_mode", 0):
        params["ceil_mode"] = True
    if kind == "ave":
        params["count_include_pad"] = bool(_attr(imp, node, "count_include_pad", 0))
    if node.op_type == "MaxPool" and len(node.output) > 1 and node.output[1]:
        raise NotALayer("the indices output")
    w.add(node, "Pooling", [w.blob(node.input[0])], params)


def _batch_norm(w: Writer, node):
    imp = w.imp
    scale, bias, mean, var = (w.const(n) for n in node.input[1:5])
    params = {"eps": float(_attr(imp, node, "epsilon", 1e-5)), "use_global_stats": True}
    w.add(node, "BatchNorm", [w.blob(node.input[0])], params,
          {"weight": scale, "bias": bias, "running_mean": mean, "running_var": var})


def _simple(kind: str, **fixed):
    def write(w: Writer, node):
        w.add(node, kind, [w.blob(node.input[0])], dict(fixed))
    return write


def _relu_like(w: Writer, node):
    alpha = float(w.imp.attr(node, "alpha", 0.01))
    w.add(node, "ReLU", [w.blob(node.input[0])], {"negative_slope": alpha})


def _elu(w: Writer, node):
    w.add(node, "ELU", [w.blob(node.input[0])], {"alpha": float(w.imp.attr(node, "alpha", 1.0))})


def _eltwise(operation: str):
    def write(w: Writer, node):
        if len(node.input) == 2 and node.op_type in ("Add", "Mul") and not all(w.computed(n) for n in node.input):
            _affine(w, node)
            return
        if not all(w.computed(n) for n in node.input):
            raise NotALayer("a constant operand (a layer's operands are both computed)")
        w.add(node, "Eltwise", [w.blob(n) for n in node.input], {"operation": operation})
    return write


def _affine(w: Writer, node):
    """x (+ - * /) a constant: a number as a Power layer (scale, shift); one value per index of an
    axis (a BatchNorm written out) as a Scale or Bias layer along that axis."""
    first, second = node.input[:2]
    if w.computed(first) == w.computed(second):
        raise NotALayer("no computed operand")
    x_name, c_name = (first, second) if w.computed(first) else (second, first)
    x, c = w.env[x_name], w.const(c_name)
    op = node.op_type
    if op in ("Sub", "Div") and x_name != first:
        if op == "Div":
            raise NotALayer("a constant divided by a computed value")
        c = -c                        # c - x = -(x) + c: Power below with scale -1
    if c.size == 1:
        value = float(c.reshape(-1)[0])
        params = {"Add": {"shift": value}, "Mul": {"scale": value}, "Div": {"scale": 1.0 / value},
                  "Sub": {"shift": value} if x_name != first else {"shift": -value}}[op]
        if op == "Sub" and x_name != first:
            params["scale"] = -1.0
        w.add(node, "Power", [w.blob(x_name)], params)
        return
    shape = list(c.shape)
    while shape and shape[0] == 1 and len(shape) > 1:
        shape.pop(0)
    axis = x.rank - len(shape)
    if (axis < 0 or any(d != 1 for d in shape[1:]) or x.shape[axis] != shape[0]
            or op in ("Sub", "Div") and x_name != first):
        raise NotALayer(f"a constant of shape {list(c.shape)} (a layer scales or shifts one axis)")
    values = c.reshape(-1).astype(np.float64)
    if op == "Sub":
        values = -values
    if op == "Div":
        values = 1.0 / values
    kind, key = ("Scale", "weight") if op in ("Mul", "Div") else ("Bias", "bias")
    params = {"axis": axis} if axis != 1 else {}
    w.add(node, kind, [w.blob(x_name)], params, {key: values})


def _concat(w: Writer, node):
    if not all(w.computed(n) for n in node.input):
        raise NotALayer("a constant operand")
    w.add(node, "Concat", [w.blob(n) for n in node.input], {"axis": int(w.imp.attr(node, "axis"))})


def _softmax(kind: str):
    def write(w: Writer, node):
        w.add(node, kind, [w.blob(node.input[0])], {"axis": int(w.imp.attr(node, "axis", -1))})
    return write


def _flatten(w: Writer, node):
    axis = int(w.imp.attr(node, "axis", 1))
    w.add(node, "Flatten", [w.blob(node.input[0])], {"axis": axis})


def _reshape(w: Writer, node):
    """Flatten where the new shape merges the trailing axes; else Caffe's Reshape, a dimension
    kept in place written 0 and one symbolic dimension -1."""
    x, y = w.env[node.input[0]], w.env[node.output[0]]
    r = y.rank
    if 1 <= r <= x.rank and tuple(y.shape[:r - 1]) == tuple(x.shape[:r - 1]):
        w.add(node, "Flatten", [w.blob(node.input[0])], {"axis": r - 1})
        return
    dims = []
    for i, d in enumerate(y.shape):
        if i < x.rank and d == x.shape[i]:
            dims.append(0)
        elif isinstance(d, int):
            dims.append(d)
        else:
            dims.append(-1)
    if dims.count(-1) > 1:
        raise NotALayer("a new shape of several symbolic dimensions")
    w.add(node, "Reshape", [w.blob(node.input[0])], {"shape": dims})


def _transpose(w: Writer, node):
    x = w.env[node.input[0]]
    perm = w.imp.attr(node, "perm", list(range(x.rank))[::-1])
    w.add(node, "Permute", [w.blob(node.input[0])], {"order": [int(p) for p in perm]})


def _lrn(w: Writer, node):
    imp = w.imp
    w.add(node, "LRN", [w.blob(node.input[0])],
          {"local_size": int(imp.attr(node, "size")), "alpha": float(imp.attr(node, "alpha", 1e-4)),
           "beta": float(imp.attr(node, "beta", 0.75)), "k": float(imp.attr(node, "bias", 1.0))})


def _clip(w: Writer, node):
    bounds = []
    for index in (1, 2):
        name = node.input[index] if len(node.input) > index and node.input[index] else None
        bounds.append(None if name is None else float(w.const(name).reshape(-1)[0]))
    if None in bounds:
        if bounds == [0.0, None]:
            w.add(node, "ReLU", [w.blob(node.input[0])], {})
            return
        raise NotALayer("a one-sided clip")
    w.add(node, "Clip", [w.blob(node.input[0])], {"min": bounds[0], "max": bounds[1]})


def _global_pool(w: Writer, node):
    w.add(node, "Pooling", [w.blob(node.input[0])],
          {"pool": "ave" if node.op_type == "GlobalAveragePool" else "max", "global_pooling": True})


def _reduce(w: Writer, node):
    """ReduceMean (ReduceSum) over the image axes of [N, C, H, W], kept: a global average Pooling;
    over every axis from some axis on, dropped: Caffe's Reduction."""
    x = w.env[node.input[0]]
    if len(node.input) > 1 and node.input[1]:
        axes = [int(a) % x.rank for a in w.const(node.input[1]).reshape(-1)]
    else:
        axes = [int(a) % x.rank for a in (w.imp.attr(node, "axes") or range(x.rank))]
    keep = bool(w.imp.attr(node, "keepdims", 1))
    mean = node.op_type == "ReduceMean"
    if mean and keep and x.rank == 4 and sorted(axes) == [2, 3]:
        w.add(node, "Pooling", [w.blob(node.input[0])], {"pool": "ave", "global_pooling": True})
        return
    if not keep and sorted(axes) == list(range(min(axes), x.rank)):
        w.add(node, "Reduction", [w.blob(node.input[0])], {"operation": "mean" if mean else "sum",
                                                            "axis": min(axes)})
        return
    raise NotALayer(f"axes {axes} with keepdims {int(keep)} (Reduction drops every axis from one on)")


WRITERS = {
    "Conv": _conv, "Gemm": _gemm, "MatMul": _matmul, "MaxPool": _pool, "AveragePool": _pool,
    "GlobalAveragePool": _global_pool, "GlobalMaxPool": _global_pool, "BatchNormalization": _batch_norm,
    "Relu": _simple("ReLU"), "LeakyRelu": _relu_like, "Elu": _elu, "Sigmoid": _simple("Sigmoid"),
    "Tanh": _simple("TanH"), "Abs": _simple("AbsVal"), "Add": _eltwise("sum"), "Sum": _eltwise("sum"),
    "Sub": _affine, "Div": _affine, "ReduceMean": _reduce, "ReduceSum": _reduce,
    "Mul": _eltwise("prod"), "Max": _eltwise("max"), "Concat": _concat, "Softmax": _softmax("Softmax"),
    "LogSoftmax": _softmax("LogSoftmax"), "Flatten": _flatten, "Reshape": _reshape, "Transpose": _transpose,
    "LRN": _lrn, "Clip": _clip,
}


def to_layers(imp, model, nodes) -> tuple[list[dict], dict[str, np.ndarray], list[str]]:
    """(layers, weights by key, problems): the nodes that compute something at run time as the
    catalog's layers; ``problems`` names each node that has no layer (then the others are moot)."""
    w = Writer(imp, model)
    w.derive(nodes)
    problems = []
    for node in nodes:
        if not any(w.computed(o) for o in node.output if o) or id(node) in w.absorbed:
            continue                     # folded at import (constants, shape arithmetic), or a bias taken in
        if node.op_type in ("Identity", "Dropout"):
            w.alias[node.output[0]] = w.alias.get(node.input[0], node.input[0])
            continue
        writer = WRITERS.get(node.op_type)
        try:
            if writer is None:
                raise NotALayer(f"no layer of the catalog is an ONNX {node.op_type}")
            writer(w, node)
        except NotALayer as e:
            problems.append(f"node '{node.name or node.output[0]}' ({node.op_type}): {e}")
    # a graph output that an Identity passes on: the layer that computes it writes that name
    renames = {}
    for info in model.graph.output:
        source = w.alias.get(info.name)
        if source is not None and w.computed(source) and w._blob(source) not in renames:
            renames[w._blob(source)] = w._blob(info.name)
    for layer in w.layers:
        for key in ("bottom", "top"):
            value = layer[key]
            layer[key] = [renames.get(v, v) for v in value] if isinstance(value, list) else renames.get(value, value)
    return w.layers, w.weights, problems
