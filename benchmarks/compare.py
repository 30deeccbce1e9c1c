#!/usr/bin/env python
"""Side-by-side CPU timings of one net in the toolkit, PyTorch eager and ONNX Runtime.

    python benchmarks/compare.py [NET.yaml] --batch 64 [--iters 50] [--rounds 5] [--json]

In one process and on the same inputs and starting weights it measures

  * inference: the toolkit's compiled Plan of the infer phase, PyTorch eager (eval, no_grad)
    and ONNX Runtime (CPU EP, all graph optimisations, intra-op threads = --threads);
  * a train step (forward + backward + plain SGD, lr 0.01, no momentum): the toolkit's
    train-step Plan vs PyTorch eager with torch.optim.SGD.

Before timing it checks that the frameworks compute the same thing (infer outputs within 1e-4
relative, the train step's loss and updated weights likewise) and prints that check; a mismatch
stops the run (exit 1) unless --force. Timing rounds are interleaved (A B C, B C A, C A B, ...)
so that load from elsewhere on the machine falls on every framework alike; the statistics are
taken over every timed iteration of every round. Each framework's turn starts after a pause
(--turn-gap, 0.1 s): the thread pools of the framework before it spin for a while after its
last call, and a turn started into them measured that contention, not the framework (the
toolkit's threads, seeing the cores taken, ran 56-69 of 240 of SqueezeNet's batch-1 calls on
one thread after ONNX Runtime's turns; with the pause, none in three runs of four, 8 in the
fourth).

Needs the ``bench`` extra (torch, onnx, onnxruntime): ``pip install -e '.[bench]'``.
The PyTorch and ONNX models are built here from the net's YAML spec, independently of the
toolkit's lowering, for every catalog layer (torch) / those of peers.onnx_export (ONNX).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_NET = ROOT / "benchmarks" / "nets" / "lenet.yaml"
TOLERANCE = 1e-4


def machine_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:                        # not Linux
        return os.cpu_count() or 1


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("net", nargs="?", default=str(DEFAULT_NET), help="net file (default: %(default)s)")
    p.add_argument("--batch", type=int, default=64, help="batch size (default: %(default)s)")
    p.add_argument("--iters", type=int, default=50,
                   help="timed iterations per framework and mode, over all rounds (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=5,
                   help="interleaved rounds the iterations are split into (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=5,
                   help="untimed iterations per framework before the first round (default: %(default)s)")
    p.add_argument("--threads", type=int, default=machine_cores(),
                   help="threads for every framework (default: this machine's cores, %(default)s); 0: each "
                        "framework's own default (the toolkit's adapts to the machine's load)")
    p.add_argument("--no-ort", action="store_true", help="leave ONNX Runtime out (toolkit and PyTorch only)")
    p.add_argument("--lr", type=float, default=None,
                   help="learning rate (default: the net's base_lr, or 0.01 without a train section)")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and inputs (default: %(default)s)")
    p.add_argument("--mode", choices=["both", "infer", "train"], default="both")
    p.add_argument("--quiet-wait", type=float, default=0.0, metavar="SECONDS",
                   help="on a shared machine: before each round, wait until other processes use under "
                        "10%% of the CPU, up to SECONDS in all (default: %(default)s, no waiting)")
    p.add_argument("--turn-gap", type=float, default=0.1, metavar="SECONDS",
                   help="pause before each framework's turn, while the last one's threads stop spinning "
                        "(default: %(default)s)")
    p.add_argument("--force", action="store_true", help="time even if the outputs disagree")
    p.add_argument("--no-optimize", action="store_true",
                   help="time the toolkit without its optional graph passes (as `toolkit bench --no-optimize`)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = p.parse_args(argv)
    for name in ("batch", "iters", "rounds"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1")
    if args.threads < 0:
        p.error("--threads must be at least 0 (0: each framework's default)")
    if args.warmup < 0 or args.quiet_wait < 0 or args.turn_gap < 0:
        p.error("--warmup, --quiet-wait and --turn-gap must not be negative")
    args.rounds = min(args.rounds, args.iters)
    from toolkit.passes.pipeline import no_optimize
    args.disable = no_optimize() if args.no_optimize else ()
    return args


def pin_threads(threads: int) -> None:
    """Before numpy / torch load: their BLAS and OpenMP pools size themselves from these, the
    toolkit's plans from TOOLKIT_THREADS. 0 pins nothing: every framework's own default."""
    if threads == 0:
        return
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "TOOLKIT_THREADS"):
        os.environ[var] = str(threads)


# -- PyTorch peer: peers.torch_net, the same translation the parity tests use ------------
def torch_peer(net, weights, phase: str):
    """The net's ``phase`` as a TorchNet loaded with ``weights`` (solver slots left out)."""
    from peers.torch_net import TorchNet
    from toolkit.errors import UserError

    for layer in net.spec.layers:
        if layer.type == "Dropout" and phase == "train" and layer.dropout_ratio > 0 and phase in layer.phases:
            raise UserError(f"compare.py: layer '{layer.name}': random dropout masks cannot be compared "
                            "(use --mode infer)")
    try:
        peer = TorchNet(net, phase)
    except NotImplementedError as e:
        raise UserError(f"compare.py: {e}") from None
    peer.load({k: v for k, v in weights.items() if "@" not in k})
    return peer


def param_groups(peer, graph, lr: float, weight_decay: float) -> list[dict]:
    """One torch param group per (lr_mult, decay_mult), as the toolkit scales them."""
    groups: dict[tuple, list] = {}
    for key, w in graph.weights.items():
        p = peer.params.get(key)
        if p is not None and p.requires_grad and w.lr_mult != 0:
            groups.setdefault((w.lr_mult, w.decay_mult), []).append(p)
    return [{"params": ps, "lr": lr * m, "weight_decay": weight_decay * d} for (m, d), ps in groups.items()]


# -- inputs, checks and timing ------------------------------------------------------------------
def make_inputs(net, graph, bindings, rng):
    """Standard-normal floats; integer inputs that feed a loss or Accuracy as labels get valid
    random class indices (zeros otherwise)."""
    from toolkit.ir.graph import FLOAT_DTYPES

    classes = {}
    for phase in ("train", "test"):
        try:
            g = net.graph(phase)
        except Exception:                         # a phase without a loss: no labels there
            continue
        by_id = {v.id: name for name, v in g.inputs.items()}
        for node in g.nodes:
            if node.op in ("nll_loss", "accuracy") and node.inputs[1].id in by_id:
                n = node.inputs[0].shape[node.attrs["axis"]]
                if isinstance(n, int):
                    classes[by_id[node.inputs[1].id]] = n
    out = {}
    for name, v in graph.inputs.items():
        if name.startswith("@"):
            continue                                  # the solver's per-step scalars
        shape = v.type.concrete(bindings)
        if v.dtype in FLOAT_DTYPES:
            out[name] = rng.standard_normal(shape).astype(v.dtype)
        else:
            out[name] = rng.integers(0, classes.get(name, 1), size=shape).astype(v.dtype)
    return out


def rel_err(a, b) -> float:
    """max |a - b| over the larger of max |a|, max |b|: relative to the output's scale."""
    import numpy as np
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    scale = max(float(np.abs(a).max(initial=0.0)), float(np.abs(b).max(initial=0.0)), 1e-30)
    return float(np.abs(a - b).max(initial=0.0)) / scale


def time_interleaved(fns: dict, iters: int, rounds: int, warmup: int, before_round=lambda: None,
                     turn_gap: float = 0.0):
    """Times each callable call by call; returns ({name: [seconds, ...] per round}, the share
    of the CPU that other processes used during the rounds).

    Rounds rotate the order (A B C, B C A, C A B, ...). Each framework's turn starts after
    ``turn_gap`` seconds (the previous framework's pool stops spinning) with one untimed call,
    which wakes its own pool after the other frameworks' turns."""
    names = list(fns)
    for name in names:
        for _ in range(warmup):
            fns[name]()
    counts = [iters // rounds + (1 if r < iters % rounds else 0) for r in range(rounds)]
    times = {name: [] for name in names}
    spent = [0.0, 0.0, 0.0]                       # busy, ours, wall over the rounds
    for r, count in enumerate(counts):
        before_round()
        for name in names[r % len(names):] + names[: r % len(names)]:
            gc.collect()
            if turn_gap:
                time.sleep(turn_gap)
            before = cpu_counters()
            f = fns[name]
            f()
            laps = []
            for _ in range(count):
                start = time.perf_counter()
                f()
                laps.append(time.perf_counter() - start)
            times[name].append(laps)
            after = cpu_counters()
            if before is not None and after is not None:
                spent = [t + a - b for t, a, b in zip(spent, after, before)]
    return times, others_share((0.0, 0.0, 0.0), tuple(spent)) if spent[2] > 0 else None


def cpu_counters():
    """(busy CPU seconds of the whole machine, CPU seconds of this process, wall seconds)."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    t = os.times()
    return ((user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK"),
            t.user + t.system, time.monotonic())


def others_share(before, after) -> float | None:
    """Share of the machine's CPU capacity that other processes used between two counters."""
    if before is None or after is None:
        return None
    busy, ours, wall = (a - b for a, b in zip(after, before))
    capacity = wall * machine_cores()
    return round(min(max((busy - ours) / capacity, 0.0), 1.0), 3) if capacity > 0 else None


class QuietWaiter:
    """Before each round, waits (within a total budget of seconds) until other processes have
    used under ``threshold`` of the machine's CPU over the last ``window`` seconds."""

    def __init__(self, budget: float, threshold: float = 0.1, window: float = 1.0):
        self.left, self.threshold, self.window = budget, threshold, window
        self.waited = 0.0

    def __call__(self) -> None:
        while self.left > 0:
            before = cpu_counters()
            time.sleep(self.window)
            share = others_share(before, cpu_counters())
            self.left -= self.window
            if share is None or share < self.threshold:
                return
            self.waited += self.window


def stats(rounds: list[list[float]], batch: int) -> dict:
    """Median, p10, p90 over every timed call of every round; each round's median besides."""
    import numpy as np
    ms = np.concatenate([np.asarray(r) for r in rounds]) * 1e3
    median = float(np.median(ms))
    return {"median_ms": round(median, 4), "p10_ms": round(float(np.percentile(ms, 10)), 4),
            "p90_ms": round(float(np.percentile(ms, 90)), 4), "items_per_s": round(batch / (median / 1e3), 1),
            "n": len(ms), "round_medians_ms": [round(float(np.median(r)) * 1e3, 3) for r in rounds]}


def numpy_blas_threads() -> int | None:
    """The thread count of numpy's bundled OpenBLAS, where it can be asked (numpy wheels)."""
    import ctypes
    import glob

    import numpy as np
    for lib in glob.glob(os.path.join(os.path.dirname(np.__file__), os.pardir, "numpy.libs", "*openblas*")):
        try:
            dll = ctypes.CDLL(lib)
        except OSError:
            continue
        for symbol in ("scipy_openblas_get_num_threads64_", "openblas_get_num_threads64_",
                       "openblas_get_num_threads"):
            if hasattr(dll, symbol):
                return int(getattr(dll, symbol)())
    return None


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# -- the two modes ------------------------------------------------------------------------------
def bench_infer(net, weights, bindings, args, rng):
    import numpy as np
    import torch

    from toolkit.compile import forward_graph
    from toolkit.runtime.plan import Plan

    # as `toolkit infer` compiles it: the weights frozen into the graph
    frozen = {k: v.copy() for k, v in weights.items()}
    graph = forward_graph(net, "infer", disable=args.disable, weights=frozen)
    plan = Plan(graph, bindings, {k: frozen[k] for k in graph.weights})
    inputs = make_inputs(net, graph, bindings, rng)
    onnx_file = args.net if args.net.endswith(".onnx") else None
    # an ONNX model is compared with ONNX Runtime running the same file (PyTorch has no reader of it)
    peer = None if onnx_file else torch_peer(net, weights, "infer")
    t_inputs = {k: torch.from_numpy(v) for k, v in inputs.items()}

    onnx_model = None
    if onnx_file and not args.no_ort:
        import onnx
        import onnxruntime as ort
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = args.threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        onnx_model = onnx.load(onnx_file)
    elif not args.no_ort:
        import onnxruntime as ort

        from peers.onnx_export import UnsupportedLayer, build_onnx_model
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = args.threads          # 0 is ONNX Runtime's own default
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        try:
            onnx_model = build_onnx_model(net, weights, bindings)
        except UnsupportedLayer as e:
            # the independent builder lacks a layer (LRN, recurrent, attention): the toolkit's own
            # exporter (the lowered graph), which every layer has, said on stderr
            from toolkit.exporters.onnx_graph import ExportError, export_graph
            try:
                onnx_model = export_graph(net.graph("infer", "float32"), weights, net.name)
                print(f"ONNX Runtime runs `toolkit export onnx`'s model ({e})", file=sys.stderr)
            except ExportError as again:
                print(f"ONNX Runtime not measured: {again}", file=sys.stderr)
    sess = names = None
    ort_inputs = inputs
    if onnx_model is not None:
        sess = ort.InferenceSession(onnx_model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        names = [o.name for o in sess.get_outputs()]
        if onnx_file:        # the net's blob names are the model's, made names: pair them by position
            ort_inputs = dict(zip([i.name for i in sess.get_inputs()], inputs.values()))
            names = dict(zip(names, graph.outputs))

    def run_torch():
        with torch.no_grad():
            return peer.module(t_inputs)

    def run_ort():
        return sess.run(list(names), ort_inputs)

    ours = {k: np.array(v) for k, v in plan.run(inputs).items()}
    theirs = {k: v.numpy() for k, v in run_torch().items()} if peer is not None else None
    onnx_out = None
    if sess is not None:
        onnx_out = dict(zip(names.values() if onnx_file else names, run_ort()))
    checks = []
    for name in graph.outputs:
        errs = {"toolkit_vs_torch": rel_err(ours[name], theirs[name])} if theirs is not None else {}
        if onnx_out is not None:
            errs.update(toolkit_vs_ort=rel_err(ours[name], onnx_out[name]))
            if theirs is not None:
                errs.update(torch_vs_ort=rel_err(theirs[name], onnx_out[name]))
        checks.append({"output": name, "shape": list(ours[name].shape), **errs,
                       "ok": all(e <= TOLERANCE for e in errs.values())})
    fns = {"toolkit": lambda: plan.run(inputs)}
    if peer is not None:
        fns["torch"] = run_torch
    if sess is not None:
        fns["ort"] = run_ort
    meta = {"kernel_calls": len(plan.calls), "arena_mib": round(plan.peak_bytes / 2**20, 2)}
    return checks, fns, meta


def bench_train(net, weights, bindings, args, rng):
    import numpy as np
    import torch

    from toolkit.compile import solver_config, train_step_graph
    from toolkit.frontend.lower import OBJECTIVE
    from toolkit.optim.solvers import host_values
    from toolkit.runtime.plan import Plan

    solver = solver_config(net)                           # the net's own solver, else plain SGD
    if solver.type not in ("sgd", "nesterov") or solver.clip_gradients:
        raise SystemExit(f"error: compare.py times sgd/nesterov train steps; the net says {solver.type}")
    lr = args.lr if args.lr is not None else (net.spec.train.solver.base_lr if net.spec.train else 0.01)
    graph = train_step_graph(net, solver, disable=args.disable)
    start = {k: weights[k].copy() for k in graph.weights if k in weights}
    for name, w in graph.weights.items():                 # solver slots (momentum) start at zero
        start.setdefault(name, np.zeros(w.value.type.concrete({}), w.value.dtype))
    live = {k: v.copy() for k, v in start.items()}      # the plan updates these in place
    plan = Plan(graph, bindings, live)
    inputs = make_inputs(net, graph, bindings, rng)
    inputs.update(host_values(solver, lr, 1, "float32"))
    peer = torch_peer(net, start, "train")
    groups = param_groups(peer, graph, lr, solver.weight_decay)
    opt = torch.optim.SGD(groups, lr=lr, momentum=solver.momentum, nesterov=solver.type == "nesterov")
    t_inputs = {k: torch.from_numpy(v) for k, v in inputs.items() if not k.startswith("@")}

    def step_torch():
        opt.zero_grad(set_to_none=True)
        out = dict(peer.module(t_inputs))
        out[OBJECTIVE] = peer.objective(out)
        out[OBJECTIVE].backward()
        opt.step()
        return out

    scalars = list(graph.losses) + ([OBJECTIVE] if len(graph.losses) > 1 else [])
    ours = {k: float(v) for k, v in plan.run(inputs).items() if k in scalars}
    theirs = {k: float(v.detach()) for k, v in step_torch().items() if k in scalars}
    checks = []
    for name in scalars:
        err = rel_err(ours[name], theirs[name])
        checks.append({"output": "objective" if name == OBJECTIVE else name, "toolkit": ours[name],
                       "torch": theirs[name], "rel_err": err, "ok": err <= TOLERANCE})
    # after one step, each array against the torch one, relative to the largest weight of the
    # net (an array that stays near zero, e.g. a bias before BatchNorm, has no scale of its own)
    after = {k: peer.params[k].detach().numpy() for k in graph.updates if k in peer.params}
    scale = max(float(np.abs(a).max(initial=0.0)) for a in after.values())
    werr = max(float(np.abs(live[k] - after[k]).max(initial=0.0)) for k in after) / max(scale, 1e-30)
    checks.append({"output": "weights after the step", "rel_err": werr, "ok": werr <= TOLERANCE,
                   "count": len(graph.updates)})
    # back to the same starting point for the timed steps
    for k, v in start.items():
        np.copyto(live[k], v)
    peer.load({k: v for k, v in start.items() if "@" not in k})
    opt.state.clear()                                    # torch's momentum buffers start over too
    fns = {"toolkit": lambda: plan.run(inputs), "torch": step_torch}
    meta = {"kernel_calls": len(plan.calls), "arena_mib": round(plan.peak_bytes / 2**20, 2),
            "solver": f"{solver.type} lr {lr} momentum {solver.momentum} weight_decay {solver.weight_decay}"}
    return checks, fns, meta


# -- report -----------------------------------------------------------------------------------
LABELS = {"toolkit": "toolkit", "torch": "PyTorch eager", "ort": "ONNX Runtime"}


def busy(report: dict) -> str:
    """How much of the machine other processes took while we timed; a warning when it matters."""
    shares = {m: v for m, v in report.get("others_cpu", {}).items() if v is not None}
    if not shares:
        return ""
    text = " Other processes used " + ", ".join(f"{100 * v:.0f}% ({m})" for m, v in shares.items()) + \
        " of the machine's CPU time during timing"
    if max(shares.values()) > 0.1:
        text += ": the figures are disturbed by that load, the multi-threaded ones most"
    waited = sum(report.get("quiet_waited_s", {}).values())
    if waited:
        text += f"; the rounds waited {waited:.0f} s in all for quieter moments"
    return text + "."


def markdown(report: dict) -> str:
    cfg = report["config"]
    lines = [f"### {cfg['net']}, batch {cfg['batch']}: toolkit vs PyTorch vs ONNX Runtime", "",
             f"CPU: {cfg['cpu']} ({cfg['cores']} cores), {cfg['threads']} thread(s) for every framework; "
             f"{cfg['iters']} timed iterations each in {cfg['rounds']} interleaved rounds "
             f"(+{cfg['warmup']} warmup); numpy {cfg['versions']['numpy']}, torch {cfg['versions']['torch']}, "
             f"onnxruntime {cfg['versions']['onnxruntime']}, Python {cfg['versions']['python']}."
             + busy(report), "",
             "| mode | framework | median ms | p10 ms | p90 ms | items/s | toolkit / framework |",
             "|---|---|--:|--:|--:|--:|--:|"]
    for mode, res in report["results"].items():
        base = res["toolkit"]["median_ms"]
        for fw, s in res.items():
            ratio = base / s["median_ms"]
            lines.append(f"| {'train step' if mode == 'train' else mode} | {LABELS[fw]} | {s['median_ms']:.3f} | "
                         f"{s['p10_ms']:.3f} | {s['p90_ms']:.3f} | {s['items_per_s']:.0f} | {ratio:.2f}x |")
    lines.append("")
    lines.append("toolkit / framework > 1 means the toolkit takes longer (ratio of medians).")
    return "\n".join(lines)


def check_lines(report: dict) -> list[str]:
    out = [f"check (same inputs and starting weights; tolerance {TOLERANCE:g} relative to each output's "
           "largest magnitude):"]
    for c in report["checks"].get("infer", []):
        parts = [f"toolkit~torch {c['toolkit_vs_torch']:.1e}"] if "toolkit_vs_torch" in c else []
        if "toolkit_vs_ort" in c:
            parts.append(f"toolkit~ORT {c['toolkit_vs_ort']:.1e}")
        if "torch_vs_ort" in c:
            parts.append(f"torch~ORT {c['torch_vs_ort']:.1e}")
        if "toolkit_vs_ort" not in c:
            parts.append("(no ONNX export)")
        out.append(f"  infer {c['output']} {c['shape']}: {', '.join(parts)}  {'ok' if c['ok'] else 'MISMATCH'}")
    for c in report["checks"].get("train", []):
        if "toolkit" in c:
            out.append(f"  train {c['output']}: toolkit {c['toolkit']:.6f}, torch {c['torch']:.6f}, "
                       f"rel err {c['rel_err']:.1e}  {'ok' if c['ok'] else 'MISMATCH'}")
        else:
            out.append(f"  train {c['output']} ({c['count']} arrays, {report['meta']['train']['solver']}): "
                       f"max rel err {c['rel_err']:.1e}  {'ok' if c['ok'] else 'MISMATCH'}")
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    pin_threads(args.threads)
    sys.path.insert(0, str(ROOT))                  # run from a checkout without installing
    try:
        import numpy as np
        import torch
        if not args.no_ort:
            import onnx  # noqa: F401
            import onnxruntime  # noqa: F401
    except ImportError as e:
        print(f"compare.py needs the bench extra (pip install -e '.[bench]'): {e}", file=sys.stderr)
        return 2
    from toolkit.errors import UserError
    from toolkit.runtime.session import batch_bindings
    from toolkit.zoo.resolve import load_net

    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        net = load_net(args.net)
        from toolkit.benchmarking import stand_in_weights
        if args.net.endswith(".onnx"):            # the model's own weights; ONNX Runtime has no train step
            weights = net.load_weights(args.net)
            modes = ["infer"]
        else:
            weights = stand_in_weights(net.init_weights(seed=args.seed), args.seed)
            modes = ["infer", "train"] if args.mode == "both" else [args.mode]
        report = {"config": {"net": net.name, "file": args.net, "batch": args.batch, "iters": args.iters,
                             "rounds": args.rounds, "warmup": args.warmup, "threads": args.threads,
                             "lr": args.lr, "seed": args.seed, "cpu": cpu_name(), "cores": machine_cores(),
                             "numpy_blas_threads": numpy_blas_threads(), "torch_threads": torch.get_num_threads(),
                             "versions": {"numpy": np.__version__, "torch": torch.__version__,
                                          "onnxruntime": (None if args.no_ort
                                                          else sys.modules["onnxruntime"].__version__),
                                          "python": platform.python_version()}},
                  "checks": {}, "results": {}, "meta": {}}
        runs = {}
        for mode in modes:
            try:
                graph = net.graph(mode)
            except UserError as e:
                if args.mode != "both":
                    raise
                print(f"skipping the {mode} mode: {e}", file=sys.stderr)
                continue
            bindings = batch_bindings(graph, args.batch)
            rng = np.random.default_rng(args.seed)
            setup = bench_infer if mode == "infer" else bench_train
            checks, fns, meta = setup(net, weights, bindings, args, rng)
            report["checks"][mode], report["meta"][mode] = checks, meta
            runs[mode] = fns
    except UserError as e:
        print(e, file=sys.stderr)
        return 2

    ok = all(c["ok"] for cs in report["checks"].values() for c in cs)
    if not args.json:
        print("\n".join(check_lines(report)), flush=True)
    if not ok and not args.force:
        if args.json:
            print(json.dumps(report))
        print("outputs disagree: the timings would compare different computations (--force to time anyway)",
              file=sys.stderr)
        return 1

    waiter = QuietWaiter(args.quiet_wait)
    for mode, fns in runs.items():
        waited = waiter.waited
        times, others = time_interleaved(fns, args.iters, args.rounds, args.warmup, waiter, args.turn_gap)
        report.setdefault("others_cpu", {})[mode] = others
        report.setdefault("quiet_waited_s", {})[mode] = round(waiter.waited - waited, 1)
        res = {fw: stats(t, args.batch) for fw, t in times.items()}
        report["results"][mode] = res
        report.setdefault("ratios", {})[mode] = {
            f"toolkit/{fw}": round(res["toolkit"]["median_ms"] / res[fw]["median_ms"], 3)
            for fw in res if fw != "toolkit"}
    if args.json:
        print(json.dumps(report))
    else:
        print()
        print(markdown(report))
        print()
        for mode, ratios in report["ratios"].items():
            print(f"{mode}: " + ", ".join(f"{k} = {v:.2f}" for k, v in ratios.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
