"""GPU kernels (CuPy), registered under (op, "gpu", dtype). Importing this package imports CuPy
(backend/devices.py turns its absence into a one-line user error), so nothing imports it unless
a GPU is asked for.

- ``dispatched.py``: the numpy kernels run on CuPy arrays (elementwise ops, data movement), plus
  reductions and softmax written for the device, and the transfer.
- ``blas.py``: GEMMs through a cuBLAS handle of our own with its own workspace (ctypes), which
  a CUDA graph can capture (CuPy's cuBLAS calls refuse to be captured).
- ``dnn.py``: convolutions through a cuDNN handle of our own (ctypes), capturable, with
  arrays.py's im2col convolutions as the fallback; ``dnn_routes.py`` decides and records which
  route each takes (the float32 policy, the measured choices), ``dnn_bfloat16.py`` runs
  bfloat16 ones on bfloat16 copies, ``dnn_epilogue.py`` a conv + bias (+ add) + ReLU in one call.
- ``arrays.py``: convolution (im2col + cuBLAS), pooling, the losses, accuracy and dropout,
  written once against an array module and shared with the CPU where they can be.
- ``nhwc.py``: the channels-last layout's convolution through cuDNN, its reorders and pooling.
- ``pooling.py``: max and average pooling and their gradients, NCHW and channels last, as CUDA
  kernels of our own (one launch each, two for max pooling's gradient).
- ``rows.py``: one CUDA kernel each for softmax, log-softmax, the NLL loss and its gradient,
  accuracy and the finiteness check of loss scaling (each several CuPy kernels otherwise).
- ``channel_reductions.py``: sums and means over every axis but the channels (BatchNorm's), and
  the fused reductions that compute what they reduce, as two-stage kernels of our own.
- ``fused.py``: the fused groups, rendered to CUDA by the kernel generator's GPU dialect and
  compiled once per source text (``cuda.py``).

rows.py's, dnn.py's, channel_reductions.py's and pooling.py's kernels declare that they take the
place of the array programs (``KERNELS.specialise`` at ``SPECIALISED`` priority): the registry is
the same whatever order these modules are imported in (tests/backend/test_kernel_priority.py).

Every op with a CPU kernel has a GPU kernel (tests/runtime/test_gpu_backend.py checks it); an op
without one would fail when a plan is built, naming the op, the device, the dtype and what is
registered.
"""
from __future__ import annotations

from .. import control as _control
from . import arrays, blas, channel_reductions, collective, dispatched, dnn, fused, nhwc, pooling, quant, rows  # noqa: F401,E501  (each registers its kernels)
from .dispatched import DISPATCHED  # noqa: F401

_control.register("gpu")
