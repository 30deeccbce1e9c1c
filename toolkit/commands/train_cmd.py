"""``toolkit train`` and ``toolkit test``."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from ..backend.options import check_device
from ..compile import disabled_passes
from ..errors import UserError
from ..frontend.spec import parse_overrides  # noqa: F401  (the commands' --set, imported from here too)
from ..ir.graph import LOW_PRECISION
from ..training import runs
from ..zoo.resolve import load_net


def run_train(args) -> int:
    return _maybe_data_parallel(args, _train)


def _maybe_data_parallel(args, run) -> int:
    """``run(args, comm)``: in a single process with comm None (mpi4py never imported then);
    under an MPI launcher in a supervised rank process (distributed/supervisor.py), on the job's
    communicator, a failure of any rank stopping the whole job (distributed/faults.py)."""
    from ..distributed import supervisor
    from ..distributed.launcher import launched_size, world
    size = launched_size()
    if size <= 1:
        return run(args, None)
    if supervisor.available() and not supervisor.in_rank_process():
        return supervisor.supervise(args.argv, size)
    if supervisor.in_rank_process():
        supervisor.die_with_supervisor()
    comm = world()
    from ..distributed.comm import use
    from ..distributed.faults import stop_job_on_failure
    with use(comm), stop_job_on_failure(comm):
        pids = comm.pids()
        if comm.rank == 0:
            print(f"data-parallel over {comm.size} ranks (" + ", ".join(f"rank {r} pid {p}" for r, p in enumerate(pids))
                  + ")", file=sys.stderr, flush=True)
        return run(args, comm)


# what a new run writes into --out besides its checkpoints/ (a mean image aside: train/runs.py)
RUN_OUTPUTS = ("net.yaml", "model.safetensors", "best.safetensors", "metrics.jsonl", "history.jsonl", "input.json",
               "loss.png")


def _refuse_inputs(net, args) -> None:
    """A new run's --out holds none of the files it trains from (a --weights best.safetensors of
    an earlier run, a data source named like a run's file), which the run would replace."""
    from ..fileio import refuse_own_inputs
    from ..training.data import data_files
    from .io import net_inputs
    weights = args.weights if args.weights and not args.weights.startswith("zoo:") else None
    refuse_own_inputs("--out", args.out, [Path(args.out) / f for f in RUN_OUTPUTS],
                      net_inputs(net, weights) + data_files(net))


def _train(args, comm) -> int:
    args.device = check_device(args.device)
    from ..training.start import train_net
    overrides = parse_overrides(args.overrides)
    # --dtype float16 is mixed_precision.dtype=float16 (the net's other scaler settings kept);
    # float32 switches mixed precision off. Either comes before --set, which has the last word.
    if args.dtype in LOW_PRECISION:
        overrides.insert(0, (("train", "solver", "mixed_precision", "dtype"), args.dtype))
    elif args.dtype is not None:
        overrides.insert(0, (("train", "solver", "mixed_precision"), None))
    run = runs.run_of(args.resume) if args.resume else None
    if args.net is None and run is None:
        raise UserError("train needs a net file, or --resume RUN_DIR to continue a run as it was recorded")
    net = load_net(args.net if args.net is not None else str(runs.recorded_net(run)), overrides)
    if getattr(args, "new_head", None) is not None:
        net = _with_new_head(net, args, comm)
    if args.out is not None and run is None:
        _refuse_inputs(net, args)
    result = train_net(net, args.device, out=args.out, resume=args.resume, weights=args.weights,
                       allow_missing=args.allow_missing, overrides=overrides, set_texts=args.overrides,
                       disable=disabled_passes(net, args.disable, args.no_optimize), comm=comm)
    if result.status == 0 and (comm is None or comm.rank == 0):
        metrics = ", ".join(f"{k} {v:.4f}" for k, v in result.metrics.items())
        best = result.best
        kept = (f"; best {best['metric']} {best['value']:.4f} at iteration {best['iteration']} in {best['file']}"
                if best else "")
        # a pipeline-parallel run runs no test passes (training/pipeline.py)
        untested = "not tested (pipeline stages)" if net.spec.train and net.spec.train.distributed.stages > 1 \
            else "no test data"
        print(f"trained {net.name} for {result.iterations} iterations; {metrics or untested}; "
              f"weights in {result.folder / 'model.safetensors'}{kept}")
    return result.status


def _with_new_head(net, args, comm):
    """The net with a new head of ``args.new_head`` classes (frontend/heads.py), after checking
    that it is a fine-tuning: weights to start from, data to train on, a new run."""
    from ..frontend.heads import has_training_data, with_new_head
    if args.resume:
        raise UserError("--new-head starts a fine-tuning; --resume continues a run with the net it recorded "
                        "(which has the new head already): leave --new-head out")
    if not args.weights:
        raise UserError("--new-head goes with --weights FILE|zoo:NAME (the trained weights of the other layers)")
    if not has_training_data(net):
        raise UserError(f"--new-head: {net.name} says nothing of its training data; give it in the net file's "
                        "train.data or with --set train.data.source=PATH (an image folder, .npz, CSV, ...)")
    new, notes = with_new_head(net, args.new_head)
    if comm is None or comm.rank == 0:
        for line in notes:
            print(line, file=sys.stderr)
    return new


def run_test(args) -> int:
    return _maybe_data_parallel(args, _test)


def _test(args, comm) -> int:
    args.device = check_device(args.device)
    from ..training.evaluate import evaluate
    net = load_net(args.net, parse_overrides(args.overrides))
    disable = disabled_passes(net, args.disable, args.no_optimize)
    result = evaluate(net, args.weights, "test", device=args.device, disable=disable, comm=comm)
    if comm is not None and comm.rank != 0:
        return 0
    print(json.dumps({"examples": result.examples, **{k: round(v, 6) for k, v in result.metrics.items()}}))
    return 0


def run_data(args) -> int:
    from ..training.feeding import load_data, train_spec
    from .io import check_output_path, write_outputs
    net = load_net(args.net, parse_overrides(args.overrides))
    if not args.out.endswith((".npz", ".csv")):
        raise UserError(f"--out {args.out}: use a .npz or .csv file name")
    check_output_path(args.out, ["data"])
    if args.out.endswith(".csv"):
        from .data_csv import check_csv_spec
        check_csv_spec(args.out, train_spec(net).data.lengths)
    from ..fileio import refuse_own_inputs
    from ..training.data import data_files
    from .io import net_inputs
    refuse_own_inputs("--out", args.out, [args.out], net_inputs(net) + data_files(net))
    train_set, test_set = load_data(net, train_spec(net), transformed=False)
    chosen = train_set if args.split == "train" else test_set
    if chosen is None:
        raise UserError("the net's data has no test split: set train.data.test_fraction or test_source")
    if args.out.endswith(".csv"):
        from .data_csv import csv_label, write_csv_split
        write_csv_split(args.out, chosen.arrays, csv_label(args.out, chosen.arrays))
    else:
        write_outputs(args.out, chosen.arrays)
    print(f"wrote {args.out}: {len(chosen)} examples of {', '.join(chosen.arrays)}")
    return 0
