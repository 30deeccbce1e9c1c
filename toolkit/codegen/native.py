"""Native calls: loop programs bound to a plan's arrays, compiled together, called through ctypes.

A native kernel builder (kernels/native/) turns a node with concrete shapes into a ``NativeCall``:
the loop program and the arrays its parameters point at, in order. A plan links all of its
native calls into one translation unit (one compiler run per plan, cached on disk), plus one
C function per *segment*, a run of consecutive native steps, that calls them in turn: a plan
made only of native steps is one call from Python per run, and the interpreter's per-step cost
(about a microsecond per ctypes call, several per numpy call) is paid once.

Each call's arguments are a pointer array built once, when the plan is built: a plan's buffers
never move. A kernel that reads run-time sizes (loops.py's ``SizeInt``) gets one more argument,
the plan's values of those sizes (``with_sizes``): its text holds no bound size, so the plans of
every sequence length share one compiled library.
"""
from __future__ import annotations

import ctypes
import dataclasses
from dataclasses import dataclass, field

import numpy as np

from . import toolchain
from .blas import numpy_blas
from .loops import SIZES_PARAM, Buf, Kernel, sizes_used
from .render import CDialect


@dataclass(eq=False)
class NativeCall:
    kernel: Kernel
    arrays: list                              # one per kernel parameter, C-contiguous
    label: str = "native"
    pointers: np.ndarray = field(init=False)

    def __post_init__(self):
        for a in self.arrays:
            if not (isinstance(a, np.ndarray) and a.flags.c_contiguous):
                raise ValueError("a native call needs C-contiguous arrays")
        self.pointers = np.array([a.ctypes.data for a in self.arrays], dtype=np.uintp)


def with_sizes(call: NativeCall, bindings) -> NativeCall:
    """``call`` with the sizes argument its kernel reads (none: ``call`` itself), valued from
    ``bindings``, the plan's numbers for its symbols."""
    names = sizes_used(call.kernel)
    if not names:
        return call
    missing = [n for n in names if n not in bindings]
    if missing:
        raise ValueError(f"a kernel reads the run-time size of {', '.join(missing)}, which the plan does not bind")
    values = np.array([int(bindings[n]) for n in names], dtype=np.int64)
    kernel = dataclasses.replace(call.kernel, params=[*call.kernel.params, Buf(SIZES_PARAM, "int64", len(names))],
                                 sizes=tuple(names))
    return NativeCall(kernel, [*call.arrays, values], call.label)


# The most C one translation unit holds: the compiler's time and memory grow faster than the
# source (a 16 MB unit ran past a 300 s timeout), so a plan's kernels are compiled in units of
# at most this size, and a kernel alone over it is not generated (its step runs the numpy kernel).
MAX_UNIT_BYTES = 4 << 20


@dataclass
class Unit:
    members: list[int]                        # positions of the unit's kernels, in order
    too_big: str | None = None                # why the unit is not compiled at all


def units(kernels: list[Kernel], limit: int | None = None) -> list[Unit]:
    """Consecutive kernels grouped into units of at most ``limit`` bytes of C each."""
    limit = MAX_UNIT_BYTES if limit is None else limit
    c = dialect()
    out: list[Unit] = []
    current: list[int] = []
    size = 0
    for i, kernel in enumerate(kernels):
        n = len(c.kernel(kernel))
        if n > limit:
            if current:
                out.append(Unit(current))
                current, size = [], 0
            out.append(Unit([i], f"the generated {kernel.name} kernel is {n / 1e6:.1f} MB of C, over the "
                                 f"{limit / 1e6:.1f} MB a compiler unit may hold"))
            continue
        if current and size + n > limit:
            out.append(Unit(current))
            current, size = [], 0
        current.append(i)
        size += n
    if current:
        out.append(Unit(current))
    return out


def dialect() -> CDialect:
    blas = numpy_blas()
    return CDialect(blas.int_type if blas else "int64_t")


class Linked:
    """The loaded library of a plan's native calls, and one Python callable per segment."""

    def __init__(self, calls: list[NativeCall], segments: list[list[int]]):
        self.calls = calls                        # keeps every pointer array and scratch alive
        if numpy_blas() is None and any(call.kernel.uses_gemm() for call in calls):
            # the GEMM pointer would stay null: refuse here, and the plan runs the numpy kernels
            raise toolchain.NativeUnavailable("numpy's BLAS library has no cblas_sgemm the generated kernels can call")
        kernels = [call.kernel for call in calls]
        names = [f"tk_k{i}_{k.name}" for i, k in enumerate(kernels)]
        extra = []
        for j, seg in enumerate(segments):
            body = "".join(f"    {names[i]}((void *const *)argv[{n}]);\n" for n, i in enumerate(seg))
            extra.append(f"void tk_segment{j}(void *const *argv) {{\n{body}}}")
        self.source = dialect().unit(kernels, "\n\n".join(extra), names)
        self.lib = toolchain.load(self.source)
        self.lib.tk_set_team.argtypes, self.lib.tk_set_team.restype = [ctypes.c_int], None
        if not hasattr(self.lib, "tk_team"):       # the size the library's loops use now (set_team)
            self.lib.tk_team = 1 << 30
        blas = numpy_blas()
        if blas is not None:
            self.lib.tk_set_blas(ctypes.c_void_p(blas.sgemm), ctypes.c_void_p(blas.dgemm))
        self.functions = []
        for name in names:
            fn = getattr(self.lib, name)
            fn.argtypes, fn.restype = [ctypes.c_void_p], None
            self.functions.append(fn)
        self.segments = []
        self._keep = []
        for j, seg in enumerate(segments):
            fn = getattr(self.lib, f"tk_segment{j}")
            fn.argtypes, fn.restype = [ctypes.c_void_p], None
            argv = np.array([calls[i].pointers.ctypes.data for i in seg], dtype=np.uintp)
            self._keep.append(argv)
            self.segments.append((fn, int(argv.ctypes.data)))

    def set_team(self, threads: int) -> None:
        """How many threads the library's parallel loops use from now on (at most each kernel's
        own count). The library is shared by every plan that built the same source, so it keeps
        the size last set, and a call that changes nothing costs no call into C."""
        if self.lib.tk_team != threads:
            self.lib.tk_set_team(int(threads))
            self.lib.tk_team = threads

    def step(self, i: int, call: NativeCall):
        """A no-argument callable running call i alone (for profiling)."""
        fn, ptr = self.functions[i], int(call.pointers.ctypes.data)
        return lambda: fn(ptr)

    def segment(self, j: int):
        fn, ptr = self.segments[j]
        return lambda: fn(ptr)

