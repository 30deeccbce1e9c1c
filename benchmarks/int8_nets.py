#!/usr/bin/env python
"""int8 beside float32 on the real-size nets: the toolkit's `toolkit quantize` model against ONNX
Runtime's `quantize_static` (and OpenVINO's reading of that int8 model, where the `openvino`
package is installed), on the published Caffe deploy files with stand-in weights, one thread.

    python benchmarks/int8_nets.py [--net resnet50 ...] [--batch 1 --batch 8] [--rounds 4] [--json FILE]

For each net: `toolkit import caffe` of its deploy file; stand-in weights (the ones compare.py
uses); the same 16 calibration inputs (standard normal images) for both quantizers: the toolkit's
`quantize_model` (what `toolkit quantize` runs; default method) and ONNX Runtime's
`quantize_static` of `toolkit export onnx`'s float model (QDQ, per-channel weights, its default
calibration). Before timing, each int8 model is checked against its own float32 model on the
timed batch: top-1 agreement and the largest difference of a probability. The stand-in weights
give near-uniform class probabilities, so the agreement is weak evidence of accuracy; it shows
that the int8 nets compute the float nets' function, not that they keep a trained net's top-1.
Timing rounds are interleaved as in compare.py; the table gives medians over every timed call.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CALIBRATION_EXAMPLES = 16
FRAMEWORKS = ("toolkit_fp32", "toolkit_int8", "ort_fp32", "ort_int8", "openvino_fp32", "openvino_int8")


def parse_args(argv=None) -> argparse.Namespace:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from real_nets import NETS
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--net", action="append", choices=list(NETS), help="default: all, ResNet-50 and MobileNet v2 first")
    p.add_argument("--batch", action="append", type=int, help="default: 1 and 8")
    p.add_argument("--iters", type=int, default=8, help="timed calls per framework over all rounds")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--json", metavar="FILE", help="write every row's figures here")
    args = p.parse_args(argv)
    order = ["resnet50", "mobilenet_v2", "mobilenet_v1", "squeezenet1.1", "googlenet", "alexnet"]
    args.net = args.net or order
    args.batch = args.batch or [1, 8]
    args.nets = NETS
    return args


def agreement(fp32, int8) -> dict:
    """Top-1 agreement of two [N, classes...] probability outputs and their largest difference."""
    import numpy as np
    a = np.asarray(fp32, np.float64).reshape(len(fp32), -1)
    b = np.asarray(int8, np.float64).reshape(len(int8), -1)
    return {"top1_agree": int((a.argmax(1) == b.argmax(1)).sum()), "of": len(a),
            "max_prob_diff": float(np.abs(a - b).max()), "max_prob": float(a.max())}


class Calibration:
    """ONNX Runtime's calibration reader over the same examples the toolkit calibrates on."""

    def __init__(self, name: str, examples):
        self.rows = iter([{name: examples[i:i + 1]} for i in range(len(examples))])

    def get_next(self):
        return next(self.rows, None)


def ort_session(model_path: Path):
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(model_path), opts, providers=["CPUExecutionProvider"])


def openvino_model(model_path: Path, input_name: str, shape: list[int]):
    """OpenVINO's compiled model of an ONNX file at a fixed shape on one thread, or None where the
    package is not installed. An int8 QDQ file runs as int8: OpenVINO turns its QuantizeLinear /
    DequantizeLinear pairs into its own quantized operations."""
    try:
        import openvino as ov
    except ImportError:
        return None
    core = ov.Core()
    model = core.read_model(str(model_path))
    model.reshape({input_name: shape})
    return core.compile_model(model, "CPU", {"INFERENCE_NUM_THREADS": 1, "NUM_STREAMS": 1,
                                             "INFERENCE_PRECISION_HINT": "f32"})


def prepare(name: str, args, tmp: Path) -> dict:
    """Imports, quantizes and exports one net; returns what the rows of its batches need."""
    import numpy as np
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    from toolkit.benchmarking import stand_in_weights
    from toolkit.exporters.onnx_graph import export_graph
    from toolkit.quantization.model import quantize_model
    from toolkit.weights import save_weights
    from toolkit.zoo.resolve import load_net

    folder = tmp / name
    subprocess.run([sys.executable, "-m", "toolkit.cli", "import", "caffe",
                    str(ROOT / "tests" / "data" / "caffe" / args.nets[name]), "--out", str(folder)],
                   cwd=ROOT, check=True, capture_output=True)
    net = load_net(str(folder / "net.yaml"))
    weights = stand_in_weights(net.init_weights(seed=0), 0)
    save_weights(str(folder / "float.safetensors"), weights)
    graph = net.graph("infer", "float32")
    (input_name, value), = [(k, v) for k, v in graph.inputs.items() if not k.startswith("@")]
    image = [d for d in value.shape[1:]]
    rng = np.random.default_rng(0)
    examples = rng.standard_normal([CALIBRATION_EXAMPLES, *image]).astype(np.float32)
    quantize_model(net, folder / "float.safetensors", {input_name: examples}, folder / "int8",
                   data_name="random normal images", max_examples=CALIBRATION_EXAMPLES)
    qnet = load_net(str(folder / "int8" / "net.yaml"))
    qweights = qnet.load_weights(str(folder / "int8" / "model.safetensors"))

    fp32_onnx, int8_onnx = folder / "fp32.onnx", folder / "int8.onnx"
    model = export_graph(graph, weights, net.name)
    onnx_input = model.graph.input[0].name
    fp32_onnx.write_bytes(model.SerializeToString())
    # the probabilities stay float, as the toolkit keeps its softmax: quantize_static's default
    # quantizes the Softmax's output too, and near-uniform probabilities all round to zero there
    softmax = [node.name for node in model.graph.node if node.op_type == "Softmax"]
    quantize_static(str(fp32_onnx), str(int8_onnx), Calibration(onnx_input, examples), quant_format=QuantFormat.QDQ,
                    per_channel=True, activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                    nodes_to_exclude=softmax)
    return {"net": net, "weights": weights, "qnet": qnet, "qweights": qweights, "input": input_name,
            "image": image, "onnx_input": onnx_input, "fp32_onnx": fp32_onnx, "int8_onnx": int8_onnx}


def toolkit_plan(net, weights, batch):
    from toolkit.compile import forward_graph
    from toolkit.runtime.plan import Plan
    from toolkit.runtime.session import batch_bindings
    frozen = {k: v.copy() for k, v in weights.items()}
    graph = forward_graph(net, "infer", weights=frozen)
    return Plan(graph, batch_bindings(graph, batch), {k: frozen[k] for k in graph.weights}), list(graph.outputs)[-1]


def row(prepared: dict, batch: int, args) -> dict:
    """One net at one batch: outputs checked, then interleaved timing."""
    import numpy as np
    from compare import QuietWaiter, stats, time_interleaved
    rng = np.random.default_rng(batch)
    x = rng.standard_normal([batch, *prepared["image"]]).astype(np.float32)
    name = prepared["input"]
    fns, outs = {}, {}
    for fw, (net, weights) in {"toolkit_fp32": (prepared["net"], prepared["weights"]),
                               "toolkit_int8": (prepared["qnet"], prepared["qweights"])}.items():
        plan, out = toolkit_plan(net, weights, batch)
        fns[fw] = (lambda plan=plan: plan.run({name: x}))
        outs[fw] = np.array(plan.run({name: x})[out])
    for fw, path in {"ort_fp32": prepared["fp32_onnx"], "ort_int8": prepared["int8_onnx"]}.items():
        sess = ort_session(path)
        feed = {sess.get_inputs()[0].name: x}
        fns[fw] = (lambda sess=sess, feed=feed: sess.run(None, feed))
        outs[fw] = sess.run(None, feed)[-1]
    for fw, path in {"openvino_fp32": prepared["fp32_onnx"], "openvino_int8": prepared["int8_onnx"]}.items():
        try:
            compiled = openvino_model(path, prepared["onnx_input"], [batch, *prepared["image"]])
        except RuntimeError as e:          # OpenVINO's own transformations refuse some QDQ graphs
            print(f"{fw} left out: {str(e).strip().splitlines()[-1][:300]}", file=sys.stderr)
            continue
        if compiled is None:
            continue
        request = compiled.create_infer_request()
        fns[fw] = (lambda request=request: request.infer({0: x}))
        outs[fw] = np.array(request.infer({0: x})[compiled.outputs[-1]])
    checks = {"toolkit": agreement(outs["toolkit_fp32"], outs["toolkit_int8"]),
              "ort": agreement(outs["ort_fp32"], outs["ort_int8"]),
              "toolkit_fp32_vs_ort_fp32": float(np.abs(outs["toolkit_fp32"].reshape(batch, -1)
                                                       - outs["ort_fp32"].reshape(batch, -1)).max())}
    if "openvino_fp32" in outs and "openvino_int8" in outs:
        checks["openvino"] = agreement(outs["openvino_fp32"], outs["openvino_int8"])
    print(json.dumps({"batch": batch, "checks": checks}), file=sys.stderr, flush=True)
    times, others = time_interleaved(fns, args.iters, args.rounds, args.warmup, QuietWaiter(0), turn_gap=0.1)
    return {"batch": batch, "checks": checks, "others_cpu": others,
            **{f"{fw}_ms": stats(t, batch)["median_ms"] for fw, t in times.items()}}


def table(rows: list[dict]) -> str:
    cols = [fw for fw in FRAMEWORKS if any(f"{fw}_ms" in r for r in rows)]
    head = {"toolkit_fp32": "toolkit fp32", "toolkit_int8": "toolkit int8", "ort_fp32": "ORT fp32",
            "ort_int8": "ORT int8", "openvino_fp32": "OpenVINO fp32", "openvino_int8": "OpenVINO int8"}
    lines = ["| net | batch | " + " | ".join(f"{head[c]} ms" for c in cols)
             + " | toolkit int8 / fp32 | toolkit int8 / ORT int8 | top-1 agree toolkit, ORT "
               "| largest prob diff (of top prob) toolkit, ORT | other load |",
             "|---|--:|" + "--:|" * len(cols) + "--:|--:|---|---|--:|"]
    for r in rows:
        t, o = r["checks"]["toolkit"], r["checks"]["ort"]
        times = [f"{r[c + '_ms']:.1f}" if c + "_ms" in r else "-" for c in cols]
        lines.append(f"| {r['net']} | {r['batch']} | " + " | ".join(times)
                     + f" | {r['toolkit_int8_ms'] / r['toolkit_fp32_ms']:.2f}"
                     + f" | {r['toolkit_int8_ms'] / r['ort_int8_ms']:.2f}"
                     + f" | {t['top1_agree']}/{t['of']}, {o['top1_agree']}/{o['of']}"
                     + f" | {100 * t['max_prob_diff'] / t['max_prob']:.1f}%,"
                     + f" {100 * o['max_prob_diff'] / o['max_prob']:.1f}%"
                     + f" | {100 * (r['others_cpu'] or 0):.0f}% |")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    from compare import cpu_name, pin_threads
    pin_threads(1)
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("TOOLKIT_THREADS", "1")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.net:
            prepared = prepare(name, args, Path(tmp))
            for batch in args.batch:
                r = {"net": name, **row(prepared, batch, args)}
                rows.append(r)
                print(json.dumps(r), file=sys.stderr, flush=True)
    try:
        import openvino
        ov_text = f"OpenVINO {openvino.__version__}"
    except ImportError:
        ov_text = "OpenVINO not installed (left out)"
    import onnxruntime
    print(f"CPU: {cpu_name()}, 1 thread for every framework; ONNX Runtime {onnxruntime.__version__}; {ov_text}\n")
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
