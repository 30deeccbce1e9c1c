"""int8 post-training quantization of an infer graph (and of a test graph with frozen weights, so
that ``toolkit test`` scores the int8 net), from the net's ``quantization`` section
(docs/spec.md section 10; schemas/quantization.py): each convolution and InnerProduct whose input
has a scale becomes qconv2d / qgemm (ops/quant.py) with int8 weights per output channel and an
int32 bias, a ReLU on its result folded in.

    conv2d(x, W, b) -> relu      ==>   qconv2d(quantize_linear(x), Wq, bq, relu=True, out_dtype=uint8)
    matmul(x, W) + b             ==>   qgemm(xq, Wq, bq)

Where the regions meet: ``quantize_linear`` where a float value enters (at the scale of that
value's top), ``dequantize_linear`` where a quantized value leaves (into softmax, a layer kept
float, a graph output). Between two quantized layers the value stays uint8/int8: a layer whose
result some quantized layer reads (directly, or through ops that commute with quantization) writes
it quantized at its top's scale; one whose result only float ops read writes float32 straight from
its int32 sums (no second rounding). Reshape commutes with quantization, and so does max pooling
(max of (q - zp) * s is (max q - zp) * s): they run on the quantized value, carrying its scale,
where their op takes the quantized dtype. A residual add (a ReLU after it folded in), a
concatenation, average pooling and global average pooling (reduce_mean over H and W) do not
commute, but have int8 forms of their own (qadd, qconcat, qavg_pool2d, qglobal_avg_pool) that
requantize to their top's scale: where their inputs and their top have scales they run on the
int8 values, so a ResNet block or an Inception module stays int8 from end to end.

Where it runs in the pipeline: after ``fold_batch_norm`` and the canonical passes that follow it,
so that the weights it quantizes are constants (an infer graph's frozen weights, a BatchNorm already
folded into them: quantizing before the fold would round weights the fold then scales), and before
``choose_layout`` and the fusion passes, which look for conv2d and matmul and would otherwise turn
them into blocked or fused kernels the quantized ops do not replace. A layer's scale is found by
name: the last value its top names (values keep their top's name through the rewrites before this
pass: rewrite.py's Substitution hands a replaced value's name to its replacement).

A layer the section's ``bias_correction`` names has that amount added to its bias (one a
channel; a layer without a bias gets one) before the bias is quantized: the mean error its int8
form put into its output over the calibration data (toolkit/quantization/bias.py measures it).
A layer the section's ``equalized`` names (its output channels, or its readers' input channels,
scaled by toolkit/quantization/equalize.py before calibration) is quantized as any other: its
weights file holds the scaled weights; its verdict says "equalized".

Every layer of the graph gets one note for ``toolkit compile --explain``: int8 (and in what form)
or float and why (no scale for its input, listed float, an op that has no quantized form).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import UserError
from ..ir.graph import Graph, Node, TensorType, Value
from ..ops.base import ShapeError, get_op
from ..ops.quant import quantize_bias, quantize_weights
from .context import PassContext
from .rewrite import Emitter, Substitution, constant_value, kept_ids

HEADS = ("conv2d", "matmul")
# ops that commute with per-tensor quantization: y(dequantize(q)) == dequantize(y(q)) exactly
COMMUTING = ("reshape", "max_pool2d")
# ops with an int8 form of their own, requantized to their top's scale: a residual add (ReLU folded
# in), a concatenation, average pooling and a global average pooling (reduce_mean over H and W)
INT8_OPS = ("add", "concat", "avg_pool2d", "reduce_mean")
# the phases a quantization section rewrites: what the model runs (infer) and what measures it
# (test: ``toolkit test`` and a published card's metric score the int8 net, not the float one it
# came from); a train graph's weights are not constants, and training a quantized net is not done
QUANTIZED_PHASES = ("infer", "test")
# ops no layer's verdict is about (a quantized layer's weights are constants too)
PLUMBING = ("constant", "scalar")


@dataclass(frozen=True)
class Act:
    """A quantized value's parameters: real = (q - zero_point) * scale."""
    scale: float
    zero_point: int
    dtype: str


@dataclass
class Int8Op:
    """An add, concat or average pooling that runs on int8: its result's parameters and the ReLU
    folded into it (an add's)."""
    node: Node
    out: Value                       # the last value of the match: what its readers read
    act: Act
    relu: Node | None = None


@dataclass
class Head:
    """A conv2d or matmul with what folds into it: its bias add and a ReLU."""
    node: Node
    x: Value
    weight: np.ndarray               # [O, C/g, kh, kw] or [O, I]
    bias: np.ndarray | None
    relu: bool
    out: Value                       # the last value of the match: what its readers read
    absorbed: list[Node] = field(default_factory=list)
    pool_relu: Node | None = None    # a ReLU after the max pooling that reads ``out``, folded in


def layer_of(node: Node) -> str:
    """The net layer a node was lowered from (fusion and folding add '+...' to a scope)."""
    return node.scope.split("+")[0]


def named_params(graph: Graph, section) -> dict[int, Act]:
    """Value id -> the parameters of its top: an input of that name, else the last value the
    top names (an in-place layer's result: what a net's top holds when the net has run)."""
    last: dict[str, Value] = {}
    for node in graph.nodes:
        for v in node.outputs:
            if v.name:
                last[v.name] = v
    found = {}
    for name, a in section.activations.items():
        v = graph.inputs.get(name) or last.get(name)
        if v is not None:
            found[v.id] = Act(float(a.scale), int(a.zero_point), a.dtype)
    # quantize(reshape(v)) == reshape(quantize(v)): an InnerProduct's flattened input has the
    # scale of the top it flattens (and a pooling without a top scale of its own its input's)
    for node in graph.nodes:
        if node.op in COMMUTING and node.inputs and node.inputs[0].id in found:
            found.setdefault(node.outputs[0].id, found[node.inputs[0].id])
    return found


def match_head(node: Node, readers: dict[int, list[Node]], kept: set[int]) -> Head | str:
    """The head at ``node`` with its bias and ReLU, or why it has no quantized form."""
    if node.outputs[0].dtype != "float32":
        return f"{node.op} in {node.outputs[0].dtype}: only float32 layers are quantized"
    w = constant_value(node.inputs[1])
    if w is None:
        return f"{node.op}'s weight is not a constant (weights given at run time)"

    def sole(v: Value, op: str) -> Node | None:
        uses = readers.get(v.id, [])
        return uses[0] if len(uses) == 1 and uses[0].op == op and v.id not in kept else None

    absorbed: list[Node] = []
    if node.op == "conv2d":
        bias = constant_value(node.inputs[2]) if len(node.inputs) == 3 else None
        if len(node.inputs) == 3 and bias is None:
            return "conv2d's bias is not a constant"
        weight = w
    else:
        a = node.attrs
        if a["trans_a"] or node.inputs[0].rank != 2 or w.ndim != 2:
            return "a batched or transposed matmul (only InnerProduct's x @ W^T is quantized)"
        weight = w if a["trans_b"] else w.T         # qgemm's weight is [N, K]
        bias = None
        add = sole(node.outputs[0], "add")
        if add is not None:
            other = add.inputs[1] if add.inputs[0] is node.outputs[0] else add.inputs[0]
            b = constant_value(other)
            if b is not None and b.size == weight.shape[0] and b.shape[-1:] == (weight.shape[0],) \
                    and add.outputs[0].type == node.outputs[0].type:
                bias = b.reshape(-1)
                absorbed.append(add)
    out = absorbed[-1].outputs[0] if absorbed else node.outputs[0]
    relu = sole(out, "relu")
    pool_relu = None
    if relu is None and (pool := sole(out, "max_pool2d")) is not None:
        # simplify moves a ReLU after the max pooling that follows it (4x fewer elements): it
        # folds into the head all the same, since relu(max_pool(y)) == max_pool(relu(y))
        pool_relu = sole(pool.outputs[0], "relu")
    if relu is not None:
        absorbed.append(relu)
        out = relu.outputs[0]
    head = Head(node, node.inputs[0], np.ascontiguousarray(weight), None if bias is None else np.asarray(bias),
                relu is not None or pool_relu is not None, out, absorbed)
    if pool_relu is not None:
        head.pool_relu = pool_relu
        head.absorbed.append(pool_relu)
    return head


def accepts(op: str, x: TensorType, attrs: dict) -> bool:
    """Whether ``op`` takes a value of ``x``'s (quantized) type."""
    try:
        get_op(op).infer([x], attrs)
    except (ShapeError, TypeError, KeyError, ValueError):
        return False
    return True


class Quantizer:
    """One walk over the graph in order, emitting the quantized nodes in place of the float ones."""

    def __init__(self, graph: Graph, section, ctx: PassContext):
        self.graph = graph
        self.ctx = ctx
        self.params = named_params(graph, section)
        self.float_reasons = section.float_reasons()
        self.bias_correction = section.bias_correction
        # layers whose weights cross-layer equalization scaled (their output channels, or their input
        # channels back): said by --explain, the weights are the file's
        self.equalized = set(section.equalized) | {r for readers in section.equalized.values() for r in readers}
        self.readers = graph.consumers()
        self.kept = kept_ids(graph)
        self.subst = Substitution()
        self.quantized: dict[int, tuple[Value, Act]] = {}   # original value id -> its quantized form
        self.verdicts: dict[str, str] = {}                  # layer -> what became of it
        self.heads: dict[int, Head | str] = {}
        self.int8_ops: dict[int, Int8Op | str] = {}
        self.aliases: dict[int, Value] = {}                 # a folded ReLU's result -> the pooling it equals
        self.order = dict.fromkeys(layer_of(n) for n in graph.nodes if n.op not in PLUMBING)   # layers, in order
        self.folded: dict[str, str] = {}                    # layer -> the quantized layer it went into
        self.others: dict[str, str] = {}                    # layer -> its first op without a quantized form

    def head(self, node: Node) -> Head | str:
        if id(node) not in self.heads:
            self.heads[id(node)] = match_head(node, self.readers, self.kept)
        return self.heads[id(node)]

    def has_scale(self, v: Value) -> bool:
        return any(u.id in self.params or u.id in self.quantized for u in (v, self.aliases.get(v.id, v)))

    def int8_op(self, node: Node) -> Int8Op | str:
        """The int8 form of an add, concat or average pooling, or why it has none."""
        if id(node) not in self.int8_ops:
            self.int8_ops[id(node)] = self._match_int8_op(node)
        return self.int8_ops[id(node)]

    def _match_int8_op(self, node: Node) -> Int8Op | str:
        if layer_of(node) in self.float_reasons:
            return self.float_reasons[layer_of(node)]
        out = node.outputs[0]
        if out.dtype != "float32" or any(x.dtype != "float32" for x in node.inputs):
            return f"{node.op} in {out.dtype}: only float32 layers are quantized"
        if node.op == "add":
            if any(constant_value(x) is not None for x in node.inputs):
                return "add of a constant (a bias): only an add of two computed values runs in int8"
            if any(tuple(x.shape) != tuple(out.shape) for x in node.inputs):
                return "add with broadcasting: only an add of two values of one shape runs in int8"
        elif node.op == "reduce_mean":
            if node.inputs[0].rank != 4 or sorted(a % 4 for a in node.attrs["axes"]) != [2, 3]:
                return "a mean over other axes than H and W (only global average pooling runs in int8)"
        elif node.op == "avg_pool2d" and not accepts("max_pool2d", node.inputs[0].type, node.attrs):
            return "avg_pool2d's window does not fit"
        missing = [x for x in node.inputs if not self.has_scale(x)]
        if missing:
            return f"no scale for its input{_named(missing[0])}"
        relu = None
        if node.op == "add":
            uses = self.readers.get(out.id, [])
            if len(uses) == 1 and uses[0].op == "relu" and out.id not in self.kept:
                relu = uses[0]
        last = relu.outputs[0] if relu is not None else out
        act = self.params.get(last.id)
        if act is None:
            return "no scale for its output"
        return Int8Op(node, last, act, relu)

    def int8_reader(self, v: Value, through: Node | None = None, seen: int = 0) -> bool:
        """Some reader of ``v`` would take it quantized: a head not listed float, an add, concat or
        average pooling with an int8 form, or a commuting op whose result such a reader reads
        (``through``: a ReLU folded into the head, looked past)."""
        for r in self.readers.get(v.id, []):
            if r.op in HEADS and layer_of(r) not in self.float_reasons and r.inputs[0] is v \
                    and isinstance(self.head(r), Head):
                return True
            if r.op in INT8_OPS and isinstance(self.int8_op(r), Int8Op):
                return True
            if (r.op in COMMUTING or r is through) and seen < 16 \
                    and self.int8_reader(r.outputs[0], through, seen + 1):
                return True
        return False

    def verdict(self, node: Node, text: str) -> None:
        """What became of ``node``'s layer: a convolution's or InnerProduct's verdict is the layer's
        (an InnerProduct's flattening reshape comes first, and says less)."""
        if node.op in HEADS:
            self.verdicts[layer_of(node)] = text
        else:
            self.verdicts.setdefault(layer_of(node), text)

    def input_form(self, x: Value, b: Emitter) -> tuple[Value, Act] | None:
        """``x`` quantized: its form already in the int8 region, or quantize_linear at its top's scale."""
        same = self.aliases.get(x.id, x)
        for v in (x, same):
            if v.id in self.quantized:
                return self.quantized[v.id]
        act = self.params.get(x.id) or self.params.get(same.id)
        if act is None:
            return None
        q = b.op("quantize_linear", x, scale=act.scale, zero_point=act.zero_point, dtype=act.dtype)
        self.quantized[x.id] = (q, act)
        return q, act

    def rewrite_head(self, h: Head, b: Emitter) -> bool:
        form = self.input_form(h.x, b)
        if form is None:
            self.verdict(h.node, f"float: no scale for its input{_named(h.x)}")
            return False
        xq, xa = form
        wq, w_scales = quantize_weights(h.weight)
        bias, corrected = self.corrected_bias(h)
        try:
            bq = None if bias is None else quantize_bias(bias, xa.scale, w_scales)
        except ValueError as e:
            self.verdict(h.node, f"float: {e}")
            return False
        out_act = self.params.get(h.out.id)
        out_q = out_act is not None and self.int8_reader(h.out, h.pool_relu)
        attrs: dict = {"relu": h.relu, "out_dtype": out_act.dtype if out_q else "float32"}
        if out_q:
            attrs.update(y_scale=out_act.scale, y_zero_point=out_act.zero_point)
        consts = [b.op("constant", value=wq)] + ([b.op("constant", value=bq)] if bq is not None else [])
        if h.node.op == "conv2d":
            a = h.node.attrs
            y = b.op("qconv2d", xq, *consts, stride=a["stride"], pad=a["pad"], dilation=a["dilation"],
                     group=a["group"], x_scale=xa.scale, x_zero_point=xa.zero_point, w_scales=w_scales, **attrs)
        else:
            y = b.op("qgemm", xq, *consts, a_scale=xa.scale, a_zero_point=xa.zero_point, b_scales=w_scales, **attrs)
        if h.pool_relu is not None:
            self.subst.replace(h.pool_relu.outputs[0], h.pool_relu.inputs[0])
            self.aliases[h.pool_relu.outputs[0].id] = h.pool_relu.inputs[0]
        for n in h.absorbed:                 # an in-place ReLU layer says where it went
            self.folded.setdefault(layer_of(n), f"int8: folded into {layer_of(h.node)}")
        folded = "".join(f" + {n.op}" for n in h.absorbed)
        equalized = ", equalized" if layer_of(h.node) in self.equalized else ""
        what = f"{y.producer.op}{folded}{', bias corrected' if corrected else ''}{equalized}, {xa.dtype} in"
        if out_q:
            self.quantized[h.out.id] = (y, out_act)
            self.subst.replace(h.out, b.op("dequantize_linear", y, scale=out_act.scale,
                                           zero_point=out_act.zero_point))
            self.verdict(h.node, f"int8: {what}, {out_act.dtype} out")
        else:
            self.subst.replace(h.out, y)
            why = "no scale for its output" if out_act is None else "no quantized layer reads it"
            self.verdict(h.node, f"int8: {what}, float32 out ({why})")
        return True

    def corrected_bias(self, h: Head) -> tuple[np.ndarray | None, bool]:
        """The head's bias plus its layer's bias correction (a zero bias where it had none), and
        whether there was one."""
        layer = layer_of(h.node)
        amounts = self.bias_correction.get(layer)
        if amounts is None:
            return h.bias, False
        channels = h.weight.shape[0]
        if len(amounts) != channels:
            raise UserError(f"quantization.bias_correction.{layer}: {len(amounts)} amounts for a layer of "
                            f"{channels} output channels")
        base = np.zeros(channels, np.float32) if h.bias is None else h.bias.astype(np.float32)
        return base + np.asarray(amounts, np.float32), True

    def rewrite_int8_op(self, node: Node, b: Emitter) -> bool:
        """An add, concat or average pooling on the int8 values of its inputs, its result at its
        top's scale (a following ReLU folded into an add)."""
        match = self.int8_op(node)
        if isinstance(match, str):
            self.verdict(node, f"float: {match}")
            return False
        forms = [self.input_form(x, b) for x in node.inputs]
        if any(f is None for f in forms):
            self.verdict(node, "float: no scale for an input")
            return False
        act = match.act
        out = dict(y_scale=act.scale, y_zero_point=act.zero_point, out_dtype=act.dtype)
        (xq, xa), a = forms[0], node.attrs
        if node.op == "add":
            (yq, ya), = forms[1:]
            y = b.op("qadd", xq, yq, a_scale=xa.scale, a_zero_point=xa.zero_point, b_scale=ya.scale,
                     b_zero_point=ya.zero_point, relu=match.relu is not None, **out)
        elif node.op == "concat":
            y = b.op("qconcat", *(q for q, _ in forms), axis=a["axis"], x_scales=tuple(f.scale for _, f in forms),
                     x_zero_points=tuple(f.zero_point for _, f in forms), **out)
        elif node.op == "avg_pool2d":
            y = b.op("qavg_pool2d", xq, kernel=a["kernel"], stride=a["stride"], pad=a["pad"], ceil_mode=a["ceil_mode"],
                     count_include_pad=a["count_include_pad"], x_scale=xa.scale, x_zero_point=xa.zero_point, **out)
        else:
            y = b.op("qglobal_avg_pool", xq, keepdims=a["keepdims"], x_scale=xa.scale, x_zero_point=xa.zero_point,
                     **out)
        self.quantized[match.out.id] = (y, act)
        self.subst.replace(match.out, b.op("dequantize_linear", y, scale=act.scale, zero_point=act.zero_point))
        folded = ""
        if match.relu is not None:
            self.folded.setdefault(layer_of(match.relu), f"int8: folded into {layer_of(node)}")
            folded = " + relu"
        ins = " + ".join(f.dtype for _, f in forms) if node.op != "concat" else f"{len(forms)} x {xa.dtype}"
        self.verdict(node, f"int8: {y.producer.op}{folded}, {ins} in, {act.dtype} out")
        return True

    def rewrite_commuting(self, node: Node, b: Emitter) -> bool:
        x = node.inputs[0]
        x = self.aliases.get(x.id, x)
        if len(node.inputs) != 1 or x.id not in self.quantized:
            return False
        xq, act = self.quantized[x.id]
        if not accepts(node.op, xq.type, node.attrs):
            self.verdict(node, f"float: {node.op} has no {act.dtype} form here (dequantized before it)")
            return False
        y = b.op(node.op, xq, **node.attrs)
        self.quantized[node.outputs[0].id] = (y, act)
        self.subst.replace(node.outputs[0], b.op("dequantize_linear", y, scale=act.scale, zero_point=act.zero_point))
        self.verdict(node, f"int8: {node.op} on {act.dtype} (commutes with quantization: keeps its input's scale)")
        return True

    def run(self) -> bool:
        nodes: list[Node] = []
        skip: set[int] = set()
        changed = False
        for node in self.graph.nodes:
            if id(node) in skip:
                continue
            b = Emitter(node.scope)
            done = False
            if node.op in HEADS:
                h = self.head(node)
                layer = layer_of(node)
                if layer in self.float_reasons:
                    self.verdict(node, f"float: {self.float_reasons[layer]}")
                elif isinstance(h, str):
                    self.verdict(node, f"float: {h}")
                else:
                    done = self.rewrite_head(h, b)
                    if done:
                        skip.update(id(n) for n in h.absorbed)
            elif node.op in COMMUTING:
                done = self.rewrite_commuting(node, b)
            elif node.op in INT8_OPS:
                done = self.rewrite_int8_op(node, b)
                match = self.int8_ops.get(id(node))
                if done and match.relu is not None:
                    skip.add(id(match.relu))
            if not done and node.op not in PLUMBING + HEADS + INT8_OPS:
                self.others.setdefault(layer_of(node), f"float: {node.op} on a float input" if node.op in COMMUTING
                                       else f"float: {node.op} has no quantized form")
            nodes.append(node)
            emitted = b.take()
            nodes.extend(emitted)
            changed |= done
        if not changed:
            self.notes()
            return False
        self.graph.nodes = nodes
        self.subst.apply(self.graph)
        self.notes()
        return True

    def notes(self) -> None:
        """One line per layer: a head's or a commuting op's verdict before any other op's."""
        order = self.order
        for layer in [*order, *self.verdicts]:
            if layer in self.float_reasons and layer not in self.verdicts:
                self.verdicts[layer] = f"float: {self.float_reasons[layer]}"
        for layer in dict.fromkeys([*order, *self.verdicts, *self.folded]):
            text = self.verdicts.get(layer) or self.folded.get(layer) or self.others.get(layer)
            if text:
                self.ctx.note(f"quantize: {layer}: {text}")


def _named(v: Value) -> str:
    return f" '{v.name}'" if v.name else ""


def quantize(graph: Graph, ctx: PassContext) -> bool:
    """Convolutions and InnerProducts with scales as qconv2d / qgemm, quantize_linear and
    dequantize_linear where the int8 region begins and ends (an infer graph whose net has a
    quantization section; any other graph is left as it is)."""
    section = graph.quantization
    if section is None or graph.phase not in QUANTIZED_PHASES:
        return False
    if graph.phase == "test" and graph.weights:
        return False               # a training run's test pass reads live weights: it scores the float net
    if any(n.op in ("qconv2d", "qgemm") for n in graph.nodes):
        return False               # already quantized (a graph optimised a second time)
    try:
        return Quantizer(graph, section, ctx).run()
    except ShapeError as e:
        raise UserError(f"quantize: {e}") from None


QUANTIZED_OPS = ("qconv2d", "qgemm", "qadd", "qconcat", "qavg_pool2d", "qglobal_avg_pool")
BOUNDARY_OPS = ("quantize_linear", "dequantize_linear")


def int8_layers(graph: Graph) -> tuple[int, int]:
    """(layers that run in int8, layers with work) in a compiled graph: a layer runs in int8 where
    one of its ops is a quantized op or computes a uint8/int8 value (max pooling on int8); the
    quantize_linear and dequantize_linear at a region's edges are no layer's work, and a ReLU
    folded into the layer before it has none of its own."""
    from ..ir.graph import QUANT_DTYPES
    layers: dict[str, bool] = {}
    for node in graph.nodes:
        if node.op in PLUMBING + BOUNDARY_OPS:
            continue
        int8 = node.op in QUANTIZED_OPS or any(v.dtype in QUANT_DTYPES for v in node.outputs)
        layer = layer_of(node)
        layers[layer] = layers.get(layer, False) or int8
    return sum(layers.values()), len(layers)
