#!/usr/bin/env python
"""Real-size nets on one GPU: the toolkit against PyTorch as its users run it, side by side.

    python benchmarks/gpu_real_nets.py [--net resnet50 ...] [--batch 64 --batch 256]
        [--dtype float32 --dtype float16 --dtype bfloat16] [--mode train --mode infer]
        [--precision strict|tf32] [--torch-compile] [--split] [--json FILE]

Nets: ResNet-50, VGG-16 and MobileNet v2 (benchmarks/nets/) and GoogLeNet (BVLC's deploy file
in tests/data/caffe, read through `toolkit import caffe`; for training, its last Softmax becomes
a SoftmaxWithLoss as in benchmarks/real_nets.py). For each net, batch, dtype and mode, on the
same inputs and starting weights, already on the device:

  * the toolkit: the plan `toolkit bench --device gpu` times, captured as one CUDA graph (the
    default); a half dtype in training is mixed precision (float32 master weights, loss scaling
    for float16);
  * PyTorch eager as its users train: the module and its 4-D inputs in ``channels_last``,
    ``torch.autocast`` for the half dtypes and a ``GradScaler`` for float16, SGD with the net's
    rate and momentum; float32 follows the same math policy as the toolkit (``--precision``:
    strict sets ``torch.backends.cudnn.allow_tf32 = False``; tf32 keeps PyTorch's defaults,
    TF32 convolutions and float32 GEMMs);
  * with ``--torch-compile``: ``torch.compile`` of the module (``mode="reduce-overhead"`` to
    infer, the default mode to train, backward and the optimizer step eager, as its tutorials do).

Before timing, the outputs (infer) or the first step's loss (train) must agree within 1e-3
relative (float32 strict), 1e-2 (tf32) or 3e-2 (half types). Each timed iteration ends with a
device synchronisation; rounds rotate between the contenders; medians over every timed
iteration. Peak memory: what the toolkit's plan takes from CuPy's pool (weights, solver state,
arena, workspaces), against PyTorch's ``max_memory_allocated`` over its steps (module, solver
state, inputs). ``--split`` adds, for each row, the device time of one step split into cuDNN,
cuBLAS and the toolkit's own kernels (PyTorch's profiler over the kernel-by-kernel plan; the
kernels are those of the captured one), with the fifteen longest kernels, and the same for PyTorch.
Needs a CUDA GPU with cupy and torch.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
NETS = {"resnet50": ROOT / "benchmarks" / "nets" / "resnet50.yaml",
        "vgg16": ROOT / "benchmarks" / "nets" / "vgg16.yaml",
        "mobilenet_v2": ROOT / "benchmarks" / "nets" / "mobilenet_v2.yaml",
        "googlenet": ROOT / "tests" / "data" / "caffe" / "models_bvlc_googlenet_deploy.prototxt"}
from benchmarks.gpu_compare import rel_err, timed, torch_runner  # noqa: E402  (the same checks, clock, step)

TOLERANCE = {"strict": 1e-3, "tf32": 1e-2, "half": 3e-2}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--net", action="append", choices=list(NETS), help="repeatable (default: resnet50)")
    p.add_argument("--batch", type=int, action="append", help="repeatable (default: 64)")
    p.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], action="append",
                   help="repeatable (default: float32 and float16)")
    p.add_argument("--mode", choices=["train", "infer"], action="append", help="repeatable (default: both)")
    p.add_argument("--precision", choices=["strict", "tf32"], default="strict",
                   help="the float32 math policy of both sides (default: strict)")
    p.add_argument("--torch-compile", action="store_true", help="also time torch.compile (compiles take minutes)")
    p.add_argument("--split", action="store_true", help="also split one step's device time by kernel library")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--json", metavar="FILE", help="append each row to this file as a JSON line")
    return p.parse_args(argv)


def net_file(name: str, mode: str, folder: Path) -> Path:
    """The net file of ``name``: the benchmarks' own, or GoogLeNet imported from Caffe (made
    trainable for the train mode)."""
    path = NETS[name]
    if path.suffix == ".yaml":
        return path
    out = folder / name
    if not (out / "net.yaml").exists():
        subprocess.run([sys.executable, "-m", "toolkit.cli", "import", "caffe", str(path), "--out", str(out)],
                       cwd=ROOT, check=True, capture_output=True)
    if mode == "infer":
        return out / "net.yaml"
    from benchmarks.real_nets import trainable
    return trainable(out / "net.yaml")


def library_of(kernel: str) -> str:
    """Which library a kernel's name says it comes from: cuDNN's convolutions, cuBLAS's (and
    cuBLASLt's) GEMMs, or everything else (the toolkit's own kernels and CuPy's; PyTorch's own
    for PyTorch)."""
    name = kernel.lower()
    if any(k in name for k in ("cudnn", "fprop", "dgrad", "wgrad", "implicit_convolve", "implicit_gemm",
                               "convolve", "conv2d", "winograd", "fft")):
        return "cudnn"
    if any(k in name for k in ("gemm", "gemv", "cublas", "cutlass", "splitk", "nvjet")):
        return "cublas"
    return "own"


def kernel_split(step, sync, steps: int = 3) -> dict:
    """Device time of one step by library, and the fifteen longest kernels, from PyTorch's profiler
    (CUPTI sees every kernel of the process, CuPy's and cuDNN's included)."""
    from torch.profiler import ProfilerActivity, profile
    step()
    sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        sync()
    by_lib: dict[str, float] = {}
    kernels: dict[str, list] = {}
    for ev in prof.events():
        if getattr(ev, "device_type", None) is None or "CUDA" not in str(ev.device_type):
            continue
        us = ev.device_time if hasattr(ev, "device_time") else ev.cuda_time
        if "memcpy" in ev.name.lower() or "memset" in ev.name.lower():
            lib = "copies"
        else:
            lib = library_of(ev.name)
        by_lib[lib] = by_lib.get(lib, 0.0) + us / steps / 1e3
        k = kernels.setdefault(ev.name[:120], [0, 0.0, lib])
        k[0] += 1
        k[1] += us / steps / 1e3
    top = sorted(kernels.items(), key=lambda kv: -kv[1][1])[:15]
    return {"ms_by_library": {k: round(v, 3) for k, v in sorted(by_lib.items())},
            "kernels_per_step": round(sum(v[0] for v in kernels.values()) / steps, 1),
            "top": [{"kernel": k, "calls": round(v[0] / steps, 1), "ms": round(v[1], 3), "library": v[2]}
                    for k, v in top]}


def measure(name: str, path: Path, batch: int, mode: str, dtype: str, args) -> dict:
    import cupy
    import numpy as np
    import torch

    from peers.torch_net import TorchNet
    from toolkit.benchmarking import bench_plan, stand_in_weights
    from toolkit.zoo.resolve import load_net

    train = mode == "train"
    half = dtype != "float32"
    torch.backends.cudnn.allow_tf32 = args.precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = False       # PyTorch's default: float32 GEMMs
    torch.backends.cudnn.benchmark = True               # as PyTorch's training scripts set it
    net = load_net(str(path))
    pool = cupy.get_default_memory_pool()
    pool.free_all_blocks()
    base = pool.total_bytes()
    started = time.perf_counter()
    plan, inputs = bench_plan(net, batch, train, dtype if half else None, device="gpu")
    build_s = time.perf_counter() - started
    ours_in = {k: (cupy.asarray(v) if not k.startswith("@") else v) for k, v in inputs.items()}
    first = {k: cupy.asnumpy(cupy.asarray(v)) for k, v in plan.run(ours_in).items()}
    for _ in range(2):
        plan.run(ours_in)
    cupy.cuda.Device().synchronize()
    toolkit_peak = pool.total_bytes() - base

    weights = stand_in_weights(net.init_weights(seed=0))
    peer = TorchNet(net, "train" if train else "infer")
    peer.load({k: v for k, v in weights.items() if "@" not in k})
    peer.module.to("cuda").to(memory_format=torch.channels_last)

    def device_input(v):
        t = torch.from_numpy(np.ascontiguousarray(v)).cuda()
        return t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t
    t_in = {k: device_input(v) for k, v in inputs.items() if not k.startswith("@")}
    torch_dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16}.get(dtype)
    autocast = torch.autocast("cuda", dtype=torch_dtype or torch.float16, enabled=half)

    def torch_step(module):
        return torch_runner(peer, net, module, t_in, train, dtype, autocast)

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    eager = torch_step(peer.module)
    theirs = {k: v.detach().float().cpu().numpy() for k, v in eager().items() if hasattr(v, "detach")}
    for _ in range(2):
        eager()
    torch.cuda.synchronize()
    torch_peak = torch.cuda.max_memory_allocated()
    names = [k for k in (plan.graph.losses if train else plan.graph.outputs) if k in first and k in theirs]
    if not names:
        raise RuntimeError("no output of the toolkit's plan to check against torch")
    err = max(rel_err(first[k], theirs[k]) for k in names)
    bound = TOLERANCE["half" if half else args.precision]

    def sync():
        torch.cuda.synchronize()

    fns = {"toolkit": lambda: plan.run(ours_in), "torch": eager}
    compile_s = None
    if args.torch_compile:
        torch._dynamo.reset()
        started = time.perf_counter()
        compiled = torch.compile(peer.module, mode=None if train else "reduce-overhead")
        fns["torch_compiled"] = torch_step(compiled)
        for _ in range(3):
            fns["torch_compiled"]()
        sync()
        compile_s = time.perf_counter() - started
    for fn in fns.values():
        for _ in range(args.warmup):
            fn()
        sync()
    times = {k: [] for k in fns}
    order = list(fns)
    for r in range(args.rounds):
        for k in order[r % len(order):] + order[:r % len(order)]:
            times[k] += timed(fns[k], sync, args.iters)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    row = {"net": name, "batch": batch, "mode": mode, "dtype": dtype, "precision": args.precision,
           "captured": plan.captured, "capture_blocker": plan.capture_blocker, "kernel_calls": len(plan.calls),
           "plan_build_s": round(build_s, 1),
           **{f"{k}_ms": round(v, 3) for k, v in med.items()},
           **{f"{k}_images_per_s": round(batch / v * 1e3, 1) for k, v in med.items()},
           "ratio": round(med["toolkit"] / med["torch"], 3),
           "toolkit_peak_mib": round(toolkit_peak / 2**20), "torch_peak_mib": round(torch_peak / 2**20),
           "rel_err": err, "ok": err <= bound}
    if "torch_compiled" in med:
        row["ratio_compiled"] = round(med["toolkit"] / med["torch_compiled"], 3)
        row["torch_compile_s"] = round(compile_s, 1)
    if args.split:
        from toolkit.benchmarking import bench_plan as build
        kernel_plan, _ = build(net, batch, train, dtype if half else None, device="gpu", capture=False)
        row["split_toolkit"] = kernel_split(lambda: kernel_plan.run(ours_in), sync)
        row["split_torch"] = kernel_split(eager, sync)
    return row


def release() -> None:
    """Gives the last row's device memory back, so that each row's peak is its own."""
    import gc

    import cupy
    import torch
    gc.collect()
    cupy.get_default_memory_pool().free_all_blocks()
    torch.cuda.empty_cache()


def print_table(rows: list[dict], gpu: str) -> None:
    print(f"GPU: {gpu}\n")
    print("| net | mode | dtype | batch | toolkit ms | img/s | PyTorch eager ms | ratio | torch.compile ms | ratio "
          "| peak MiB toolkit / PyTorch | check |")
    print("|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['net']} | {r['mode']} | {r['dtype']} | {r['batch']} | | | | | | | | {r['error'][:100]} |")
            continue
        compiled = (f"{r['torch_compiled_ms']:.2f} | {r['ratio_compiled']:.2f}x" if "torch_compiled_ms" in r
                    else "- | -")
        print(f"| {r['net']} | {r['mode']} | {r['dtype']}{' tf32' if r['precision'] == 'tf32' else ''} "
              f"| {r['batch']} | {r['toolkit_ms']:.2f} | {r['toolkit_images_per_s']:.0f} | {r['torch_ms']:.2f} "
              f"| {r['ratio']:.2f}x | {compiled} | {r['toolkit_peak_mib']} / {r['torch_peak_mib']} "
              f"| {'ok' if r['ok'] else 'MISMATCH'} {r['rel_err']:.1e} |")
    for r in rows:
        for side in ("toolkit", "torch"):
            split = r.get(f"split_{side}")
            if split:
                print(f"\n{r['net']} {r['mode']} {r['dtype']} b{r['batch']} {side}: "
                      f"{split['kernels_per_step']} kernels/step, ms by library {split['ms_by_library']}")
                for k in split["top"]:
                    print(f"    {k['ms']:8.3f} ms  {k['calls']:5.1f}x  {k['library']:6s}  {k['kernel']}")


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TOOLKIT_PRECISION", args.precision)
    import cupy
    import torch
    gpu = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    print(f"GPU: {gpu}; torch {torch.__version__}; cupy {cupy.__version__}", file=sys.stderr, flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.net or ["resnet50"]:
            for mode in args.mode or ["infer", "train"]:
                path = net_file(name, mode, Path(tmp))
                for dtype in args.dtype or ["float32", "float16"]:
                    for batch in args.batch or [64]:
                        try:
                            row = measure(name, path, batch, mode, dtype, args)
                        except Exception as e:      # one row that fails must not stop the others
                            traceback.print_exc()
                            row = {"net": name, "batch": batch, "mode": mode, "dtype": dtype,
                                   "error": f"{type(e).__name__}: {e}"}
                        row["gpu"] = gpu
                        release()
                        rows.append(row)
                        print(json.dumps(row), file=sys.stderr, flush=True)
                        if args.json:
                            with open(args.json, "a") as f:
                                f.write(json.dumps(row) + "\n")
    print_table(rows, gpu)
    return 0


if __name__ == "__main__":
    sys.exit(main())
