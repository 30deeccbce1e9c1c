#!/usr/bin/env python
"""float32 inference of one net file in the toolkit, ONNX Runtime and OpenVINO side by side, in
one process: the same stand-in weights and inputs as compare.py, both peers given the ONNX model
of compare.py's builder, every output checked against the toolkit's before timing, interleaved
rounds (a pause before each framework's turn, as compare.py's --turn-gap), medians.

    python benchmarks/cpu_peers.py NET.yaml [--batch 1] [--threads 1] [--rounds 4] [--iters 40]

Prints one JSON object: each framework's median ms, toolkit / ORT, toolkit / OpenVINO, the
largest output difference against each peer, and /proc/loadavg before and after (a shared
machine's load is part of the figure). Needs the ``bench`` extra and ``openvino``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load_average() -> list[str]:
    try:
        return Path("/proc/loadavg").read_text().split()[:3]
    except OSError:
        return []


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("net")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--iters", type=int, default=40, help="timed iterations per framework, over all rounds")
    p.add_argument("--turn-gap", type=float, default=0.1)
    args = p.parse_args()
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "TOOLKIT_THREADS"):
        os.environ[var] = str(args.threads)           # before numpy and the peers load
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import numpy as np
    import onnxruntime as ort
    import openvino as ov
    from compare import make_inputs

    from peers.onnx_export import build_onnx_model
    from toolkit.benchmarking import stand_in_weights
    from toolkit.compile import forward_graph
    from toolkit.runtime.plan import Plan
    from toolkit.runtime.session import batch_bindings
    from toolkit.zoo.resolve import load_net

    load_before = load_average()
    net = load_net(args.net)
    weights = stand_in_weights(net.init_weights(seed=0), 0)
    frozen = {k: v.copy() for k, v in weights.items()}
    graph = forward_graph(net, "infer", weights=frozen)
    bindings = batch_bindings(graph, args.batch)
    plan = Plan(graph, bindings, {k: frozen[k] for k in graph.weights})
    inputs = make_inputs(net, graph, bindings, np.random.default_rng(0))
    model = build_onnx_model(net, weights, bindings)

    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = args.threads, 1
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    ort_inputs = {i.name: inputs[i.name] for i in sess.get_inputs()}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.onnx"
        path.write_bytes(model.SerializeToString())
        compiled = ov.Core().compile_model(str(path), "CPU", {
            "INFERENCE_NUM_THREADS": args.threads, "INFERENCE_PRECISION_HINT": "f32",
            "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1})
    request = compiled.create_infer_request()
    ov_inputs = {i.get_any_name(): inputs[i.get_any_name()] for i in compiled.inputs}

    ours = np.asarray(plan.run(inputs)[names[0]]).reshape(args.batch, -1)
    theirs_ort = sess.run(names, ort_inputs)[0].reshape(args.batch, -1)
    request.infer(ov_inputs)
    theirs_ov = request.get_output_tensor(0).data.copy().reshape(args.batch, -1)
    diffs = {"ort": float(np.abs(ours - theirs_ort).max()), "openvino": float(np.abs(ours - theirs_ov).max())}
    scale = float(np.abs(ours).max()) or 1.0
    if max(diffs.values()) > 1e-3 * scale:
        print(f"outputs disagree: {diffs}", file=sys.stderr)
        return 1

    runs = {"toolkit": lambda: plan.run(inputs), "ort": lambda: sess.run(names, ort_inputs),
            "openvino": lambda: request.infer(ov_inputs)}
    for run in runs.values():
        for _ in range(3):
            run()
    times = {name: [] for name in runs}
    per_round = max(1, args.iters // args.rounds)
    for _ in range(args.rounds):
        for name, run in runs.items():
            time.sleep(args.turn_gap)          # the last framework's threads stop spinning
            for _ in range(per_round):
                start = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - start)
    med = {name: float(np.median(t)) * 1e3 for name, t in times.items()}
    print(json.dumps({"net": args.net, "batch": args.batch, "threads": args.threads,
                      **{f"{name}_ms": round(m, 2) for name, m in med.items()},
                      "toolkit_over_ort": round(med["toolkit"] / med["ort"], 3),
                      "toolkit_over_openvino": round(med["toolkit"] / med["openvino"], 3),
                      "max_diff": diffs, "openvino": ov.__version__, "onnxruntime": ort.__version__,
                      "load_before": load_before, "load_after": load_average()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
