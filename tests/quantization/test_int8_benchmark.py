"""benchmarks/int8_nets.py, the int8 rows beside float32 against ONNX Runtime's quantize_static:
its agreement figures, and one small real net prepared and checked end to end (SqueezeNet 1.1 at
batch 2, one timed call each)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]


def _script():
    sys.path.insert(0, str(ROOT / "benchmarks"))       # the script imports compare.py and real_nets.py
    spec = importlib.util.spec_from_file_location("int8_nets", ROOT / "benchmarks" / "int8_nets.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_agreement_counts_top1_matches_and_the_largest_probability_difference():
    fp32 = np.array([[0.1, 0.7, 0.2], [0.5, 0.3, 0.2], [0.2, 0.2, 0.6]], np.float32)
    int8 = np.array([[0.1, 0.6, 0.3], [0.3, 0.45, 0.25], [0.2, 0.2, 0.6]], np.float32)
    found = _script().agreement(fp32[:, :, None, None], int8)     # SqueezeNet's [N, C, 1, 1] reads as [N, C]
    assert (found["top1_agree"], found["of"]) == (2, 3)
    assert found["max_prob_diff"] == pytest.approx(0.2, abs=1e-6)


def test_squeezenet_int8_rows_agree_with_float32_and_onnx_runtime_keeps_its_softmax_float(tmp_path):
    pytest.importorskip("onnxruntime")
    import onnx
    script = _script()
    args = script.parse_args(["--net", "squeezenet1.1", "--batch", "2", "--iters", "1", "--rounds", "1",
                              "--warmup", "0"])
    prepared = script.prepare("squeezenet1.1", args, tmp_path)
    int8 = onnx.load(str(prepared["int8_onnx"]))
    ops = [node.op_type for node in int8.graph.node]
    assert ops.count("QuantizeLinear") > 20                 # ORT's QDQ model: quantized throughout
    after_softmax = ops[ops.index("Softmax") + 1:]
    assert "QuantizeLinear" not in after_softmax            # but its probabilities stay float
    row = script.row(prepared, 2, args)
    checks = row["checks"]
    assert checks["toolkit_fp32_vs_ort_fp32"] < 1e-6        # the two float32 nets are the same net
    assert checks["toolkit"]["top1_agree"] == 2 and checks["ort"]["top1_agree"] == 2
    # near-uniform probabilities (about 1e-3) of stand-in weights: int8 within a few percent of them
    assert checks["toolkit"]["max_prob_diff"] < 0.05 * checks["toolkit"]["max_prob"]
    assert checks["ort"]["max_prob_diff"] < 0.05 * checks["ort"]["max_prob"]
    assert row["toolkit_int8_ms"] > 0 and row["ort_int8_ms"] > 0
