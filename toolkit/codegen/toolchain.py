"""The system C compiler and the on-disk cache of what it built.

A translation unit is compiled once per (source, compiler, flags, processor) and kept under the
user's cache folder (``$TOOLKIT_CACHE/kernels``, else the platform's cache folder), named by the
SHA-256 of those four. The library is written to a temporary name in the same folder and renamed
into place, so a process that finds the file finds a whole one, and two processes compiling the
same unit at once both succeed (the last rename wins; both files are equal).

No compiler (``$CC``, else cc, gcc or clang on PATH), or ``TOOLKIT_NATIVE=0`` (the ``native``
setting): ``available()`` is false and the numpy kernels run, with a one-line notice the first
time.

A compile runs in a process group of its own, bounded by the ``compile_timeout`` setting
(``TOOLKIT_COMPILE_TIMEOUT``, 300 s); a timeout ends the whole group. A unit that fails or times
out is remembered by its shape (its source with the numbers erased) for the rest of the process:
the same net's other batch sizes do not each wait for the same failure.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
from functools import lru_cache
from pathlib import Path

from ..cachedir import cache_root
from ..errors import notice
from ..settings import current

FLAGS = ("-O3", "-march=native", "-fPIC", "-shared", "-std=gnu11", "-fno-math-errno", "-fopenmp")
# units that failed or timed out in this process, by their shape (the source with every number
# replaced): the other batch sizes of the same net make the same unit but for its numbers, and
# would each wait for the same failure
_failed_shapes: dict[str, str] = {}


def compile_timeout() -> float:
    """Seconds a compile may take: the ``compile_timeout`` setting (``TOOLKIT_COMPILE_TIMEOUT``)."""
    return current().compile_timeout


def unit_shape(source: str) -> str:
    """The source with its numbers erased, hashed: one per net structure, whatever the shapes."""
    return hashlib.sha256(re.sub(r"\d+", "#", source).encode()).hexdigest()


def _run_compiler(argv: list[str], timeout: float) -> subprocess.CompletedProcess:
    """The compiler in a process group of its own: on a timeout the whole group (the driver and
    its cc1, as, ld) is killed, not the driver alone, which left cc1 running orphaned."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:                    # the timeout, or an interrupt (Ctrl-C): no compiler left behind
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.communicate()
        raise
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)
_lock = threading.Lock()
_loaded: dict[str, ctypes.CDLL] = {}


class NativeUnavailable(RuntimeError):
    """Native kernels cannot run here (no compiler, or it failed); the numpy kernels run instead."""


def switched_off() -> bool:
    """The ``native`` setting is off (``TOOLKIT_NATIVE=0``)."""
    return not current().native


@lru_cache(maxsize=None)
def _compiler_for(cc_env: str | None, path: str) -> tuple[tuple[str, ...], str] | None:
    """(command, identity) of the C compiler, or None. Identity = its version line and path."""
    candidates = [shlex.split(cc_env)] if cc_env else [["cc"], ["gcc"], ["clang"]]
    for command in candidates:
        if not command:
            continue
        exe = shutil.which(command[0], path=path)
        if exe is None:
            continue
        try:
            version = subprocess.run([exe, *command[1:], "--version"], capture_output=True, text=True,
                                     timeout=30).stdout.splitlines()
        except (OSError, subprocess.SubprocessError):
            continue
        return (exe, *command[1:]), f"{os.path.realpath(exe)} {version[0] if version else '?'}"
    return None


def compiler() -> tuple[tuple[str, ...], str] | None:
    return _compiler_for(os.environ.get("CC") or None, os.environ.get("PATH", os.defpath))


@lru_cache(maxsize=1)
def processor_id() -> str:
    """What -march=native depends on: the machine and, on Linux, the CPU's model and flags."""
    text = platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("model name", "flags", "Features", "CPU part")):
                    text += "|" + line.strip()
                if line.strip() == "":
                    break
    except OSError:
        pass
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def available() -> bool:
    """Whether native kernels can be built here; prints the notice once when they cannot."""
    if switched_off():
        return False
    if compiler() is None:
        notice("no C compiler found ($CC, cc, gcc or clang); running the numpy kernels "
               "(slower; install gcc or clang for the generated kernels)", once="no-compiler")
        return False
    return True


def cache_dir() -> Path:
    return cache_root() / "kernels"


def unit_key(source: str, command: tuple[str, ...], identity: str, flags: tuple[str, ...]) -> str:
    h = hashlib.sha256()
    for part in (source, identity, " ".join(command[1:]), " ".join(flags), processor_id()):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def build(source: str) -> Path:
    """The shared library of ``source``: from the cache, or compiled now and cached."""
    found = compiler()
    if found is None or switched_off():
        raise NativeUnavailable("no C compiler")
    command, identity = found
    key = unit_key(source, command, identity, FLAGS)
    folder = cache_dir() / key[:2]
    library = folder / f"{key}.so"
    if library.exists():
        return library
    shape = unit_shape(source)
    if shape in _failed_shapes:
        raise NativeUnavailable(_failed_shapes[shape])     # the same words: its notice is printed once
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp_source = tempfile.mkstemp(prefix=f".{key[:16]}-", suffix=".c", dir=folder)
    tmp_library = tmp_source[:-2] + ".so"
    try:
        with os.fdopen(fd, "w") as f:
            f.write(source)
        timeout = compile_timeout()
        try:
            result = _run_compiler([*command, *FLAGS, tmp_source, "-o", tmp_library, "-lm"], timeout)
        except subprocess.TimeoutExpired:
            why = (f"the C compiler took over {timeout:g} s on {source.count(chr(10)) + 1} lines of generated "
                   f"kernels and was stopped")
            _failed_shapes[shape] = why
            raise NativeUnavailable(why) from None
        if result.returncode != 0:
            log = folder / f"{key}.log"
            log.write_text(result.stderr)
            why = f"the C compiler failed on generated kernels (log: {log})"
            _failed_shapes[shape] = why
            raise NativeUnavailable(why)
        os.replace(tmp_source, folder / f"{key}.c")        # kept beside the library, for reading
        os.replace(tmp_library, library)
    except (OSError, subprocess.SubprocessError) as e:
        raise NativeUnavailable(f"cannot build generated kernels: {e}") from e
    finally:
        for leftover in (tmp_source, tmp_library):
            if os.path.exists(leftover):
                os.unlink(leftover)
    return library


# libgomp's idle threads: with no setting at all, measured on a 2-core EPYC, LeNet's batch-1
# forward took 8 ms instead of 0.13 ms (its helper thread slept between the plan's parallel
# loops); an explicit spin count (its documented default, a fraction of a millisecond) keeps it
# awake across a run without spinning for long once the process goes idle.
OPENMP_DEFAULTS = {"GOMP_SPINCOUNT": "300000"}


def load(source: str) -> ctypes.CDLL:
    """Build (or find) and load ``source``; one handle per library per process."""
    for key, value in OPENMP_DEFAULTS.items():
        os.environ.setdefault(key, value)        # read by libgomp when it is first loaded
    with _lock:
        path = str(build(source))
        lib = _loaded.get(path)
        if lib is None:
            lib = ctypes.CDLL(path)
            _loaded[path] = lib
        return lib
