"""The toolkit's settings: every knob declared once in ``KNOBS`` (its name, kind, default,
environment variable and a line of help), the frozen ``Settings`` made from that table, and the
two ways to set them: the ``TOOLKIT_*`` environment variables, read once by ``current()``, and
``use(...)`` for a block of code.

A command (``toolkit.cli.main``) and the Python API (``toolkit.load``, ``toolkit.Net``,
``toolkit.train``) call ``current()`` before any work, so a bad value is one line naming the
variable, the value and what is accepted (exit status 2 on the command line), never a surprise
halfway through a run. The modules that act on a knob read ``current()`` when they decide (a
kernel when it is built, a plan when it is made), never at import, so ``use()`` reaches them.

Process-wide on purpose, not a ContextVar: a plan runs its kernels on worker threads and a
server answers on threads of its own, and each must see the settings the process was started
with; a ContextVar would give a new thread the defaults instead. ``use()`` therefore changes the
settings of the whole process for its block, and is meant for one thread at a time (a test, a
benchmark, a script), not for threads that each want their own. A child process (a data-parallel
job's rank process) reads its own environment: ``use()`` does not reach it.

``TOOLKIT_RANK_PROCESS`` is not a knob: it is the marker a data-parallel job's supervisor
hands its rank process (distributed/supervisor.py); it is named here (``RANK_PROCESS``) so that
this module lists every ``TOOLKIT_*`` variable, but no user sets it.

``python -m toolkit.settings`` prints the table as markdown: the documentation site's settings page,
made from it when the site builds (docs/hooks/generated_pages.py).
"""
from __future__ import annotations

import dataclasses
import math
import os
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

from .errors import UserError, did_you_mean

# The marker between a data-parallel job's supervisor and its rank process; internal, not a knob.
RANK_PROCESS = "TOOLKIT_RANK_PROCESS"

ON_WORDS = ("1", "on", "yes", "true")
OFF_WORDS = ("0", "off", "no", "false")


@dataclass(frozen=True)
class Knob:
    """One setting. ``kind`` says how its text is read and what a value may be:
    switch (on/off), count (a whole number from ``minimum``), seconds (a number above 0),
    path (a file or folder, as given), list (comma-separated texts), choice (one of ``choices``).
    ``default`` None means "decided at run time" (``help`` says how)."""
    name: str
    kind: str
    default: Any
    variable: str
    help: str
    minimum: int = 1
    also_off: tuple[str, ...] = ()      # further words that mean off, kept from older releases
    choices: tuple[str, ...] = ()       # the words a choice knob takes


KNOBS: tuple[Knob, ...] = (
    # -- the CPU's threads ------------------------------------------------------------------------
    Knob("threads", "count", None, "TOOLKIT_THREADS",
         "threads a CPU plan may use (default: the cores this process may use, shared among a "
         "data-parallel job's ranks on this machine)"),
    Knob("adaptive_threads", "switch", True, "TOOLKIT_ADAPTIVE_THREADS",
         "let a plan use fewer threads while other work takes the cores (off pins the team)"),
    # Off by default, by measurement (README, "Concurrent branches"): on a 2-core EPYC, splitting
    # each op's batch across the cores beat running an Inception block's branches side by side
    # at batch 64 and at batch 1.
    Knob("concurrent", "switch", False, "TOOLKIT_CONCURRENT",
         "run a CPU plan's independent branches side by side instead of splitting each op's batch"),
    Knob("device_groups", "switch", True, "TOOLKIT_DEVICE_GROUPS",
         "run a plan placed over several host devices (cpu:0, cpu:1, ...) as core groups, each "
         "device's steps on its own thread with its share of the cores (off: one after another)"),
    # -- the generated C kernels ------------------------------------------------------------------
    Knob("native", "switch", True, "TOOLKIT_NATIVE",
         "generate, compile and run C kernels on the CPU (off: the numpy kernels)", also_off=("numpy",)),
    Knob("run_time_sizes", "switch", True, "TOOLKIT_RUN_TIME_SIZES",
         "compile kernels that take a symbolic size at run time (off: every size compiled in)"),
    Knob("compile_timeout", "seconds", 300.0, "TOOLKIT_COMPILE_TIMEOUT",
         "seconds one compile of generated C may take before it is stopped"),
    Knob("winograd", "switch", True, "TOOLKIT_WINOGRAD",
         "3x3 stride-1 convolutions through Winograd's F(2x2, 3x3) where they have enough tiles"),
    Knob("packed_gemm", "switch", True, "TOOLKIT_PACKED_GEMM",
         "convolution GEMMs through the toolkit's AVX-512 kernel on a packed weight (off: BLAS)"),
    # -- the GPU ----------------------------------------------------------------------------------
    Knob("cuda_graphs", "switch", True, "TOOLKIT_CUDA_GRAPHS",
         "capture a GPU plan's run as a CUDA graph and replay it with one launch"),
    Knob("cudnn", "switch", True, "TOOLKIT_CUDNN",
         "GPU convolutions through cuDNN (off: im2col and cuBLAS)"),
    Knob("channel_reductions", "switch", True, "TOOLKIT_CHANNEL_REDUCTIONS",
         "GPU sums and means over every axis but the channels (BatchNorm's statistics) by the "
         "toolkit's own two-stage kernel (off: CuPy's reduction)"),
    # None: the net file's ``precision`` key decides, else strict (kernels/gpu/dnn.py's policy)
    Knob("precision", "choice", None, "TOOLKIT_PRECISION",
         "float32 math on the GPU: strict (FMA, equal to the CPU to float32 rounding) or tf32 (cuDNN "
         "convolutions may use TF32 tensor cores, as PyTorch's default; GEMMs stay float32); overrides "
         "a net file's precision key (default: the net file's, else strict)", choices=("strict", "tf32")),
    # ResNet-50's fast cuDNN algorithms at batch 256 want tens to a few hundred MiB; 256 per stream
    # leaves them in reach while the activations keep the rest of the device
    Knob("cudnn_workspace_mb", "count", 256, "TOOLKIT_CUDNN_WORKSPACE_MB",
         "MiB of workspace one cuDNN convolution may use on a stream; algorithms that want more are "
         "passed over, and a weight gradient whose im2col column buffer would be larger goes to cuDNN"),
    Knob("cublas_library", "path", None, "TOOLKIT_CUBLAS_LIBRARY",
         "the libcublas file to load (default: the one CuPy uses)"),
    Knob("cublaslt_library", "path", None, "TOOLKIT_CUBLASLT_LIBRARY",
         "the libcublasLt file to load (default: the NVIDIA wheels', else the loader's search)"),
    Knob("cudnn_library", "path", None, "TOOLKIT_CUDNN_LIBRARY",
         "the libcudnn file to load (default: the NVIDIA wheels', else the loader's search)"),
    # -- files ------------------------------------------------------------------------------------
    Knob("cache", "path", None, "TOOLKIT_CACHE",
         "the folder for compiled kernels and fetched models (default: the user's cache folder, "
         "~/.cache/toolkit on Linux)"),
    # PIL's own limit for a decompression bomb: a 3-channel image of 256 MiB
    Knob("max_image_pixels", "count", 1024 * 1024 * 1024 // 4 // 3, "TOOLKIT_MAX_IMAGE_PIXELS",
         "the most pixels an image file may claim before it is decoded"),
    Knob("zoo", "list", (), "TOOLKIT_ZOO",
         "where to look for zoo: models after the shipped zoo (comma-separated folders, http(s):// "
         "URLs or git+URLs); --source replaces it"),
)

_BY_NAME = {k.name: k for k in KNOBS}
_KIND_TYPES = {"switch": bool, "count": int, "seconds": float, "path": Path, "list": tuple, "choice": str}

Settings = dataclasses.make_dataclass(
    "Settings",
    [(k.name, _KIND_TYPES[k.kind] if k.default is not None else (_KIND_TYPES[k.kind] | None),
      dataclasses.field(default=k.default)) for k in KNOBS],
    frozen=True, namespace={"__doc__": "The value of every knob in ``KNOBS`` (one field each).",
                            "__module__": __name__})


def _accepted(knob: Knob, short: bool = False) -> str:
    return {"switch": "on/off" if short else "on or off (1/0, on/off, yes/no, true/false)",
            "count": f"a whole number from {knob.minimum}",
            "seconds": "a number of seconds above 0",
            "path": "a path",
            "list": "comma-separated texts",
            "choice": ("/" if short else " or ").join(knob.choices)}[knob.kind]


def _parse(knob: Knob, text: str):
    """The value of ``knob`` that the environment's ``text`` gives; a UserError naming the
    variable, the text and what is accepted when it gives none."""
    word = text.strip()
    if knob.kind == "switch":
        if word.lower() in ON_WORDS:
            return True
        if word.lower() in OFF_WORDS + knob.also_off:
            return False
    elif knob.kind == "count":
        if word.isascii() and word.isdigit() and int(word) >= knob.minimum:
            return int(word)
    elif knob.kind == "seconds":
        try:
            seconds = float(word)
        except ValueError:
            seconds = -1.0
        if seconds > 0 and math.isfinite(seconds):
            return seconds
    elif knob.kind == "path":
        return Path(text).expanduser()
    elif knob.kind == "list":
        return tuple(item.strip() for item in text.split(",") if item.strip())
    elif knob.kind == "choice":
        if word.lower() in knob.choices:
            return word.lower()
    raise UserError(f"{knob.variable}={text}: expected {_accepted(knob)}")


def from_environment(environ: Mapping[str, str] | None = None) -> "Settings":
    """The settings that ``environ`` (default: this process's environment) gives: each knob's
    variable where it is set and not blank, else its default. Every bad value is reported, each
    on its own line."""
    environ = os.environ if environ is None else environ
    values, problems = {}, []
    for knob in KNOBS:
        text = environ.get(knob.variable, "")
        if not text.strip():
            continue
        try:
            values[knob.name] = _parse(knob, text)
        except UserError as e:
            problems.extend(e.problems)
    if problems:
        raise UserError(*problems)
    return Settings(**values)


def _checked(name: str, value):
    """``value`` for the knob ``name`` as ``use()`` was given it, in the knob's own type."""
    knob = _BY_NAME.get(name)
    if knob is None:
        raise TypeError(f"no setting '{name}'{did_you_mean(name, _BY_NAME)}; the settings are {', '.join(_BY_NAME)}")
    if value is None and knob.default is None:
        return None
    ok = {"switch": isinstance(value, bool),
          "count": isinstance(value, int) and not isinstance(value, bool) and value >= knob.minimum,
          "seconds": isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < math.inf,
          "path": isinstance(value, (str, os.PathLike)),
          "list": isinstance(value, (str, tuple, list)) and all(isinstance(v, str) for v in value),
          "choice": value in knob.choices}[knob.kind]
    if not ok:
        raise UserError(f"setting {name}={value!r}: expected {_accepted(knob)}")
    if knob.kind == "seconds":
        return float(value)
    if knob.kind == "path":
        return Path(value).expanduser()
    if knob.kind == "list":
        return _parse(knob, value) if isinstance(value, str) else tuple(value)
    return value


_lock = threading.Lock()
_active: "Settings | None" = None


def current() -> "Settings":
    """The settings in force: the innermost ``use()`` block's, else the environment's, read on
    the first call and kept for the life of the process."""
    global _active
    active = _active
    if active is None:
        with _lock:
            if _active is None:
                _active = from_environment()
            active = _active
    return active


@contextmanager
def use(**knobs) -> Iterator["Settings"]:
    """The settings ``knobs`` changed (``use(winograd=False, threads=1)``) for the block, for the
    whole process (see the module's docstring); the previous ones again after it, nested or not."""
    global _active
    changes = {name: _checked(name, value) for name, value in knobs.items()}
    current()                            # the environment read first, so that it is what comes back
    with _lock:
        before = _active
        _active = changed = dataclasses.replace(before, **changes)
    try:
        yield changed
    finally:
        with _lock:
            _active = before


def precision_policy(declared: str | None = None) -> str:
    """The float32 math policy on the GPU: the ``precision`` setting where given, else
    ``declared`` (a net file's ``precision`` key), else strict."""
    return current().precision or declared or "strict"


def knob_for_variable(variable: str) -> Knob:
    """The knob that the environment variable ``variable`` sets."""
    for knob in KNOBS:
        if knob.variable == variable:
            return knob
    raise KeyError(variable)


def off_text(name: str) -> str:
    """How a user switches the knob ``name`` off from the environment (``TOOLKIT_CUDNN=0``): the
    reason given where something does not happen because the knob is off."""
    return f"{_BY_NAME[name].variable}=0"


def _default_text(knob: Knob) -> str:
    if knob.default is None:
        return "chosen at run time"
    if knob.kind == "switch":
        return "on" if knob.default else "off"
    if knob.kind == "list":
        return "(none)"
    if knob.kind == "seconds":
        return f"{knob.default:g}"
    return f"{knob.default:,}" if isinstance(knob.default, int) else str(knob.default)


def markdown(knobs: tuple[Knob, ...] = KNOBS) -> str:
    """The settings page: every knob of ``knobs`` (all of ``KNOBS``), generated from the table so
    that the page cannot drift."""
    lines = [
        "# Settings",
        "",
        "<!-- Generated from toolkit/settings.py when the site builds (docs/hooks/generated_pages.py). -->",
        "",
        "Every knob of the toolkit, declared once in `toolkit/settings.py`. Each is set by its",
        "environment variable, read once when a command or `toolkit.load`, `toolkit.Net` or",
        "`toolkit.train` starts (a bad value is a one-line error, exit status 2 on the command line),",
        "or for a block of Python code by `toolkit.settings.use(name=value, ...)`.",
        "",
        "On/off knobs accept 1/0, on/off, yes/no and true/false, in any case; a blank variable is",
        "the default.",
        "",
        "| knob | environment variable | value | default | what it does |",
        "| --- | --- | --- | --- | --- |",
    ]
    for knob in knobs:
        lines.append(f"| `{knob.name}` | `{knob.variable}` | {_accepted(knob, short=True)} | {_default_text(knob)} | "
                     f"{knob.help} |")
    lines += ["", f"`{RANK_PROCESS}` is not a setting: a data-parallel job's supervisor sets it for the",
              "rank process it starts.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(markdown())
