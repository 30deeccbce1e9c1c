"""The parsers the fuzzer drives, each as a function of one input's bytes, and the property every
input must meet: it ends in a result or in the toolkit's refusal (a UserError whose every problem
prints as one line; for the KServe decoder, a BadRequest), never in another exception,
within ``SECONDS`` of wall time.

- ``prototxt``: ``toolkit import caffe FILE`` (the net read, converted and loaded back), then the
  same text read as a solver;
- ``caffemodel``: ``toolkit import caffe`` of a fixed prototxt (``CAFFE_NET``: a layer of each
  kind whose blobs the importer reshapes) with the input as its ``--weights``;
- ``onnx``: ``toolkit import onnx FILE``;
- ``netfile``: ``toolkit check FILE``;
- ``kserve``: the KServe v2 request decoder (``toolkit.serve.protocol.decode_request``), then the
  decoded tensors encoded back as a response. The input's first line is the
  ``Inference-Header-Content-Length`` header's value (an empty line: no such header), the rest
  the request's body.

A command runs as ``toolkit.cli.main`` runs it, minus main's own catching: in a scratch folder
(the input's file and --out there), its output swallowed. ``check`` runs one input and returns
the finding (None where the property holds); run.py drives it under atheris and replays corpora.
"""
from __future__ import annotations

import atexit
import contextlib
import io
import os
import shutil
import signal
import sys
import tempfile
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

SECONDS = 10.0                 # one input's bound: the longest legitimate one here takes well under a second

CAFFE_NET = """name: "blobs"
input: "data"
input_shape { dim: 1 dim: 3 dim: 6 dim: 6 }
input: "index"
input_shape { dim: 1 dim: 2 }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param { num_output: 2 kernel_size: 3 } }
layer { name: "bn" type: "BatchNorm" bottom: "conv" top: "conv" }
layer { name: "scale" type: "Scale" bottom: "conv" top: "conv" scale_param { bias_term: true } }
layer { name: "prelu" type: "PReLU" bottom: "conv" top: "conv" }
layer { name: "deconv" type: "Deconvolution" bottom: "conv" top: "deconv"
        convolution_param { num_output: 2 kernel_size: 2 group: 2 } }
layer { name: "ip" type: "InnerProduct" bottom: "deconv" top: "ip" inner_product_param { num_output: 3 } }
layer { name: "embed" type: "Embed" bottom: "index" top: "embed"
        embed_param { num_output: 2 input_dim: 4 } }
"""


class TookTooLong(BaseException):
    """An input still running after SECONDS (a BaseException: no ``except Exception`` in the
    toolkit may turn it into a refusal)."""


@dataclass
class Finding:
    """An input that broke the property: its kind (the exception's type, or 'not one line', or
    'took too long'), where (the deepest frame in the toolkit's own code) and the whole story."""
    kind: str
    where: str
    text: str

    @property
    def key(self) -> str:
        return f"{self.kind} at {self.where}"


class _Scratch:
    """A folder of the process's own, emptied before each input (an input's files and --out)."""

    def __init__(self):
        # inside the fuzzing driver's own scratch folder where there is one (the engine ends with
        # _exit, past atexit; the driver removes its folder), else removed at exit
        self.root = Path(tempfile.mkdtemp(prefix="toolkit-fuzz-", dir=os.environ.get("TOOLKIT_FUZZ_SCRATCH")))
        atexit.register(shutil.rmtree, self.root, True)

    def fresh(self) -> Path:
        for item in self.root.iterdir():
            if item.is_dir() and not item.is_symlink():
                shutil.rmtree(item, ignore_errors=True)
            else:
                item.unlink(missing_ok=True)
        return self.root


_scratch: _Scratch | None = None


def scratch() -> Path:
    global _scratch
    if _scratch is None:
        _scratch = _Scratch()
    return _scratch.fresh()


def command(*argv: str) -> None:
    """``toolkit ARGV`` as main runs it, but letting every exception through, output swallowed."""
    from toolkit.cli import build_parser, runner
    args = build_parser().parse_args(list(argv))
    args.argv = list(argv)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        runner(args.command)(args)


def _in_folder(folder: Path):
    @contextlib.contextmanager
    def inside():
        before = os.getcwd()
        os.chdir(folder)
        try:
            yield
        finally:
            os.chdir(before)
    return inside()


def prototxt(data: bytes) -> None:
    here = scratch()
    (here / "net.prototxt").write_bytes(data)
    with _in_folder(here):
        try:
            # a data layer's shape is in its database: given, so that train/test nets import whole
            command("import", "caffe", "net.prototxt", "--input-shape", "data=1,28,28", "--out", "out")
        finally:
            # the same text as a solver file (whatever the net import said)
            from toolkit.importers.caffe.layers import Context
            from toolkit.importers.caffe.net import read_prototxt
            from toolkit.importers.caffe.solver import import_solver
            ctx = Context("net.prototxt")
            import_solver(read_prototxt("net.prototxt"), ctx, [])


def caffemodel(data: bytes) -> None:
    here = scratch()
    (here / "net.prototxt").write_text(CAFFE_NET)
    (here / "net.caffemodel").write_bytes(data)
    with _in_folder(here):
        command("import", "caffe", "net.prototxt", "--weights", "net.caffemodel", "--out", "out")


def onnx(data: bytes) -> None:
    here = scratch()
    (here / "model.onnx").write_bytes(data)
    with _in_folder(here):
        command("import", "onnx", "model.onnx", "--out", "out")


def netfile(data: bytes) -> None:
    here = scratch()
    (here / "net.yaml").write_bytes(data)
    with _in_folder(here):
        command("check", "net.yaml")


def kserve(data: bytes) -> None:
    from toolkit.serve.protocol import decode_request, encode_response
    head, _, body = data.partition(b"\n")
    header = head.decode("latin-1") if head else None
    request = decode_request(body, header)
    encode_response("fuzzed", request, request.inputs)


TARGETS: dict[str, Callable[[bytes], None]] = {
    "prototxt": prototxt, "caffemodel": caffemodel, "onnx": onnx, "netfile": netfile, "kserve": kserve}


def _refusals(name: str) -> tuple[type, ...]:
    if name == "kserve":
        from toolkit.serve.protocol import BadRequest
        return (BadRequest,)
    from toolkit.errors import UserError
    return (UserError,)


def _lines(error: BaseException) -> list[str]:
    """What the CLI prints of a UserError, one entry per problem (each must be one line); a
    BadRequest travels as a JSON string, where any character is fine."""
    problems = getattr(error, "problems", None)
    return [str(p) for p in problems] if problems is not None else ["error"]


def _where(tb) -> str:
    """The deepest frame of the toolkit's own code (toolkit/, layers/, schemas/), else the deepest."""
    frames = traceback.extract_tb(tb)
    ours = [f for f in frames if any(f"{os.sep}{p}{os.sep}" in f.filename for p in ("toolkit", "layers", "schemas"))
            and f"{os.sep}tests{os.sep}" not in f.filename]
    frame = (ours or frames or [None])[-1]
    if frame is None:
        return "?"
    parts = Path(frame.filename).parts
    short = "/".join(parts[-2:]) if len(parts) >= 2 else frame.filename
    return f"{short}:{frame.lineno} ({frame.name})"


def _alarm(signum, frame):
    raise TookTooLong(f"still running after {SECONDS:g} s")


def check(name: str, data: bytes, seconds: float = SECONDS) -> Finding | None:
    """Runs target ``name`` on ``data``; the Finding where the property fails, else None."""
    refusals = _refusals(name)
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        try:
            TARGETS[name](data)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except refusals as e:
        bad = [line for line in _lines(e) if "\n" in line or not line.removeprefix("error:").strip()]
        if bad:
            return Finding("not one line", _where(e.__traceback__), f"{type(e).__name__}: {bad[0]!r}")
        return None
    except KeyboardInterrupt:
        raise
    except TookTooLong as e:
        return Finding("took too long", _where(e.__traceback__), "".join(traceback.format_exception(e)))
    except BaseException as e:         # noqa: B036 -- every other ending is what the fuzzer looks for
        return Finding(type(e).__name__, _where(e.__traceback__), "".join(traceback.format_exception(e)))
    finally:
        signal.signal(signal.SIGALRM, previous)
    return None


def warm_up() -> None:
    """Imports what the targets import lazily (so that atheris instruments them with the rest)."""
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 1000))
    from toolkit.cli import COMMANDS, runner
    for command in COMMANDS:              # each command's module (the command line imports it when it runs)
        runner(command.name)
