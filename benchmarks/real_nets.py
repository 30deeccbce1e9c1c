#!/usr/bin/env python
"""Real-size nets side by side: the toolkit, PyTorch eager and ONNX Runtime on the published Caffe
deploy files (tests/data/caffe, read through `toolkit import caffe`), at each batch and thread
count asked, with the FLOP floor (the net's FLOPs at this machine's measured SGEMM rate on as
many threads) as the yardstick that does not move.

    python benchmarks/real_nets.py [--net resnet50 ...] [--batch 1 --batch 8] [--threads 1 --threads 2]
    python benchmarks/real_nets.py --mode train --net resnet50 --net squeezenet1.1 --batch 8 --batch 32

Each row is one `benchmarks/compare.py --json` run in its own process (the same inputs and
stand-in weights for all, outputs checked equal before timing, interleaved rounds); the table is
markdown, and --json writes every figure. ``--mode train`` times the SGD train step against
PyTorch's: the deploy net's last Softmax becomes a SoftmaxWithLoss over a label input (ONNX
Runtime does not train).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CAFFE = ROOT / "tests" / "data" / "caffe"
NETS = {
    "alexnet": "models_bvlc_alexnet_deploy.prototxt",
    "googlenet": "models_bvlc_googlenet_deploy.prototxt",
    "resnet50": "resnet50_deploy.prototxt",
    "squeezenet1.1": "squeezenet1.1_deploy.prototxt",
    "mobilenet_v1": "mobilenet_deploy.prototxt",
    "mobilenet_v2": "mobilenet_v2_deploy.prototxt",
}


def gemm_rate(threads: int, size: int = 1024, repeats: int = 5) -> float:
    """SGEMM GFLOP/s of numpy's BLAS on ``threads`` threads: the best of a few square products."""
    import numpy as np
    from threadpoolctl import threadpool_limits
    a = np.random.default_rng(0).standard_normal((size, size)).astype(np.float32)
    best = float("inf")
    with threadpool_limits(threads):
        a @ a
        for _ in range(repeats):
            start = time.perf_counter()
            a @ a
            best = min(best, time.perf_counter() - start)
    return 2 * size ** 3 / best / 1e9


def net_flops(net_file: Path) -> float:
    """The infer pass's FLOPs per image."""
    sys.path.insert(0, str(ROOT))
    from toolkit.ir.dims import evaluate
    from toolkit.ops.flops import graph_flops
    from toolkit.runtime.session import batch_bindings
    from toolkit.zoo.resolve import load_net
    graph = load_net(str(net_file)).graph("infer", "float32")
    return float(evaluate(graph_flops(graph), batch_bindings(graph, 1)))


def trainable(net_file: Path) -> Path:
    """A copy of an imported deploy net that trains: its last Softmax layer replaced by a
    SoftmaxWithLoss of its bottom (flattened) and an int64 ``label`` input, in-place Dropout left out,
    SGD with momentum."""
    import yaml
    spec = yaml.safe_load(net_file.read_text())
    last = max(i for i, layer in enumerate(spec["layers"]) if layer.get("type") == "Softmax")
    bottom = spec["layers"][last]["bottom"]
    # flattened first: a [N, classes, 1, 1] score (SqueezeNet's global pooling) against [N] labels
    spec["layers"][last:last + 1] = [
        {"name": "scores", "type": "Flatten", "bottom": bottom, "top": "scores"},
        {"name": "loss", "type": "SoftmaxWithLoss", "bottom": ["scores", "label"], "top": "loss"}]
    spec["inputs"]["label"] = {"shape": ["N"], "dtype": "int64"}
    # in-place Dropout goes: two frameworks' random masks cannot be checked against each other
    spec["layers"] = [layer for layer in spec["layers"]
                      if not (layer.get("type") == "Dropout" and layer.get("bottom") == layer.get("top"))]
    spec["train"] = {"solver": {"type": "sgd", "base_lr": 0.001, "momentum": 0.9}}
    out = net_file.with_name("train.yaml")
    out.write_text(yaml.safe_dump(spec, sort_keys=False))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--net", action="append", choices=list(NETS), help="default: all")
    p.add_argument("--batch", action="append", type=int, help="default: 1 and 8")
    p.add_argument("--threads", action="append", type=int, help="default: 1 and 2")
    p.add_argument("--mode", choices=["infer", "train"], default="infer")
    p.add_argument("--iters", type=int, default=12)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--json", metavar="FILE", help="write every row's figures here")
    args = p.parse_args()
    nets, batches, threads = args.net or list(NETS), args.batch or [1, 8], args.threads or [1, 2]
    rates = {t: gemm_rate(t) for t in threads}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in nets:
            out = Path(tmp) / name
            subprocess.run([sys.executable, "-m", "toolkit.cli", "import", "caffe", str(CAFFE / NETS[name]), "--out",
                            str(out)], cwd=ROOT, check=True, capture_output=True)
            flops = net_flops(out / "net.yaml") * (3 if args.mode == "train" else 1)   # forward + 2x backward
            net_file = trainable(out / "net.yaml") if args.mode == "train" else out / "net.yaml"
            for t in threads:
                for b in batches:
                    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "compare.py"), str(net_file),
                                          "--mode", args.mode, "--batch", str(b), "--threads", str(t), "--iters",
                                          str(args.iters), "--rounds", str(args.rounds), "--json"],
                                         cwd=ROOT, capture_output=True, text=True)
                    if run.returncode != 0:
                        print(f"{name} batch {b}, {t} thread(s): compare.py failed: {run.stderr.strip()[-300:]}",
                              file=sys.stderr)
                        continue
                    report = json.loads(run.stdout.strip().splitlines()[-1])
                    res = report["results"][args.mode]
                    row = {"net": name, "batch": b, "threads": t, "gflop_per_image": round(flops / 1e9, 3),
                           "floor_ms": round(flops * b / (rates[t] * 1e9) * 1e3, 1),
                           "gemm_gflops": round(rates[t], 1),
                           **{f"{fw}_ms": r["median_ms"] for fw, r in res.items()},
                           "others_cpu": report.get("others_cpu", {}).get(args.mode), "mode": args.mode,
                           "cpu": report["config"]["cpu"]}
                    rows.append(row)
                    print(json.dumps(row), file=sys.stderr, flush=True)
    print(f"CPU: {rows[0]['cpu'] if rows else '?'}; SGEMM " +
          ", ".join(f"{rates[t]:.0f} GFLOP/s on {t} thread(s)" for t in threads))
    print(f"\n{args.mode}:\n\n| net | batch | threads | toolkit ms | PyTorch ms | ONNX Runtime ms | toolkit / PyTorch "
          "| toolkit / ORT | FLOP floor ms |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|--:|")
    for r in rows:
        ort, torch_ms = r.get("ort_ms"), r.get("torch_ms")
        ort_text, ratio = ("-", "-") if not ort else (f"{ort:.1f}", f"{r['toolkit_ms'] / ort:.2f}")
        torch_text, torch_ratio = (("-", "-") if not torch_ms
                                   else (f"{torch_ms:.1f}", f"{r['toolkit_ms'] / torch_ms:.2f}"))
        print(f"| {r['net']} | {r['batch']} | {r['threads']} | {r['toolkit_ms']:.1f} | {torch_text} | "
              f"{ort_text} | {torch_ratio} | {ratio} | {r['floor_ms']:.1f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
