"""The training loop: one compiled train-step plan per batch size (forward, generated backward,
solver updates), test passes, checkpoints with exact resume, signals, NaN guard, metrics. What it
runs on lives beside it: the batches in feeding.py, the plans in plans.py, the test passes'
graph and means in evaluate.py, resuming in resume.py, the run folder's files in runs.py.
"""
from __future__ import annotations

import math
import signal
import sys
from pathlib import Path

import numpy as np

from ..backend.devices import CPU, Device, parse_device, to_host
from ..backend.measured import adopt, recorded
from ..compile import disabled_passes, optimize, train_graph
from ..distributed.comm import use
from ..distributed.grid import PipelineGrid, place
from ..errors import UserError
from ..frontend import OBJECTIVE, Net
from ..frontend.train_checks import LOGGED, logged_name
from ..optim.data_parallel import DataParallel
from ..optim.loss_scaling import SCALE_OUTPUT
from ..optim.solvers import SolverConfig, host_values, initial_state, is_slot
from ..passes.pipeline import memory_reuse
from ..runtime.plan import RuntimeState
from ..weights import save_weights
from .checkpoint import Checkpoint, write_checkpoint
from .data import BatchOrder
from .evaluate import mean_outputs, mean_outputs_shared, test_graph
from .feeding import iteration_feed, load_data, net_dtype, rank_rows, train_spec
from .pipeline import build_pipeline, describe, micro_batch_feed, micro_batches_of, pipeline_of
from .plans import PlanCache, compile_reporter
from .progress import MetricsLog, NoLog, Progress, Silent, plot
from .resume import check_not_finished, resume_into
from .runs import save_input, save_net
from .scalars import StepScalars
from .schedule import learning_rate
from .sequences import bucketed_dimensions
from .watch import TensorBoard, trackers


class Trainer:
    """``comm``: the job's communicator when this process is one rank of a data-parallel run
    (toolkit/distributed/); each rank then trains on its share of every global batch, and rank 0
    alone writes. With ``train.distributed.stages`` the ranks are a pipeline's stages instead
    (training/pipeline.py): each runs and updates its stage of every batch's step."""

    def __init__(self, net: Net, out: Path, weights: str | None = None, resume: str | None = None,
                 device: Device | str = CPU, stream=None, disable: tuple[str, ...] | None = None, comm=None,
                 allow_missing: bool = False):
        self.net = net
        self.comm = comm if comm is not None and comm.size > 1 else None
        self.rank, self.ranks = (self.comm.rank, self.comm.size) if self.comm else (0, 1)
        self.spec = spec = train_spec(net)
        self.cfg = SolverConfig.from_spec(spec.solver)
        self.stream = stream
        self.train_set, self.test_set = load_data(net, spec)
        # pipeline parallelism: the ranks are the stages of one step (training/pipeline.py), or
        # stages x replicas of it (distributed/grid.py); this rank's stage and replica
        pipelined = spec.distributed.stages > 1
        stages = spec.distributed.stages if pipelined else 1
        self.stage, self.replica = place(self.rank, stages)
        self.replicas = max(self.ranks // stages, 1)
        # the global batch: R data-parallel ranks (or replicas of a pipeline) read the batches of
        # one process at R x batch_size
        self.global_batch = spec.data.batch_size * self.replicas
        self.order = BatchOrder(len(self.train_set), self.global_batch, spec.data.shuffle, spec.seed)
        if spec.max_iter:
            self.max_iter = spec.max_iter
        elif spec.epochs:
            self.max_iter = spec.epochs * self.order.per_epoch
        else:
            raise UserError("train needs max_iter or epochs (e.g. --set train.max_iter=1000)")
        self.pipeline = None
        if pipelined:
            self.pipeline = pipeline_of(net, self.cfg, spec, self.comm, parse_device(device))
            if self.replicas > 1:     # the kernels' sends, receives and sums on their parts of the job
                self.comm = PipelineGrid(self.comm, stages)
            self._short_steps: dict[int, tuple] = {}     # micro-batch count -> (pipeline, graph, plans)

        self.disable = disabled_passes(net) if disable is None else disable
        self.device = device = parse_device(device)
        data_parallel = None
        if self.comm and not self.pipeline:
            if not device.host_memory:
                self.device = device = self._rank_gpu(device)
            d = spec.distributed
            data_parallel = DataParallel(d.bucket_mb, d.overlap, d.sync_batchnorm)
        bucketed = bucketed_dimensions(net)   # sequences of different lengths: the graphs read theirs
        if self.pipeline:                # the whole step's weights first: a run starts from them all
            self.graph = self.pipeline.cut.graph
        else:
            self.graph = optimize(train_graph(net, self.cfg, data_parallel=data_parallel, bucketed=bucketed),
                                  self.disable, device=device)
        self.dtype = net_dtype(net)
        self.store = self._initial_weights(weights, allow_missing)
        self.runtime = RuntimeState(np.random.default_rng(spec.seed))
        self.start = 0
        self.out = out
        self.resumed_watch: dict = {}
        self.resumed_from: Path | None = None
        if resume:
            resumed = resume_into(resume, self.store, net.name, self.cfg.type, self.global_batch, self.max_iter)
            self.runtime.rng.bit_generator.state = resumed.rng_state
            self.start, self.resumed_watch, self.resumed_from = resumed.start, resumed.watch, resumed.path
            check_not_finished(resume, resumed, spec, self.max_iter)
            if resumed.routes is not None and not device.host_memory:
                # the routes the run measured, taken again before any plan is built: measured
                # anew they could differ, and differ in the last bits (docs/spec.md, resume)
                for line in adopt(device.kind, resumed.routes, resumed.path):
                    if self.rank == 0:
                        print(f"{resumed.path}: {line}", file=self.stream or sys.stderr, flush=True)
        if self.pipeline:                         # each rank holds its stage's weights alone
            stage = self.pipeline.cut
            self.graph = optimize(stage.stage_graph(self.stage), self.disable, device=device)
            self.store = {k: v for k, v in self.store.items() if stage.weight_stage[k] == self.stage}
            if self.replicas > 1:                 # every replica of a stage starts from replica 0's state
                for k in sorted(self.store):
                    self.comm.across.broadcast(self.store[k])
            if self.rank == 0:
                print(describe(self.pipeline), file=self.stream or sys.stderr, flush=True)
        elif self.comm:                           # every rank starts from rank 0's state
            for k in sorted(self.store):
                self.comm.broadcast(self.store[k])
        if not device.host_memory:                # the weights live on the device for the whole run
            self.store = {k: device.to_device(v) for k, v in self.store.items()}
        reuse = memory_reuse(self.disable)
        self.train_plans = PlanCache(self.graph, self.store, self.runtime, device, reuse)
        tg = test_graph(net, self.disable, device=device, bucketed=bucketed) if self.test_set is not None else None
        if self.pipeline and tg is not None:
            tg = None
            if self.rank == 0:
                print("a pipeline-parallel run does not run test passes yet: test its model.safetensors with "
                      "`toolkit test`", file=self.stream or sys.stderr, flush=True)
        self.test_plans = (PlanCache(tg, self.store, RuntimeState(np.random.default_rng(0)), device, reuse)
                           if tg else None)
        self.loss_tops = [t for t in self.graph.losses if t not in LOGGED]
        measured = [self._metric_key(k) for k, v in tg.outputs.items() if v.shape == ()] if tg else []
        self.best, self.early_stop = trackers(spec, measured)
        for tracked, key in ((self.best, "best"), (self.early_stop, "early_stop")):
            if tracked is not None:
                tracked.restore(self.resumed_watch.get(key))
        self.iterations_done = self.max_iter
        # under mixed precision the loss scale after each step is logged beside the loss
        self.extra_scalars = [SCALE_OUTPUT] if SCALE_OUTPUT in self.graph.outputs else []
        self._stop: int | None = None

    def _rank_gpu(self, device: Device) -> Device:
        """One GPU per rank: ``gpu`` (``gpu:0``) is the GPU of the rank's place among the ranks on
        its machine, modulo their count; a GPU named by a higher index is kept as named. The
        gradients are summed by NCCL there, or through host memory where NCCL cannot run; rank 0
        says which in one line."""
        from ..distributed.nccl import start_device_sums
        cp = device.xp
        if device.index == 0:
            device = type(device)(self.comm.local_rank() % cp.cuda.runtime.getDeviceCount())
        device.check_exists()
        # the rank's GPU is the process's current device, as a one-GPU process's is gpu:0: every
        # array and kernel the plans do not place is there
        chosen = cp.cuda.Device(device.index)
        if hasattr(chosen, "use"):
            chosen.use()
        sums, line = start_device_sums(self.comm, cp, device.index)
        self.comm.device_sums = sums
        if self.rank == 0:
            print(line, file=self.stream or sys.stderr, flush=True)
        return device

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

    def checkpoint(self, iteration: int, whole: dict[str, np.ndarray] | None = None) -> Path:
        """``whole``: the state of every stage (``gathered``) when this rank holds one stage's."""
        meta = {"net": self.net.name, "solver": self.cfg.type, "rng": self.runtime.rng.bit_generator.state,
                "max_iter": self.max_iter, "seed": self.spec.seed, "global_batch": self.global_batch,
                "watch": {"best": self.best.state() if self.best else None,
                          "early_stop": self.early_stop.state() if self.early_stop else None}}
        if not self.device.host_memory:           # what a resume takes again (backend/measured.py)
            meta["routes"] = recorded(self.device.kind)
        return write_checkpoint(self.out / "checkpoints", Checkpoint(iteration, whole or self.host_store(), meta),
                                self.spec.keep_last)

    def model_weights(self, whole: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        return {k: v for k, v in (whole or self.host_store()).items() if not is_slot(k)}

    def gathered(self) -> dict[str, np.ndarray] | None:
        """Every stage's weights and slots, on every rank, when the ranks are a pipeline's stages
        (every rank must call it at the same point); None otherwise."""
        if not self.pipeline:
            return None
        parts = self.comm.gather_all(self.host_store())
        stages = self.pipeline.stages.count
        whole: dict[str, np.ndarray] = {}
        for part in parts[:stages]:               # replica 0's stages (distributed/grid.py)
            whole.update(part)
        self._check_replicas_agree(parts, stages)
        return whole

    def _check_replicas_agree(self, parts: list[dict[str, np.ndarray]], stages: int) -> None:
        """Every replica of a stage holds the same weights and solver slots (their updates sum
        the same gradients); only BatchNorm's running statistics are each replica's own."""
        weights = self.pipeline.cut.graph.weights
        for rank in range(stages, len(parts)):
            first = parts[rank % stages]
            for k, v in parts[rank].items():
                if (is_slot(k) or weights[k].trainable) and not np.array_equal(v, first[k]):
                    raise RuntimeError(f"'{k}' differs between replica 0 and replica {rank // stages} of stage "
                                       f"{rank % stages}: the replicas' gradient sums disagree")

    def host_store(self) -> dict[str, np.ndarray]:
        """The weights and solver slots as host arrays (copies only where they live on a GPU)."""
        return {k: to_host(v) for k, v in self.store.items()}

    # -- the loop -----------------------------------------------------------------------------------
    def _on_signal(self, signum, frame):
        self._stop = signum

    def lr_at(self, i: int) -> float:
        return learning_rate(self.spec.solver.base_lr, self.spec.solver.lr_policy, i, self.max_iter)

    def launch(self, i: int) -> dict:
        """Runs iteration i; its outputs stay where they were computed (see scalars.py)."""
        rows = self.order.rows(i)
        if self.pipeline:
            share = 1.0
            if self.replicas > 1:             # this replica's rows of the global batch, as a rank's
                rows, share = rank_rows(rows, self.replica, self.spec.data.batch_size)
            pipeline, graph, plans = self._stage_step(len(rows))
            batch = iteration_feed(self.train_set, rows, self.net, self.spec, i, pipeline.forward)
            feed = micro_batch_feed(batch, pipeline.forward, pipeline.micro_batches, self.dtype, share)
            feed.update(host_values(self.cfg, self.lr_at(i), i + 1, self.dtype))
            with use(self.comm):
                outs = plans.run({k: v for k, v in feed.items() if k in graph.inputs})
                self.comm.finish_sends()      # this step's sends have left their buffers
            return outs
        weight = None
        if self.comm:
            rows, weight = rank_rows(rows, self.rank, self.spec.data.batch_size)
        feed = iteration_feed(self.train_set, rows, self.net, self.spec, i, self.graph, weight)
        feed.update(host_values(self.cfg, self.lr_at(i), i + 1, self.dtype))
        return self.train_plans.run(feed)

    def _stage_step(self, rows: int) -> tuple:
        """This rank's stage of the step for a batch of ``rows``: the run's, or for a short batch
        that its micro-batch count does not divide, a step of fewer micro-batches over the same
        stages (built once, on every rank alike: every rank sees the same batches)."""
        m = micro_batches_of(rows, self.pipeline.micro_batches)
        if m == self.pipeline.micro_batches:
            return self.pipeline, self.graph, self.train_plans
        if m not in self._short_steps:
            p = build_pipeline(self.net, self.cfg, self.pipeline.stages.count, m, rows // m,
                               chosen=self.pipeline.stages, schedule=self.pipeline.schedule,
                               replicas=self.pipeline.replicas)
            graph = optimize(p.cut.stage_graph(self.stage), self.disable, device=self.device)
            plans = PlanCache(graph, self.store, self.runtime, self.device, self.train_plans.reuse_memory,
                              on_build=self.train_plans.on_build)
            self._short_steps[m] = (p, graph, plans)
        return self._short_steps[m]

    def step(self, i: int) -> dict[str, float]:
        """Runs iteration i and reads its loss (and each loss top) back as floats."""
        outs = self.launch(i)
        return {"loss": float(outs[OBJECTIVE]), **{t: float(outs[t]) for t in self.loss_tops}}

    def _metric_key(self, name: str) -> str:
        return logged_name(name, self.loss_tops)

    def test(self) -> dict[str, float]:
        if self.test_plans is None:
            return {}
        if self.comm:
            metrics = self._shared_test()
        else:
            metrics = mean_outputs(self.test_plans, self.test_set, self.spec.data.batch_size)
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
        return mean_outputs_shared(self.test_plans, self.test_set, self.spec.data.batch_size, self.comm)

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
            save_net(self.net, self.out)
            save_input(self.net, self.out, self.spec.data.source)
        log = MetricsLog(self.out / "metrics.jsonl", self.start if self.start else None) if writer else NoLog()
        board = TensorBoard(self.out / "tensorboard") if writer and self.spec.tensorboard else None
        spec = self.spec
        progress = Progress(self.max_iter, self.start, spec.display, self.stream if writer else Silent(),
                            per_epoch=self.order.per_epoch)
        self.train_plans.on_build = compile_reporter(progress, "of the train step")
        if self.test_plans is not None:
            self.test_plans.on_build = compile_reporter(progress, "of the test pass")
        test_every = spec.test_interval
        test_keys: set[str] = set()
        scalars = StepScalars([OBJECTIVE] + self.loss_tops + self.extra_scalars, self.device, spec.display or 1)
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        last_good: Path | None = self.resumed_from
        stopped_by = None
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
                whole = self.gathered() if snapshot or stop is not None else None
                if snapshot and writer:
                    last_good = self.checkpoint(done, whole)
                if stop is not None:
                    if writer:
                        last_good = self.checkpoint(done, whole)
                        save_weights(str(self.out / "model.safetensors"), self.model_weights(whole))
                    progress.message(f"stopped by signal {stop} after iteration {done}; "
                                     f"checkpoint {last_good} (continue with --resume {self.out})")
                    stopped_by = stop
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
            whole = self.gathered()
            if writer:
                last_good = self.checkpoint(self.max_iter, whole)
                save_weights(str(self.out / "model.safetensors"), self.model_weights(whole))
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
            # a launched rank that stopped by a signal ignores the copies still on their way: the
            # launcher signals every rank in turn and the ranks stop together at the first copy, so
            # a rank's own can land after its run has ended, where Python's handler, put back,
            # raised KeyboardInterrupt on the way out: the rank died of SIGINT without finalizing
            # MPI, and the launcher killed the others with SIGKILL (the job ended 9, not 130)
            late = signal.SIG_IGN if stopped_by is not None and self.comm is not None and self.comm.launched else None
            for s, handler in previous.items():
                signal.signal(s, late if late is not None else handler)

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
