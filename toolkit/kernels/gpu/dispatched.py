"""GPU kernels that are the numpy kernels themselves, run on CuPy arrays, and the few written
for the device: reductions and softmax (float32 accumulation for float16) and the transfer.

``DISPATCHED`` kernels' calls (ufuncs with ``out=``, ``np.sum``/``np.copyto``...) reach CuPy
through numpy's dispatch protocols (``__array_ufunc__``, ``__array_function__``), so elementwise
ops go to CuPy's kernels with no host round trip. Only kernels without host-side scratch are
listed. GEMMs are blas.py's (our own cuBLAS handle, which a CUDA graph can capture).
"""
from __future__ import annotations

import numpy as np

from ...backend.devices import gpu_module
from ...backend.registry import KERNELS, register_kernel
from ...ops.base import get_op
from ...ops.elementwise import ELEMENTWISE_IMPL
from .. import cpu  # noqa: F401  (the numpy kernels the dispatched entries reuse)

cp = gpu_module()

# random (impure) ops: the CPU's draw from the host generator; arrays.py has the device's
DISPATCHED = sorted(op for op in ELEMENTWISE_IMPL if get_op(op).pure) + [
    "reshape", "transpose", "concat", "slice", "broadcast_to", "scalar", "constant",
    "reduce_mean_grad", "bessel_correct", "pad_axis", "all_finite", "round_precision"]


def half_accumulator(dtype: str):
    """The dtype sums are taken in: float32 for half precision, the dtype itself otherwise."""
    return np.float32 if dtype == "float16" else None


# the CPU's plain kernels (imported above, so all registered), whatever specialises them there
for _op in DISPATCHED:
    for _dtype, _entry in KERNELS.portable(_op, "cpu").items():
        register_kernel(_op, "gpu", _dtype, inplace=_entry.inplace)(_entry.factory)


def _reduction_factory(name: str):
    """sum or mean over axes, in float32 for float16 inputs."""
    def factory(ctx):
        axes, keep, acc = tuple(ctx.attrs["axes"]), ctx.attrs["keepdims"], half_accumulator(ctx.dtype)
        reduce = getattr(cp, name)

        def run(ins, outs):
            if acc is None:
                reduce(ins[0], axis=axes, keepdims=keep, out=outs[0])
            else:
                outs[0][...] = reduce(ins[0], axis=axes, keepdims=keep, dtype=acc)
        return run
    return factory


@register_kernel("iota", "gpu")
def iota_gpu(ctx):
    """Positions, made once on the device (a plan computes an iota when it is built, on the
    host; this runs where a graph still holds one on the device)."""
    value = cp.asarray(get_op("iota").reference(ctx.out_shapes[0], ctx.attrs["axis"], ctx.dtype))

    def run(ins, outs):
        outs[0][...] = value
    return run


register_kernel("reduce_sum", "gpu")(_reduction_factory("sum"))
register_kernel("reduce_mean", "gpu")(_reduction_factory("mean"))
# over BatchNorm's axes (every axis but the channels) channel_reductions.py's two-stage kernel
# takes their place (it specialises these, which stay its fallback)


def _softmax_factory(log: bool):
    def factory(ctx):
        axis = ctx.attrs["axis"]
        acc = half_accumulator(ctx.dtype) or ctx.dtype

        def run(ins, outs):
            x = ins[0].astype(acc, copy=False)
            shifted = x - cp.max(x, axis=axis, keepdims=True)
            if log:
                outs[0][...] = shifted - cp.log(cp.sum(cp.exp(shifted), axis=axis, keepdims=True))
            else:
                e = cp.exp(shifted)
                outs[0][...] = e / cp.sum(e, axis=axis, keepdims=True)
        return run
    return factory


register_kernel("softmax", "gpu")(_softmax_factory(False))
register_kernel("log_softmax", "gpu")(_softmax_factory(True))


@register_kernel("transfer", "gpu")
def transfer_gpu(ctx):
    """Into this GPU's memory: from the host (one host-to-device copy) or another GPU."""
    def run(ins, outs):
        if isinstance(ins[0], np.ndarray) and not isinstance(outs[0], np.ndarray):
            outs[0].set(np.ascontiguousarray(ins[0]))
        else:
            outs[0][...] = ins[0]
    return run
