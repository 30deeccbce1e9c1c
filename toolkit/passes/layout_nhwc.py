"""The layout pass on a GPU: which convolutions run channels last (NHWC, ops/nhwc.py), with the
ops that follow them and the reorders between layouts as graph ops, placed so that two never
meet. layout.py's ``choose_layout`` runs this for the GPU's nodes and its blocked layout for the
host's.

The cost rule:

- cuDNN's Tensor Core kernels for float16 read NHWC images and a [O, kH, kW, C/group] filter;
  given NCHW, cuDNN transposes the input into NHWC and the output back around the kernel (the
  ``nchwToNhwc`` and ``nhwcToNchw`` kernels of an NCHW half-precision profile). So a float16
  convolution saves, channels last, about one read and write of its input and of its output
  (``saving_elements``), and a reorder at a region's border costs the same one read and write
  of the value it reorders: the convolutions are grouped into regions (convolutions joined
  through the ops that follow the layout), and a region goes channels last when its
  convolutions' input and output elements exceed the elements reordered at its borders. A lone
  convolution between two NCHW ops saves nothing (its reorders are the transposes cuDNN would
  have made) and stays NCHW; a ResNet's body is one region, one reorder in and one out.
- float32 under the strict policy (FMA math, no Tensor Cores) and float64 stay NCHW: cuDNN's
  NCHW kernels need no transposes. Under the ``tf32`` policy float32 goes channels last like the
  half types: an H100 profile of ResNet-50's TF32 step showed cuDNN's transposes around every
  NCHW float32 convolution (whether the whole step gains is still to be timed on a device, with
  and without ``--disable choose_layout``).
- Only where cuDNN runs the convolution (the kernel's ``fusion_pays``: loaded and switched on;
  the fallback is the NCHW im2col kernel between two copies), on concrete map and channel sizes.
  A weight known when the graph is compiled is reordered to the filter layout above there,
  once; a weight fed at run time (a train step's) by a transpose each run, a weight's worth of
  elements.
- A train step's convolutions of every direction count alike: the input gradient
  (``nhwc_conv2d_backward_data``: the output gradient and the result NHWC) and the weight
  gradient (``nhwc_conv2d_backward_filter``: the output gradient and the input NHWC, the result
  [O, kH, kW, C/group] transposed back to the OIHW the optimizer reads).

What follows the layout: elementwise ops (an operand of shape [C, 1, 1] or [N, C, 1, 1] is
relabelled as [1, 1, C] or [N, 1, 1, C], a free reshape, so per-channel constants, a folded
BatchNorm's scale and shift, biases and residual sums follow, and in a train step the
activations' gradients and casts), a concatenation along channels (axis 3) and a slice of
channels (its gradient), max and average
pooling and their gradients (``nhwc_*_pool2d``, ``nhwc_*_pool2d_backward``), reductions over the
map and maybe the batch too (global pooling, BatchNorm's statistics in training: each axis moved
to its NHWC place; kept dims [N|1, 1, 1, C] are [N|1, C, 1, 1] by a reshape), and their
gradients, a per-channel value spread over an image (``reduce_mean_grad``, ``broadcast_to``).
Anything else (a flatten into a classifier, a softmax over channels) reads the NCHW form: one
``from_nhwc`` per value, made once, and a value that was reordered back and is wanted channels
last again is taken from where it came (the cancelled pair never exists).
"""
from __future__ import annotations

import numpy as np

from ..backend.registry import KERNELS
from ..ir.graph import Graph, Node, Value
from ..ops.base import get_op
from ..settings import precision_policy
from .context import PassContext
from .rewrite import LayoutRewriter, Regions, constant_value

HALF_TYPES = ("float16",)                  # the dtypes whose cuDNN kernels want channels last
# ... and, under the tf32 policy, float32's: an H100's profile of ResNet-50's TF32 train step
# showed cuDNN transposing every NCHW float32 convolution into NHWC and back around its
# tensor-core kernel (nchwToNhwcKernel 135 calls, nhwcToNchwKernel 69, 3.5 ms of a 56 ms step)
TF32_TYPES = ("float32",)
MAP_REDUCTIONS = ("reduce_mean", "reduce_sum", "reduce_max")
POOLS = {"max_pool2d": "nhwc_max_pool2d", "avg_pool2d": "nhwc_avg_pool2d",
         "max_pool2d_grad": "nhwc_max_pool2d_backward", "avg_pool2d_grad": "nhwc_avg_pool2d_backward"}
SPREADS = ("reduce_mean_grad", "broadcast_to")   # a per-channel value spread over an image
CONVOLUTIONS = {"conv2d": "nhwc_conv2d", "conv2d_grad_input": "nhwc_conv2d_backward_data",
                "conv2d_grad_weight": "nhwc_conv2d_backward_filter"}
NHWC_AXIS = {0: 0, 1: 3, 2: 1, 3: 2}            # an NCHW axis's place in NHWC
TO_KRSC, FROM_KRSC = (0, 2, 3, 1), (0, 3, 1, 2)
REORDERS = ("to_nhwc", "from_nhwc")


def _image(v: Value) -> bool:
    """A 4-d value with concrete channel counts and maps (the batch may be symbolic)."""
    return v.rank == 4 and all(isinstance(d, int) for d in v.shape[1:])


def _per_image(v: Value) -> int:
    return int(np.prod(v.shape[1:]))


def _same_memory(v: Value) -> bool:
    """Whether an image's NCHW and NHWC forms are the same memory ([N, C, 1, 1], [N, 1, H, W]):
    a reshape, not a reorder, between them (any value of another rank: a reduction's result)."""
    return v.rank != 4 or tuple(v.shape[2:]) == (1, 1) or v.shape[1] == 1


def _relabelled(v: Value) -> tuple | None:
    """The channels-last shape of an operand that is one value per channel ([C, 1, 1] or
    [N|1, C, 1, 1]), which is the same memory: None for any other shape."""
    if v.rank == 3 and tuple(v.shape[1:]) == (1, 1):
        return (1, 1, v.shape[0])
    if v.rank == 4 and tuple(v.shape[2:]) == (1, 1):
        return (v.shape[0], 1, 1, v.shape[1])
    return None


def _over_the_map(node: Node) -> bool:
    """A reduction over an image's H and W axes, and maybe more (global pooling, BatchNorm's
    statistics over N, H and W): its result is the same memory in either layout."""
    return (node.op in MAP_REDUCTIONS and _image(node.inputs[0])
            and {2, 3} <= {a % 4 for a in node.attrs["axes"]})


def _images(node: Node) -> list[Value]:
    """A convolution's images, the one it reads first: conv2d's input and output, the input
    gradient's output gradient and result, the weight gradient's output gradient and input."""
    if node.op == "conv2d_grad_weight":
        return [node.inputs[0], node.inputs[1]]
    return [node.inputs[0], node.outputs[0]]


def _could_follow(node: Node) -> list[Value] | None:
    """The image operands an op would take channels last if it followed the layout (None if it
    cannot)."""
    if len(node.outputs) != 1:
        return None
    out = node.outputs[0]
    if _over_the_map(node):
        return [node.inputs[0]]
    if not _image(out):
        return None
    opdef = get_op(node.op)
    if opdef.elementwise and opdef.pure:
        images = [v for v in node.inputs if tuple(v.shape) == tuple(out.shape)]
        others = [v for v in node.inputs if tuple(v.shape) != tuple(out.shape)]
        if all((v.type.numel == 1 and v.rank <= 1) or _relabelled(v) is not None for v in others):
            return images
        return None
    if node.op == "concat" and node.attrs["axis"] % 4 == 1 and all(_image(v) for v in node.inputs):
        return list(node.inputs)
    if node.op == "slice" and node.attrs["axis"] % 4 == 1 and _image(node.inputs[0]):
        return [node.inputs[0]]          # a concatenation's gradient: its parts' channels
    if node.op in POOLS:
        return [v for v in node.inputs if _image(v)]
    if node.op in SPREADS and (node.inputs[0].type.numel == 1 or _relabelled(node.inputs[0]) is not None):
        return []
    return None


def saving_elements(node: Node) -> int:
    """What one image's convolution (of any direction) saves channels last: cuDNN's transposes
    of its two images around an NCHW half-precision kernel, in elements read and written once."""
    return sum(_per_image(v) for v in _images(node))


def why_not_channels_last(node: Node, device, precision: str = "strict") -> str | None:
    """None when ``node`` (a convolution of any direction on a GPU) can run channels last, else
    why not, in a few words. ``precision``: the float32 math policy in force (TF32's tensor-core
    kernels want NHWC as the half types' do)."""
    images = _images(node)
    wanted = HALF_TYPES + (TF32_TYPES if precision == "tf32" else ())
    if images[0].dtype not in wanted:
        return f"{images[0].dtype}: its cuDNN kernels take NCHW as fast"
    if not all(_image(v) for v in images):
        return "a symbolic map size"
    if not KERNELS.fusion_pays("nhwc_conv2d", device, images[0].dtype, node):
        return "cuDNN does not run it"
    return None


def worthwhile(graph: Graph, candidates: list[Node], followers: set[int]) -> tuple[set[int], set[int]]:
    """(ids of the candidates in regions whose saving exceeds the elements their borders reorder,
    ids of the ops that would follow the layout in those regions)."""
    regions = Regions()
    follow_inputs = {}
    for node in graph.nodes:
        if id(node) in followers:
            operands = _could_follow(node)
            if operands is not None:
                follow_inputs[id(node)] = operands
                for v in operands:
                    regions.union(v.id, node.outputs[0].id)
    cand_ids = {id(n) for n in candidates}
    for node in candidates:
        first, second = _images(node)
        regions.union(first.id, second.id)
    members = cand_ids | set(follow_inputs)
    # the values the members make channels last (a weight gradient makes none)
    produced_by = {id(node): node.outputs[0].id for node in graph.nodes
                   if id(node) in members and node.op != "conv2d_grad_weight"}
    produced_inside = set(produced_by.values())
    saving: dict[int, int] = {}
    cost: dict[int, int] = {}
    for node in candidates:
        root = regions.find(_images(node)[0].id)
        saving[root] = saving.get(root, 0) + saving_elements(node)
    readers = graph.consumers()
    kept = {v.id for v in graph.outputs.values()} | {v.id for v in graph.updates.values()}
    seen = set()
    for node in graph.nodes:
        if id(node) not in members:
            continue
        values = _images(node) if id(node) in cand_ids else follow_inputs[id(node)] + [node.outputs[0]]
        for v in values:
            if v.id in seen or _same_memory(v):           # relabelled, not reordered
                continue
            seen.add(v.id)
            enters = v.id not in produced_inside
            leaves = v.id in produced_inside and (v.id in kept or any(id(r) not in members
                                                                      for r in readers.get(v.id, [])))
            if enters or leaves:
                root = regions.find(v.id)
                cost[root] = cost.get(root, 0) + _per_image(v)
    paid = {root for root, saved in saving.items() if saved > cost.get(root, 0)}
    return ({id(n) for n in candidates if regions.find(_images(n)[0].id) in paid},
            {i for i in follow_inputs if regions.find(produced_by[i]) in paid})


class _Rewriter(LayoutRewriter):
    """Walks the nodes in order, emitting the new list: channels-last convolutions, the ops that
    follow them, and the reorders where a layout meets the other (``nhwc`` is the base's
    ``other``)."""

    REORDERS = REORDERS

    def __init__(self, region: set[int]):
        super().__init__()
        self.region = region                      # ids of the ops the regions chosen hold
        self.nhwc = self.other                    # NCHW value id -> its channels-last form
        self.only_nhwc = self.only_other          # NCHW values that exist only channels last
        self.filters: dict[int, Value] = {}       # OIHW weight id -> its [O, kH, kW, C/group] form

    def relabel(self, v: Value, shape: tuple, scope: str) -> Value:
        return self.emit(scope, "reshape", v, shape=shape)

    def to_nhwc(self, v: Value, scope: str) -> Value:
        if v.id not in self.nhwc:
            n, c, h, w = v.shape
            self.nhwc[v.id] = (self.relabel(v, (n, h, w, c), scope) if _same_memory(v)
                               else self.emit(scope, "to_nhwc", v))
        return self.nhwc[v.id]

    def reorder_back(self, v: Value, y: Value) -> Value:
        scope = y.producer.scope
        return self.relabel(y, tuple(v.shape), scope) if _same_memory(v) else self.emit(scope, "from_nhwc", y)

    def constant(self, like: Value, value: np.ndarray) -> Value:
        value.flags.writeable = False
        return self.emit(like.producer.scope, "constant", value=value)

    def filter(self, w: Value, scope: str) -> Value:
        """An OIHW weight as [O, kH, kW, C/group]: reordered once when the graph is compiled where
        it is a constant, else by a transpose each run (a train step's weights), made once."""
        if w.id not in self.filters:
            weight = constant_value(w)
            self.filters[w.id] = (self.constant(w, np.ascontiguousarray(weight.transpose(TO_KRSC)))
                                  if weight is not None else self.emit(scope, "transpose", w, perm=TO_KRSC))
        return self.filters[w.id]

    # -- per node -----------------------------------------------------------------------------
    def convolution(self, node: Node) -> None:
        """A convolution of any direction channels last: conv2d and the input gradient make an
        NHWC image; the weight gradient's [O, kH, kW, C/group] result is transposed back to the
        OIHW the optimizer reads (a weight's worth of elements)."""
        images = [self.nhwc.get(v.id) or self.to_nhwc(v, node.scope) for v in _images(node)
                  if v.producer is not node]
        op = CONVOLUTIONS[node.op]
        if node.op == "conv2d_grad_weight":
            dw = self.emit(node.scope, op, *images, **node.attrs)
            self.subst.replace(node.outputs[0], self.emit(node.scope, "transpose", dw, perm=FROM_KRSC))
            return
        attrs = ({k: node.attrs[k] for k in ("stride", "pad", "dilation", "group")} if node.op == "conv2d"
                 else node.attrs)
        y = self.emit(node.scope, op, images[0], self.filter(node.inputs[1], node.scope), *node.inputs[2:], **attrs)
        self.produce(node.outputs[0], y)

    def operand(self, v: Value, image_shape, scope: str) -> Value | None:
        """``v`` as an operand of an elementwise op on channels-last images: its channels-last
        form, a scalar as it is, a per-channel value relabelled; None where it cannot follow."""
        if v.id in self.nhwc:
            return self.nhwc[v.id]
        if tuple(v.shape) == tuple(image_shape):
            return self.to_nhwc(v, scope)
        if v.type.numel == 1 and v.rank <= 1:
            return v
        shape = _relabelled(v)
        return None if shape is None else self.relabel(v, shape, scope)

    def follow(self, node: Node) -> bool:
        """Emit ``node`` on channels-last operands when it is in a region chosen (an input
        pooled before the convolution that reads it, a branch of a concatenation) or one of its
        inputs exists only channels last, and the rest can follow; whether it did."""
        if not (id(node) in self.region or any(v.id in self.only_nhwc for v in node.inputs)) \
                or _could_follow(node) is None:
            return False
        opdef = get_op(node.op)
        out = node.outputs[0]
        if _over_the_map(node):
            x = node.inputs[0]
            axes = tuple(sorted(NHWC_AXIS[a % 4] for a in node.attrs["axes"]))
            r = self.emit(node.scope, node.op, self.nhwc.get(x.id) or self.to_nhwc(x, node.scope), axes=axes,
                          keepdims=True)
            # with H and W reduced, [N|1, 1, 1, C|1] is the NCHW result's memory: a reshape, no reorder
            self.subst.replace(out, self.relabel(r, tuple(out.shape), node.scope))
            self.followers += 1
            return True
        if node.op in SPREADS:
            g = node.inputs[0]
            shape = None if g.type.numel == 1 else _relabelled(g)
            spread = self.nhwc.get(g.id) or (self.relabel(g, shape, node.scope) if shape is not None else g)
            attrs = dict(node.attrs, shape=tuple(out.shape[i] for i in (0, 2, 3, 1)))
            if "axes" in attrs:
                attrs["axes"] = tuple(sorted(NHWC_AXIS[a % 4] for a in attrs["axes"]))
            self.produce(out, self.emit(node.scope, node.op, spread, **attrs))
            self.followers += 1
            return True
        if opdef.elementwise and opdef.pure:
            operands = [self.operand(v, out.shape, node.scope) for v in node.inputs]
            if any(o is None for o in operands):
                return False
            y = self.emit(node.scope, node.op, *operands, **node.attrs)
        elif node.op == "concat":
            y = self.emit(node.scope, "concat", *[self.nhwc.get(v.id) or self.to_nhwc(v, node.scope)
                                                  for v in node.inputs], axis=3)
        elif node.op == "slice":
            x = node.inputs[0]
            y = self.emit(node.scope, "slice", self.nhwc.get(x.id) or self.to_nhwc(x, node.scope),
                          **dict(node.attrs, axis=3))
        elif node.op in POOLS:
            y = self.emit(node.scope, POOLS[node.op], *[self.nhwc.get(v.id) or self.to_nhwc(v, node.scope)
                                                        for v in node.inputs], **node.attrs)
        else:
            return False
        self.produce(out, y)
        self.followers += 1
        return True

def choose_channels_last(graph: Graph, ctx: PassContext) -> bool:
    """Rewrite the GPU convolutions the cost rule (module docstring) picks into the channels-last
    layout; whether it changed the graph."""
    where = ctx.placement(graph)
    on_gpu = {id(n) for n in graph.nodes if not where.node(n).host_memory}
    convs = [n for n in graph.nodes if n.op in CONVOLUTIONS and id(n) in on_gpu]
    if not convs:
        return False
    precision = precision_policy(graph.precision)
    reasons = [(n, why_not_channels_last(n, where.node(n), precision)) for n in convs]
    chosen, region = worthwhile(graph, [n for n, why in reasons if why is None], on_gpu)
    reasons = [(n, "saves less than its reorders cost" if why is None and id(n) not in chosen else why)
               for n, why in reasons]
    if not chosen:
        return False                 # notes are changes (context.py): what stayed NCHW rides on one
    rw = _Rewriter(region)
    for node in graph.nodes:
        node.inputs = [rw.subst.resolve(v) for v in node.inputs]
        if id(node) in chosen:
            rw.convolution(node)
        elif not (id(node) in on_gpu and rw.follow(node)):
            rw.keep(node)
    for name, v in list(graph.outputs.items()):
        graph.outputs[name] = rw.to_plain(rw.subst.resolve(v))
    for name, v in list(graph.updates.items()):
        graph.updates[name] = rw.to_plain(rw.subst.resolve(v))
    graph.nodes = rw.nodes
    rw.subst.apply(graph)
    ctx.note(f"choose_layout: {len(chosen)} of {len(convs)} convolutions channels last (NHWC) on the GPU, "
             f"{rw.followers} op(s) follow the layout; "
             f"reorders: {rw.reorders['to_nhwc']} to NHWC, {rw.reorders['from_nhwc']} back to NCHW")
    kept = [f"{n.scope} ({why})" for n, why in reasons if why is not None]
    if kept:
        shown = ", ".join(kept[:6]) + (f", and {len(kept) - 6} more" if len(kept) > 6 else "")
        ctx.note(f"choose_layout: kept NCHW on the GPU: {shown}")
    return True
