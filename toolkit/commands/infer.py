"""``toolkit infer``: the infer phase on files of inputs (.npy, .npz, CSV, images, folders of
images), read and run a chunk of rows at a time through batch buckets, so that memory stays
flat however many rows there are; the outputs are gathered and written at the end."""
from __future__ import annotations

import math
import sys
import time

import numpy as np

from ..inference import infer_phase
from ..ir.binding import bind_symbols
from ..runtime.session import InferSession, check_input_arrays
from ..training.data import InputTransform, recorded_input
from ..training.progress import StatusLine, bar, format_time
from .classes import check_top, class_names, score_widths, top_lines
from .io import InputStream, check_output_path, open_inputs, write_csv_outputs, write_outputs

CHUNK_BUCKETS = 4      # the default chunk: this many times the largest bucket's rows


def _refuse_inputs(args, net) -> None:
    """--output names none of the files infer reads: the net's, the weights, an --input, --labels."""
    from ..fileio import refuse_own_inputs
    from .io import net_inputs
    weights = args.weights or (net.file if net.file.endswith(".onnx") else None)
    inputs = net_inputs(net, weights) + [("the labels file", args.labels)]
    for spec in args.input:            # NAME=FILE or FILE: both readings, as a file may hold '='
        inputs += [("an --input file", spec), ("an --input file", spec.partition("=")[2] or None)]
    refuse_own_inputs("--output", args.output, [args.output], inputs)


def run_infer(args) -> int:
    from ..frontend.spec import parse_overrides
    verbose = args.verbose
    phase = infer_phase(args.net, args.device, args.dtype, args.disable, args.no_optimize,
                        parse_overrides(args.overrides))
    graph = phase.graph
    if args.output:   # before loading weights and running: a bad name wastes no work
        check_output_path(args.output, list(graph.outputs))
        _refuse_inputs(args, phase.net)
    about = recorded_input(phase.net.file)
    widths = score_widths({name: tuple(v.shape) for name, v in graph.outputs.items()})
    check_top(args.top, widths)
    names = class_names(args.labels, about, widths)
    weights = phase.load_weights(args.weights, allow_missing=args.allow_missing)
    shapes = {name: tuple(v.shape) for name, v in graph.inputs.items()}
    # columns a CSV of training data has that no input here reads: the label, by the recorded name
    # or by the name of an input the infer phase does not use
    unused = ({about["label_column"]} if about.get("label_column") else set()) | \
        (set(phase.net.spec.inputs) - set(graph.inputs))
    transform = None if args.no_transform else InputTransform.of(phase.net)
    with open_inputs(args.input, list(graph.inputs), list(phase.net.spec.inputs), shapes,
                     drop_columns=unused, image_reader=transform.image_reader if transform else None,
                     note=lambda line: print(line, file=sys.stderr)) as stream:
        row_names = stream.row_names()
        session = phase.session(weights, args.buckets)     # the weights frozen in
        chunk_rows = _chunk_rows(session, args.chunk_rows)
        if chunk_rows is not None:
            stream.check_rows()
        # the whole inputs' types and shapes, checked before a row is read, in a run's own words
        filled = session.lengths_inputs.values()           # the session fills in the real lengths
        check_input_arrays(session.graph, {k: np.empty(0, dt) for k, dt in stream.dtypes().items()}, filled)
        bind_symbols(session.graph, transform.shapes(stream.shapes()) if transform else stream.shapes(), filled)
        if transform is not None:
            print(f"inputs are transformed {transform.heading}: {transform.describe()} "
                  "(--no-transform feeds them as given)", file=sys.stderr)
        outputs, stats = _run_chunks(session, stream, chunk_rows, args.warm, verbose, transform)
    if args.output and args.output.endswith(".csv"):
        write_csv_outputs(args.output, outputs, row_names, names, args.top or 1)
        print(f"wrote {args.output}: {len(next(iter(outputs.values())))} rows of {', '.join(outputs)}")
    elif args.output:
        write_outputs(args.output, outputs)
        shapes = ", ".join(f"{k} {list(v.shape)}" for k, v in outputs.items())
        print(f"wrote {args.output}: {shapes}")
    if args.top:
        print("\n".join(top_lines(outputs, row_names, names, args.top)))
    if not args.output:
        ranked = set(widths) if args.top else set()          # shown as their top classes above
        with np.printoptions(precision=5, suppress=True, threshold=200):
            for name, value in outputs.items():
                if name not in ranked:
                    print(f"{name} {list(value.shape)} {value.dtype}:\n{value}")
    if verbose:
        _report(session, stats)
    return 0


def _chunk_rows(session: InferSession, asked: int | None) -> int | None:
    """Rows per chunk; None (everything at once) when the rows cannot be cut: no batch
    dimension, or an output that does not keep it (the chunks' outputs could not be joined)."""
    if session.batch_symbol is None or not all(map(session.keeps_batch, session.graph.outputs)):
        return None
    return asked or CHUNK_BUCKETS * session.buckets[-1]


def _run_chunks(session: InferSession, stream: InputStream, chunk_rows: int | None, warm: bool,
                verbose: bool, transform=None) -> tuple[dict[str, np.ndarray], dict]:
    progress = RowProgress(stream.rows or 0, verbose)
    collected: dict[str, list[np.ndarray]] = {}
    stats = {"rows": 0, "chunks": 0, "chunk_rows": chunk_rows, "warm_s": None, "warm_plans": 0}
    try:
        for rows, arrays in stream.chunks(chunk_rows):
            if transform is not None:
                arrays = transform(arrays)
            if warm and stats["warm_s"] is None:
                t = time.perf_counter()
                others = session.graph.symbols() - {session.batch_symbol}
                stats["warm_plans"] = session.warm(arrays if others else None)
                stats["warm_s"] = time.perf_counter() - t
                if verbose:
                    progress.message(f"warm: {stats['warm_plans']} plan(s) built and run once "
                                     f"in {stats['warm_s']:.3f} s")
                progress.restart_clock()
            for name, value in session.run(arrays).items():
                collected.setdefault(name, []).append(value)
            stats["rows"] += rows
            stats["chunks"] += 1
            progress.update(rows)
    finally:
        progress.close()
    stats["run_s"] = time.perf_counter() - progress.t0
    outputs = {k: v[0] if len(v) == 1 else np.concatenate(v) for k, v in collected.items()}
    return outputs, stats


def _report(session: InferSession, stats: dict) -> None:
    runs = session.bucket_runs
    if None in runs:
        used = f"none (no batch dimension: {runs[None]} run(s) of one plan)"
    else:
        used = ", ".join(f"{size} x {runs[size]}" for size in sorted(runs, reverse=True)) or "none"
    chunking = "whole" if stats["chunk_rows"] is None else f"of up to {stats['chunk_rows']} rows"
    speed = stats["rows"] / stats["run_s"] if stats["run_s"] > 0 else float("inf")
    peak = peak_rss_mib()
    print(f"buckets used: {used}", file=sys.stderr)
    print(f"rows: {stats['rows']} in {stats['chunks']} chunk(s) {chunking}, {stats['run_s']:.3f} s, "
          f"{speed:.0f} rows/s" + (f"; peak RSS {peak:.1f} MiB" if peak is not None else ""), file=sys.stderr)


def peak_rss_mib() -> float | None:
    """The process's peak resident memory so far, in MiB (None where the OS does not say).
    Linux's VmHWM first: ru_maxrss also holds the peak of the process that started this one
    (it survives fork and exec), so under a large parent it says the parent's size."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource
    except ImportError:
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024 if sys.platform == "darwin" else 1024)   # bytes on macOS, KiB elsewhere


class RowProgress:
    """Rows done of the total, rows/s and ETA on stderr: a redrawn bar on a terminal; off one, a
    line at every tenth of the rows with --verbose and nothing without."""

    def __init__(self, total: int, verbose: bool, stream=None):
        self.total, self.done = total, 0
        self.line = StatusLine(stream)
        self.on = (self.line.tty or verbose) and total > 0
        self.next_tenth = 1
        self.restart_clock()

    def restart_clock(self) -> None:
        self.t0 = time.perf_counter()

    def update(self, rows: int) -> None:
        self.done += rows
        if not self.on:
            return
        elapsed = time.perf_counter() - self.t0
        speed = self.done / elapsed if elapsed > 0 else float("inf")
        eta = (self.total - self.done) / speed if speed > 0 else float("inf")
        if self.line.tty:
            self.line.draw(f"{bar(self.done, self.total)} {self.done}/{self.total} rows "
                           f"{speed:.0f} rows/s ETA {format_time(eta)} ", last=self.done >= self.total)
        elif self.done * 10 >= self.next_tenth * self.total:
            self.next_tenth = math.floor(self.done * 10 / self.total) + 1
            self.line.print(f"infer: {self.done}/{self.total} rows ({100 * self.done // self.total}%) "
                            f"{speed:.0f} rows/s ETA {format_time(eta)}")

    def message(self, text: str) -> None:
        self.line.message(text)

    def close(self) -> None:
        self.line.close()
