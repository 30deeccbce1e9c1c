#!/usr/bin/env python
"""Each convolution of a net's GPU train step, timed through cuDNN and through im2col + cuBLAS.

    python benchmarks/gpu_conv.py [NET.yaml ...] [--batch 64] [--dtype float16] [--reps 20]

For every convolution kernel the train-step plan builds (forward, with its bias or as the head of
a fused epilogue or pooling; the input gradient; the weight gradient), the same kernel context is
built twice, once by the cuDNN builder (kernels/gpu/dnn.py) and once by the im2col builder it
falls back to, run on the same random inputs (they must agree within 1e-3 relative, 3e-2 in
float16), then each is captured ``--reps`` times in one CUDA graph and timed by CUDA events
around graph launches: device time, as a captured plan pays it. Rounds alternate the two; the
figure is the median per call. Needs a CUDA GPU with CuPy and cuDNN.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
CONV_OPS = ("conv2d", "conv2d_max_pool2d", "conv2d_grad_input", "conv2d_grad_weight")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("nets", nargs="*", help="net files (default: zoo/lenet and zoo/resnet)")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--dtype", choices=["float32", "float16"], default="float32")
    p.add_argument("--reps", type=int, default=20, help="calls per captured graph")
    p.add_argument("--rounds", type=int, default=5)
    return p.parse_args(argv)


def convolution_contexts(net_path: Path, batch: int, dtype: str):
    """(label, op, KernelContext) of every convolution kernel in the net's GPU train step."""
    from toolkit.backend.devices import CudaDevice
    from toolkit.backend.registry import KernelContext
    from toolkit.benchmarking import bench_plan
    from toolkit.ir.binding import bind_attrs
    from toolkit.ops.fused import head_parts
    from toolkit.zoo.resolve import load_net
    plan, _inputs = bench_plan(load_net(str(net_path)), batch, True, dtype if dtype == "float16" else None,
                               device="gpu", capture=False)
    for node in plan.graph.nodes:
        op, attrs, k = node.op, dict(node.attrs), len(node.inputs)
        if op == "fused_epilogue":
            op, attrs, k = head_parts(node.attrs)
        if op not in CONV_OPS:
            continue
        in_shapes = [tuple(plan.build.shapes[v.id]) for v in node.inputs[:k]]
        out_shapes = [tuple(plan.build.shapes[node.outputs[0].id])]
        dtype_of = str(plan.build.dtypes[node.outputs[0].id])
        attrs = bind_attrs(attrs, plan.bindings)
        if dtype_of not in ("float32", "float16", "float64"):
            continue
        yield node.scope, op, KernelContext(node, attrs, in_shapes, out_shapes, dtype_of, CudaDevice())


def builders(op: str):
    from toolkit.backend.registry import load_device
    load_device("gpu")
    from toolkit.kernels.cpu.conv import CONV_KERNELS
    from toolkit.kernels.gpu import arrays, dnn
    return dnn.BUILDERS[op], arrays._over_cupy(CONV_KERNELS[op])


def time_graph(cp, run, ins, outs, reps: int):
    """A CUDA graph of ``reps`` calls of ``run``, and a function timing one launch per call (ms)."""
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        run(ins, outs)
        run(ins, outs)
        stream.synchronize()
        stream.begin_capture()
        for _ in range(reps):
            run(ins, outs)
        graph = stream.end_capture()
        graph.launch(stream)
        stream.synchronize()
    start, end = cp.cuda.Event(), cp.cuda.Event()

    def once() -> float:
        start.record(stream)
        graph.launch(stream)
        end.record(stream)
        end.synchronize()
        return cp.cuda.get_elapsed_time(start, end) / reps
    return once


def measure(label, op, ctx, reps: int, rounds: int) -> dict:
    import cupy as cp
    import numpy as np
    rng = np.random.default_rng(0)
    ins = [cp.asarray(rng.standard_normal(s).astype(ctx.dtype)) for s in ctx.in_shapes]
    cudnn_builder, im2col_builder = builders(op)
    row = {"layer": label, "op": op, "in": ctx.in_shapes, "out": ctx.out_shapes[0], "dtype": ctx.dtype}
    try:
        runs = {"cudnn": cudnn_builder(ctx), "im2col": im2col_builder(ctx)}
    except Exception as e:                   # cuDNN declined: the plan would use im2col here
        return {**row, "error": f"{type(e).__name__}: {e}"}
    outs = {k: [cp.empty(ctx.out_shapes[0], ctx.dtype)] for k in runs}
    for k, run in runs.items():
        run(ins, outs[k])
    a, b = (cp.asnumpy(outs[k][0]).astype(np.float64) for k in ("cudnn", "im2col"))
    row["rel_err"] = float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))
    timers = {k: time_graph(cp, run, ins, outs[k], reps) for k, run in runs.items()}
    times = {k: [] for k in runs}
    for r in range(rounds):
        for k in (("cudnn", "im2col") if r % 2 == 0 else ("im2col", "cudnn")):
            times[k].append(timers[k]())
    for k, v in times.items():
        row[f"{k}_us"] = round(statistics.median(v) * 1e3, 2)
    row["ratio"] = round(row["cudnn_us"] / row["im2col_us"], 3)
    return row


def main(argv=None) -> int:
    args = parse_args(argv)
    import cupy as cp
    paths = [Path(p) for p in args.nets] or [ROOT / "zoo" / "lenet" / "net.yaml", ROOT / "zoo" / "resnet" / "net.yaml"]
    device = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    print(f"GPU: {device}; cupy {cp.__version__}; batch {args.batch}; {args.dtype}; medians of {args.rounds} "
          f"launches of {args.reps} calls")
    totals = {}
    for path in paths:
        name = f"{path.parent.name}/{path.stem}" if path.stem == "net" else path.stem
        sums = {"cudnn": 0.0, "im2col": 0.0}
        for label, op, ctx in convolution_contexts(path, args.batch, args.dtype):
            row = measure(label, op, ctx, args.reps, args.rounds)
            print(json.dumps({"net": name, **row}), flush=True)
            if "error" not in row:
                sums["cudnn"] += row["cudnn_us"]
                sums["im2col"] += row["im2col_us"]
        totals[name] = sums
        print(f"{name}: all convolution kernels of one train step: cuDNN {sums['cudnn']:.1f} us, "
              f"im2col {sums['im2col']:.1f} us, ratio {sums['cudnn'] / max(sums['im2col'], 1e-9):.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
