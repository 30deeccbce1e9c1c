"""The toolkit's graph of primitive ops written as an ONNX model.

Export works on the lowered graph, not on the layers: every layer of both catalogs lowers to the
primitives below, so a net exports whenever its primitives do, and the ONNX model computes what
the toolkit's graph computes. Each primitive maps to one ONNX node or a few; ``loop`` becomes
``Scan`` (sequences) or ``Loop`` (a trip count, an early stop), ``if`` becomes ``If``, with the
bodies as subgraphs that read outer values by name.

Symbolic dimensions stay symbolic: a shape that holds ``N`` (or ``N*T``) is computed at run time
from the graph inputs' ``Shape``, so the batch (and any other named input dimension) is dynamic
in the model. A primitive with no ONNX counterpart raises ``ExportError`` naming the layer it was
lowered from (the node's scope).

``onnx`` is an optional extra, imported inside functions only.
"""
from __future__ import annotations

from typing import Callable, Mapping

import numpy as np

from ..errors import UserError
from ..ir.dims import Sym, format_dim
from ..ir.graph import Graph, Node, Value
from ..onnxtypes import ONNX_TYPE_NUMBER

DEFAULT_OPSET = 17
MIN_OPSET = 13


class ExportError(UserError):
    """The graph holds something ONNX cannot express; the message names the layer."""


def _dim_param(d) -> int | str:
    return int(d) if isinstance(d, int) else format_dim(d)


class _Names:
    """Unique ONNX names across the model and its subgraphs (ONNX's scoping rule)."""

    def __init__(self):
        self.taken: set[str] = set()

    def fresh(self, hint: str) -> str:
        hint = hint or "t"
        name, i = hint, 1
        while name in self.taken:
            i += 1
            name = f"{hint}_{i}"
        self.taken.add(name)
        return name


class _Model:
    """What the whole export shares: names, initializers, the top graph's dimension tensors."""

    def __init__(self, opset: int, names: _Names):
        self.opset = opset
        self.names = names
        self.inits: dict[str, object] = {}
        self.top_nodes: list = []            # the top graph's node list (dimension tensors go there)
        self.symbol_source: dict[str, tuple[str, int]] = {}    # symbol -> (input name, axis)
        self.dim_cache: dict[object, str] = {}

    def initializer(self, arr: np.ndarray, hint: str, name: str | None = None) -> str:
        from onnx import numpy_helper
        name = name or self.names.fresh(hint)
        # (np.ascontiguousarray would make a 0-d array 1-d)
        self.inits[name] = numpy_helper.from_array(np.array(arr, order="C"), name)
        return name

    def const_i64(self, values, hint: str = "const") -> str:
        key = ("i64", tuple(int(v) for v in values))
        if key not in self.dim_cache:
            self.dim_cache[key] = self.initializer(np.array(values, np.int64), hint)
        return self.dim_cache[key]

    def top_node(self, op: str, inputs: list[str], hint: str, **attrs) -> str:
        from onnx import helper
        out = self.names.fresh(hint)
        self.top_nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    # -- symbolic dimensions as int64 [1] tensors, built once in the top graph ------------------
    def symbol(self, name: str) -> str:
        key = ("sym", name)
        if key not in self.dim_cache:
            if name not in self.symbol_source:
                raise ExportError(f"ONNX export: the dimension '{name}' is no graph input's dimension")
            source, axis = self.symbol_source[name]
            shape = self.top_node("Shape", [source], f"shape_of_{source}")
            self.dim_cache[key] = self.top_node("Slice", [shape, self.const_i64([axis]), self.const_i64([axis + 1])],
                                                f"dim_{name}")
        return self.dim_cache[key]

    def dim(self, d) -> str:
        """An int64 [1] tensor holding dimension ``d`` (a number or a polynomial of symbols)."""
        if isinstance(d, int):
            return self.const_i64([d])
        key = ("dim", d)
        if key in self.dim_cache:
            return self.dim_cache[key]
        total = None
        for mono, coeff in sorted(d.terms.items()):
            term = None
            for s in mono:
                term = self.symbol(s) if term is None else self.top_node("Mul", [term, self.symbol(s)], "dim_mul")
            if term is None:
                term = self.const_i64([coeff])
            elif coeff != 1:
                term = self.top_node("Mul", [term, self.const_i64([coeff])], "dim_mul")
            total = term if total is None else self.top_node("Add", [total, term], "dim_add")
        self.dim_cache[key] = total
        return total

    def shape(self, dims) -> str:
        """An int64 [rank] tensor of the shape ``dims``."""
        dims = tuple(dims)
        if all(isinstance(d, int) for d in dims):
            return self.const_i64(dims, "shape")
        key = ("shape", dims)
        if key not in self.dim_cache:
            self.dim_cache[key] = self.top_node("Concat", [self.dim(d) for d in dims], "shape", axis=0)
        return self.dim_cache[key]


class _Scope:
    """One graph being written (the top graph or a body): its nodes and the ONNX name of each Value."""

    def __init__(self, model: _Model, names: dict[int, str], nodes: list):
        self.model = model
        self.names = names
        self.nodes = nodes
        self.node: Node | None = None        # the node being converted

    def name(self, v: Value) -> str:
        return self.names[v.id]

    def emit(self, op: str, inputs: list[str], n_out: int = 1, hint: str | None = None, **attrs) -> list[str]:
        from onnx import helper
        base = f"{self.node.scope}/{hint or op}" if self.node is not None and self.node.scope else (hint or op)
        outs = [self.model.names.fresh(base) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=outs[0], **attrs))
        return outs

    def one(self, op: str, inputs: list[str], hint: str | None = None, **attrs) -> str:
        return self.emit(op, inputs, 1, hint, **attrs)[0]

    def scalar(self, value, dtype: str) -> str:
        key = ("scalar", dtype, float(value))
        if key not in self.model.dim_cache:
            self.model.dim_cache[key] = self.model.initializer(np.array(value, dtype=dtype), "scalar")
        return self.model.dim_cache[key]

    def fail(self, what: str):
        layer = self.node.scope if self.node is not None else "?"
        raise ExportError(f"ONNX export: layer '{layer}': {what}")


Converter = Callable[[_Scope, Node, list[str]], list[str]]
CONVERT: dict[str, Converter] = {}


def converts(*ops: str):
    def register(fn):
        for op in ops:
            CONVERT[op] = fn
        return fn
    return register


# -- elementwise --------------------------------------------------------------------------------
_SAME = {"add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div", "maximum": "Max", "abs": "Abs", "exp": "Exp",
         "log": "Log", "neg": "Neg", "relu": "Relu", "sigmoid": "Sigmoid", "tanh": "Tanh", "sqrt": "Sqrt",
         "softplus": "Softplus", "sign": "Sign", "erf": "Erf"}


@converts(*_SAME)
def _same(s: _Scope, node: Node, ins: list[str]) -> list[str]:
    return [s.one(_SAME[node.op], ins)]


@converts("square")
def _square(s, node, ins):
    return [s.one("Mul", [ins[0], ins[0]])]


@converts("rsqrt")
def _rsqrt(s, node, ins):
    return [s.one("Reciprocal", [s.one("Sqrt", ins)])]


@converts("power")
def _power(s, node, ins):
    return [s.one("Pow", [ins[0], s.scalar(node.attrs["exponent"], node.inputs[0].dtype)])]


@converts("elu", "leaky_relu")
def _alpha_activation(s, node, ins):
    return [s.one({"elu": "Elu", "leaky_relu": "LeakyRelu"}[node.op], ins, alpha=float(node.attrs["alpha"]))]


@converts("gelu")
def _gelu(s, node, ins):
    x, dt = ins[0], node.inputs[0].dtype
    if node.attrs["approximate"] == "tanh":
        cube = s.one("Mul", [s.one("Mul", [x, x]), x])
        inner = s.one("Mul", [s.one("Add", [x, s.one("Mul", [cube, s.scalar(0.044715, dt)])]),
                              s.scalar(np.sqrt(2 / np.pi), dt)])
        core = s.one("Tanh", [inner])
    else:
        core = s.one("Erf", [s.one("Mul", [x, s.scalar(1 / np.sqrt(2), dt)])])
    return [s.one("Mul", [s.one("Mul", [x, s.scalar(0.5, dt)]), s.one("Add", [core, s.scalar(1.0, dt)])])]


@converts("sigmoid_cross_entropy")
def _sigmoid_ce(s, node, ins):
    x, t = ins
    dt = node.inputs[0].dtype
    zero, one = s.scalar(0.0, dt), s.scalar(1.0, dt)
    soft = s.one("Log", [s.one("Add", [one, s.one("Exp", [s.one("Neg", [s.one("Abs", [x])])])])])
    return [s.one("Add", [s.one("Sub", [s.one("Max", [x, zero]), s.one("Mul", [x, t])]), soft])]


@converts("ge_mask")
def _ge_mask(s, node, ins):
    return [s.one("Cast", [s.one("GreaterOrEqual", ins)], to=ONNX_TYPE_NUMBER[node.outputs[0].dtype])]


@converts("select")
def _select(s, node, ins):
    cond, a, b = ins
    test = s.one("Greater", [cond, s.scalar(0, node.inputs[0].dtype)])
    return [s.one("Where", [test, a, b])]


@converts("cast")
def _cast(s, node, ins):
    return [s.one("Cast", ins, to=ONNX_TYPE_NUMBER[node.attrs["dtype"]])]


@converts("scalar")
def _scalar(s, node, ins):
    return [s.scalar(node.attrs["value"], node.attrs["dtype"])]


@converts("constant")
def _constant(s, node, ins):
    return [s.model.initializer(np.asarray(node.attrs["value"]).astype(node.outputs[0].dtype), "constant")]


# -- shapes -------------------------------------------------------------------------------------
@converts("reshape")
def _reshape(s, node, ins):
    return [s.one("Reshape", [ins[0], s.model.shape(node.attrs["shape"])])]


@converts("iota")
def _iota(s, node, ins):
    """Positions: a constant for a fixed shape; else Range over the dimension's run-time size,
    reshaped onto its axis and expanded to the shape (a causal mask over a dynamic T)."""
    shape, dtype = tuple(node.attrs["shape"]), node.attrs["dtype"]
    axis = node.attrs["axis"] % len(shape)
    along = [-1 if k == axis else 1 for k in range(len(shape))]
    if all(isinstance(d, int) for d in shape):
        value = np.broadcast_to(np.arange(shape[axis]).reshape(along), shape).astype(dtype)
        return [s.model.initializer(value, "iota")]
    limit = s.one("Reshape", [s.model.dim(shape[axis]), s.model.const_i64([], "scalar_shape")])
    ramp = s.one("Range", [s.scalar(0, "int64"), limit, s.scalar(1, "int64")])
    ramp = s.one("Cast", [ramp], to=ONNX_TYPE_NUMBER[dtype])
    return [s.one("Expand", [s.one("Reshape", [ramp, s.model.const_i64(along)]), s.model.shape(shape)])]


@converts("broadcast_to")
def _broadcast_to(s, node, ins):
    return [s.one("Expand", [ins[0], s.model.shape(node.attrs["shape"])])]


@converts("transpose")
def _transpose(s, node, ins):
    return [s.one("Transpose", ins, perm=[int(p) for p in node.attrs["perm"]])]


@converts("concat")
def _concat(s, node, ins):
    return [s.one("Concat", ins, axis=int(node.attrs["axis"]))] if len(ins) > 1 else [s.one("Identity", ins)]


@converts("slice")
def _slice(s, node, ins):
    a = node.attrs
    axis = a["axis"] % node.inputs[0].rank
    return [s.one("Slice", [ins[0], s.model.dim(a["start"]), s.model.dim(a["stop"]), s.model.const_i64([axis])])]


@converts("pad_axis")
def _pad_axis(s, node, ins):
    a, rank = node.attrs, node.inputs[0].rank
    axis = a["axis"] % rank
    if not all(isinstance(d, int) for d in (a["before"], a["after"])):
        pads = [s.model.dim(a["before"] if i == axis else 0) for i in range(rank)] + \
               [s.model.dim(a["after"] if i == axis else 0) for i in range(rank)]
        return [s.one("Pad", [ins[0], s.model.top_node("Concat", pads, "pads", axis=0)])]
    pads = [0] * (2 * rank)
    pads[axis], pads[rank + axis] = a["before"], a["after"]
    return [s.one("Pad", [ins[0], s.model.const_i64(pads, "pads")])]


def _reduce(s: _Scope, op: str, node: Node, ins: list[str]) -> str:
    axes = [int(x) % max(node.inputs[0].rank, 1) for x in node.attrs["axes"]]
    if not axes:
        return s.one("Identity", ins)
    keep = int(bool(node.attrs["keepdims"]))
    # ReduceSum takes its axes as an input from opset 13, the other reductions from opset 18
    if op == "ReduceSum" or s.model.opset >= 18:
        return s.one(op, [ins[0], s.model.const_i64(axes, "axes")], keepdims=keep)
    return s.one(op, ins, axes=axes, keepdims=keep)


@converts("reduce_sum", "reduce_mean")
def _reductions(s, node, ins):
    return [_reduce(s, {"reduce_sum": "ReduceSum", "reduce_mean": "ReduceMean"}[node.op], node, ins)]


# -- linear algebra, convolution, pooling -------------------------------------------------------
def _swap_last(s: _Scope, x: str, rank: int) -> str:
    perm = list(range(rank))
    perm[-2:] = perm[-1], perm[-2]
    return s.one("Transpose", [x], perm=perm)


@converts("matmul")
def _matmul(s, node, ins):
    a, b = ins
    if node.attrs["trans_a"]:
        a = _swap_last(s, a, node.inputs[0].rank)
    if node.attrs["trans_b"]:
        b = _swap_last(s, b, node.inputs[1].rank)
    return [s.one("MatMul", [a, b])]


@converts("conv2d")
def _conv(s, node, ins):
    a = node.attrs
    (ph, pw) = a["pad"]
    kh, kw = node.inputs[1].shape[2:]
    return [s.one("Conv", ins, kernel_shape=[kh, kw], strides=list(a["stride"]), pads=[ph, pw, ph, pw],
                  dilations=list(a["dilation"]), group=int(a["group"]))]


@converts("conv2d_grad_input")
def _conv_transpose(s, node, ins):
    a = node.attrs
    (sh, sw), (ph, pw), (dh, dw) = a["stride"], a["pad"], a["dilation"]
    h, w = node.inputs[0].shape[2:]
    kh, kw = node.inputs[1].shape[2:]
    oh, ow = a["input_hw"]
    if not all(isinstance(d, int) for d in (h, w)):
        s.fail("a transposed convolution over a symbolic image size")
    extra = [oh - ((h - 1) * sh - 2 * ph + dh * (kh - 1) + 1), ow - ((w - 1) * sw - 2 * pw + dw * (kw - 1) + 1)]
    return [s.one("ConvTranspose", ins, kernel_shape=[kh, kw], strides=[sh, sw], pads=[ph, pw, ph, pw],
                  dilations=[dh, dw], group=int(a["group"]), output_padding=extra)]


@converts("max_pool2d", "avg_pool2d")
def _pool(s, node, ins):
    a = node.attrs
    (ph, pw) = a["pad"]
    attrs = dict(kernel_shape=list(a["kernel"]), strides=list(a["stride"]), pads=[ph, pw, ph, pw],
                 ceil_mode=int(a["ceil_mode"]))
    if node.op == "max_pool2d":
        return [s.one("MaxPool", ins, **attrs)]
    if a["ceil_mode"] and a["count_include_pad"] and (ph or pw):
        # the toolkit (as PyTorch) divides an overhanging last window by its part inside the padded
        # input, which ONNX leaves open: the padding made real zeros, then count_include_pad=0
        # divides by the part inside them; a last window that would start in the right padding,
        # which PyTorch drops and ONNX may not, is cut off after
        padded = s.one("Pad", [ins[0], s.model.const_i64([0, 0, ph, pw, 0, 0, ph, pw], "pads")])
        y = s.one("AveragePool", [padded], count_include_pad=0, **{**attrs, "pads": [0, 0, 0, 0]})
        oh, ow = node.outputs[0].shape[2:]
        return [s.one("Slice", [y, s.model.const_i64([0, 0]), s.model.shape((oh, ow)), s.model.const_i64([2, 3])])]
    return [s.one("AveragePool", ins, count_include_pad=int(a["count_include_pad"]), **attrs)]


# -- softmax, indexing, losses -------------------------------------------------------------------
@converts("softmax", "log_softmax")
def _softmax(s, node, ins):
    return [s.one({"softmax": "Softmax", "log_softmax": "LogSoftmax"}[node.op], ins, axis=int(node.attrs["axis"]))]


@converts("embedding")
def _embedding(s, node, ins):
    return [s.one("Gather", ins, axis=0)]


@converts("topk")
def _topk(s, node, ins):
    a = node.attrs
    values, indices = s.emit("TopK", [ins[0], s.model.const_i64([a["k"]])], 2, axis=int(a["axis"]))
    return [values] if a["values"] else [s.one("Cast", [indices], to=ONNX_TYPE_NUMBER[node.outputs[0].dtype])]


def _class_axis_last(s: _Scope, x: str, rank: int, axis: int) -> str:
    axis %= rank
    if axis == rank - 1:
        return x
    perm = [i for i in range(rank) if i != axis] + [axis]
    return s.one("Transpose", [x], perm=perm)


@converts("nll_loss")
def _nll_loss(s, node, ins):
    logp, label = ins
    rank, axis = node.inputs[0].rank, node.attrs["axis"] % node.inputs[0].rank
    if axis != 1:
        perm = [0, axis] + [i for i in range(1, rank) if i != axis] if axis else None
        if perm is None:
            s.fail("a class axis 0")
        logp = s.one("Transpose", [logp], perm=perm)
    label = s.one("Cast", [label], to=ONNX_TYPE_NUMBER["int64"])
    attrs = {"reduction": "mean"}
    if node.attrs.get("ignore_index") is not None:
        attrs["ignore_index"] = int(node.attrs["ignore_index"])
    return [s.one("NegativeLogLikelihoodLoss", [logp, label], **attrs)]


@converts("accuracy")
def _accuracy(s, node, ins):
    scores, label = ins
    rank = node.inputs[0].rank
    flat = _class_axis_last(s, scores, rank, node.attrs["axis"])
    dt = node.inputs[0].dtype
    lab = s.one("Unsqueeze", [s.one("Cast", [label], to=ONNX_TYPE_NUMBER["int64"]), s.model.const_i64([-1])])
    true_score = s.one("GatherElements", [flat, lab], axis=-1)
    higher = s.one("ReduceSum", [s.one("Cast", [s.one("Greater", [flat, true_score])], to=ONNX_TYPE_NUMBER[dt]),
                                 s.model.const_i64([-1])], keepdims=0)
    hit = s.one("Cast", [s.one("Less", [higher, s.scalar(float(node.attrs["top_k"]), dt)])], to=ONNX_TYPE_NUMBER[dt])
    return [s.one("ReduceMean", [hit], keepdims=0)]          # no axes: every axis, in every opset


# -- control flow -------------------------------------------------------------------------------
def _value_info(name: str, v: Value):
    from onnx import helper
    return helper.make_tensor_value_info(name, ONNX_TYPE_NUMBER[v.dtype], [_dim_param(d) for d in v.shape])


OUTER = "\0outer:"          # marks a body input that reads an outer value by its name


def _outer(name: str) -> str:
    return OUTER + name


def _body(s: _Scope, graph: Graph, formal: list, label: str, loop_flag: int | None = None):
    """A subgraph of ``graph``. ``formal`` pairs each body input with its ONNX input name, or with
    ``_outer(name)`` where it reads an outer value (ONNX bodies see the outer scope). With
    ``loop_flag`` (0 or 1) it is a Loop body: its first output is the go-on condition, the body's
    own flag converted to bool, or the condition passed through."""
    from onnx import helper
    names: dict[int, str] = {}
    inputs = []
    for v, name in formal:
        if name.startswith(OUTER):
            names[v.id] = name[len(OUTER):]
        else:
            if v.id is not None:
                names[v.id] = name
            inputs.append(_value_info(name, v))
    scope = _Scope(s.model, names, [])
    _convert_nodes(scope, graph.nodes)
    outputs = []
    body_outputs = list(graph.outputs.values())
    if loop_flag == 0:
        cond = s.model.names.fresh(f"{label}/cond_out")
        scope.nodes.append(helper.make_node("Identity", [formal[1][1]], [cond], name=cond))
        outputs.append(helper.make_tensor_value_info(cond, ONNX_TYPE_NUMBER["bool"], []))
    for i, v in enumerate(body_outputs):
        name = s.model.names.fresh(f"{label}/out")
        if loop_flag == 1 and i == 0:
            scope.nodes.append(helper.make_node("Cast", [scope.name(v)], [name], name=name, to=ONNX_TYPE_NUMBER["bool"]))
            outputs.append(helper.make_tensor_value_info(name, ONNX_TYPE_NUMBER["bool"], []))
            continue
        scope.nodes.append(helper.make_node("Identity", [scope.name(v)], [name], name=name))
        outputs.append(_value_info(name, v))
    return helper.make_graph(scope.nodes, label, inputs, outputs)


@converts("loop")
def _loop(s, node, ins):
    a = node.attrs
    body, k, n_scan = a["body"].graph, a["carried"], a["scanned"]
    formals = list(body.inputs.values())
    flag = 1 if a["condition"] else 0
    init = []
    for i in range(k):          # a carry that enters narrower ([1, H]) than the body carries it ([N, H])
        x, formal = node.inputs[i], formals[i]
        init.append(ins[i] if tuple(x.shape) == tuple(formal.shape)
                    else s.one("Expand", [ins[i], s.model.shape(formal.shape)], hint="carry"))
    label = s.model.names.fresh(f"{node.scope}/loop_body")
    closure = [(v, _outer(ins[k + n_scan + j])) for j, v in enumerate(formals[k + n_scan:])]
    if n_scan and not flag:
        own = [(v, s.model.names.fresh(f"{label}/in")) for v in formals[:k + n_scan]]
        graph = _body(s, body, own + closure, label)
        direction = [1 if a["reverse"] else 0]
        n_out = len(body.outputs) - k
        return s.emit("Scan", init + ins[k:k + n_scan], k + n_out, hint="scan", body=graph, num_scan_inputs=n_scan,
                      scan_input_directions=direction * n_scan, scan_output_directions=direction * n_out)
    if n_scan:
        s.fail("a loop over sequences that can stop early")
    # a trip count (and an optional stop flag): ONNX Loop, whose body takes (iteration, condition, carries)
    stubs = [(_Stub("int64"), s.model.names.fresh(f"{label}/iteration")),
             (_Stub("bool"), s.model.names.fresh(f"{label}/cond_in"))]
    own = [(v, s.model.names.fresh(f"{label}/in")) for v in formals[:k]]
    graph = _body(s, body, stubs + own + closure, label, loop_flag=flag)
    # a loop whose trips are a bound it must not reach (an imported while-loop's) is written as one
    trips = None if a.get("unfinished") else a.get("trips")
    count = "" if trips is None else s.one("Squeeze", [s.model.dim(trips), s.model.const_i64([0])], hint="trips")
    go = s.model.initializer(np.array(True), "go")
    n_out = len(body.outputs) - flag - k
    return s.emit("Loop", [count, go] + init, k + n_out, hint="loop", body=graph)


class _Stub:
    """A scalar body input of ONNX's own (Loop's iteration number and condition): no Value."""

    def __init__(self, dtype: str):
        self.dtype, self.shape, self.id = dtype, (), None


@converts("if")
def _if(s, node, ins):
    a = node.attrs
    branches = {}
    for key in ("then_body", "else_body"):
        body = a[key].graph
        label = s.model.names.fresh(f"{node.scope}/{key}")
        formal = [(v, _outer(ins[1 + j])) for j, v in enumerate(body.inputs.values())]
        branches[key] = _body(s, body, formal, label)
    cond = ins[0] if node.inputs[0].dtype == "bool" else s.one("Cast", [ins[0]], to=ONNX_TYPE_NUMBER["bool"])
    return s.emit("If", [cond], len(node.outputs), hint="if", then_branch=branches["then_body"],
                  else_branch=branches["else_body"])


# -- the whole graph ----------------------------------------------------------------------------
def _convert_nodes(scope: _Scope, nodes: list[Node]) -> None:
    for node in nodes:
        scope.node = node
        convert = CONVERT.get(node.op)
        if convert is None:
            scope.fail(f"the primitive '{node.op}' has no ONNX counterpart here")
        outs = convert(scope, node, [scope.name(v) for v in node.inputs])
        for v, name in zip(node.outputs, outs):
            scope.names[v.id] = name
    scope.node = None


def _live(graph: Graph) -> list[Node]:
    """The nodes some output depends on, in order."""
    producer = {o.id: n for n in graph.nodes for o in n.outputs}
    live: set[int] = set()
    todo = [v for v in graph.outputs.values()]
    while todo:
        v = todo.pop()
        n = producer.get(v.id)
        if n is None or id(n) in live:
            continue
        live.add(id(n))
        todo.extend(n.inputs)
    return [n for n in graph.nodes if id(n) in live]


def export_graph(graph: Graph, weights: Mapping[str, np.ndarray], name: str, opset: int = DEFAULT_OPSET,
                 metadata: Mapping[str, str] | None = None, input_transforms: Mapping[str, dict] | None = None):
    """The ONNX ModelProto of ``graph`` with ``weights`` (by key) as initializers, checked by
    ``onnx.checker`` (full check: with shape inference). ``input_transforms``: per graph input, the
    record of its transform's steps (onnx_transform.py), written as nodes in front of the graph:
    the model then takes the raw input."""
    from .onnx_transform import raw_dims, transform_nodes
    import onnx
    from onnx import helper
    if not MIN_OPSET <= opset <= onnx.defs.onnx_opset_version():
        raise UserError(f"--opset {opset}: choose one from {MIN_OPSET} to {onnx.defs.onnx_opset_version()}")
    names = _Names()
    model = _Model(opset, names)
    value_names: dict[int, str] = {}
    graph_inputs = []
    transforms = {k: r for k, r in (input_transforms or {}).items() if k in graph.inputs}
    for input_name, v in graph.inputs.items():
        names.taken.add(input_name)
        value_names[v.id] = input_name
        dims = [_dim_param(d) for d in v.shape]
        if input_name in transforms:
            dims = raw_dims(input_name, dims, transforms[input_name])
        graph_inputs.append(helper.make_tensor_value_info(input_name, ONNX_TYPE_NUMBER[v.dtype], dims))
        for axis, d in enumerate(v.shape):
            if isinstance(d, Sym) and len(d.terms) == 1 and list(d.terms.items())[0][1] == 1 \
                    and len(list(d.terms)[0]) == 1:
                model.symbol_source.setdefault(list(d.terms)[0][0], (input_name, axis))
    names.taken.update(graph.outputs)
    nodes = _live(graph)
    used = {v.id for n in nodes for v in n.inputs} | {v.id for v in graph.outputs.values()}
    for key, w in graph.weights.items():
        if w.value.id not in used:
            continue
        if key not in weights:
            raise UserError(f"ONNX export: no array for weight '{key}'")
        names.taken.add(key)
        arr = np.asarray(weights[key]).astype(w.value.dtype, copy=False)
        model.initializer(arr, key, name=key)
        value_names[w.value.id] = key
    front = []
    for input_name, record in transforms.items():
        v = graph.inputs[input_name]
        added, out = transform_nodes(input_name, record, v.dtype, model.initializer, names.fresh)
        front += added
        value_names[v.id] = out
    scope = _Scope(model, value_names, [])
    _convert_nodes(scope, nodes)
    graph_outputs = []
    for out_name, v in graph.outputs.items():
        scope.nodes.append(helper.make_node("Identity", [scope.name(v)], [out_name], name=f"{out_name}/output"))
        graph_outputs.append(_value_info(out_name, v))
    g = helper.make_graph(front + model.top_nodes + scope.nodes, name, graph_inputs, graph_outputs,
                          list(model.inits.values()))
    proto = helper.make_model(g, producer_name="toolkit", opset_imports=[helper.make_opsetid("", opset)])
    proto.ir_version = min(proto.ir_version, 10)
    for key, value in (metadata or {}).items():
        proto.metadata_props.add(key=key, value=value)
    try:
        onnx.checker.check_model(proto, full_check=True)
    except Exception as e:               # onnx's ValidationError / InferenceError
        raise ExportError(f"ONNX export: the model does not pass onnx.checker: {str(e).splitlines()[0]}") from None
    return proto
