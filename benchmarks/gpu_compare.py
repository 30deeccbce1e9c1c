#!/usr/bin/env python
"""GPU timings of nets in the toolkit (its cupy back end) and in PyTorch on CUDA.

    python benchmarks/gpu_compare.py [NET.yaml ...] --batch 64 [--batch 256] [--dtype float16]
                                     [--iters 50] [--rounds 5] [--torch-compile] [--channels-last] [--json]

For each net, on the same inputs and starting weights (already on the GPU for all):

  * inference: the plan `toolkit infer --device gpu` runs (weights frozen in) against the torch
    translation of the net (peers.torch_net) in eval mode under no_grad;
  * a train step: the toolkit's train-step plan with the net's SGD solver against forward,
    backward and torch.optim.SGD with the same rate and momentum.

The toolkit runs twice: its plan captured as one CUDA graph (the default) and kernel by kernel
(``TOOLKIT_CUDA_GRAPHS=0``), and with ``--im2col`` a third time, captured, with its convolutions
on im2col + cuBLAS instead of cuDNN (``TOOLKIT_CUDNN=0``); PyTorch runs eager and, with ``--torch-compile``, as
``torch.compile(mode="reduce-overhead")`` (its CUDA-graph path; the module compiled, the backward
and the optimizer step eager, as its tutorials do).

Before timing it checks that all compute the same thing (infer outputs, the first steps' loss)
within 1e-3 relative, as TF32 may be used by either side's GEMMs, and that the captured plan
equals the kernel-by-kernel one. Each timed iteration ends with a device synchronisation; rounds
rotate between the contenders and the statistics are over every timed iteration. Needs a CUDA
GPU with cupy and torch.
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
    p.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], action="append",
                   help="repeatable (default: float32); a half type is mixed precision on both sides: the "
                        "toolkit's --dtype, torch.autocast (and a GradScaler for float16's train step)")
    p.add_argument("--channels-last", action="store_true",
                   help="run PyTorch's module and 4-D inputs in channels_last, as its users train with "
                        "half types (benchmarks/gpu_real_nets.py always does)")
    p.add_argument("--torch-compile", action="store_true",
                   help="also time torch.compile(mode='reduce-overhead') (compiles take a while)")
    p.add_argument("--im2col", action="store_true",
                   help="also time the captured plan with its convolutions on im2col + cuBLAS (TOOLKIT_CUDNN=0)")
    p.add_argument("--json", action="store_true")
    return p.parse_args(argv)


def torch_runner(peer, net, module, t_in: dict, train: bool, dtype: str, autocast):
    """One call of ``module``'s step as PyTorch's users write it: inference under ``no_grad`` and
    ``autocast``; or a train step, SGD with the net's solver (learning rate, momentum, weight
    decay), the forward pass and loss under ``autocast``, a GradScaler for float16. Returns the
    outputs (and the loss, under the toolkit's objective name)."""
    import torch

    from toolkit.compile import solver_config
    from toolkit.frontend.lower import OBJECTIVE
    if not train:
        def run_infer():
            with torch.no_grad(), autocast:
                return module(t_in)
        return run_infer
    solver = solver_config(net)
    lr = net.spec.train.solver.base_lr if net.spec.train else 0.01
    params = [p for p in peer.params.values() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=lr, momentum=solver.momentum, weight_decay=solver.weight_decay)
    scaler = torch.amp.GradScaler("cuda", enabled=dtype == "float16")

    def run_train():
        opt.zero_grad(set_to_none=True)
        with autocast:
            out = dict(module(t_in))
            loss = peer.objective(out)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return {**out, OBJECTIVE: loss}
    return run_train


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

    from peers.torch_net import TorchNet
    from toolkit.benchmarking import bench_plan, stand_in_weights
    from toolkit.zoo.resolve import load_net

    net = load_net(str(net_path))
    half = dtype != "float32"
    from toolkit.kernels.gpu import dnn
    dnn.CHOSEN.clear()
    plans = {}
    for name, capture in (("captured", None), ("eager", False)):
        plans[name], inputs = bench_plan(net, batch, train, dtype if half else None, device="gpu", capture=capture)
    on_cudnn = sum(n for (how, _what), n in dnn.CHOSEN.items() if how == "cudnn") // 2     # per plan
    if args.im2col:
        from toolkit import settings
        with settings.use(cudnn=False):
            plans["im2col"], _ = bench_plan(net, batch, train, dtype if half else None, device="gpu")
    ours_in = {k: (cupy.asarray(v) if not k.startswith("@") else v) for k, v in inputs.items()}
    # the torch model starts from the weights bench_plan gave the plan (the same seed)
    weights = stand_in_weights(net.init_weights(seed=0))
    peer = TorchNet(net, "train" if train else "infer")
    peer.load({k: v for k, v in weights.items() if "@" not in k})
    peer.module.to("cuda")
    t_in = {k: torch.from_numpy(np.ascontiguousarray(v)).cuda() for k, v in inputs.items() if not k.startswith("@")}
    if args.channels_last:
        peer.module.to(memory_format=torch.channels_last)
        t_in = {k: v.contiguous(memory_format=torch.channels_last) if v.dim() == 4 else v for k, v in t_in.items()}
    autocast = torch.autocast("cuda", dtype=torch.bfloat16 if dtype == "bfloat16" else torch.float16, enabled=half)
    compiled = None
    if args.torch_compile:
        # dynamo's cache is keyed by the forward's code, which every net's translation shares:
        # start each net afresh, or the recompile limit turns later nets back to eager
        torch._dynamo.reset()
        compiled = torch.compile(peer.module, mode="reduce-overhead")

    def torch_step(module):
        return torch_runner(peer, net, module, t_in, train, dtype, autocast)

    def host(outs):
        return {k: (v.detach().cpu().numpy() if hasattr(v, "detach") else cupy.asnumpy(cupy.asarray(v)))
                for k, v in outs.items()}

    names = list(plans["captured"].graph.losses if train else plans["captured"].graph.outputs)
    # three runs each from the same start: the captured plan's first run is its warm-up, the
    # second its capture and first replay, the third a replay
    runs = {name: [host(plan.run(ours_in)) for _ in range(3)] for name, plan in plans.items()}
    theirs = host(torch_step(peer.module)())
    names = [k for k in names if k in runs["eager"][0] and k in theirs]
    if not names:
        raise RuntimeError("no output of the toolkit's plan to check against torch")
    err = max(rel_err(runs["eager"][0][k], theirs[k]) for k in names)
    capture_err = max(rel_err(a[k], b[k]) for a, b in zip(runs["captured"], runs["eager"]) for k in names)
    if "im2col" in runs:
        err = max(err, max(rel_err(runs["im2col"][0][k], runs["eager"][0][k]) for k in names))

    def sync():
        torch.cuda.synchronize()

    fns = {"toolkit": lambda: plans["captured"].run(ours_in), "toolkit_eager": lambda: plans["eager"].run(ours_in),
           "torch": torch_step(peer.module)}
    if compiled is not None:
        fns["torch_compiled"] = torch_step(compiled)
    if "im2col" in plans:
        fns["toolkit_im2col"] = lambda: plans["im2col"].run(ours_in)
    for fn in fns.values():
        for _ in range(args.warmup):
            fn()
        sync()
    times = {k: [] for k in fns}
    order = list(fns)
    for r in range(args.rounds):
        turn = order[r % len(order):] + order[:r % len(order)]
        for k in turn:
            times[k] += timed(fns[k], sync, args.iters)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    row = {"net": f"{net_path.parent.name}/{net_path.stem}" if net_path.stem == "net" else net_path.stem,
           "batch": batch, "mode": "train" if train else "infer", "dtype": dtype,
           "captured": plans["captured"].captured, "capture_blocker": plans["captured"].capture_blocker,
           "kernel_calls": len(plans["captured"].calls), "convolutions_on_cudnn": on_cudnn,
           **{f"{k}_ms": round(v, 4) for k, v in med.items()},
           "ratio": round(med["toolkit"] / med["torch"], 3), "rel_err": err, "capture_rel_err": capture_err,
           "ok": err <= (HALF_TOLERANCE if half else TOLERANCE) and capture_err == 0.0}
    if "torch_compiled" in med:
        row["ratio_compiled"] = round(med["toolkit"] / med["torch_compiled"], 3)
    if "toolkit_im2col" in med:
        row["ratio_cudnn_to_im2col"] = round(med["toolkit"] / med["toolkit_im2col"], 3)
    return row


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
                        rows.append({"net": f"{path.parent.name}/{path.stem}" if path.stem == "net" else path.stem,
                                     "batch": batch, "mode": "train" if train else "infer",
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
    print("| net | dtype | batch | mode | toolkit (graph) | toolkit (kernel by kernel) | PyTorch eager | ratio "
          "| torch.compile | ratio | check |")
    print("|---|---|--:|---|--:|--:|--:|--:|--:|--:|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['net']} | {r['dtype']} | {r['batch']} | {r['mode']} | | | | | | | {r['error'][:80]} |")
            continue
        compiled = (f"{r['torch_compiled_ms']:.3f} ms | {r['ratio_compiled']:.2f}x" if "torch_compiled_ms" in r
                    else " | ")
        graph = f"{r['toolkit_ms']:.3f} ms" + ("" if r["captured"] else " (not captured)")
        print(f"| {r['net']} | {r['dtype']} | {r['batch']} | {r['mode']} | {graph} | {r['toolkit_eager_ms']:.3f} ms "
              f"| {r['torch_ms']:.3f} ms | {r['ratio']:.2f}x | {compiled} "
              f"| {'ok' if r['ok'] else 'MISMATCH'} {r['rel_err']:.1e} / {r['capture_rel_err']:.1e} |")
    for r in rows:
        if "toolkit_im2col_ms" in r:
            print(f"{r['net']} {r['dtype']} {r['batch']} {r['mode']}: convolutions on cuDNN {r['toolkit_ms']:.3f} ms, "
                  f"on im2col {r['toolkit_im2col_ms']:.3f} ms, ratio {r['ratio_cudnn_to_im2col']:.2f}x "
                  f"({r['convolutions_on_cudnn']} convolution kernels on cuDNN)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
