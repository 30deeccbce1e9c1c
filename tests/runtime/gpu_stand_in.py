"""The numpy stand-in for CuPy that the GPU back end's tests run on, on machines with no device.

``STAND_IN`` (a script prefix) installs a fake ``cupy`` module made of numpy and the CUDA graph
simulator; ``RAW_MODULE`` adds CuPy's RawModule, emulated by compiling the CUDA source as C++;
``run_stand_in`` runs such a script in a child process with host builds of the cuBLAS, cuBLASLt
and cuDNN entry points (fake_cublas.c, fake_cudnn.c beside this file). ``compare_every_op`` and
``compare_case`` hold a GPU kernel to the CPU kernel on the op table's cases, on the stand-in or
on a real device.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
CXX = shutil.which("c++") or shutil.which("g++")

STAND_IN = textwrap.dedent("""
    import sys, types, contextlib, numpy
    fake = types.ModuleType("cupy")
    fake.__dict__.update({k: getattr(numpy, k) for k in dir(numpy) if not k.startswith("__")})
    runtime = types.SimpleNamespace(getDeviceCount=lambda: 1)
    class Device(contextlib.nullcontext):
        def __init__(self, index=0):
            super().__init__()
            self.id = index
        def synchronize(self):
            pass
    caller_stream = types.SimpleNamespace(ptr=0)
    fake.cuda = types.SimpleNamespace(runtime=runtime, Device=Device, get_current_stream=lambda: caller_stream)
    sys.modules["cupy"] = fake
    # GPU plans capture through the graph simulator (tests/runtime/graph_simulator.py)
    from tests.runtime import graph_simulator
    graph_simulator.install()
""")

# CuPy's RawModule, emulated: the CUDA source is compiled as C++ by the system compiler, with
# blockIdx/threadIdx/blockDim/gridDim as globals, and a launch runs every thread of a small grid
# (2 blocks of 3 threads) one after another. The kernels are grid-stride loops, so any grid
# covers the whole range: this checks the rendered source and its indexing, not CUDA's compiler.
RAW_MODULE = textwrap.dedent("""
    import ctypes, hashlib, os, subprocess, tempfile
    CUDA_SHIM = (
        "#include <math.h>\\n#define __global__\\n#define __device__\\n"
        "struct tk_dim3 { unsigned int x, y, z; };\\n"
        "static tk_dim3 blockIdx, threadIdx, blockDim, gridDim;\\n"
        "extern \\"C\\" void tk_set_thread(unsigned b, unsigned t, unsigned nb, unsigned nt) "
        "{ blockIdx.x = b; threadIdx.x = t; gridDim.x = nb; blockDim.x = nt; }\\n")
    class RawModule:
        def __init__(self, code, options=()):
            source = CUDA_SHIM + code
            folder = os.environ["CUDA_EMULATION_DIR"]
            lib = os.path.join(folder, hashlib.sha256(source.encode()).hexdigest()[:16] + ".so")
            # compiled once for the whole session (the folder is the session's, named by the
            # source's hash): written under a name of its own and moved into place whole, so
            # processes compiling the same kernel at once never load a half-written one
            if not os.path.exists(lib):
                part = f"{lib}.{os.getpid()}"
                subprocess.run([os.environ["CXX_FOR_CUDA_EMULATION"], "-O1", "-shared", "-fPIC", "-x", "c++",
                                "-", "-o", part], input=source, text=True, check=True)
                os.replace(part, lib)
            self.lib = ctypes.CDLL(lib)
        def get_function(self, name):
            function = getattr(self.lib, name)
            function.restype = None
            def launch(grid, block, args):
                values = [arg(a) for a in args]
                for b in range(min(grid[0], 2)):
                    for t in range(min(block[0], 3)):
                        self.lib.tk_set_thread(b, t, min(grid[0], 2), min(block[0], 3))
                        function(*values)
            return launch
    SCALARS = {numpy.dtype(numpy.int64): ctypes.c_int64, numpy.dtype(numpy.int32): ctypes.c_int32,
               numpy.dtype(numpy.float32): ctypes.c_float, numpy.dtype(numpy.float64): ctypes.c_double}
    def arg(a):
        if isinstance(a, numpy.ndarray):
            return ctypes.c_void_p(a.ctypes.data)
        return SCALARS[numpy.asarray(a).dtype](a.item())     # numpy scalars, as CuPy takes them
    fake.RawModule = RawModule
""")


HALF_TOLERANCE = 4e-3           # float16 keeps 11 significant bits: a few roundings of 2**-11 each


def compare_case(case, dtype: str, feeds, one_node_graph) -> None:
    from toolkit.runtime.plan import Plan, RuntimeState
    arrays = case.inputs(dtype)
    outs = {}
    for device in ("cpu", "gpu"):
        run_dtype = "float32" if device == "cpu" and dtype == "float16" else dtype
        run_arrays = [a.astype(run_dtype) if a.dtype.kind == "f" else a for a in arrays]
        graph, _vals, y = one_node_graph(case, run_arrays, case.attrs_for(run_dtype))
        graph.outputs["y"] = y
        plan = Plan(graph, {}, {}, device, RuntimeState(np.random.default_rng(0)), native=False)
        out = plan.run(feeds(run_arrays))["y"]
        outs[device] = out.get() if hasattr(out, "get") else np.array(out)
    if dtype == "float16":
        outs["gpu"] = outs["gpu"].astype(outs["cpu"].dtype)
    tol = {"float32": 1e-5, "float64": 1e-12, "float16": HALF_TOLERANCE}[dtype]
    finite = np.abs(outs["cpu"][np.isfinite(outs["cpu"])])
    scale = max(1.0, float(np.max(finite, initial=0.0)))
    np.testing.assert_allclose(outs["gpu"], outs["cpu"], rtol=tol, atol=tol * scale, err_msg=case.id,
                               equal_nan=True)


def compare_every_op(dtype: str) -> int:
    """Every op-table case with a GPU kernel, run on the GPU and on the CPU: equal within the
    dtype's tolerance. float16 runs against the CPU's float32 on the same (rounded) inputs.
    Returns how many cases ran."""
    from tests.ops.op_cases import CASES, feeds, one_node_graph
    from toolkit.backend.registry import KERNELS, load_device
    load_device("gpu")
    ran, failures = 0, []
    for case in CASES:
        if not KERNELS.has(case.op, "gpu", dtype) or case.op in ("transfer", "dropout_mask"):
            continue
        if dtype == "float16" and case.op in HALF_SKIP:
            continue
        try:
            compare_case(case, dtype, feeds, one_node_graph)
        except Exception as e:        # every failing case in one report, not the first alone
            failures.append(f"{case.id}: {type(e).__name__}: " + " | ".join(str(e).strip().splitlines()[:6])[:400])
        ran += 1
    assert not failures, f"{len(failures)} of {ran} cases differ:\n" + "\n".join(failures)
    return ran


# float16 cases left out: rounding a value to float16 is the op's whole point (round_precision),
# or the float32 reference's values do not fit in float16 (the range cases of cast)
HALF_SKIP = {"round_precision"}


def emulation_folder(fallback) -> Path:
    """Where emulated kernels and the host libraries are built: the test session's cache (one for
    every pytest-xdist worker and child process; tests/conftest.py), each file named by its
    source's hash, so a test compiles only what no earlier test of the session did; ``fallback``
    outside a pytest session."""
    session = os.environ.get("TOOLKIT_TEST_SESSION_CACHE")
    folder = Path(session) / "cuda-emulation" if session else Path(fallback)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _host_library(name: str, folder) -> str:
    """tests/runtime/NAME.c built as libNAME-HASH.so in the session's emulation folder (else
    ``folder``), with the CUDA dialect's float16 conversions pasted in."""
    from toolkit.codegen.render import HALF_HELPERS
    source = Path(__file__).with_name(f"{name}.c").read_text().replace("TK_HALF_HELPERS", HALF_HELPERS)
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    lib = emulation_folder(folder) / f"lib{name}-{digest}.so"
    if not lib.exists():
        part = lib.with_name(f"{lib.name}.{os.getpid()}")
        subprocess.run([CXX or "cc", "-O2", "-shared", "-fPIC", "-x", "c", "-", "-o", str(part), "-lm"],
                       input=source, text=True, check=True)
        os.replace(part, lib)
    return str(lib)


def fake_cublas(folder) -> str:
    """The cuBLAS and cuBLASLt entry points blas.py and lt.py call, on the host's memory, for the
    numpy stand-in for CuPy."""
    return _host_library("fake_cublas", folder)


def fake_cudnn(folder) -> str:
    """The cuDNN entry points dnn.py calls, on the host's memory, for the numpy stand-in."""
    return _host_library("fake_cudnn", folder)


def run_stand_in(script: str, tmp_path, *args, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    fake = fake_cublas(tmp_path)
    env = dict(os.environ, CUDA_EMULATION_DIR=str(emulation_folder(tmp_path)), CXX_FOR_CUDA_EMULATION=CXX or "c++",
               TOOLKIT_CUBLAS_LIBRARY=fake, TOOLKIT_CUBLASLT_LIBRARY=fake,
               TOOLKIT_CUDNN_LIBRARY=fake_cudnn(tmp_path))
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-c", script, *map(str, args)], capture_output=True, text=True,
                          cwd=ROOT, timeout=600, env=env)
