"""A fused epilogue that is exactly a convolution with its bias then ReLU, or the residual add
then ReLU, as one cudnnConvolutionBiasActivationForward (y = relu(conv(x, w) + b (+ z))), where
that measures faster than the convolution and the epilogue's kernel (fused.py keeps those two
otherwise).
"""
from __future__ import annotations

import ctypes

import numpy as np

from . import blas, dnn_routes
from .dnn import (
    MATH_FMA,
    Convolution,
    CudnnError,
    Unsupported,
    _descriptor,
    check,
    handle,
    library,
    tensor_descriptor,
    unavailable,
)
from .dnn_bfloat16 import BFLOAT16, operand_type
from .dnn_routes import FUSED, FUSED_ROUTES, policy, workspace_limit

# cudnnConvolutionFwdAlgo_t: the one algorithm cudnnConvolutionBiasActivationForward runs a ReLU
# with; cudnnActivationMode_t, cudnnNanPropagation_t
IMPLICIT_PRECOMP_GEMM = 1
ACTIVATION_RELU, PROPAGATE_NAN = 1, 1


def relu_epilogue(program, outputs, views, k: int, n_inputs: int) -> tuple[bool, int | None] | None:
    """(True, residual input's position or None) when a convolution-with-bias head's epilogue
    program is exactly ``relu(h)`` or ``relu(h + z)`` with only the ReLU leaving the group (what
    cudnnConvolutionBiasActivationForward computes); None otherwise."""
    if any(views or ()) or k != 3:
        return None
    steps = tuple((step[0], tuple(tuple(a) for a in step[1]), tuple(step[2])) for step in program)
    if steps == (("relu", (("h",),), ()),) and tuple(outputs) == (0,):
        return True, None
    if len(steps) != 2 or tuple(outputs) != (1,) or steps[1] != ("relu", (("t", 0),), ()):
        return None
    op, args, extra = steps[0]
    if op != "add" or extra or len(args) != 2 or ("h",) not in args:
        return None
    other = args[0] if args[1] == ("h",) else args[1]
    if other[0] != "x" or not k <= other[1] < n_inputs:
        return None
    return True, other[1]


class BiasActivation:
    """y = relu(conv(x, w) + b (+ z)) in one cuDNN call, with the algorithm it allows a ReLU."""

    def __init__(self, x_shape, w_shape, y_shape, attrs, dtype, precision: str):
        lib = library()
        if not getattr(lib, "fused_forward", False):
            raise Unsupported("this cuDNN has no cudnnConvolutionBiasActivationForward")
        conv = self.conv = Convolution("forward", x_shape, w_shape, y_shape, attrs, dtype, precision=precision)
        if conv.math != MATH_FMA:       # the ranking left the descriptor at its own choice's math
            check(lib.cudnnSetConvolutionMathType(conv.conv, conv.math), "cudnnSetConvolutionMathType")
        raw, _ = handle().on_current_stream()
        size = ctypes.c_size_t(0)
        status = lib.cudnnGetConvolutionForwardWorkspaceSize(raw, conv.x, conv.w, conv.conv, conv.y,
                                                             IMPLICIT_PRECOMP_GEMM, ctypes.byref(size))
        if status != 0 or size.value > workspace_limit():
            raise Unsupported("no implicit precomputed GEMM within the workspace bound")
        self.workspace_bytes = size.value
        self.bias = tensor_descriptor((1, int(w_shape[0]), 1, 1), conv.data_type)
        self.activation = _descriptor("cudnnCreateActivationDescriptor", "cudnnSetActivationDescriptor",
                                      ACTIVATION_RELU, PROPAGATE_NAN, ctypes.c_double(0.0))

    def __call__(self, x, w, b, z, y) -> None:
        conv, lib = self.conv, library()
        raw, workspace = handle().on_current_stream(self.workspace_bytes)
        check(lib.cudnnConvolutionBiasActivationForward(
            raw, ctypes.byref(conv.one), conv.x, ctypes.c_void_p(blas.pointer(x)), conv.w,
            ctypes.c_void_p(blas.pointer(w)), conv.conv, IMPLICIT_PRECOMP_GEMM, ctypes.c_void_p(workspace),
            self.workspace_bytes, ctypes.byref(conv.zero if z is None else conv.one), conv.y,
            ctypes.c_void_p(blas.pointer(y if z is None else z)), self.bias, ctypes.c_void_p(blas.pointer(b)),
            self.activation, conv.y, ctypes.c_void_p(blas.pointer(y))), "cudnnConvolutionBiasActivationForward")


def epilogue_convolution(ctx, head_attrs, k: int, separate):
    """run(ins, outs) -> True doing a fused epilogue's convolution, bias, residual add and ReLU in
    one cudnnConvolutionBiasActivationForward, where the group is exactly that, cuDNN takes it,
    and it measures faster than ``separate`` (the head's kernel then the epilogue's, timed once
    per shapes, dtype and policy in the process; where nothing can be timed, the two kernels
    stay). None where it does not apply; the run returns False for operands not contiguous."""
    if unavailable() or str(np.dtype(ctx.dtype)) not in ("float32", "float16"):
        return None
    found = relu_epilogue(ctx.attrs["program"], ctx.attrs["outputs"], ctx.attrs.get("views"), k, len(ctx.in_shapes))
    if found is None or len(ctx.out_shapes) != 1:
        return None
    _relu, residual = found
    x_shape, w_shape, b_shape = (tuple(int(v) for v in s) for s in ctx.in_shapes[:3])
    y_shape = tuple(int(v) for v in ctx.out_shapes[0])
    if b_shape not in ((w_shape[0],), (1, w_shape[0], 1, 1)) or operand_type(ctx) == BFLOAT16:
        return None
    if residual is not None and tuple(ctx.in_shapes[residual]) != y_shape:
        return None
    if any(getattr(v, "dtype", ctx.dtype) != ctx.dtype for v in getattr(ctx.node, "inputs", ())):
        return None
    key = (x_shape, w_shape, y_shape, tuple(sorted((n, repr(v)) for n, v in head_attrs.items())),
           str(np.dtype(ctx.dtype)), policy(ctx), residual is not None)
    if FUSED_ROUTES.get(key) is False:
        return None
    try:
        fused = BiasActivation(x_shape, w_shape, y_shape, head_attrs, ctx.dtype, policy(ctx))
    except (Unsupported, CudnnError):
        FUSED_ROUTES[key] = False
        return None

    def run(ins, outs) -> bool:
        operands = [ins[0], ins[1], ins[2], None if residual is None else ins[residual], outs[0]]
        if not all(a is None or a.flags.c_contiguous for a in operands):
            return False
        fused(*operands)
        return True

    if key not in FUSED_ROUTES:
        try:
            times = [dnn_routes.seconds_on_device(candidate, ctx.in_shapes, y_shape, ctx.dtype)
                     for candidate in (run, separate)]
        except CudnnError:                # cuDNN refused it when it ran: the two kernels stay
            times = [None]
        FUSED_ROUTES[key] = None not in times and times[0] < times[1]
    if not FUSED_ROUTES[key]:
        return None
    FUSED["relu(conv + b + z)" if residual is not None else "relu(conv + b)"] += 1
    return run
