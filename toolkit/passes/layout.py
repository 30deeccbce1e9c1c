"""The layout pass: which convolutions run in the blocked channel layout (NCHW16c, ops/layout.py),
with the reorders between layouts as graph ops, placed so that two never meet. This is the
host's rule; on a GPU the pass puts half-precision convolutions channels last (layout_nhwc.py).

The cost rule, from measurements on an AMD EPYC (Zen 4) core (one thread, each convolution
alone with its ReLU; the README's real-nets section has the whole nets):

- The blocked kernels vectorise over output channels, so small maps keep every lane busy: a 1x1
  convolution on a 7x7 map runs at 100-104 GFLOP/s blocked against 80-87 in NCHW, a 3x3 one at
  100 against 73, and a depthwise 3x3 at 36-50 against 16-24 on maps of 28x28 and less. A 1x1
  convolution on a larger map is within 3-6% either way; a 5x5 one is 1.3-1.5x faster blocked
  at any size (GoogLeNet's: the NCHW kernel's im2col copies 25 taps); a depthwise 3x3 one on a
  56x56 or 112x112 map 0.56-0.95x (stride 2: 0.39-0.56x).
- A reorder costs about 0.25 ns an element (MobileNet's 32x112x112 input to its first
  depthwise layer: 0.09 ms).
- So the convolutions the blocked kernels can run are grouped into regions (convolutions joined
  through the ops that follow the layout), and a region goes blocked when the time its
  convolutions save (``saving_ns``, from the rates above) exceeds what the reorders at its
  borders cost. MobileNet's body is one region with one reorder in; a lone 1x1 convolution on
  a 56x56 map between two Winograd 3x3 ones saves nothing and stays NCHW.
- Channel counts that are not a multiple of 16 are padded, as ONNX Runtime pads them: the
  weight gets zero rows and columns, the bias zeros, and ``to_blocked`` zeros the last block's
  extra lanes; the padded work is counted against the saving. The extra lanes stay zero through
  the convolutions (zero weights, zero bias), ReLU, residual sums and pooling, so an elementwise
  op follows a padded value only where it maps zeros to zero (``keeps_padding_zero``; ``exp``
  or ``x + 1`` would not), and a concatenation only of unpadded values (the blocks would not
  line up).
- A dense convolution of fewer input channels than a block (an RGB image's 3) reads its input
  as NCHW and writes blocked (``reads_nchw``): no input reorder, no padded input channels.
- Grouped convolutions with whole blocks per group (AlexNet's) run blocked, each group's output
  blocks reading its own input blocks.
- Never blocked: a dense convolution that padding would make 1.5x the work or more (17
  channels are two blocks), groups that are not whole blocks, a convolution over one output
  position (a classifier: the NCHW kernel's dot products over the weight's rows), a 3x3
  convolution the NCHW kernel runs by Winograd (the kernel module says so, through the
  registry's ``fusion_pays``),
  weights fed at run time (a train step, whose backward kernels read NCHW anyway: the pass
  leaves graphs with gradient ops alone), other dtypes than float32, a processor without
  16-float vectors, a device other than the host.

What follows the layout: elementwise ops (a per-channel or scalar constant is rearranged at
compile time), a concatenation along channels, max pooling, and reductions over the map
(global pooling; kept dims [N, C, 1, 1] need no reorder back). Anything else reads the NCHW form: one
``from_blocked`` per value, made once, and a value that was reordered back and is wanted
blocked again is taken from where it came (the cancelled pair never exists).
"""
from __future__ import annotations

import numpy as np

from ..backend.registry import KERNELS
from ..ir.graph import Graph, Node, Value
from ..ops.base import get_op
from .context import PassContext
from .layout_nhwc import choose_channels_last
from .rewrite import LayoutRewriter, Regions, constant_value

MAP_REDUCTIONS = ("reduce_mean", "reduce_sum", "reduce_max")
BLOCK = 16        # channels a block: one AVX-512 vector of float32 (the kernels' block)
REORDER_NS = 0.25           # a reorder's cost per element
# measured rates, GFLOP/s = FLOPs per ns, (NCHW, blocked) by kind and output positions per image
SMALL_MAP, MEDIUM_MAP, ANY_MAP = 64, 784, float("inf")        # up to 8x8, up to 28x28, any
POINTWISE_RATES = {SMALL_MAP: (80.0, 102.0), MEDIUM_MAP: (100.0, 106.0), ANY_MAP: (100.0, 103.0)}
WINDOW_RATES = {ANY_MAP: (75.0, 100.0)}     # dense kxk, k > 1, that Winograd does not take
DEPTHWISE_RATES = {MEDIUM_MAP: (24.0, 45.0), ANY_MAP: (35.0, 45.0)}
BLOCKED_RATE = 100.0          # where a kind has no rate of its own
MAX_PADDING_WASTE = 1.5


def keeps_padding_zero(node: Node) -> bool:
    """Whether an elementwise op maps the zeros in a padded block's extra lanes to zeros: its
    reference on zeros for the image operands and padded per-channel constants, the value of
    each scalar constant (a scalar fed at run time could be anything)."""
    operands = []
    for v in node.inputs:
        value = constant_value(v)
        if v.type.numel == 1 and v.rank <= 1:
            if value is None:
                return False
            operands.append(np.asarray(value).reshape(1))
        else:
            operands.append(np.zeros(1, v.dtype))
    with np.errstate(all="ignore"):
        result = np.asarray(get_op(node.op).reference(*operands, **node.attrs))
    return bool(np.all(result == 0))


def padded(channels: int) -> int:
    """``channels`` rounded up to whole blocks."""
    return -(-channels // BLOCK) * BLOCK


def depthwise(node: Node) -> bool:
    return node.attrs["group"] != 1 and node.attrs["group"] == node.inputs[0].shape[1] == node.outputs[0].shape[1]


def reads_nchw(node: Node) -> bool:
    """A dense convolution of fewer input channels than a block (an RGB image) reads its input
    as NCHW, each channel a block of one lane, and writes blocked: padding 3 channels to 16
    would make 5.3x the work, and a reorder of the input would buy nothing."""
    return node.attrs["group"] == 1 and node.inputs[1].shape[1] < BLOCK


def padding_waste(node: Node) -> float:
    """How many times its real work a convolution does with its channels padded to blocks."""
    w = node.inputs[1]
    o, c = w.shape[0], w.shape[1]
    if depthwise(node) or reads_nchw(node):
        return padded(o) / o
    return padded(o) * padded(c) / (o * c)


def saving_ns(node: Node) -> float:
    """The time one image's convolution saves in the blocked layout, from the measured rates
    (0 where the two kernels measured alike; negative where padding costs more than the blocked
    kernel gains)."""
    out, w = node.outputs[0], node.inputs[1]
    positions = out.shape[2] * out.shape[3]
    flops = 2.0 * out.shape[1] * positions * w.shape[1] * w.shape[2] * w.shape[3]
    if reads_nchw(node):
        # measured alike, less the reorder the blocked one spares (the region counts that):
        # MobileNet's 3x3 stride 2 0.21 ms NCHW, 0.24 blocked; AlexNet's 11x11 stride 4 2.09
        # and 2.00; ResNet's 7x7 stride 2 2.38 and 2.18; so only the padded outputs count
        return -flops * (padding_waste(node) - 1) / BLOCKED_RATE
    if depthwise(node):
        rates = DEPTHWISE_RATES
    else:
        rates = POINTWISE_RATES if w.shape[2] * w.shape[3] == 1 else WINDOW_RATES
    for limit, (nchw, blocked) in sorted(rates.items()):
        if positions <= limit:
            return flops / nchw - flops * padding_waste(node) / blocked
    return flops / BLOCKED_RATE - flops * padding_waste(node) / BLOCKED_RATE


def _over_the_map(node: Node) -> bool:
    """A reduction over an image's H and W axes (global pooling)."""
    return (node.op in MAP_REDUCTIONS and _image(node.inputs[0])
            and tuple(sorted(a % 4 for a in node.attrs["axes"])) == (2, 3))


def _could_follow(node: Node) -> list[Value]:
    """The image operands an op would take blocked if it followed the layout ([] if it cannot)."""
    if len(node.outputs) != 1:
        return []
    out = node.outputs[0]
    if _over_the_map(node):
        return [node.inputs[0]]
    if not _image(out):
        return []
    opdef = get_op(node.op)
    if opdef.elementwise and opdef.pure:
        if out.shape[1] % BLOCK and not keeps_padding_zero(node):
            return []
        return [v for v in node.inputs if tuple(v.shape) == tuple(out.shape)]
    if node.op == "concat" and node.attrs["axis"] % 4 == 1 and all(
            _image(v) and v.shape[1] % BLOCK == 0 for v in node.inputs):
        return list(node.inputs)
    if node.op == "max_pool2d":
        return [node.inputs[0]]
    return []


def worthwhile(graph: Graph, candidates: list[Node], followers: set[int]) -> tuple[set[int], list[Node]]:
    """(ids of the candidates in regions whose saving exceeds their reorders' cost, the others)."""
    regions = Regions()
    follow_inputs = {}
    for node in graph.nodes:
        if id(node) in followers:
            operands = _could_follow(node)
            if operands:
                follow_inputs[id(node)] = operands
                for v in operands:
                    regions.union(v.id, node.outputs[0].id)
    cand_ids = {id(n) for n in candidates}
    for node in candidates:
        if not reads_nchw(node):
            regions.union(node.inputs[0].id, node.outputs[0].id)
    members = cand_ids | set(follow_inputs)
    produced_inside = {node.outputs[0].id for node in graph.nodes if id(node) in members}
    saving: dict[int, float] = {}
    cost: dict[int, float] = {}
    for node in candidates:
        root = regions.find(node.outputs[0].id)
        saving[root] = saving.get(root, 0.0) + saving_ns(node)
    readers = graph.consumers()
    kept = {v.id for v in graph.outputs.values()} | {v.id for v in graph.updates.values()}
    seen = set()
    for node in graph.nodes:
        if id(node) not in members:
            continue
        if id(node) in cand_ids:
            values = ([] if reads_nchw(node) else [node.inputs[0]]) + [node.outputs[0]]
        else:
            values = follow_inputs[id(node)] + [node.outputs[0]]
        for v in values:
            if v.id in seen:
                continue
            seen.add(v.id)
            root = regions.find(v.id)
            elements = float(np.prod([d for d in v.shape[1:]]))
            enters = v.id not in produced_inside
            leaves = v.id in produced_inside and (v.id in kept or any(id(r) not in members
                                                                      for r in readers.get(v.id, [])))
            if enters or leaves:
                cost[root] = cost.get(root, 0.0) + REORDER_NS * elements
    chosen = {id(n) for n in candidates
              if saving.get(regions.find(n.outputs[0].id), 0.0) > cost.get(regions.find(n.outputs[0].id), 0.0)}
    return chosen, [n for n in candidates if id(n) not in chosen]


def _image(v: Value) -> bool:
    """A 4-d value with concrete channel counts and maps (the batch may be symbolic)."""
    return v.rank == 4 and all(isinstance(d, int) for d in v.shape[1:])


def why_not_blocked(node: Node) -> str | None:
    """None when ``node`` (a conv2d) can run blocked, else why not, in a few words."""
    x, w = node.inputs[0], node.inputs[1]
    if x.dtype != "float32":
        return f"{x.dtype}"
    if not _image(x):
        return "a symbolic map size"
    c, o, group = x.shape[1], w.shape[0], node.attrs["group"]
    if group != 1 and not depthwise(node) and ((c // group) % BLOCK or (o // group) % BLOCK):
        return f"group {group}, {c // group} -> {o // group} channels a group: not whole blocks"
    if node.outputs[0].shape[2:] == (1, 1):
        return "one output position: a matrix-vector product"
    if padding_waste(node) >= MAX_PADDING_WASTE:
        return f"{c} -> {o} channels: padded to blocks of {BLOCK}, {padding_waste(node):.1f}x the work"
    if constant_value(w) is None:
        return "weights fed at run time"
    if o % BLOCK and len(node.inputs) > 2 and constant_value(node.inputs[2]) is None:
        return "a bias fed at run time"
    return None


class _Rewriter(LayoutRewriter):
    """Walks the nodes in order, emitting the new list: blocked convolutions, the ops that follow
    them, and the reorders where a layout meets the other (``blocked`` is the base's ``other``)."""

    REORDERS = ("to_blocked", "from_blocked")

    def __init__(self, graph: Graph):
        super().__init__()
        self.graph = graph
        self.blocked = self.other                 # NCHW value id -> its blocked form
        self.only_blocked = self.only_other       # NCHW values that exist only in blocked form

    def to_blocked(self, v: Value, scope: str) -> Value:
        if v.id not in self.blocked:
            self.blocked[v.id] = self.emit(scope, "to_blocked", v, block=BLOCK)
        return self.blocked[v.id]

    def reorder_back(self, v: Value, b: Value) -> Value:
        if v.shape[2:] == (1, 1) and v.shape[1] % BLOCK == 0:   # [N, C/16, 1, 1, 16] is [N, C, 1, 1]
            return self.emit(b.producer.scope, "reshape", b, shape=tuple(v.shape))
        return self.emit(b.producer.scope, "from_blocked", b, block=BLOCK, channels=v.shape[1])

    # -- per node -----------------------------------------------------------------------------
    def convolution(self, node: Node) -> None:
        x, w = node.inputs[0], node.inputs[1]
        if reads_nchw(node):
            xb = self.to_plain(x)
        else:
            xb = self.blocked.get(x.id) or self.to_blocked(x, node.scope)
        attrs = {k: node.attrs[k] for k in ("stride", "pad", "dilation", "group")}
        params = list(node.inputs[1:])
        o, c = w.shape[0], w.shape[1]
        if o % BLOCK or (attrs["group"] == 1 and c % BLOCK and not reads_nchw(node)):
            # (a grouped convolution other than depthwise has whole blocks per group already)
            # zero rows (outputs) and columns (inputs) up to whole blocks: the extra output lanes
            # come out zero, and the extra input lanes, zero too, meet zero weights
            if depthwise(node):
                attrs["group"] = padded(o)
            weight = constant_value(w)
            columns = c if depthwise(node) or reads_nchw(node) else padded(c)
            grown = np.zeros((padded(o), columns, *weight.shape[2:]), weight.dtype)
            grown[:o, :c] = weight
            params[0] = self.constant(w, grown)
            if len(params) > 1:
                bias = np.zeros(padded(o), weight.dtype)
                bias[:o] = constant_value(params[1])
                params[1] = self.constant(params[1], bias)
        y = self.emit(node.scope, "conv2d_blocked", xb, *params, block=BLOCK, **attrs)
        self.produce(node.outputs[0], y)

    def constant(self, like: Value, value: np.ndarray) -> Value:
        value.flags.writeable = False
        return self.emit(like.producer.scope, "constant", value=value)

    def operand(self, v: Value, image_shape, scope: str) -> Value | None:
        """``v`` as an operand of an op running on blocked [N, C, H, W] values: its blocked form,
        a scalar as it is, a per-channel constant rearranged; None where it cannot follow."""
        if v.id in self.blocked:
            return self.blocked[v.id]
        if tuple(v.shape) == tuple(image_shape) and _image(v):
            return self.to_blocked(v, scope)
        if v.type.numel == 1 and v.rank <= 1:
            return v
        value = constant_value(v)
        if value is None:
            return None
        c = image_shape[1]
        shape = tuple(value.shape)
        if shape not in ((c, 1, 1), (1, c, 1, 1)):
            return None
        grown = np.zeros(padded(c), value.dtype)          # zeros for a padded block's extra lanes
        grown[:c] = value.reshape(c)
        return self.constant(v, grown.reshape(1, padded(c) // BLOCK, 1, 1, BLOCK))

    def follow(self, node: Node) -> bool:
        """Emit ``node`` on blocked operands when one of its inputs exists only blocked and the
        rest can follow; whether it did."""
        if not any(v.id in self.only_blocked for v in node.inputs) or len(node.outputs) != 1:
            return False
        opdef = get_op(node.op)
        out = node.outputs[0]
        if opdef.elementwise and opdef.pure and _image(out):
            if out.shape[1] % BLOCK and not keeps_padding_zero(node):
                return False
            operands = [self.operand(v, out.shape, node.scope) for v in node.inputs]
            if any(o is None for o in operands):
                return False
            y = self.emit(node.scope, node.op, *operands, **node.attrs)
        elif node.op == "concat" and _image(out) and node.attrs["axis"] % 4 == 1 and all(
                _image(v) and v.shape[1] % BLOCK == 0 for v in node.inputs):    # padded blocks would not line up
            y = self.emit(node.scope, "concat", *[self.blocked.get(v.id) or self.to_blocked(v, node.scope)
                                                  for v in node.inputs], axis=1)
        elif node.op == "max_pool2d" and node.inputs[0].id in self.blocked and _image(out):
            y = self.emit(node.scope, "max_pool2d_blocked", self.blocked[node.inputs[0].id], block=BLOCK,
                          **node.attrs)
        elif _over_the_map(node) and node.inputs[0].id in self.blocked:
            c = node.inputs[0].shape[1]
            keep = node.attrs["keepdims"] or c % BLOCK
            r = self.emit(node.scope, node.op, self.blocked[node.inputs[0].id], axes=(2, 3), keepdims=bool(keep))
            if c % BLOCK:                          # the padded lanes dropped: [N, C, 1, 1]
                p = self.emit(node.scope, "from_blocked", r, block=BLOCK, channels=c)
                if not node.attrs["keepdims"]:
                    p = self.emit(node.scope, "reshape", p, shape=tuple(out.shape))
                self.subst.replace(out, p)
                self.followers += 1
                return True
            if not node.attrs["keepdims"]:         # [N, C/16, 16] is [N, C]: no reorder at all
                self.subst.replace(out, self.emit(node.scope, "reshape", r, shape=tuple(out.shape)))
                self.followers += 1
                return True
            y = r
        else:
            return False
        self.produce(out, y)
        self.followers += 1
        return True

def choose_layout(graph: Graph, ctx: PassContext) -> bool:
    """The layout pass: a GPU's convolutions channels last where layout_nhwc.py's rule picks them,
    the host's blocked where this module's does."""
    on_gpu = choose_channels_last(graph, ctx)
    return _choose_blocked(graph, ctx) or on_gpu


def _choose_blocked(graph: Graph, ctx: PassContext) -> bool:
    """Rewrite the convolutions the cost rule (module docstring) picks into the blocked layout."""
    where = ctx.placement(graph)
    host = [n for n in graph.nodes if KERNELS.fusion_pays("conv2d_blocked", where.node(n), "float32")]
    convs = [n for n in host if n.op == "conv2d"]
    if not convs:
        return False
    if any("_grad" in node.op for node in graph.nodes):
        return False                 # a train step: the gradient kernels read NCHW

    reasons = [(n, why_not_blocked(n) or (None if KERNELS.fusion_pays("conv2d_blocked", where.node(n), "float32", n)
                                          else "its NCHW kernel is faster"))
               for n in convs]
    on_host = {id(n) for n in host}
    chosen, unpaid = worthwhile(graph, [n for n, why in reasons if why is None], on_host)
    unpaid_ids = {id(n) for n in unpaid}
    reasons = [(n, "saves less than its reorders cost" if id(n) in unpaid_ids else why) for n, why in reasons]
    kept = [f"{n.scope} ({why})" for n, why in reasons if why is not None]
    if kept:
        shown = ", ".join(kept[:6]) + (f", and {len(kept) - 6} more" if len(kept) > 6 else "")
        kept_note = f"choose_layout: kept NCHW: {shown}"
    if not chosen:
        return False                 # notes are changes (context.py): what stayed NCHW rides on one
    rw = _Rewriter(graph)
    kinds = {"dense": 0, "depthwise": 0, "grouped": 0}
    grown = 0
    for node in graph.nodes:
        node.inputs = [rw.subst.resolve(v) for v in node.inputs]
        if id(node) in chosen:
            rw.convolution(node)
            grown += padding_waste(node) > 1
            kinds["dense" if node.attrs["group"] == 1 else "depthwise" if depthwise(node) else "grouped"] += 1
        elif not (id(node) in on_host and rw.follow(node)):
            rw.keep(node)
    for name, v in list(graph.outputs.items()):
        graph.outputs[name] = rw.to_plain(rw.subst.resolve(v))
    for name, v in list(graph.updates.items()):
        graph.updates[name] = rw.to_plain(rw.subst.resolve(v))
    graph.nodes = rw.nodes
    rw.subst.apply(graph)
    grouped = f", {kinds['grouped']} grouped" if kinds["grouped"] else ""
    padded_note = f", {grown} with padded blocks" if grown else ""
    ctx.note(f"choose_layout: {sum(kinds.values())} of {len(convs)} convolutions in NCHW{BLOCK}c "
             f"({kinds['dense']} dense, {kinds['depthwise']} depthwise{grouped}{padded_note}), "
             f"{rw.followers} op(s) follow the layout; "
             f"reorders: {rw.reorders['to_blocked']} to NCHW{BLOCK}c, {rw.reorders['from_blocked']} back to NCHW")
    if kept:
        ctx.note(kept_note)
    return True
