"""GPU kernels of the channels-last layout (ops/nhwc.py): the convolution through cuDNN with
NHWC tensors and the filter in cuDNN's NHWC format ([O, kH, kW, C/group]), which its Tensor
Core kernels for float16 read without the transposes an NCHW convolution pays inside cuDNN;
the reorders are the CPU kernels' array programs over CuPy (one transposing copy each), and so
is pooling for a dtype that pooling.py's CUDA kernels do not take (they specialise these ops).
float32 follows the precision policy in the three directions, as the NCHW convolutions do
(dnn_routes.py's ``policy``).

The convolutions (forward, and the input and weight gradients of a train step) fall back to the
NCHW im2col kernels between reorders (kernels/cpu/nhwc.py over
CuPy) when cuDNN cannot run it (not loaded, ``TOOLKIT_CUDNN=0``, no algorithm for the shapes),
and the layout pass asks this kernel's ``fusion_pays`` before it makes the op: only with cuDNN
loaded does channels-last pay.
"""
from __future__ import annotations

from collections import Counter

from ...backend.devices import gpu_module
from ...backend.registry import register_kernel
from ...ops.nhwc import nchw_shape
from ..cpu.nhwc import NHWC_KERNELS
from . import dnn
from .arrays import GPU_ARRAYS
from .dnn_routes import policy

# what each channels-last convolution built so far ran on: ("cudnn", "") or ("im2col", why)
CHOSEN: Counter = Counter()


def _over_cupy(builder):
    def factory(ctx):
        return builder(ctx, GPU_ARRAYS)
    factory.__name__ = f"{builder.__name__}_gpu"
    return factory


def cudnn_nhwc_conv2d(ctx):
    """cuDNN's forward convolution on channels-last operands; the bias added by broadcasting
    over the last axis (cudnnAddTensor's NCHW bias descriptor would not match)."""
    o, kh, kw, cg = ctx.in_shapes[1]
    conv = dnn.Convolution("forward", nchw_shape(ctx.in_shapes[0]), (o, cg, kh, kw), nchw_shape(ctx.out_shapes[0]),
                           ctx.attrs, ctx.dtype, layout="nhwc", precision=policy(ctx))
    x_in, w_in, y_out = dnn._Packed(), dnn._Packed(), dnn._Packed()
    cp = gpu_module()

    def run(ins, outs):
        y = y_out.target(outs[0])
        conv(x_in.read(ins[0]), w_in.read(ins[1]), y)
        if len(ins) == 3:
            cp.add(y, ins[2], out=y)
        if y is not outs[0]:
            cp.copyto(outs[0], y)
    return run


def _gradient(conv: dnn.Convolution):
    """run(ins, outs) for a gradient op whose inputs are (output gradient, the other operand):
    cuDNN takes the other operand first."""
    g_in, other_in, out = dnn._Packed(), dnn._Packed(), dnn._Packed()
    cp = gpu_module()

    def run(ins, outs):
        target = out.target(outs[0])
        conv(other_in.read(ins[1]), g_in.read(ins[0]), target)
        if target is not outs[0]:
            cp.copyto(outs[0], target)
    return run


def cudnn_nhwc_conv2d_backward_data(ctx):
    g_shape, (o, kh, kw, cg) = nchw_shape(ctx.in_shapes[0]), ctx.in_shapes[1]
    return _gradient(dnn.Convolution("data", nchw_shape(ctx.out_shapes[0]), (o, cg, kh, kw), g_shape, ctx.attrs,
                                     ctx.dtype, layout="nhwc", precision=policy(ctx)))


def cudnn_nhwc_conv2d_backward_filter(ctx):
    g_shape, x_shape = nchw_shape(ctx.in_shapes[0]), nchw_shape(ctx.in_shapes[1])
    return _gradient(dnn.Convolution("filter", x_shape, nchw_shape(ctx.out_shapes[0]), g_shape, ctx.attrs, ctx.dtype,
                                     layout="nhwc", precision=policy(ctx)))


def _cudnn_or_im2col(op: str, through_cudnn):
    def factory(ctx):
        why = dnn.unavailable()
        if why is None:
            try:
                run = through_cudnn(ctx)
                CHOSEN["cudnn", ""] += 1
                return run
            except dnn.Unsupported as e:
                why = str(e)
        CHOSEN["im2col", why] += 1
        return NHWC_KERNELS[op](ctx, GPU_ARRAYS)
    factory.__name__ = f"{op}_cudnn_or_im2col"
    return factory


CUDNN_BUILDERS = {"nhwc_conv2d": cudnn_nhwc_conv2d, "nhwc_conv2d_backward_data": cudnn_nhwc_conv2d_backward_data,
                  "nhwc_conv2d_backward_filter": cudnn_nhwc_conv2d_backward_filter}


def channels_last_pays(node=None) -> bool:
    """Whether the layout pass should put convolutions channels last here: only where cuDNN runs
    them (the fallback is the NCHW kernel plus two copies)."""
    return dnn.unavailable() is None


for _op, _builder in NHWC_KERNELS.items():
    if _op in CUDNN_BUILDERS:
        register_kernel(_op, "gpu", fusion_pays=channels_last_pays)(_cudnn_or_im2col(_op, CUDNN_BUILDERS[_op]))
    else:
        register_kernel(_op, "gpu")(_over_cupy(_builder))
