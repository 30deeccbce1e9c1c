#!/usr/bin/env python
"""GPU timings of nets in the toolkit (its cupy back end) and in PyTorch eager on CUDA.

    python benchmarks/gpu_compare.py [NET.yaml ...] --batch 64 [--batch 256] [--dtype float16]
                                     [--iters 50] [--rounds 5] [--json]

For each net, on the same inputs and starting weights (already on the GPU for both):

  * inference: the plan `toolkit infer --device gpu` runs (weights frozen in) against the torch
    translation of the net (toolkit.peers.torch_net) in eval mode under no_grad;
  * a train step: the toolkit's train-step plan with the net's SGD solver against forward,
    backward and torch.optim.SGD with the same rate and momentum.

Before timing it checks that both compute the same thing (infer outputs, the first step's loss)
within 1e-3 relative, as TF32 may be used by either side's GEMMs. Each timed iteration ends with
a device synchronisation; rounds alternate between the frameworks and the statistics are over
every timed iteration. Needs a CUDA GPU with cupy and torch.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
NETS = ["lenet", "mlp", "inception", "gru_digits", "transformer_digits"]
TOLERANCE = 1e-3
HALF_TOLERANCE = 3e-2


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("nets", nargs="*", help="net files (default: benchmarks/nets/{%s}.yaml)" % ",".join(NETS))
    p.add_argument("--batch", type=int, action="append", help="batch size, repeatable (default: 64)")
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--dtype", choices=["float32", "float16"], action="append",
                   help="repeatable (default: float32); float16 is mixed precision on both sides: the "
                        "toolkit's --dtype float16, torch.autocast (and a GradScaler for the train step)")
    p.add_argument("--json", action="store_true")
    return p.parse_args(argv)


def rel_err(a, b) -> float:
    import numpy as np
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    scale = max(float(np.abs(a).max(initial=0.0)), float(np.abs(b).max(initial=0.0)), 1e-30)
    return float(np.abs(a - b).max(initial=0.0)) / scale


def timed(fn, sync, iters: int) -> list[float]:
    out = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        sync()
        out.append(time.perf_counter() - start)
    return out


def measure(net_path: Path, batch: int, train: bool, dtype: str, args) -> dict:
    import cupy
    import numpy as np
    import torch
    from toolkit.commands.bench import bench_plan, stand_in_weights
    from toolkit.compile import solver_config
    from toolkit.zoo.resolve import load_net
    from toolkit.frontend.lower import OBJECTIVE
    from toolkit.peers.torch_net import TorchNet

    net = load_net(str(net_path))
    half = dtype == "float16"
    plan, inputs = bench_plan(net, batch, train, dtype if half else None, device="gpu")
    ours_in = {k: (cupy.asarray(v) if not k.startswith("@") else v) for k, v in inputs.items()}
    # the torch model starts from the weights bench_plan gave the plan (the same seed)
    weights = stand_in_weights(net.init_weights(seed=0))
    peer = TorchNet(net, "train" if train else "infer")
    peer.load({k: v for k, v in weights.items() if "@" not in k})
    peer.module.to("cuda")
    t_in = {k: torch.from_numpy(np.ascontiguousarray(v)).cuda() for k, v in inputs.items() if not k.startswith("@")}
    autocast = torch.autocast("cuda", dtype=torch.float16, enabled=half)
    if train:
        solver = solver_config(net)
        lr = net.spec.train.solver.base_lr if net.spec.train else 0.01
        params = [p for p in peer.params.values() if p.requires_grad]
        opt = torch.optim.SGD(params, lr=lr, momentum=solver.momentum, weight_decay=solver.weight_decay)
        scaler = torch.amp.GradScaler("cuda", enabled=half)

        def run_torch():
            opt.zero_grad(set_to_none=True)
            with autocast:
                out = dict(peer.module(t_in))
                loss = peer.objective(out)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            return {**out, OBJECTIVE: loss}
    else:
        def run_torch():
            with torch.no_grad(), autocast:
                return peer.module(t_in)

    ours = {k: cupy.asnumpy(cupy.asarray(v)) for k, v in plan.run(ours_in).items()}
    theirs = {k: v.detach().cpu().numpy() for k, v in run_torch().items()}
    names = [k for k in (plan.graph.losses if train else plan.graph.outputs) if k in ours and k in theirs]
    if not names:
        raise RuntimeError("no output of the toolkit's plan to check against torch")
    err = max(rel_err(ours[k], theirs[k]) for k in names)

    def sync_ours():
        plan.synchronize()

    def sync_torch():
        torch.cuda.synchronize()

    fns = {"toolkit": (lambda: plan.run(ours_in), sync_ours), "torch": (run_torch, sync_torch)}
    for fn, sync in fns.values():
        for _ in range(args.warmup):
            fn()
        sync()
    times = {k: [] for k in fns}
    order = list(fns)
    for r in range(args.rounds):
        for k in (order if r % 2 == 0 else order[::-1]):
            times[k] += timed(*fns[k], args.iters)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    return {"net": net_path.stem, "batch": batch, "mode": "train" if train else "infer", "dtype": dtype,
            "toolkit_ms": round(med["toolkit"], 4), "torch_ms": round(med["torch"], 4),
            "ratio": round(med["toolkit"] / med["torch"], 3), "rel_err": err,
            "ok": err <= (HALF_TOLERANCE if half else TOLERANCE)}


def main(argv=None) -> int:
    args = parse_args(argv)
    import cupy
    import torch
    paths = [Path(p) for p in args.nets] or [ROOT / "benchmarks" / "nets" / f"{n}.yaml" for n in NETS]
    rows = []
    for path in paths:
        for dtype in args.dtype or ["float32"]:
            for batch in args.batch or [64]:
                for train in (False, True):
                    try:
                        rows.append(measure(path, batch, train, dtype, args))
                    except Exception as e:       # one net the peer cannot run must not stop the others
                        rows.append({"net": path.stem, "batch": batch, "mode": "train" if train else "infer",
                                     "dtype": dtype, "error": f"{type(e).__name__}: {e}"})
                    if not args.json:
                        print(json.dumps(rows[-1]), file=sys.stderr)
    device = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    report = {"gpu": device, "torch": torch.__version__, "cupy": cupy.__version__, "rows": rows}
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    print(f"GPU: {device}; torch {torch.__version__}; cupy {cupy.__version__}; medians of "
          f"{args.rounds} x {args.iters} iterations\n")
    print("| net | dtype | batch | mode | toolkit | PyTorch eager | ratio | check |")
    print("|---|---|--:|---|--:|--:|--:|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['net']} | {r['dtype']} | {r['batch']} | {r['mode']} | | | | {r['error'][:80]} |")
        else:
            print(f"| {r['net']} | {r['dtype']} | {r['batch']} | {r['mode']} | {r['toolkit_ms']:.3f} ms | {r['torch_ms']:.3f} ms "
                  f"| {r['ratio']:.2f}x | {'ok' if r['ok'] else 'MISMATCH'} {r['rel_err']:.1e} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
