"""The ``toolkit`` command: parses arguments, calls the library, prints. User mistakes exit 2
with ``error: ...`` lines (``FILE:LINE:COL: error: ...`` for net files); a traceback means a bug
(exit 1)."""
from __future__ import annotations

import argparse
import sys
import warnings

from . import __version__
from .errors import UserError
from .ir.graph import FLOAT_DTYPES, TRAIN_DTYPES


class _Parser(argparse.ArgumentParser):
    """argparse, but its errors look like every other user error: one line, exit 2."""

    def error(self, message: str):  # noqa: D401  (argparse's hook)
        raise UserError(f"{message} (see '{self.prog} --help')")


def _device(text: str):
    """The ``--device`` value as a Device, which the command hands inward as it is."""
    from .backend.devices import parse_device
    try:
        return parse_device(text)
    except UserError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _positive_int(text: str) -> int:
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
        raise argparse.ArgumentTypeError(f"'{shown}': a bucket or gear size may be at most 2,147,483,647")
    try:
        sizes = tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{whole}' is not a comma-separated list of sizes") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"'{whole}': bucket sizes must be positive")
    return sizes


def _buckets(text: str) -> "tuple[int, ...] | dict[str, tuple[int, ...]]":
    """``1,2,4,8`` (the batch's buckets) or gears per symbolic dimension, ``N=1,8,32 T=16,64,256``
    (space- or semicolon-separated)."""
    if "=" not in text:
        return _sizes(text, text)
    gears: dict[str, tuple[int, ...]] = {}
    for part in text.replace(";", " ").split():
        name, eq, sizes = part.partition("=")
        if not eq or not name.isidentifier():
            raise argparse.ArgumentTypeError(f"'{part}' is not NAME=SIZE,SIZE,... (e.g. T=16,64,256)")
        if name in gears:
            raise argparse.ArgumentTypeError(f"'{text}' gives {name} twice")
        gears[name] = _sizes(sizes, part)
    return gears


def _optimize_flags(p: argparse.ArgumentParser) -> None:
    """--no-optimize and --disable PASS: on every command that builds a plan."""
    p.add_argument("--no-optimize", action="store_true",
                   help="skip every optional graph pass (dead-code removal and buffer reuse stay)")
    p.add_argument("--disable", action="append", default=[], metavar="PASS",
                   help="switch off one graph pass by name (repeatable; `toolkit compile --explain` lists them)")


LABELS_HELP = ("class names, one per line in index order (Caffe's synset_words.txt); default: the names the "
               "model recorded (its input.json)")


def build_parser() -> argparse.ArgumentParser:
    from .backend.devices import device_help
    parser = _Parser(prog="toolkit", description="Caffe-style YAML nets, compiled and run.")
    parser.add_argument("--version", action="version", version=f"toolkit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    p = sub.add_parser("check", help="validate a net; print shapes, parameter counts and FLOPs")
    p.add_argument("net")
    p.add_argument("--phase", choices=["train", "test", "infer"], default=None,
                   help="print this phase's layers (default: every layer, in its first phase)")

    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                   help="override any key of the net file, e.g. layers.conv1.num_output=32")

    p = sub.add_parser("render", help="print the net with every base merged and every --set applied")
    p.add_argument("net")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                   help="override any key of the net file, applied after the bases")

    p = sub.add_parser("schema", help="print the JSON Schema of net files (for editors)")
    p.add_argument("--indent", type=int, default=2)

    p = sub.add_parser("infer", help="run the infer phase on inputs")
    p.add_argument("net", help="a net file or zoo:NAME")
    p.add_argument("--weights", help="weights file (default for zoo:NAME: the model's published weights)")
    p.add_argument("--input", action="extend", nargs="+", required=True, metavar="[NAME=]FILE",
                   help=".npy, .npz, .csv, an image or a folder of images; several files after one --input, or "
                        "--input repeated, for several inputs or for images and CSVs stacked (read in step, a "
                        "chunk of rows at a time); a CSV's label column, named in its header, is left out")
    p.add_argument("--output", help=".npz (keyed by output name), .npy (one output), or .csv (one row per "
                                    "example: its row number or file name, then each output, a class score "
                                    "output as its class and class name); default: print")
    p.add_argument("--top", type=_positive_int, default=None, metavar="K",
                   help="print each example's K best classes (score, index, name where known), and write "
                        "them to a .csv --output")
    p.add_argument("--labels", metavar="FILE", help=LABELS_HELP)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                   help="override any key of the net file, as for train")
    p.add_argument("--device", type=_device, default="cpu", help=device_help())
    p.add_argument("--dtype", choices=FLOAT_DTYPES, default=None,
                   help="float16 and bfloat16 accumulate in float32; on cpu they run as float32")
    p.add_argument("--buckets", type=_buckets, default=None,
                   help="batch bucket sizes, e.g. 1,2,4,8; or gears per symbolic dimension, e.g. "
                        "'N=1,8,32 T=16,64,256' (a sequence is padded up to its gear; default: the net file's gears)")
    p.add_argument("--chunk-rows", type=_positive_int, default=None, metavar="N",
                   help="rows read and run at a time (default: 4 x the largest bucket); memory stays flat")
    p.add_argument("--warm", action="store_true", help="build and run every bucket's plan before the first chunk")
    p.add_argument("--verbose", action="store_true",
                   help="print progress (also off a terminal), the buckets used, rows/s and peak memory to stderr")
    p.add_argument("--allow-missing", action="store_true",
                   help="copy the weights whose name and shape match; start the others from their fillers")
    p.add_argument("--no-transform", action="store_true",
                   help="feed the inputs as given, without the input transform the net was trained with "
                        "(its train.data scale and mean, applied by default)")
    _optimize_flags(p)

    p = sub.add_parser("serve", help="serve the infer phase over HTTP (KServe v2 / Triton protocol)")
    p.add_argument("net", help="a net file or zoo:NAME")
    p.add_argument("--weights", help="weights file (default for zoo:NAME: the model's published weights)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s, this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port (default: %(default)s; 0 picks a free one)")
    p.add_argument("--device", type=_device, default="cpu", help=device_help())
    p.add_argument("--dtype", choices=FLOAT_DTYPES, default=None,
                   help="float16 and bfloat16 accumulate in float32; on cpu they run as float32")
    p.add_argument("--buckets", type=_buckets, default=None,
                   help="batch bucket sizes, e.g. 1,2,4,8 (default 1,2,4,...,64); the largest is the batcher's limit; "
                        "or gears per symbolic dimension, e.g. 'N=1,8,32 T=16,64,256' (default: the net file's gears)")
    p.add_argument("--max-delay-ms", type=float, default=2.0,
                   help="how long a request may wait for others to batch with (default: %(default)s)")
    p.add_argument("--max-queue", type=_positive_int, default=256,
                   help="requests waiting at most; one more is answered 503 at once (default: %(default)s)")
    p.add_argument("--max-body-mb", type=float, default=64.0,
                   help="largest request body accepted, in MiB (default: %(default)s); larger: 413")
    p.add_argument("--shutdown-timeout", type=float, default=30.0,
                   help="seconds SIGTERM waits for requests in flight before closing them (default: %(default)s)")
    p.add_argument("--timeout-s", type=float, default=30.0,
                   help="seconds a connection has to send a request's headers, and then its body; "
                        "slower: 408 and closed (default: %(default)s)")
    p.add_argument("--max-connections", type=_positive_int, default=None, metavar="N",
                   help="connections open at once; the next closes the longest idle one, or is answered 503 "
                        "(default: the descriptor limit, ulimit -n, less headroom)")
    p.add_argument("--warm", action="store_true", help="compile and run every bucket before accepting requests")
    p.add_argument("--labels", metavar="FILE", help=LABELS_HELP + "; answer KServe's classification parameter "
                                                                 "with these names")
    p.add_argument("--allow-missing", action="store_true",
                   help="copy the weights whose name and shape match; start the others from their fillers")
    p.add_argument("--no-transform", action="store_true",
                   help="feed the inputs as given, without the input transform the net was trained with "
                        "(its train.data scale and mean, applied by default)")
    _optimize_flags(p)

    p = sub.add_parser("bench", help="time inference or train steps")
    p.add_argument("net")
    p.add_argument("--batch", type=_positive_int, required=True)
    p.add_argument("--train", action="store_true", help="time forward + backward + SGD update")
    p.add_argument("--iters", type=_positive_int, default=50)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--device", type=_device, default="cpu", help=device_help())
    p.add_argument("--dtype", choices=FLOAT_DTYPES, default=None,
                   help="float16 and bfloat16 accumulate in float32; with --train they mean mixed precision; "
                        "on cpu they run through float32 kernels")
    p.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE",
                   help="value of another symbolic dimension, e.g. T=32")
    p.add_argument("--lr", type=float, default=None,
                   help="rate for --train (default: the net's base_lr; plain SGD at 0.01 without a train section)")
    p.add_argument("--weights", help="weights to run with (default: the fillers', biases and BatchNorm "
                                     "parameters given small random values as after training)")
    _optimize_flags(p)
    p.add_argument("--per-layer", action="store_true",
                   help="also profile the timed iterations and print the time of each layer (forward and, "
                        "with --train, backward), as Caffe's `caffe time`")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("train", help="train a net (its train section: data, solver, schedule)")
    p.add_argument("net", nargs="?", help="the net file or zoo:NAME (with --resume: default the run's own net.yaml)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                   help="override any key of the net file, e.g. train.solver.base_lr=0.1")
    p.add_argument("--out", help="run folder (default runs/NAME, or runs/NAME-2, -3, ... when that holds a run)")
    p.add_argument("--weights", metavar="FILE|zoo:NAME",
                   help="start from these weights, copied by layer name (fine-tuning)")
    p.add_argument("--allow-missing", action="store_true",
                   help="with --weights: copy the weights whose name and shape match, start new, renamed or "
                        "reshaped layers from their fillers, ignore the file's other weights (a table says which)")
    p.add_argument("--new-head", type=_positive_int, metavar="NUM_CLASSES",
                   help="with --weights: fine-tune to NUM_CLASSES classes: the classifier (the last layer with "
                        "weights before the output) replaced by a new one of that width from its fillers, the "
                        "label input, a SoftmaxWithLoss and an Accuracy added where the net has none")
    p.add_argument("--resume", metavar="DIR", help="continue exactly from a run folder or checkpoint, with the net "
                                                   "and settings the run recorded (a change must be named by --set)")
    p.add_argument("--device", type=_device, default="cpu", help=device_help())
    p.add_argument("--dtype", choices=TRAIN_DTYPES, default=None,
                   help="float16/bfloat16: mixed precision (GEMMs and convolutions in that type, float32 master "
                        "weights, dynamic loss scaling), as train.solver.mixed_precision; float32: without it")
    _optimize_flags(p)

    p = sub.add_parser("test", help="run the test phase over the net's test data and print the metrics")
    p.add_argument("net", help="a net file or zoo:NAME")
    p.add_argument("--weights", help="weights file (default for zoo:NAME: the model's published weights)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides")
    p.add_argument("--device", type=_device, default="cpu", help=device_help())
    _optimize_flags(p)

    p = sub.add_parser("data", help="export the net's training data (train or test split) as .npz")
    p.add_argument("net")
    p.add_argument("--split", choices=["train", "test"], default="test")
    p.add_argument("--out", required=True, help=".npz keyed by input name, as `infer` takes them (it applies the "
                                                 "net's input transform)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides")

    p = sub.add_parser("compile", help="run a phase's graph through the passes and report what each did")
    p.add_argument("net")
    p.add_argument("--phase", choices=["train", "test", "infer"], default="infer")
    p.add_argument("--explain", action="store_true",
                   help="print per-pass nodes, FLOPs, peak memory and changes (the default output)")
    p.add_argument("--json", action="store_true", help="print one JSON object (docs/spec.md section 4)")
    p.add_argument("--dump", action="store_true", help="print the final graph as text")
    p.add_argument("--batch", type=_positive_int, default=1, help="batch size for the memory plan")
    p.add_argument("--ranks", type=_positive_int, default=1,
                   help="with --phase train: the data-parallel step of this many ranks, with its "
                        "gradient all-reduce buckets (what `mpiexec -n RANKS toolkit train` runs)")
    p.add_argument("--weights", help="weights to freeze into infer and test graphs (default: the fillers')")
    p.add_argument("--device", type=_device, default="cpu", help=device_help())
    _optimize_flags(p)

    p = sub.add_parser("graph", help="draw a phase's graph, before or after the passes, as .svg or .dot")
    p.add_argument("net")
    p.add_argument("--phase", choices=["train", "test", "infer"], default="infer",
                   help="train adds the generated backward pass and the solver's updates")
    p.add_argument("--optimized", action="store_true", help="draw the graph after the optimiser passes")
    p.add_argument("-o", "--output", required=True, metavar="FILE.svg|FILE.dot",
                   help=".dot (Graphviz's text) or .svg (needs Graphviz's dot program)")
    p.add_argument("--weights", help="with --optimized: weights frozen into infer and test graphs "
                                     "(default: the fillers')")
    _optimize_flags(p)

    p = sub.add_parser("import", help="a model of another toolkit as a net file and a weights file")
    formats = p.add_subparsers(dest="format", metavar="FORMAT", parser_class=_Parser)
    formats.required = True
    q = formats.add_parser("caffe", help="a Caffe prototxt, with its caffemodel and solver")
    q.add_argument("prototxt", metavar="NET.prototxt", help="a deploy or train_val prototxt (V1 `layers` files too)")
    q.add_argument("--weights", metavar="M.caffemodel", help="its trained weights, written as model.safetensors")
    q.add_argument("--solver", metavar="S.prototxt", help="its solver, written as the net's train section")
    q.add_argument("--stage", action="append", default=[], help="a stage of the net's state (repeatable), for "
                                                                "include/exclude rules that name stages")
    q.add_argument("--input-shape", action="append", default=[], metavar="NAME=C,H,W",
                   help="the example shape of what a data layer reads (its database holds it)")
    q.add_argument("--out", required=True, metavar="DIR", help="where net.yaml (and model.safetensors) go")
    q.add_argument("--labels", metavar="FILE", help="the class names, one per line in index order (Caffe's "
                                                    "synset_words.txt), recorded in DIR/input.json")
    q.add_argument("--transform", metavar="PRESET", choices=["caffe-imagenet", "torchvision-imagenet"],
                   help="how images become the input, written as the net's transform: caffe-imagenet (BGR, "
                        "warped to 256 x 256, the centre crop of the input's size, minus ILSVRC 2012's mean per "
                        "channel) or torchvision-imagenet")
    q.add_argument("--force", action="store_true", help="replace net.yaml and model.safetensors in DIR")
    q = formats.add_parser("onnx", help="an ONNX model (opset 13 and up; older ones are converted)")
    q.add_argument("model", metavar="MODEL.onnx")
    q.add_argument("--out", required=True, metavar="DIR", help="where net.yaml, the model and model.safetensors go")
    q.add_argument("--labels", metavar="FILE", help="the class names, one per line in index order, recorded in "
                                                    "DIR/input.json")
    q.add_argument("--force", action="store_true", help="replace the files in DIR")

    p = sub.add_parser("export", help="a net in another toolkit's format (ONNX)")
    formats = p.add_subparsers(dest="format", metavar="FORMAT", parser_class=_Parser)
    formats.required = True
    q = formats.add_parser("onnx", help="the infer (or test) phase as an ONNX model, checked by onnx.checker")
    q.add_argument("net", metavar="NET", help="a net file or zoo:NAME")
    q.add_argument("--weights", help="weights file (default: a zoo model's published weights)")
    q.add_argument("-o", "--output", required=True, metavar="FILE.onnx")
    q.add_argument("--opset", type=_positive_int, default=None, help="the ONNX opset (13 and up; default 17)")
    q.add_argument("--phase", choices=["infer", "test"], default="infer")
    q.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                   help="override any key of the net file, as for train")
    q.add_argument("--no-transform", action="store_true",
                   help="leave the net's input transform out of the graph (it stays in the metadata): the model "
                        "takes its inputs transformed already")

    p = sub.add_parser("zoo", help="the model zoo: list, show, get, verify and publish models with checksummed weights")
    zoo = p.add_subparsers(dest="zoo_command", metavar="ACTION", parser_class=_Parser)
    zoo.required = True
    zoo_list = zoo.add_parser("list", help="the models of the shipped zoo, the sources and the cache")
    zoo_show = zoo.add_parser("show", help="a model's card: its fields, its text, where it is cached")
    zoo_show.add_argument("name", metavar="NAME")
    zoo_get = zoo.add_parser("get", help="fetch a model into the cache (checked by sha256), or copy it out with --to")
    zoo_get.add_argument("name", metavar="NAME")
    zoo_get.add_argument("--to", metavar="DIR", help="also copy the card, net and weights into DIR")
    zoo_get.add_argument("--force", action="store_true", help="replace differing files in DIR")
    zoo_verify = zoo.add_parser("verify", help="check a model folder: card, hashes, net, weights, the metric")
    zoo_verify.add_argument("dir", metavar="DIR", help="a model folder (with README.md), or zoo:NAME")
    zoo_verify.add_argument("--no-test", action="store_true", help="do not measure the card's metric")
    for q in (zoo_list, zoo_show, zoo_get, zoo_verify):
        q.add_argument("--source", action="append", default=None, metavar="FOLDER|URL|git+URL[@REF]",
                       help="where to look after the shipped zoo (repeatable; default: $TOOLKIT_ZOO, "
                            "comma-separated)")
    q = zoo.add_parser("publish", help="add the model in DIR (net, weights, draft card) to a zoo folder")
    q.add_argument("dir", metavar="DIR", help="a folder with net.yaml (or one *.yaml), its weights and "
                                              "optionally a draft README.md")
    q.add_argument("--to", required=True, metavar="FOLDER", help="the zoo folder (then a source as it stands)")
    q.add_argument("--name", help="the model's name (default: the draft card's, else the net's)")
    q.add_argument("--licence", help="the licence of the weights (or 'licence' in the draft card)")
    q.add_argument("--task", help="what the model does (or 'task' in the draft card)")
    q.add_argument("--force", action="store_true", help="replace a differing model of that name in FOLDER")
    q.add_argument("--bundle-data", action="store_true",
                   help="publish the training data with the model (as data.npz and test.npz), for a net that "
                        "trains on files: without it such a net is refused, as others could not reproduce it")
    return parser


def main(argv: list[str] | None = None) -> int:
    warnings.simplefilter("ignore", RuntimeWarning)   # overflow in user data is not a crash
    try:
        args = build_parser().parse_args(argv)
        args.argv = list(sys.argv[1:] if argv is None else argv)     # what a rank process re-runs
        from . import commands
        return getattr(commands, f"run_{args.command}")(args) or 0
    except UserError as e:
        for problem in e.problems:
            print(problem, file=sys.stderr)
        return 2
    except BrokenPipeError:   # the reader went away (`toolkit compile --json | head`): not an error
        return 0
    except OSError as e:    # the machine, not the toolkit: a full disk, a read-only folder
        where = f"{e.filename}: " if e.filename else ""
        print(f"error: {where}{e.strerror or e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
