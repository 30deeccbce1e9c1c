"""The training loop: one compiled train-step plan per batch size (forward, generated backward,
solver updates), test passes, checkpoints with exact resume, signals, NaN guard, metrics.

Exactness of resume rests on three facts: every array that changes (weights, running stats,
solver slots) is in the checkpoint; the data order of iteration i is a function of (seed, i);
and the dropout generator's state is saved with the iteration.
"""
from __future__ import annotations

import math
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from ..backend.devices import CPU, Device, parse_device, to_host
from ..compile import disabled_passes, optimize, train_graph
from ..errors import UserError
from ..fileio import atomic_write
from ..frontend import OBJECTIVE, Net
from ..ir.binding import bind_symbols
from ..ir.graph import FLOAT_DTYPES, Graph
from ..optim.data_parallel import DIST_WEIGHT, ROW_MASK, DataParallel
from ..optim.loss_scaling import SCALE_OUTPUT
from ..optim.solvers import SolverConfig, host_values, initial_state, is_slot
from ..passes.pipeline import memory_reuse
from ..runtime.plan import Plan, RuntimeState
from ..weights import save_weights
from .checkpoint import Checkpoint, find_resume_point, read_checkpoint, write_checkpoint
from .data import (INPUT_FILE, BatchOrder, Dataset, InputTransform, augment, center_crop, data_folder, describe_source,
                   fit_to_inputs, image_inputs, load_source, split, transform)
from .progress import MetricsLog, Progress, plot
from .sources import Mapped, kind_of as lazy_kind, open_lazy
from .watch import TensorBoard, trackers
from .scalars import StepScalars
from .sequences import (GearedBatches, attach_lengths, train_gear_sizes, training_gears, unpack_ragged,
                        uses_lengths)
from .schedule import check_policy, learning_rate

RESERVED = {"iter", "loss", "lr"}


class FinishedRun(Exception):
    """``--resume`` of a run that has nothing left to train: it reached its last iteration, or
    stopped early and would stop again at its next test. Carries the line that says so and the
    iteration the run ended at."""

    def __init__(self, line: str, iteration: int):
        super().__init__(line)
        self.iteration = iteration


class _NoLog:
    """Ranks other than 0 log nothing."""

    def write(self, record: dict) -> None:
        pass


class _Silent:
    """A stream for the progress of ranks other than 0."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def net_dtype(net: Net) -> str:
    for spec in net.spec.inputs.values():
        if spec.dtype in FLOAT_DTYPES:
            return spec.dtype
    return "float32"


def train_spec(net: Net):
    from schemas.train import TrainSpec
    return net.spec.train or TrainSpec()


def load_data(net: Net, spec, transformed: bool = True) -> tuple[Dataset, Dataset | None]:
    """Train and test sets, shaped for the net's inputs and (``transformed``) with the input
    transform applied, as training feeds them."""
    inputs = net.spec.inputs
    data_spec = spec.data
    source = data_spec.source
    crop = data_spec.crop_size
    if crop is not None:
        for name in image_inputs(inputs):
            if tuple(inputs[name].shape[2:]) != (crop, crop):
                raise UserError(f"train.data.crop_size {crop}: the net's input '{name}' is "
                                f"{list(inputs[name].shape)}; its height and width must be the crop size")
    full = _open_data(net, "source", source, data_spec, crop)
    if data_spec.test_source:
        train_set = full
        test_set = _open_data(net, "test_source", data_spec.test_source, data_spec, crop)
    else:
        train_set, test_set = split(full, data_spec.test_fraction, spec.seed)
    if uses_lengths(data_spec):               # each batch cut to its gear along T
        sizes = train_gear_sizes(net)
        train_set = GearedBatches(train_set, inputs, sizes)
        test_set = GearedBatches(test_set, inputs, sizes) if test_set is not None else None
    if not transformed:
        return train_set, test_set
    dtype = net_dtype(net)
    base = Path(net.file).parent

    # a top-level transform (train.data then declares none): its tensor steps on every batch, its
    # centre crop in test passes only (a training batch is cropped at random, if at all, by augment)
    declared = InputTransform.of(net) if getattr(net.spec, "transform", None) is not None else None

    def transformed_batch(arrays: dict, test: bool) -> dict:
        arrays = transform(arrays, inputs, data_spec, dtype, base)
        if declared is not None:
            arrays = declared(arrays, dtype, crop=test)
        if test and crop is not None:           # test: the centre, as Caffe's TEST phase crops
            arrays = {k: center_crop(v, crop) if k in image_inputs(inputs) else v for k, v in arrays.items()}
        return arrays

    if isinstance(train_set, Dataset):
        train_set = Dataset(transformed_batch(train_set.arrays, False))
    else:                                        # read a batch at a time: transformed as read
        train_set = Mapped(train_set, lambda arrays: transformed_batch(arrays, False))
    if test_set is not None:
        test_set = (Dataset(transformed_batch(test_set.arrays, True)) if isinstance(test_set, Dataset)
                    else Mapped(test_set, lambda arrays: transformed_batch(arrays, True)))
    return train_set, test_set


def _open_data(net: Net, key: str, source: str, data_spec, crop):
    """A source as a Dataset, in memory, or, for Caffe's LMDB, image list and HDF5 sources, one
    read a batch at a time (checked on its first example, each batch cast as it is read)."""
    inputs = net.spec.inputs
    path = Path(source)
    folder = data_folder(net, key)
    if not source.startswith("builtin:") and not path.is_absolute() and not path.exists():
        path = folder / path
    kind = None if source.startswith("builtin:") else lazy_kind(path)
    if kind is None:
        raw = load_source(source, inputs, folder)
        if uses_lengths(data_spec):
            raw = unpack_ragged(raw, data_spec, inputs, source)
        fitted = fit_to_inputs(raw, inputs, source, crop)
        if uses_lengths(data_spec):
            fitted = Dataset(attach_lengths(fitted.arrays, raw, data_spec, inputs, source))
        return fitted
    if uses_lengths(data_spec):
        raise UserError(f"train.data.lengths and padding_value need a source read whole (.npz, a folder of "
                        f".npy, CSV), not {source}")
    lazy = open_lazy(kind, path, inputs, data_spec)
    fit_to_inputs(lazy.take([0]), inputs, source, crop)          # the shapes and kinds, said up front
    return Mapped(lazy, lambda arrays: fit_to_inputs(arrays, inputs, source, crop).arrays)


@dataclass
class PlanCache:
    """Plans of one graph by batch binding, all sharing the weight arrays and the runtime state."""

    graph: Graph
    weights: dict[str, np.ndarray]
    runtime: RuntimeState
    device: Device = CPU
    reuse_memory: bool = True
    plans: dict = field(default_factory=dict)
    # told of each plan built: the input shapes and the seconds its build (the kernel compile) took
    on_build: Callable[[dict, float], None] | None = None

    def run(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        shapes = {k: np.shape(v) for k, v in arrays.items()}
        key = tuple(sorted(shapes.items()))
        build_s = None
        if key not in self.plans:
            started = time.perf_counter()
            bindings = bind_symbols(self.graph, shapes)
            self.plans[key] = Plan(self.graph, bindings, {k: self.weights[k] for k in self.graph.weights},
                                   self.device, self.runtime, reuse_memory=self.reuse_memory)
            build_s = time.perf_counter() - started
        outs = self.plans[key].run(arrays)
        if build_s is not None and self.on_build is not None:     # told once the plan has run: a
            self.on_build(shapes, build_s)                        # step that fails says only why
        return outs


def evaluate(cache: PlanCache, dataset: Dataset, batch: int) -> dict[str, float]:
    """Example-weighted means of the graph's scalar outputs over a data set."""
    names = [n for n, v in cache.graph.outputs.items() if v.shape == ()]
    totals = dict.fromkeys(names, 0.0)
    inputs = list(cache.graph.inputs)
    for start in range(0, len(dataset), batch):
        rows = np.arange(start, min(start + batch, len(dataset)))
        outs = cache.run({k: v for k, v in dataset.take(rows).items() if k in inputs})
        for n in names:
            totals[n] += float(outs[n]) * len(rows)
    return {n: t / len(dataset) for n, t in totals.items()}


def evaluate_shared(cache: PlanCache, dataset: Dataset, batch: int, comm) -> dict[str, float]:
    """``evaluate`` over the whole data set shared out among the ranks of ``comm``: each rank
    its contiguous part, the example-weighted sums added up over the ranks."""
    n = len(dataset)
    lo, hi = n * comm.rank // comm.size, n * (comm.rank + 1) // comm.size
    names = [k for k, v in cache.graph.outputs.items() if v.shape == ()]
    part = evaluate(cache, Dataset(dataset.take(np.arange(lo, hi))), batch) if hi > lo else dict.fromkeys(names, 0.0)
    sums = comm.sum_floats([part[k] * (hi - lo) for k in names])
    return {k: s / n for k, s in zip(names, sums)}


def test_graph(net: Net, disable: tuple[str, ...] = (), weights: dict[str, np.ndarray] | None = None,
               device: Device | str = CPU, gears: frozenset[str] = frozenset()) -> Graph | None:
    """The test phase's scalar outputs, optimised; ``weights`` (when they stay fixed, as in
    ``toolkit test``) are frozen into it. A training run's test graph reads the live weights.
    ``gears``: a sequence dimension whose batches come padded, with their lengths."""
    graph = net.graph("test", gears=gears) if gears else net.graph("test")
    graph.outputs = {k: v for k, v in graph.outputs.items() if v.shape == ()}
    if not graph.outputs:
        return None
    return optimize(graph, disable, weights, device)


class Trainer:
    """``comm``: the job's communicator when this process is one rank of a data-parallel run
    (toolkit/distributed/); each rank then trains on its share of every global batch, and rank 0
    alone writes."""

    def __init__(self, net: Net, out: Path, weights: str | None = None, resume: str | None = None,
                 device: Device | str = CPU, stream=None, disable: tuple[str, ...] | None = None, comm=None,
                 allow_missing: bool = False):
        self.net = net
        self.comm = comm if comm is not None and comm.size > 1 else None
        self.rank, self.ranks = (self.comm.rank, self.comm.size) if self.comm else (0, 1)
        self.spec = spec = train_spec(net)
        self.cfg = SolverConfig.from_spec(spec.solver)
        if self.cfg.type == "nesterov" and not self.cfg.momentum:
            raise UserError("solver nesterov needs momentum > 0")
        if self.cfg.momentum_convention == "caffe" and self.cfg.type not in ("sgd", "nesterov"):
            raise UserError(f"solver.momentum_convention caffe is for sgd and nesterov, not {self.cfg.type}")
        if self.cfg.momentum and self.cfg.type in ("adam", "adamw", "adagrad", "adadelta"):
            raise UserError(f"solver {self.cfg.type} has no momentum (use betas for adam/adamw, rho for adadelta)")
        check_policy(spec.solver.lr_policy)
        self.stream = stream
        self.train_set, self.test_set = load_data(net, spec)
        # the global batch: K ranks read the batches of one process at K x batch_size
        self.global_batch = spec.data.batch_size * self.ranks
        self.order = BatchOrder(len(self.train_set), self.global_batch, spec.data.shuffle, spec.seed)
        if spec.max_iter:
            self.max_iter = spec.max_iter
        elif spec.epochs:
            self.max_iter = spec.epochs * self.order.per_epoch
        else:
            raise UserError("train needs max_iter or epochs (e.g. --set train.max_iter=1000)")

        self.disable = disabled_passes(net) if disable is None else disable
        self.device = device = parse_device(device)
        data_parallel = None
        if self.comm:
            if not device.host_memory:
                raise UserError("data-parallel training runs on the CPU for now (--device cpu)")
            d = spec.distributed
            data_parallel = DataParallel(d.bucket_mb, d.overlap, d.sync_batchnorm)
        gears = training_gears(net)           # sequences of different lengths: the graphs read theirs
        self.graph = optimize(train_graph(net, self.cfg, data_parallel=data_parallel, gears=gears), self.disable,
                              device=device)
        self.dtype = net_dtype(net)
        self.store = self._initial_weights(weights, allow_missing)
        self.runtime = RuntimeState(np.random.default_rng(spec.seed))
        self.start = 0
        self.out = out
        if resume:
            self._resume(resume)
        if self.comm:                             # every rank starts from rank 0's state
            for k in sorted(self.store):
                self.comm.broadcast(self.store[k])
        if not device.host_memory:                # the weights live on the device for the whole run
            self.store = {k: device.to_device(v) for k, v in self.store.items()}
        reuse = memory_reuse(self.disable)
        self.train_plans = PlanCache(self.graph, self.store, self.runtime, device, reuse)
        tg = test_graph(net, self.disable, device=device, gears=gears) if self.test_set is not None else None
        self.test_plans = PlanCache(tg, self.store, RuntimeState(np.random.default_rng(0)), device, reuse) if tg else None
        self.loss_tops = [t for t in self.graph.losses if t not in RESERVED]
        measured = [self._metric_key(k) for k, v in tg.outputs.items() if v.shape == ()] if tg else []
        self.best, self.early_stop = trackers(spec, measured)
        for tracked, key in ((self.best, "best"), (self.early_stop, "early_stop")):
            if tracked is not None:
                tracked.restore(getattr(self, "resumed_watch", {}).get(key))
        self.iterations_done = self.max_iter
        # under mixed precision the loss scale after each step is logged beside the loss
        self.extra_scalars = [SCALE_OUTPUT] if SCALE_OUTPUT in self.graph.outputs else []
        self._stop: int | None = None

    # -- state ------------------------------------------------------------------------------------
    def _initial_weights(self, path: str | None, allow_missing: bool = False) -> dict[str, np.ndarray]:
        if path:
            say = (lambda line: print(line, file=self.stream or sys.stderr)) if self.rank == 0 else None
            model = self.net.load_weights(path, allow_missing=allow_missing, seed=self.spec.seed, dtype=self.dtype,
                                          say=say)
        else:
            model = self.net.init_weights(self.spec.seed, self.dtype)
        store = {k: np.array(v, dtype=self.dtype, order="C") for k, v in model.items()}
        for name, w in self.graph.weights.items():
            if name not in store:           # solver slots and the loss scale
                store[name] = initial_state(w)
        return store

    def _check_not_finished(self, target: str) -> None:
        """Raises FinishedRun where the run resumed (its checkpoint read and found to match the
        net) has nothing left to train; before any kernel is compiled."""
        limit = "train.max_iter" if self.spec.max_iter else "train.epochs"
        if self.start == self.max_iter:
            raise FinishedRun(f"{target}: the run is finished: it reached iteration {self.start}, its last "
                              f"({limit} {self.spec.max_iter or self.spec.epochs}); nothing to train. To train on, "
                              f"raise it (--set {limit}=N)", self.start)
        stopped = self.resumed_watch.get("early_stop") or {}
        rule = self.spec.early_stop
        if rule is not None and stopped.get("since", 0) >= rule.patience:
            raise FinishedRun(f"{target}: the run is finished: it stopped early at iteration {self.start} "
                              f"({rule.metric} had not improved for {stopped['since']} tests); nothing to train. "
                              f"To train on, raise train.early_stop.patience (--set train.early_stop.patience=N)",
                              self.start)

    def _resume(self, target: str) -> None:
        path = find_resume_point(target)
        ckpt = read_checkpoint(path)
        if ckpt.meta.get("solver") != self.cfg.type:
            raise UserError(f"{path}: written by solver '{ckpt.meta.get('solver')}', but the net now says "
                            f"'{self.cfg.type}'; resuming must continue the same solver")
        missing = sorted(set(self.store) - set(ckpt.arrays))
        extra = sorted(set(ckpt.arrays) - set(self.store))
        whose = f"a checkpoint of net '{ckpt.meta.get('net')}'"
        if missing or extra:
            raise UserError(f"{path}: {whose} does not match net '{self.net.name}' (missing: "
                            f"{', '.join(missing) or '-'}; unexpected: {', '.join(extra) or '-'})")
        reshaped = [f"'{k}' has shape {list(arr.shape)}, the net needs {list(self.store[k].shape)}"
                    for k, arr in ckpt.arrays.items() if arr.shape != self.store[k].shape]
        if reshaped:
            raise UserError(*(f"{path}: {whose}: {line}" for line in reshaped))
        for k, arr in ckpt.arrays.items():
            np.copyto(self.store[k], arr)
        self.runtime.rng.bit_generator.state = ckpt.meta["rng"]
        self.resumed_watch = ckpt.meta.get("watch") or {}       # applied once the trackers exist
        self.start = ckpt.iteration
        written_at = ckpt.meta.get("global_batch", self.global_batch)
        if written_at != self.global_batch:       # another rank count: continue at the same sample
            self.start = ckpt.iteration * written_at // self.global_batch
        if self.start > self.max_iter:
            raise UserError(f"{path}: the run is at iteration {self.start} already and train.max_iter is "
                            f"{self.max_iter}; to train on, raise it (--set train.max_iter=N)")
        self.resumed_from = path
        self._check_not_finished(target)

    def checkpoint(self, iteration: int) -> Path:
        meta = {"net": self.net.name, "solver": self.cfg.type, "rng": self.runtime.rng.bit_generator.state,
                "max_iter": self.max_iter, "seed": self.spec.seed, "global_batch": self.global_batch,
                "watch": {"best": self.best.state() if self.best else None,
                          "early_stop": self.early_stop.state() if self.early_stop else None}}
        return write_checkpoint(self.out / "checkpoints", Checkpoint(iteration, self.host_store(), meta),
                                self.spec.keep_last)

    def model_weights(self) -> dict[str, np.ndarray]:
        return {k: v for k, v in self.host_store().items() if not is_slot(k)}

    def host_store(self) -> dict[str, np.ndarray]:
        """The weights and solver slots as host arrays (copies only where they live on a GPU)."""
        return {k: to_host(v) for k, v in self.store.items()}

    # -- the loop -----------------------------------------------------------------------------------
    def _save_input(self) -> None:
        """input.json: what deployment needs to know of the inputs beyond the net (class names of
        an image folder, a CSV's columns and label column), beside net.yaml."""
        import json
        spec = self.spec.data
        about = describe_source(spec.source, self.net.spec.inputs, data_folder(self.net, "source"))
        if not about:
            return
        text = json.dumps(about, indent=1) + "\n"
        target = self.out / INPUT_FILE
        if not (target.exists() and target.read_text() == text):
            atomic_write(target, lambda tmp: Path(tmp).write_text(text))

    def _save_net(self) -> None:
        """The run folder keeps the net it trained, bases merged and --set applied (what
        `toolkit zoo publish RUN_DIR` shares)."""
        from ..frontend.render import render_net
        if not self.net.raw:       # a Net built in code, not loaded from a file
            return
        from .runs import carry_mean
        text = render_net(self.net, folder=self.out, replace=carry_mean(self.net, self.out))
        target = self.out / "net.yaml"
        if target.exists() and target.read_text() == text:
            return
        atomic_write(target, lambda tmp: Path(tmp).write_text(text))

    def _on_signal(self, signum, frame):
        self._stop = signum

    def lr_at(self, i: int) -> float:
        return learning_rate(self.spec.solver.base_lr, self.spec.solver.lr_policy, i, self.max_iter)

    def launch(self, i: int) -> dict:
        """Runs iteration i; its outputs stay where they were computed (see scalars.py)."""
        rows = self.order.rows(i)
        weight = None
        if self.comm:
            rows, weight = self._my_rows(rows)
        batch = self.train_set.take(rows)
        data = self.spec.data
        if data.crop_size is not None or data.mirror:
            # the crop offsets and flips of iteration i come from (seed, i) alone: resume stays exact
            batch = augment(batch, self.net.spec.inputs, data, np.random.default_rng([self.spec.seed, 1013, i]))
        feed = {k: v for k, v in batch.items() if k in self.graph.inputs}
        if weight is not None:
            feed[DIST_WEIGHT] = np.asarray(weight, dtype=self.graph.inputs[DIST_WEIGHT].dtype)
            if ROW_MASK in self.graph.inputs:       # a placeholder row (weight 0) is masked out
                feed[ROW_MASK] = np.full(len(rows), float(weight > 0), dtype=self.graph.inputs[ROW_MASK].dtype)
        feed.update(host_values(self.cfg, self.lr_at(i), i + 1, self.dtype))
        return self.train_plans.run(feed)

    def _my_rows(self, rows: np.ndarray) -> tuple[np.ndarray, float]:
        """This rank's rows [r*B, (r+1)*B) of a global batch, and its share of the objective.
        A rank left without rows by a short last batch runs one placeholder row that weighs
        nothing (and is masked out of global BatchNorm statistics)."""
        b = self.spec.data.batch_size
        mine = rows[self.rank * b: (self.rank + 1) * b]
        if len(mine) == 0:
            return rows[:1], 0.0
        return mine, len(mine) / len(rows)

    def step(self, i: int) -> dict[str, float]:
        """Runs iteration i and reads its loss (and each loss top) back as floats."""
        outs = self.launch(i)
        return {"loss": float(outs[OBJECTIVE]), **{t: float(outs[t]) for t in self.loss_tops}}

    def _metric_key(self, name: str) -> str:
        """A test output's name in the log: a loss or a reserved name gets a ``test_`` prefix."""
        return f"test_{name}" if name in RESERVED or name in self.loss_tops else name

    def test(self) -> dict[str, float]:
        if self.test_plans is None:
            return {}
        if self.comm:
            metrics = self._shared_test()
        else:
            metrics = evaluate(self.test_plans, self.test_set, self.spec.data.batch_size)
        return {self._metric_key(k): v for k, v in metrics.items()}

    def _watch(self, iteration: int, metrics: dict[str, float], progress: Progress, writer: bool) -> bool:
        """After a test pass: print it, keep the best weights, and say whether to stop early."""
        shown = ", ".join(f"{k} {v:.4f}" for k, v in metrics.items())
        if self.best is not None and self.best.see(iteration, metrics[self.best.metric]):
            if writer:
                save_weights(str(self.out / "best.safetensors"), self.model_weights(),
                             metadata={"iteration": str(iteration), self.best.metric: repr(metrics[self.best.metric])})
            shown += f" (best {self.best.metric} so far: best.safetensors)"
        progress.message(f"test at iteration {iteration}: {shown}")
        if self.early_stop is None:
            return False
        self.early_stop.see(iteration, metrics[self.early_stop.metric])
        return self.early_stop.since >= self.spec.early_stop.patience

    def _shared_test(self) -> dict[str, float]:
        """The metrics of the whole test set, shared out among the ranks. BatchNorm's running
        statistics (per rank unless sync_batchnorm) are rank 0's, as the saved model's are."""
        for k in sorted(self.store):             # the state no gradient updates
            w = self.graph.weights.get(k)
            if not is_slot(k) and (w is None or not w.trainable):
                self.comm.broadcast(self.store[k])
        return evaluate_shared(self.test_plans, self.test_set, self.spec.data.batch_size, self.comm)

    @staticmethod
    def _where(last_good: Path | None) -> str:
        return f"the last good checkpoint is {last_good}" if last_good else "no checkpoint was written yet"

    def _check_finite(self, i: int, last_good: Path | None, progress: Progress) -> None:
        """A finite loss does not make the update that follows it finite: check the whole state
        (weights, running stats, solver slots) before it is written."""
        bad = next((k for k, v in self.host_store().items() if v.dtype.kind == "f" and not np.isfinite(v).all()), None)
        if bad is not None:
            progress.close()
            raise UserError(f"the weights became nan/inf at iteration {i} ('{bad}', lr {self.lr_at(i):.3g}); "
                            f"training stopped and {self._where(last_good)}")

    def run(self) -> int:
        """Trains to max_iter; returns the exit status (0, or 128 + signal after a checkpoint)."""
        writer = self.rank == 0                   # rank 0 alone writes (docs/spec.md section 8)
        if writer:
            self.out.mkdir(parents=True, exist_ok=True)
            self._save_net()
            self._save_input()
        log = MetricsLog(self.out / "metrics.jsonl", self.start if self.start else None) if writer else _NoLog()
        board = TensorBoard(self.out / "tensorboard") if writer and self.spec.tensorboard else None
        spec = self.spec
        progress = Progress(self.max_iter, self.start, spec.display, self.stream if writer else _Silent(),
                            per_epoch=self.order.per_epoch)
        self.train_plans.on_build = _compile_reporter(progress, "of the train step")
        if self.test_plans is not None:
            self.test_plans.on_build = _compile_reporter(progress, "of the test pass")
        test_every = spec.test_interval
        test_keys: set[str] = set()
        scalars = StepScalars([OBJECTIVE] + self.loss_tops + self.extra_scalars, self.device, spec.display or 1)
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        last_good: Path | None = getattr(self, "resumed_from", None)
        try:
            for i in range(self.start, self.max_iter):
                record: dict = {}
                if test_every and i > 0 and i % test_every == 0:
                    metrics = self.test()
                    test_keys |= set(metrics)
                    record.update(metrics)
                    if self._watch(i, metrics, progress, writer):
                        return self._stop_early(i, metrics, log, board, progress, writer, sorted(test_keys))
                scalars.add(i, self.launch(i))
                done = i + 1
                snapshot = bool(spec.snapshot and done % spec.snapshot == 0 and done < self.max_iter)
                logged = bool(record) or i % spec.display == 0
                if (not scalars.deferred or logged or snapshot or scalars.full() or self._stop is not None
                        or done == self.max_iter):
                    values = {}
                    for j, values in scalars.drain():
                        if not math.isfinite(values[OBJECTIVE]):
                            progress.close()
                            raise UserError(f"the loss became {values[OBJECTIVE]} at iteration {j} "
                                            f"(lr {self.lr_at(j):.3g}); training stopped and {self._where(last_good)}")
                        progress.update(j, values[OBJECTIVE], self.lr_at(j))
                    if logged:
                        entry = {"iter": i, "loss": values[OBJECTIVE], "lr": self.lr_at(i),
                                 **{t: values[t] for t in self.loss_tops + self.extra_scalars}, **record}
                        log.write(entry)
                        if board is not None:
                            board.write(entry)
                # the decision to stop is read once an iteration, and with several ranks after they
                # agree: a signal landing between the agreement and a second read would stop one
                # rank while the others go on into the next step's collectives, and hang the job
                stop = self._stop
                if self.comm:                 # a signal seen by any rank stops all at this iteration,
                    agreed = self.comm.largest(int(stop or 0))     # and all by the same signal
                    stop = signal.Signals(agreed) if agreed else None
                    if stop is not None:      # (else a signal after the vote: the next iteration's)
                        self._stop = stop
                if snapshot or stop is not None or done == self.max_iter:
                    self._check_finite(i, last_good, progress)   # never checkpoint a nan/inf state
                if snapshot and writer:
                    last_good = self.checkpoint(done)
                if stop is not None:
                    if writer:
                        last_good = self.checkpoint(done)
                        save_weights(str(self.out / "model.safetensors"), self.model_weights())
                    progress.message(f"stopped by signal {stop} after iteration {done}; "
                                     f"checkpoint {last_good} (continue with --resume {self.out})")
                    return 128 + stop
            final = self.test()
            test_keys |= set(final)
            if final:
                self._watch(self.max_iter, final, progress, writer)
                entry = {"iter": self.max_iter, "lr": self.lr_at(self.max_iter - 1), **final}
                log.write(entry)
                if board is not None:
                    board.write(entry)
            progress.close()
            if writer:
                last_good = self.checkpoint(self.max_iter)
                save_weights(str(self.out / "model.safetensors"), self.model_weights())
                plot(log.records(), self.out / "loss.png", self.net.name, sorted(test_keys))
            self.final_metrics = final
            return 0
        except OSError as e:       # a full disk or a read-only folder: the file it was, and what is safe
            progress.close()
            raise UserError(f"{e.filename or self.out}: {e.strerror or e}; training stopped and "
                            f"{self._where(last_good)}") from None
        finally:
            if board is not None:
                board.close()
            for s, handler in previous.items():
                signal.signal(s, handler)

    def _stop_early(self, i: int, metrics: dict, log, board, progress: Progress, writer: bool, keys: list[str]) -> int:
        """Early stopping after the test at iteration ``i``: the run ends as a finished one does,
        with a checkpoint, the weights and the plot, and says why."""
        entry = {"iter": i, "lr": self.lr_at(max(i - 1, 0)), **metrics}
        log.write(entry)
        if board is not None:
            board.write(entry)
        stop = self.early_stop
        progress.message(f"early stop at iteration {i}: {stop.metric} has not improved for {stop.since} tests "
                         f"(best {stop.best:.4f} at iteration {stop.best_iter})")
        progress.close()
        if writer:
            self.checkpoint(i)
            save_weights(str(self.out / "model.safetensors"), self.model_weights())
            plot(log.records(), self.out / "loss.png", self.net.name, keys)
        self.iterations_done, self.final_metrics = i, metrics
        return 0


# a plan built after the first of its kind (another batch size: an epoch's short last batch) is
# shown only when its compile took this long; with run-time sizes most take a few milliseconds
SHOWN_COMPILE_S = 0.5


def _compile_reporter(progress: Progress, what: str) -> Callable[[dict, float], None]:
    """What a PlanCache calls after building a plan: the first build on a line of its own, later
    ones when they took a while, each left out of the iterations' speed."""
    built = []

    def report(shapes: dict, seconds: float) -> None:
        if not built:
            progress.compiled(what, seconds)
        else:
            rows = next((s[0] for s in shapes.values() if len(s)), None)
            progress.compiled(f"{what} for a batch of {rows}" if rows is not None else what, seconds,
                              show=seconds >= SHOWN_COMPILE_S)
        built.append(seconds)
    return report
