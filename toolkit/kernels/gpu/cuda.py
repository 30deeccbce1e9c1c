"""CUDA source to a launchable function: compiled by NVRTC through CuPy once per source text,
when a plan is built (a compile error surfaces there, never mid-run), and launched with a
grid-stride configuration.

The kernels come from the loop programs of codegen/loops.py rendered by ``CudaDialect``: their
outermost parallel loop is a grid-stride loop, so any grid covers any size and the grid is sized
for occupancy, not for the element count.
"""
from __future__ import annotations

from ...backend.devices import gpu_module
from ...codegen.loops import Kernel
from ...codegen.render import CudaDialect

cp = gpu_module()

THREADS_PER_BLOCK = 256
# Enough blocks to fill an H100's 132 SMs several times over; beyond that the grid-stride loop
# takes the rest (more blocks only add scheduling).
MAX_BLOCKS = 132 * 32

_FUNCTIONS: dict[tuple[str, str], object] = {}


def compiled(kernel: Kernel):
    """The CuPy function of ``kernel``, compiled on first use of its source text."""
    return compiled_source(CudaDialect().unit([kernel]), kernel.name)


_MODULES: dict[str, object] = {}


def compiled_source(source: str, name: str):
    """The CuPy function ``name`` of a CUDA source unit, the unit compiled once per text."""
    key = (source, name)
    function = _FUNCTIONS.get(key)
    if function is None:
        module = _MODULES.get(source)
        if module is None:
            module = _MODULES[source] = cp.RawModule(code=source, options=("--std=c++14",))
        function = _FUNCTIONS[key] = module.get_function(name)
    return function


def launcher(kernel: Kernel, size: int):
    """A call ``launch(arrays)`` running ``kernel`` over ``size`` iterations."""
    function = compiled(kernel)
    blocks = (max(1, min(MAX_BLOCKS, -(-size // THREADS_PER_BLOCK))),)
    threads = (THREADS_PER_BLOCK,)

    def launch(arrays):
        function(blocks, threads, tuple(arrays))
    return launch
