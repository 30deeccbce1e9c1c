"""The int8 ops (ops/quant.py) on the GPU: the CPU's numpy kernels on host copies of the inputs,
the result copied back. There are no int8 GPU kernels yet (int8 quantization targets CPUs), so a
graph that places these ops on a GPU still runs, exactly as on the CPU, and says that each of
them synchronises with the host (a run holding one is not captured as a CUDA graph)."""
from __future__ import annotations

import numpy as np

from ...backend.devices import gpu_module, to_host
from ...backend.registry import KERNELS, register_kernel
from .. import cpu  # noqa: F401  (the numpy kernels these run)

cp = gpu_module()
QUANT_OPS = ("quantize_linear", "dequantize_linear", "qconv2d", "qgemm", "qadd", "qconcat", "qavg_pool2d",
             "qglobal_avg_pool")


def _on_host(cpu_factory):
    def factory(ctx):
        run_cpu = cpu_factory(ctx)

        def run(ins, outs):
            host_outs = [np.empty(o.shape, o.dtype) for o in outs]
            run_cpu([to_host(a) for a in ins], host_outs)
            for out, host in zip(outs, host_outs):
                out[...] = cp.asarray(host)
        return run
    return factory


for _op in QUANT_OPS:
    for _dtype, _entry in KERNELS.portable(_op, "cpu").items():
        register_kernel(_op, "gpu", _dtype, host_sync="runs on the host (no int8 GPU kernels)")(
            _on_host(_entry.factory))
