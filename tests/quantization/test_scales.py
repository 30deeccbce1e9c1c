"""Scale and zero point of a range, held to ONNX Runtime's own compute_scale_zp on many
ranges, the degenerate ones too (an empty range, all positive, all negative, tiny, huge)."""
from __future__ import annotations

import numpy as np
import pytest

from toolkit.errors import UserError
from toolkit.quantization.scales import qrange, scale_zero_point, scales_of

quant_utils = pytest.importorskip("onnxruntime.quantization.quant_utils")
from onnx import TensorProto  # noqa: E402  (after the skip: onnx comes with onnxruntime)

ONNX_TYPE = {"uint8": TensorProto.UINT8, "int8": TensorProto.INT8}


def ort(rmin, rmax, dtype, symmetric):
    qmin, qmax = quant_utils.get_qmin_qmax_for_qType(ONNX_TYPE[dtype], symmetric=symmetric)
    zp, scale = quant_utils.compute_scale_zp(np.array(rmin, np.float32), np.array(rmax, np.float32),
                                             qmin, qmax, symmetric)
    assert scale.dtype == np.float32
    return float(scale), int(zp)


def ranges():
    rng = np.random.default_rng(7)
    fixed = [(0.0, 0.0), (3.0, 3.0), (-2.0, -2.0), (0.5, 7.25), (-9.0, -0.125), (-1.0, 1.0), (-1.0, 3.0),
             (-3.0, 1.0), (1e-30, 1e-30), (-1e-38, 1e-38), (0.0, 1e-40), (-1e-45, 0.0), (1e-7, 2e-7),
             (-3e38, 3e38), (-0.0, 0.0), (-6.0, 255.0), (-1e-3, 100.0), (0.0, 255.0), (-127.0, 127.0)]
    drawn = []
    for _ in range(400):
        a, b = np.sort(rng.normal(0, 10.0 ** rng.integers(-6, 6), 2)).astype(np.float32)
        drawn.append((float(a), float(b)))
    return fixed + drawn


@pytest.mark.parametrize("dtype,symmetric", [("uint8", False), ("int8", True), ("int8", False), ("uint8", True)])
def test_scale_and_zero_point_equal_onnx_runtimes_on_many_ranges(dtype, symmetric):
    for rmin, rmax in ranges():
        got = scale_zero_point(rmin, rmax, dtype, symmetric)
        assert got == ort(rmin, rmax, dtype, symmetric), (rmin, rmax)
        assert isinstance(got[1], int)
        qmin, qmax = qrange(dtype, symmetric)
        assert qmin <= got[1] <= qmax


def test_the_defaults_are_uint8_asymmetric_and_int8_symmetric():
    assert scale_zero_point(-1.0, 3.0) == ort(-1.0, 3.0, "uint8", False)
    scale, zp = scale_zero_point(-1.0, 3.0, "int8")
    assert (scale, zp) == ort(-1.0, 3.0, "int8", True) and zp == 0 and scale == np.float32(3.0 / 127)
    # the brief's formulas, by hand: rmin forced to 0 for an all-positive range
    scale, zp = scale_zero_point(2.0, 10.0)
    assert scale == np.float32(10.0 / 255) and zp == 0
    scale, zp = scale_zero_point(-10.0, -2.0)
    assert scale == np.float32(10.0 / 255) and zp == 255
    assert scale_zero_point(0.0, 0.0) == (1.0, 0) and scale_zero_point(0.0, 0.0, "int8") == (1.0, 0)
    assert scales_of({"a": (-1.0, 3.0), "b": (0.0, 0.0)}) == {"a": ort(-1.0, 3.0, "uint8", False), "b": (1.0, 0)}


@pytest.mark.parametrize("rmin,rmax,dtype,said", [
    (float("nan"), 1.0, "uint8", "not finite"), (0.0, float("inf"), "uint8", "not finite"),
    (2.0, 1.0, "uint8", "above its maximum"), (0.0, 1.0, "int4", "not one of uint8, int8")])
def test_a_bad_range_or_dtype_is_one_line(rmin, rmax, dtype, said):
    with pytest.raises(UserError, match=said) as caught:
        scale_zero_point(rmin, rmax, dtype)
    assert "\n" not in str(caught.value)


def test_the_net_files_section_holds_each_scale_exactly_and_passes_its_schema():
    import yaml

    from schemas.quantization import QuantizationSpec
    from toolkit.quantization.scales import quantization_section
    ranges = {"data": (0.0, 1.0), "conv1": (0.0, 3.4478285), "ip2": (-16.56165, 23.959057)}
    section = quantization_section(ranges, calibration={"method": "minmax", "examples": 256, "data": "d.csv"})
    read = yaml.safe_load(yaml.safe_dump({"quantization": section}))["quantization"]
    spec = QuantizationSpec.model_validate(read)
    for name, (lo, hi) in ranges.items():
        scale, zero_point = ort(lo, hi, "uint8", False)
        given = spec.activations[name]
        assert np.float32(given.scale) == np.float32(scale) and given.scale == scale
        assert (given.zero_point, given.dtype) == (zero_point, "uint8")
    assert spec.calibration.method == "minmax" and spec.calibration.examples == 256
    assert quantization_section({"x": (-1.0, 2.0)}, "int8")["activations"]["x"] == {
        "scale": float(np.float32(2.0 / 127)), "zero_point": 0, "dtype": "int8"}
