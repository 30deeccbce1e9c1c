"""The command line's vocabulary: how option values are read (``--device``, ``--buckets``, sizes)
and the options several commands share, each declared once here (flags, type, default, help) and
listed by the commands that take it in toolkit/cli.py's table.

Importing this stays light (no numpy, no command module): ``toolkit --help`` and ``toolkit zoo
list`` build the whole parser from it.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from ..errors import UserError
from ..ir.graph import FLOAT_DTYPES, TRAIN_DTYPES  # noqa: F401  (TRAIN_DTYPES: train's --dtype)


@dataclass(frozen=True)
class Option:
    """One argument of argparse: its flags and ``add_argument``'s keywords. ``help`` may be a
    function, asked when the parser is built (the device names come from the backend's table)."""
    flags: tuple[str, ...]
    settings: dict = field(default_factory=dict)

    def but(self, **changes) -> Option:
        """This option as one command words it (its own help text, a required flag)."""
        return Option(self.flags, {**self.settings, **changes})

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        settings = dict(self.settings)
        if callable(settings.get("help")):
            settings["help"] = settings["help"]()
        parser.add_argument(*self.flags, **settings)


def option(*flags: str, **settings) -> Option:
    return Option(tuple(flags), settings)


# --- how values are read: argparse's type= functions (their errors become one-line UserErrors)

def device(text: str):
    """The ``--device`` value as a Device, which the command hands inward as it is."""
    from ..backend.devices import parse_device
    try:
        return parse_device(text)
    except UserError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _device_help() -> str:
    from ..backend.devices import device_help
    return device_help()


def positive_int(text: str) -> int:
    if len(text.strip().lstrip("+")) > 18:      # beyond 64 bits' reach (and Python's 4,300-digit limit)
        shown = text if len(text) <= 40 else text[:40] + "..."
        raise argparse.ArgumentTypeError(f"'{shown}' is more than any size this takes")
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def _sizes(text: str, whole: str) -> tuple[int, ...]:
    # (the range is the session's to check; a size this long is beyond it, and Python would not
    # convert one of 4,300 digits)
    if any(len(t.strip()) > 12 for t in text.split(",")):
        shown = whole if len(whole) <= 40 else whole[:40] + "..."
        raise argparse.ArgumentTypeError(f"'{shown}': a bucket size may be at most 2,147,483,647")
    try:
        sizes = tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{whole}' is not a comma-separated list of sizes") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"'{whole}': bucket sizes must be positive")
    return sizes


def buckets(text: str) -> tuple[int, ...] | dict[str, tuple[int, ...]]:
    """``1,2,4,8`` (the batch's buckets) or buckets per symbolic dimension, ``N=1,8,32 T=16,64,256``
    (space- or semicolon-separated)."""
    if "=" not in text:
        return _sizes(text, text)
    per_symbol: dict[str, tuple[int, ...]] = {}
    for part in text.replace(";", " ").split():
        name, eq, sizes = part.partition("=")
        if not eq or not name.isidentifier():
            raise argparse.ArgumentTypeError(f"'{part}' is not NAME=SIZE,SIZE,... (e.g. T=16,64,256)")
        if name in per_symbol:
            raise argparse.ArgumentTypeError(f"'{text}' gives {name} twice")
        per_symbol[name] = _sizes(sizes, part)
    return per_symbol


# --- the shared options. A command lists the ones it takes, in the order its --help shows them,
# and changes only the words (``.but(help=...)``), never the flag, type or default.

PHASES = ["train", "test", "infer"]

NET = option("net", help="a net file or zoo:NAME")
SET = option("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
             help="override any key of the net file, e.g. layers.conv1.num_output=32")
WEIGHTS = option("--weights", help="weights file (default for zoo:NAME: the model's published weights)")
DEVICE = option("--device", type=device, default="cpu", help=_device_help)
DTYPE = option("--dtype", choices=FLOAT_DTYPES, default=None,
               help="float16 and bfloat16 accumulate in float32; on cpu they run as float32")
# the float32 math policy on the GPU; main() puts it in force as the precision setting, over the
# TOOLKIT_PRECISION variable and the net file's precision key
PRECISION = option("--precision", choices=["strict", "tf32"], default=None,
                   help="float32 math on the GPU: strict (FMA, equal to the CPU to float32 rounding) or tf32 "
                        "(cuDNN convolutions on TF32 tensor cores, as PyTorch's default; GEMMs stay float32); "
                        "default: TOOLKIT_PRECISION, else the net file's precision key, else strict")
BUCKETS = option("--buckets", type=buckets, default=None,
                 help="batch bucket sizes, e.g. 1,2,4,8; or buckets per symbolic dimension, e.g. "
                      "'N=1,8,32 T=16,64,256' (a sequence is padded up to its bucket; default: the net file's "
                      "buckets)")
ALLOW_MISSING = option("--allow-missing", action="store_true",
                       help="copy the weights whose name and shape match; start the others from their fillers")
NO_TRANSFORM = option("--no-transform", action="store_true",
                      help="feed the inputs as given, without the input transform the net was trained with "
                           "(its train.data scale and mean, applied by default)")
LABELS = option("--labels", metavar="FILE",
                help="class names, one per line in index order (Caffe's synset_words.txt); default: the names "
                     "the model recorded (its input.json)")
# every command that builds a plan takes both
OPTIMIZE = (
    option("--no-optimize", action="store_true",
           help="skip every optional graph pass (dead-code removal and buffer reuse stay)"),
    option("--disable", action="append", default=[], metavar="PASS",
           help="switch off one graph pass by name (repeatable; `toolkit compile --explain` lists them)"),
)


def phase(default: str | None, *, choices: list[str] = PHASES, help: str | None = None) -> Option:  # noqa: A002
    """``--phase``: which of the net's phases a command reads."""
    return option("--phase", choices=choices, default=default, help=help)

