"""GPU kernels of the fused ops: the group's loop program rendered to CUDA (one thread per
element, every step in registers), compiled when the plan is built. A float16 group reads and
writes half-precision buffers and computes in float32 registers.

- ``fused_elementwise``: one kernel reads the group's inputs and writes its outputs once.
- ``fused_epilogue``: a GEMM whose program is ``h + b`` or ``relu(h + b)`` is one cuBLASLt call
  with the bias (and ReLU) in its epilogue (lt.py); a convolution with its bias whose program is
  ``relu(h)`` or ``relu(h + z)`` is one cudnnConvolutionBiasActivationForward where that
  measures faster (dnn_epilogue.py); otherwise the head (a cuBLAS GEMM, or the
  im2col convolution) writes the first output's array, and one kernel then reads it as the head
  and overwrites it element by element (each element's reads come before its writes, in one
  thread).

A group that stores values in another dtype than it computes in (``compute``, ``in_dtypes``,
``out_dtypes``: casts the fuse_casts pass took in) reads and writes them in that dtype.

A program with a step the generator cannot write (none of today's elementwise ops, but the
table may grow) runs as the CPU's program runner over CuPy arrays instead: one CuPy call per
step, still on the device.
"""
from __future__ import annotations

import numpy as np

from ...backend.devices import gpu_module
from ...backend.registry import KERNELS, KernelContext, register_kernel
from ...ir.graph import Node
from ...ops.fused import head_parts
from ..cpu.fused import ProgramRunner, elementwise_inplace_pairs
from ..native.elementwise import _arrays_for, elementwise_kernel
from .cuda import launcher
from .dnn_epilogue import epilogue_convolution
from .lt import epilogue_gemm

cp = gpu_module()

CUDA_DTYPES = ("float32", "float64", "float16")


def _program_call(ctx: KernelContext, name: str, head: bool):
    """run(ins, outs, head_array) for the node's program, or None where CUDA cannot write it."""
    if ctx.dtype not in CUDA_DTYPES:
        return None
    group = tuple(ctx.out_shapes[0])
    built = elementwise_kernel(name, ctx.attrs["program"], ctx.attrs["outputs"], ctx.in_shapes, group, ctx.dtype,
                               ctx.attrs.get("views", ()), threads=2, head=head, min_parallel=0, flat=True,
                               in_dtypes=ctx.attrs.get("in_dtypes", ()), out_dtypes=ctx.attrs.get("out_dtypes", ()))
    if built is None:
        return None
    kernel, keys = built
    launch = launcher(kernel, int(np.prod(group, dtype=np.int64)))

    def run(ins, outs, head_array=None):
        launch(_arrays_for(keys, ins, outs, head_array))
    return run


def _runner(ctx: KernelContext, head: bool):
    if "compute" in ctx.attrs:
        return _stored_runner(ctx)
    runner = ProgramRunner(ctx.attrs["program"], ctx.attrs["outputs"], ctx.in_shapes, ctx.out_shapes[0], ctx.dtype,
                           head_shape=tuple(ctx.out_shapes[0]) if head else None, views=ctx.attrs.get("views", ()),
                           scratch=lambda _slot, shape, dtype: cp.empty(shape, dtype))

    def run(ins, outs, head_array=None):
        runner(ins, outs, head_array)
    return run


def _stored_runner(ctx: KernelContext):
    """The runner of a group storing values in other dtypes than it computes in (no epilogue
    does): widened copies of the inputs in, each output step once, rounded copies out."""
    compute = ctx.attrs["compute"]
    steps = list(dict.fromkeys(ctx.attrs["outputs"]))
    runner = ProgramRunner(ctx.attrs["program"], tuple(steps), ctx.in_shapes, ctx.out_shapes[0], compute,
                           views=ctx.attrs.get("views", ()),
                           scratch=lambda _slot, shape, dtype: cp.empty(shape, dtype))
    shape = tuple(ctx.out_shapes[0])

    def run(ins, outs, head_array=None):
        wide = [cp.empty(shape, compute) for _ in steps]
        runner([a.astype(compute, copy=False) for a in ins], wide)
        for out, step in zip(outs, ctx.attrs["outputs"]):
            out[...] = wide[steps.index(step)]
    return run


@register_kernel("fused_elementwise", "gpu", inplace=elementwise_inplace_pairs, stores=CUDA_DTYPES)
def fused_elementwise_gpu(ctx: KernelContext):
    program = _program_call(ctx, "tk_fused", head=False) or _runner(ctx, head=False)

    def run(ins, outs):
        program(ins, outs)
    return run


@register_kernel("fused_epilogue", "gpu")
def fused_epilogue_gpu(ctx: KernelContext):
    head, head_attrs, k = head_parts(ctx.attrs)
    group = tuple(ctx.out_shapes[0])
    head_node = Node(head, ctx.node.inputs[:k], head_attrs, ctx.node.scope)
    head_ctx = KernelContext(head_node, head_attrs, ctx.in_shapes[:k], [group], ctx.dtype, ctx.device,
                             ctx.runtime, ctx.xp, precision=ctx.precision)
    head_fn = KERNELS.lookup(head, ctx.device, ctx.dtype).factory(head_ctx)
    program = _program_call(ctx, "tk_epilogue", head=True)
    head_buffer = None
    if program is None:
        # the runner may write output 0 while a later step still reads the head: keep it apart
        program = _runner(ctx, head=True)
        head_buffer = cp.empty(group, ctx.dtype)

    def two_kernels(ins, outs):
        target = outs[0] if head_buffer is None else head_buffer
        head_fn(ins[:k], [target])
        program(ins, outs, target)

    # h + b or relu(h + b) after a GEMM: one cuBLASLt call with the bias (and ReLU) in its
    # epilogue; relu(conv + b (+ z)): one cuDNN call
    one_call = None
    if head == "matmul":
        one_call = epilogue_gemm(ctx, head_attrs, k)
    elif head == "conv2d":
        one_call = epilogue_convolution(ctx, head_attrs, k, two_kernels)

    def run(ins, outs):
        if one_call is not None and one_call(ins, outs):
            return
        two_kernels(ins, outs)
    return run
