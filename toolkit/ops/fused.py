"""Fused ops that graph passes create (users never write them): one kernel for a group of ops.

conv2d_max_pool2d: conv2d (with optional bias) whose output feeds only an unpadded, floor-mode
max_pool2d; the kernel pools in the convolution's working layout before the move back to NCHW.

fused_elementwise: a group of elementwise ops of one shape, described as a *program*: a tuple of
steps ``(op, args, attrs)`` whose args name a node input ``("x", i)``, an earlier step
``("t", j)`` or, in an epilogue, the head's result ``("h",)``. ``outputs`` lists the steps
whose values leave the group (one node output each). Inputs of other shapes broadcast into the
group's shape (biases, scalars); every step has the group's shape.

fused_epilogue: a head op (matmul, conv2d, conv2d_max_pool2d, conv2d_grad_input) whose result is
read only by an elementwise program: ``head``/``head_attrs`` name it, the first ``head_inputs``
node inputs are its operands, and the program reads the rest.

Both fused programs may read an input through a view, ``views[i] = (axis, start, stop)`` (empty
when none): a slice along a non-batch axis, such as one branch's columns of a batched GEMM's
result, read in place instead of copied out first.

fused_elementwise and fused_reduce may also store values in a type other than the one they
compute in (a mixed-precision step's float16 activations around float32 arithmetic): then
``compute`` names the program's dtype, ``in_dtypes[i]`` the stored dtype of input i (widened as
it is read) and, for fused_elementwise, ``out_dtypes[k]`` that of output k (rounded as it is
written): the casts the passes/fuse_casts.py pass took in, each done where the value is loaded
or stored. Without ``compute`` every value has the program's dtype.

All are made after autodiff, so none needs a gradient rule.
"""
from __future__ import annotations

from ..ir.dims import Dim
from ..ir.graph import TensorType
from .base import OpDef, ShapeError, get_op, register
from .conv import _conv_flops, _conv_infer, conv2d_reference
from .pool import _pool_flops, _pool_infer, max_pool2d_reference

CONV_KEYS = ("stride", "pad", "dilation", "group")
POOL_PREFIX = "pool_"


def split_attrs(attrs: dict) -> tuple[dict, dict]:
    conv = {k: attrs[k] for k in CONV_KEYS}
    pool = {k[len(POOL_PREFIX):]: v for k, v in attrs.items() if k.startswith(POOL_PREFIX)}
    return conv, pool


def _infer(types, attrs):
    conv, pool = split_attrs(attrs)
    return _pool_infer(_conv_infer(types, conv), pool)


def _reference(*arrays, **attrs):
    conv, pool = split_attrs(attrs)
    return max_pool2d_reference(conv2d_reference(*arrays, **conv), **pool)


def _flops(ins, outs, attrs):
    conv, pool = split_attrs(attrs)
    mid = _conv_infer(ins, conv)
    return _conv_flops(ins, mid, conv) + _pool_flops(mid, outs, pool)


register(OpDef("conv2d_max_pool2d", _infer, _reference, None, _flops, batch_rows=True, fused=True,
               doc="max_pool2d(conv2d(x, w[, b])) in one kernel; made by the fuse_conv_max_pool pass"))


# -- programs ---------------------------------------------------------------------------------
def make_step(op: str, args, attrs: dict) -> tuple:
    return (op, tuple(args), tuple(sorted(attrs.items())))


def _arg(ref, inputs: list, steps: list, head):
    kind = ref[0]
    if kind == "x":
        return inputs[ref[1]]
    if kind == "t":
        return steps[ref[1]]
    if kind == "h" and head is not None:
        return head
    raise ShapeError(f"program argument {ref} names nothing")


def program_types(program, input_types: list[TensorType], head: TensorType | None = None) -> list[TensorType]:
    """The type of every step, by each op's own shape rule; every step must have the type of
    the last one (the group's shape), as the fused kernels compute all steps block by block."""
    types: list[TensorType] = []
    for op, args, attrs in program:
        opdef = get_op(op)
        if not opdef.elementwise or not opdef.pure:
            raise ShapeError(f"fused program step {op} is not a pure elementwise op")
        (t,) = opdef.infer([_arg(a, input_types, types, head) for a in args], dict(attrs))
        types.append(t)
    group = types[-1]
    for t in types:
        if t.shape != group.shape:
            raise ShapeError(f"fused program steps differ in shape: {t} vs {group}")
    return types


def run_program(program, inputs: list, head=None) -> list:
    """Every step's value, by each op's reference (the slow, obvious evaluation)."""
    values: list = []
    for op, args, attrs in program:
        values.append(get_op(op).reference(*[_arg(a, inputs, values, head) for a in args], **dict(attrs)))
    return values


def program_flops(program, types: list[TensorType]) -> Dim:
    total: Dim = 0
    for (op, _args, _attrs), t in zip(program, types):
        fl = get_op(op).flops
        if fl is not None:
            total = total + fl([], [t], {})
    return total


def _check_outputs(attrs):
    if not attrs["outputs"]:
        raise ShapeError("a fused program needs at least one output")


def viewed_types(types: list[TensorType], views) -> list[TensorType]:
    """The types a program reads: each input through its view, if it has one."""
    out = []
    for t, view in zip(types, views or ()):
        if view:
            axis, start, stop = view
            if axis < 1:
                raise ShapeError("a fused program views inputs along a non-batch axis only")
            (t,) = get_op("slice").infer([t], {"axis": axis, "start": start, "stop": stop})
        out.append(t)
    return out + list(types[len(views or ()):])


def viewed_arrays(arrays: list, views) -> list:
    out = list(arrays)
    for i, view in enumerate(views or ()):
        if view:
            axis, start, stop = view
            index = [slice(None)] * arrays[i].ndim
            index[axis] = slice(start, stop)
            out[i] = arrays[i][tuple(index)]
    return out


def computed_types(types: list[TensorType], attrs) -> list[TensorType]:
    """The input types a program computes with: each stored input widened to ``compute``."""
    if "compute" not in attrs:
        return list(types)
    stored = attrs["in_dtypes"]
    if len(stored) != len(types) or any(t.dtype != d for t, d in zip(types, stored)):
        raise ShapeError(f"a fused op's inputs are stored as {[t.dtype for t in types]}, "
                         f"not as its in_dtypes {list(stored)}")
    return [TensorType(t.shape, attrs["compute"]) for t in types]


def computed_arrays(arrays: list, attrs) -> list:
    if "compute" not in attrs:
        return list(arrays)
    return [a.astype(attrs["compute"], copy=False) for a in arrays]


def stored_types(types: list[TensorType], attrs) -> list[TensorType]:
    """The output types as stored: rounded to ``out_dtypes`` where it names one."""
    if "out_dtypes" not in attrs:
        return list(types)
    return [TensorType(t.shape, d) for t, d in zip(types, attrs["out_dtypes"])]


def _elementwise_infer(types, attrs):
    _check_outputs(attrs)
    steps = program_types(attrs["program"], viewed_types(computed_types(types, attrs), attrs.get("views")))
    return stored_types([steps[j] for j in attrs["outputs"]], attrs)


def _elementwise_reference(*arrays, program, outputs, views=(), compute=None, in_dtypes=(), out_dtypes=()):
    if compute is not None:
        arrays = computed_arrays(list(arrays), {"compute": compute})
    values = run_program(program, viewed_arrays(list(arrays), views))
    result = tuple(values[j] for j in outputs)
    if out_dtypes:
        result = tuple(r.astype(d, copy=False) for r, d in zip(result, out_dtypes))
    return result if len(result) > 1 else result[0]


def _elementwise_flops(ins, outs, attrs):
    types = viewed_types(computed_types(ins, attrs), attrs.get("views"))
    return program_flops(attrs["program"], program_types(attrs["program"], types))


register(OpDef("fused_elementwise", _elementwise_infer, _elementwise_reference, None, _elementwise_flops,
               batch_rows=True,
               fused=True, doc="a chain of elementwise ops as one pass over memory; made by the fuse_elementwise pass"))


# -- epilogues --------------------------------------------------------------------------------
EPILOGUE_HEADS = ("matmul", "conv2d", "conv2d_max_pool2d", "conv2d_grad_input", "conv2d_blocked", "nhwc_conv2d")


def store_program(program, outputs, residual_ok) -> tuple[int | None, bool] | None:
    """(the input position of a residual added, or None; whether a ReLU follows) where an
    epilogue program is one a GEMM tile applies as it stores it: relu(h), h + r, or relu(h + r),
    with r input ``("x", i)`` where ``residual_ok(i)`` (the head's shape, no view); None for any
    other program. The packed GEMM's and the blocked convolutions' kernels take these."""
    h = ("h",)
    steps, outputs = tuple(program), tuple(outputs)

    def residual(step) -> int | None:
        op, args, attrs = step
        if op != "add" or attrs or len(args) != 2 or h not in args:
            return None
        other = args[1] if args[0] == h else args[0]
        return other[1] if other[0] == "x" and residual_ok(other[1]) else None
    if steps == (("relu", (h,), ()),) and outputs == (0,):
        return None, True
    if len(steps) == 1 and outputs == (0,) and residual(steps[0]) is not None:
        return residual(steps[0]), False
    if (len(steps) == 2 and outputs == (1,) and residual(steps[0]) is not None
            and steps[1] == ("relu", (("t", 0),), ())):
        return residual(steps[0]), True
    return None


def head_parts(attrs: dict) -> tuple[str, dict, int]:
    return attrs["head"], dict(attrs["head_attrs"]), attrs["head_inputs"]


def _epilogue_infer(types, attrs):
    _check_outputs(attrs)
    head, head_attrs, k = head_parts(attrs)
    if head not in EPILOGUE_HEADS:
        raise ShapeError(f"{head} cannot head an epilogue (heads: {', '.join(EPILOGUE_HEADS)})")
    (head_type,) = get_op(head).infer(types[:k], head_attrs)
    steps = program_types(attrs["program"], viewed_types(types, attrs.get("views")), head_type)
    if steps[-1].shape != head_type.shape:
        raise ShapeError(f"the epilogue's shape {steps[-1]} differs from its head's {head_type}")
    return [steps[j] for j in attrs["outputs"]]


def _epilogue_reference(*arrays, head, head_attrs, head_inputs, program, outputs, views=()):
    head_value = get_op(head).reference(*arrays[:head_inputs], **dict(head_attrs))
    values = run_program(program, viewed_arrays(list(arrays), views), head_value)
    result = tuple(values[j] for j in outputs)
    return result if len(result) > 1 else result[0]


def _epilogue_flops(ins, outs, attrs):
    head, head_attrs, k = head_parts(attrs)
    opdef = get_op(head)
    (head_type,) = opdef.infer(ins[:k], head_attrs)
    total = opdef.flops(ins[:k], [head_type], head_attrs) if opdef.flops else 0
    viewed = viewed_types(ins, attrs.get("views"))
    return total + program_flops(attrs["program"], program_types(attrs["program"], viewed, head_type))


register(OpDef("fused_epilogue", _epilogue_infer, _epilogue_reference, None, _epilogue_flops, batch_rows=True,
               fused=True, doc="a GEMM or convolution followed by an elementwise program, in one kernel; made by the "
                   "fuse_epilogue pass"))


# -- the weight and bias gradients of an InnerProduct, from one read of g -------------------------
def _bias_grad_infer(types, attrs):
    g, x = types
    if g.rank != 2 or x.rank != 2:
        raise ShapeError(f"matmul_bias_gradient needs matrices, got {g} and {x}")
    (weight,) = get_op("matmul").infer([g, x], {"trans_a": True, "trans_b": False})
    (bias,) = get_op("reduce_sum").infer([g], {"axes": (0,), "keepdims": attrs["keepdims"]})
    return [weight, bias]


def _bias_grad_reference(g, x, keepdims):
    return get_op("matmul").reference(g, x, trans_a=True, trans_b=False), g.sum(axis=0, keepdims=keepdims)


def _bias_grad_flops(ins, outs, attrs):
    return 2 * outs[0].numel * ins[0].shape[0] + ins[0].numel


register(OpDef("matmul_bias_gradient", _bias_grad_infer, _bias_grad_reference, None, _bias_grad_flops, fused=True,
               doc="(g^T x, the sum of g's rows): a weight gradient and its bias gradient from one read of g; "
                   "made by the fuse_bias_gradient pass"))
