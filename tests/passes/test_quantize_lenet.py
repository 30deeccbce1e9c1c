"""zoo:lenet quantized end to end: scales from min/max over the training split (computed here, in
numpy, through the float net's tops), written into the net's quantization section; the int8
net's held-out accuracy within 0.5 points of the fp32 net's (0.9861), and ``toolkit compile
--explain`` saying which layers became int8."""
from __future__ import annotations

import numpy as np
import pytest

from toolkit.cli import main
from toolkit.compile import forward_graph
from toolkit.runtime.plan import Plan
from toolkit.training.feeding import load_data, train_spec
from toolkit.zoo.resolve import load_net

TOPS = ("data", "conv1", "pool1", "conv2", "pool2", "ip1", "ip2")


def uint8_scale(lo: float, hi: float) -> tuple[float, int]:
    """ONNX Runtime's compute_scale_zp for uint8: the range widened to hold 0."""
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    if hi == lo:
        return 1.0, 0
    scale = (hi - lo) / 255
    return scale, int(np.clip(np.rint(-lo / scale), 0, 255))


def run(net, weights, x, outputs=None) -> dict:
    graph = forward_graph(net, "infer", outputs=outputs, weights=dict(weights))
    return {k: np.array(v) for k, v in Plan(graph, {"N": len(x)}, {}).run({"data": x}).items()}


@pytest.fixture(scope="module")
def lenet(tmp_path_factory):
    fp32 = load_net("zoo:lenet")
    weights = fp32.load_weights(fp32.weights_or_published(None))
    train, test = load_data(fp32, train_spec(fp32))
    tops = run(fp32, weights, train.arrays["data"], list(TOPS))
    lines = ["quantization:", "  activations:"]
    for top in TOPS:
        scale, zero_point = uint8_scale(float(tops[top].min()), float(tops[top].max()))
        lines.append(f"    {top}: {{scale: {scale!r}, zero_point: {zero_point}}}")
    lines += ["  float: [{layer: prob, reason: softmax}]",
              f"  calibration: {{method: minmax, examples: {len(train)}, data: 'builtin:digits train split'}}"]
    with open(fp32.file) as f:
        text = f.read() + "\n".join(lines) + "\n"
    path = tmp_path_factory.mktemp("lenet") / "lenet_int8.yaml"
    path.write_text(text)
    int8 = load_net(str(path))
    return fp32, int8, weights, test, path


def probabilities(net, weights, test) -> np.ndarray:
    return run(net, weights, test.arrays["data"])["prob"]


def test_the_int8_lenet_is_within_half_a_point_of_fp32(lenet):
    fp32, int8, weights, test, _ = lenet
    graph = forward_graph(int8, "infer", weights=dict(weights))
    ops = [n.op for n in graph.nodes]
    assert ops.count("qconv2d") == 2 and ops.count("qgemm") == 2 and "conv2d" not in ops
    # uint8 from the input to the last InnerProduct: quantized once, never dequantized
    assert ops.count("quantize_linear") == 1 and "dequantize_linear" not in ops
    float_prob, int8_prob = probabilities(fp32, weights, test), probabilities(int8, weights, test)
    gap = float(np.abs(float_prob - int8_prob).max())
    float_top1, int8_top1 = float_prob.argmax(axis=1), int8_prob.argmax(axis=1)
    float_acc, int8_acc = (float(np.mean(p == test.arrays["label"])) for p in (float_top1, int8_top1))
    print(f"held-out accuracy ({len(test)} digits): fp32 {float_acc:.4f}, int8 {int8_acc:.4f}, "
          f"top-1 agreement {np.mean(float_top1 == int8_top1):.4f}, largest probability difference {gap:.4f}")
    assert 0 < gap < 0.1                  # quantized (not the float net again), and close
    assert round(float_acc, 4) == 0.9861
    assert abs(int8_acc - float_acc) <= 0.005


def test_compile_explain_says_which_layers_became_int8(lenet, capsys):
    fp32, _, _, _, path = lenet
    assert main(["compile", str(path), "--weights", fp32.weights_or_published(None), "--explain"]) in (0, None)
    out = capsys.readouterr().out
    said = [line.strip() for line in out.splitlines() if line.strip().startswith("quantize: ")]
    assert said == [
        "quantize: conv1: int8: qconv2d + relu, uint8 in, uint8 out",
        "quantize: pool1: int8: max_pool2d on uint8 (commutes with quantization: keeps its input's scale)",
        "quantize: conv2: int8: qconv2d + relu, uint8 in, uint8 out",
        "quantize: pool2: int8: max_pool2d on uint8 (commutes with quantization: keeps its input's scale)",
        "quantize: ip1: int8: qgemm + add + relu, uint8 in, uint8 out",
        "quantize: relu3: int8: folded into ip1",
        "quantize: ip2: int8: qgemm + add, uint8 in, float32 out (no quantized layer reads it)",
        "quantize: prob: float: listed float: softmax"], out
