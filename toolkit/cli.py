"""The ``toolkit`` command: parses arguments, calls the library, prints. User mistakes exit 2
with ``error: ...`` lines (``FILE:LINE:COL: error: ...`` for net files); a traceback means a bug
(exit 1).

What lives here: ``COMMANDS``, the table of every command (its help, the options it takes, the
module under toolkit/commands/ that runs it), the parser built from it, and ``main``. The options
several commands share are declared once in commands/options.py. A command's module is imported
only when that command runs, so that ``toolkit --help`` or ``toolkit zoo list`` loads nothing else.
"""
from __future__ import annotations

import argparse
import importlib
import sys
import warnings
from dataclasses import dataclass

from .commands.options import (
    ALLOW_MISSING,
    BUCKETS,
    DEVICE,
    DTYPE,
    LABELS,
    NET,
    NO_TRANSFORM,
    OPTIMIZE,
    PRECISION,
    SET,
    TRAIN_DTYPES,
    WEIGHTS,
    Option,
    option,
    phase,
    positive_int,
)
from .errors import UserError
from .version import __version__


class _Parser(argparse.ArgumentParser):
    """argparse, but its errors look like every other user error: one line, exit 2."""

    def error(self, message: str):  # noqa: D401  (argparse's hook)
        raise UserError(f"{message} (see '{self.prog} --help')")


@dataclass(frozen=True)
class Command:
    """One command or action: its name and help, its options in --help's order, and either the
    function that runs it (``"MODULE:FUNCTION"`` under toolkit/commands/) or its own actions
    (``toolkit zoo list``), chosen by ``dest``."""
    name: str
    help: str
    options: tuple[Option, ...] = ()
    run: str | None = None
    actions: tuple[Command, ...] = ()
    dest: str | None = None
    metavar: str | None = None


ZOO_SOURCE = option("--source", action="append", default=None, metavar="FOLDER|URL|git+URL[@REF]",
                    help="where to look after the shipped zoo (repeatable; default: $TOOLKIT_ZOO, comma-separated)")

COMMANDS: tuple[Command, ...] = (
    Command("check", "validate a net; print shapes, parameter counts and FLOPs", run="check:run_check", options=(
        NET, phase(None, help="print this phase's layers (default: every layer, in its first phase)"), SET)),
    Command("render", "print the net with every base merged and every --set applied", run="check:run_render",
            options=(NET, SET.but(help="override any key of the net file, applied after the bases"))),
    Command("schema", "print the JSON Schema of net files (for editors)", run="check:run_schema",
            options=(option("--indent", type=int, default=2, help="spaces per level of the JSON (default 2)"),)),
    Command("infer", "run the infer phase on inputs", run="infer:run_infer", options=(
        NET, WEIGHTS,
        option("--input", action="extend", nargs="+", required=True, metavar="[NAME=]FILE",
               help=".npy, .npz, .csv, an image or a folder of images; several files after one --input, or "
                    "--input repeated, for several inputs or for images and CSVs stacked (read in step, a "
                    "chunk of rows at a time); a CSV's label column, named in its header, is left out"),
        option("--output", help=".npz (keyed by output name), .npy (one output), or .csv (one row per "
                                "example: its row number or file name, then each output, a class score "
                                "output as its class and class name); default: print"),
        option("--top", type=positive_int, default=None, metavar="K",
               help="print each example's K best classes (score, index, name where known), and write "
                    "them to a .csv --output"),
        LABELS, SET.but(help="override any key of the net file, as for train"), DEVICE, DTYPE, PRECISION, BUCKETS,
        option("--chunk-rows", type=positive_int, default=None, metavar="N",
               help="rows read and run at a time (default: 4 x the largest bucket); memory stays flat"),
        option("--warm", action="store_true", help="build and run every bucket's plan before the first chunk"),
        option("--verbose", action="store_true",
               help="print progress (also off a terminal), the buckets used, rows/s and peak memory to stderr"),
        ALLOW_MISSING, NO_TRANSFORM, *OPTIMIZE)),
    Command("serve", "serve the infer phase over HTTP (KServe v2 / Triton protocol)", run="serve_cmd:run_serve",
            options=(
        NET, WEIGHTS,
        option("--host", default="127.0.0.1", help="address to listen on (default: %(default)s, this machine only)"),
        option("--port", type=int, default=8000, help="port (default: %(default)s; 0 picks a free one)"),
        DEVICE, DTYPE,
        BUCKETS.but(help="batch bucket sizes, e.g. 1,2,4,8 (default 1,2,4,...,64); the largest is the batcher's "
                         "limit; or buckets per symbolic dimension, e.g. 'N=1,8,32 T=16,64,256' (default: the net "
                         "file's buckets)"),
        option("--max-delay-ms", type=float, default=2.0,
               help="how long a request may wait for others to batch with (default: %(default)s)"),
        option("--max-queue", type=positive_int, default=256,
               help="requests waiting at most; one more is answered 503 at once (default: %(default)s)"),
        option("--max-body-mb", type=float, default=64.0,
               help="largest request body accepted, in MiB (default: %(default)s); larger: 413"),
        option("--shutdown-timeout", type=float, default=30.0,
               help="seconds SIGTERM waits for requests in flight before closing them (default: %(default)s)"),
        option("--timeout-s", type=float, default=30.0,
               help="seconds a connection has to send a request's headers, and then its body; "
                    "slower: 408 and closed (default: %(default)s)"),
        option("--max-connections", type=positive_int, default=None, metavar="N",
               help="connections open at once; the next closes the longest idle one, or is answered 503 "
                    "(default: the descriptor limit, ulimit -n, less headroom)"),
        option("--warm", action="store_true", help="compile and run every bucket before accepting requests"),
        LABELS.but(help=LABELS.settings["help"] + "; answer KServe's classification parameter with these names"),
        ALLOW_MISSING, NO_TRANSFORM, *OPTIMIZE, SET)),
    Command("bench", "time inference or train steps", run="bench:run_bench", options=(
        NET, option("--batch", type=positive_int, required=True, help="the batch size N to time"),
        option("--train", action="store_true", help="time forward + backward + SGD update"),
        option("--iters", type=positive_int, default=50, help="timed iterations (default 50)"),
        option("--warmup", type=int, default=5, help="untimed iterations first (default 5)"),
        DEVICE, DTYPE.but(help="float16 and bfloat16 accumulate in float32; with --train they mean mixed "
                               "precision; on cpu they run through float32 kernels"),
        PRECISION,
        option("--dim", action="append", default=[], metavar="NAME=SIZE",
               help="value of another symbolic dimension, e.g. T=32"),
        option("--lr", type=float, default=None,
               help="rate for --train (default: the net's base_lr; plain SGD at 0.01 without a train section)"),
        WEIGHTS.but(help="weights to run with (default: the fillers', biases and BatchNorm parameters given "
                         "small random values as after training)"),
        *OPTIMIZE,
        option("--per-layer", action="store_true",
               help="also profile the timed iterations and print the time of each layer (forward and, "
                    "with --train, backward), as Caffe's `caffe time`"),
        option("--predict", action="store_true",
               help="also print the step time the measured cost model predicts for this plan (its kernels "
                    "profiled on first use, at least 15 more runs, then cached per machine)"),
        option("--json", action="store_true", help="print one JSON object (docs/spec.md section 4)"), SET)),
    Command("train", "train a net (its train section: data, solver, schedule)", run="train_cmd:run_train", options=(
        NET.but(nargs="?", help="the net file or zoo:NAME (with --resume: default the run's own net.yaml)"),
        SET.but(help="override any key of the net file, e.g. train.solver.base_lr=0.1"),
        option("--out", help="run folder (default runs/NAME, or runs/NAME-2, -3, ... when that holds a run)"),
        WEIGHTS.but(metavar="FILE|zoo:NAME", help="start from these weights, copied by layer name (fine-tuning)"),
        ALLOW_MISSING.but(help="with --weights: copy the weights whose name and shape match, start new, renamed "
                               "or reshaped layers from their fillers, ignore the file's other weights (a table "
                               "says which)"),
        option("--new-head", type=positive_int, metavar="NUM_CLASSES",
               help="with --weights: fine-tune to NUM_CLASSES classes: the classifier (the last layer with "
                    "weights before the output) replaced by a new one of that width from its fillers, the "
                    "label input, a SoftmaxWithLoss and an Accuracy added where the net has none"),
        option("--resume", metavar="DIR", help="continue exactly from a run folder or checkpoint, with the net "
                                               "and settings the run recorded (a change must be named by --set)"),
        DEVICE, DTYPE.but(choices=TRAIN_DTYPES,
                          help="float16/bfloat16: mixed precision (GEMMs and convolutions in that type, float32 "
                               "master weights, dynamic loss scaling), as train.solver.mixed_precision; float32: "
                               "without it"),
        PRECISION,
        *OPTIMIZE)),
    Command("test", "run the test phase over the net's test data and print the metrics", run="train_cmd:run_test",
            options=(NET, WEIGHTS, SET, DEVICE, *OPTIMIZE)),
    Command("data", "export the net's training data (train or test split) as .npz or .csv", run="train_cmd:run_data",
            options=(
        NET, option("--split", choices=["train", "test"], default="test",
                    help="which part of the net's training data (default: test, the held-out split)"),
        option("--out", required=True, help=".npz keyed by input name, or .csv (a header, then one row per "
                                            "example: the features flattened row-major as NAME_0, NAME_1, ..., "
                                            "then the label; a net's train.data.source reads it back), as `infer` "
                                            "takes them (it applies the net's input transform)"),
        SET)),
    Command("compile", "run a phase's graph through the passes and report what each did", run="compile_cmd:run_compile",
            options=(
        NET, phase("infer", help="the phase whose graph is compiled (train: with its backward pass and updates)"),
        option("--explain", action="store_true",
               help="print per-pass nodes, FLOPs, peak memory and changes (the default output); given by name, "
                    "also the step time the measured cost model predicts (with --json too; the kernels are "
                    "timed on first use and cached)"),
        option("--json", action="store_true", help="print one JSON object (docs/spec.md section 4)"),
        option("--dump", action="store_true", help="print the final graph as text"),
        option("--batch", type=positive_int, default=1, help="batch size for the memory plan"),
        option("--ranks", type=positive_int, default=1,
               help="with --phase train: the data-parallel step of this many ranks, with its "
                    "gradient all-reduce buckets (what `mpiexec -n RANKS toolkit train` runs)"),
        option("--stages", type=positive_int, default=1,
               help="with --phase train: the step cut into this many pipeline stages (what `mpiexec -n STAGES "
                    "toolkit train --set train.distributed.stages=STAGES` runs): each stage's layers, FLOPs, "
                    "predicted time, weights and memory, the bytes sent and the bubble; with --ranks a multiple "
                    "of STAGES, the data-parallel replicas of the pipeline too"),
        WEIGHTS.but(help="weights to freeze into infer and test graphs (default: the fillers')"),
        DEVICE,
        option("--place", choices=["auto"], default=None,
               help="auto: choose each layer's device by cost over --devices (as the net file's placement: auto)"),
        option("--devices", metavar="DEV,DEV,...", default=None,
               help="with --place auto: the devices to place over (default: --device and cpu:1, or gpu and cpu)"),
        option("--emit", metavar="FILE.yaml", default=None,
               help="with --place auto: write the net with the chosen devices as its layers' device: keys"),
        *OPTIMIZE, SET)),
    Command("quantize", "an int8 model folder from a float model and calibration data", run="quantize_cmd:run_quantize",
            options=(
        NET, WEIGHTS.but(help="the float weights, .safetensors (default for zoo:NAME: the published weights)"),
        option("--calibrate", action="extend", nargs="+", required=True, metavar="[NAME=]FILE",
               help="calibration data, read as infer reads --input (CSV, .npz, images, folders); keep it apart "
                    "from the data you measure accuracy on"),
        option("--out", required=True, metavar="DIR",
               help="the quantized model folder to write (new or empty): net.yaml with its quantization "
                    "section, model.safetensors"),
        option("--method", choices=["minmax", "percentile", "entropy", "mse"], default="mse",
               help="how each activation's range is found: mse (default: the range whose 8-bit values have the "
                    "least squared error; measured best on real photos), minmax, percentile (99.999) or entropy "
                    "(KL divergence, TensorRT's)"),
        option("--examples", type=positive_int, default=256, metavar="N",
               help="calibration examples drawn, in a seeded order (default 256)"),
        option("--dtype", choices=["uint8", "int8"], default="uint8",
               help="the activations' type: uint8 with a zero point (default) or symmetric int8"),
        option("--float", action="append", default=None, metavar="LAYER",
               help="a layer to keep in float (repeatable); softmax layers always are"),
        option("--bias-correction", action=argparse.BooleanOptionalAction, default=True,
               help="add to each int8 convolution's and InnerProduct's bias the mean error its int8 form puts "
                    "into its output over the calibration examples (default: on; measured better on real photos)"),
        option("--equalize", action=argparse.BooleanOptionalAction, default=None,
               help="before calibration, scale each convolution's and InnerProduct's output channels against the "
                    "weights of the layers that read them (cross-layer equalization: the same function in float, "
                    "the channels' ranges evened out for 8 bits; default: on; measured better on real photos)"),
        SET)),
    Command("graph", "draw a phase's graph, before or after the passes, as .svg or .dot", run="graph_cmd:run_graph",
            options=(
        NET, phase("infer", help="train adds the generated backward pass and the solver's updates"),
        option("--optimized", action="store_true", help="draw the graph after the optimiser passes"),
        option("-o", "--output", required=True, metavar="FILE.svg|FILE.dot",
               help=".dot (Graphviz's text) or .svg (laid out by Graphviz's dot program where it is "
                    "installed, else by the toolkit's own layered layout)"),
        option("--layout", choices=["auto", "dot", "builtin"], default="auto",
               help="who lays out an .svg: auto (default: Graphviz's dot if installed, else builtin), "
                    "dot (Graphviz, which must be installed) or builtin (the toolkit's own, "
                    "the same on every machine)"),
        WEIGHTS.but(help="with --optimized: weights frozen into infer and test graphs (default: the fillers')"),
        *OPTIMIZE, SET)),
    Command("import", "a model of another toolkit as a net file and a weights file", run="import_cmd:run_import",
            dest="format", metavar="FORMAT", actions=(
        Command("caffe", "a Caffe prototxt, with its caffemodel and solver", options=(
            option("prototxt", metavar="NET.prototxt", help="a deploy or train_val prototxt (V1 `layers` files too)"),
            option("--weights", metavar="M.caffemodel", help="its trained weights, written as model.safetensors"),
            option("--solver", metavar="S.prototxt", help="its solver, written as the net's train section"),
            option("--stage", action="append", default=[],
                   help="a stage of the net's state (repeatable), for include/exclude rules that name stages"),
            option("--input-shape", action="append", default=[], metavar="NAME=C,H,W",
                   help="the example shape of what a data layer reads (its database holds it)"),
            option("--out", required=True, metavar="DIR", help="where net.yaml (and model.safetensors) go"),
            option("--labels", metavar="FILE", help="the class names, one per line in index order (Caffe's "
                                                    "synset_words.txt), recorded in DIR/input.json"),
            option("--transform", metavar="PRESET", choices=["caffe-imagenet", "torchvision-imagenet"],
                   help="how images become the input, written as the net's transform: caffe-imagenet (BGR, "
                        "warped to 256 x 256, the centre crop of the input's size, minus ILSVRC 2012's mean per "
                        "channel) or torchvision-imagenet"),
            option("--force", action="store_true", help="replace net.yaml and model.safetensors in DIR"))),
        Command("onnx", "an ONNX model (opset 13 and up; older ones are converted)", options=(
            option("model", metavar="MODEL.onnx", help="the ONNX model file to import"),
            option("--out", required=True, metavar="DIR", help="where net.yaml, the model and model.safetensors go"),
            option("--labels", metavar="FILE", help="the class names, one per line in index order, recorded in "
                                                    "DIR/input.json"),
            option("--force", action="store_true", help="replace the files in DIR"))))),
    Command("export", "a net in another toolkit's format (ONNX)", run="export_cmd:run_export",
            dest="format", metavar="FORMAT", actions=(
        Command("onnx", "the infer (or test) phase as an ONNX model, checked by onnx.checker", options=(
            NET.but(metavar="NET"), WEIGHTS.but(help="weights file (default: a zoo model's published weights)"),
            option("-o", "--output", required=True, metavar="FILE.onnx", help="the ONNX file to write"),
            option("--opset", type=positive_int, default=None, help="the ONNX opset (13 and up; default 17)"),
            phase("infer", choices=["infer", "test"], help="the phase exported (default: infer)"),
            SET.but(help="override any key of the net file, as for train"),
            NO_TRANSFORM.but(help="leave the net's input transform out of the graph (it stays in the metadata): "
                                  "the model takes its inputs transformed already"))),)),
    Command("zoo", "the model zoo: list, show, get, verify and publish models with checksummed weights",
            run="zoo_cmd:run_zoo", dest="zoo_command", metavar="ACTION", actions=(
        Command("list", "the models of the shipped zoo, the sources and the cache", options=(ZOO_SOURCE,)),
        Command("show", "a model's card: its fields, its text, where it is cached", options=(
            option("name", metavar="NAME", help="the model's name in the zoo"), ZOO_SOURCE)),
        Command("get", "fetch a model into the cache (checked by sha256), or copy it out with --to", options=(
            option("name", metavar="NAME", help="the model's name in the zoo"),
            option("--to", metavar="DIR", help="also copy the card, net and weights into DIR"),
            option("--force", action="store_true", help="replace differing files in DIR"), ZOO_SOURCE)),
        Command("verify", "check a model folder: card, hashes, net, weights, the metric", options=(
            option("dir", metavar="DIR", help="a model folder (with README.md), or zoo:NAME"),
            option("--no-test", action="store_true", help="do not measure the card's metric"), ZOO_SOURCE)),
        Command("publish", "add the model in DIR (net, weights, draft card) to a zoo folder", options=(
            option("dir", metavar="DIR", help="a folder with net.yaml (or one *.yaml), its weights and "
                                              "optionally a draft README.md"),
            option("--to", required=True, metavar="FOLDER", help="the zoo folder (then a source as it stands)"),
            option("--name", help="the model's name (default: the draft card's, else the net's)"),
            option("--licence", help="the licence of the weights (or 'licence' in the draft card)"),
            option("--task", help="what the model does (or 'task' in the draft card)"),
            option("--force", action="store_true", help="replace a differing model of that name in FOLDER"),
            option("--bundle-data", action="store_true",
                   help="publish the training data with the model (as data.npz and test.npz), for a net that "
                        "trains on files: without it such a net is refused, as others could not reproduce it"))))),
)
BY_NAME = {command.name: command for command in COMMANDS}


def _add(parser: argparse.ArgumentParser, command: Command) -> None:
    for opt in command.options:
        opt.add_to(parser)
    if command.actions:
        actions = parser.add_subparsers(dest=command.dest, metavar=command.metavar, parser_class=_Parser)
        actions.required = True
        for action in command.actions:
            _add(actions.add_parser(action.name, help=action.help), action)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="toolkit", description="Caffe-style YAML nets, compiled and run.")
    parser.add_argument("--version", action="version", version=f"toolkit {__version__}")
    _add(parser, Command("toolkit", "", dest="command", metavar="COMMAND", actions=COMMANDS))
    return parser


def runner(name: str):
    """The function that runs command ``name``, its module imported now."""
    module, function = BY_NAME[name].run.split(":")
    return getattr(importlib.import_module(f"{__package__}.commands.{module}"), function)


def main(argv: list[str] | None = None) -> int:
    warnings.simplefilter("ignore", RuntimeWarning)   # overflow in user data is not a crash
    try:
        args = build_parser().parse_args(argv)
        args.argv = list(sys.argv[1:] if argv is None else argv)     # what a rank process re-runs
        from . import settings
        settings.current()             # every TOOLKIT_* variable read once: a bad value stops here
        # --precision (train, infer, bench) is the precision setting for the command's whole run
        chosen = {"precision": args.precision} if getattr(args, "precision", None) else {}
        with settings.use(**chosen):
            return runner(args.command)(args) or 0
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
