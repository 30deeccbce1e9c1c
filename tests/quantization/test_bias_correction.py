"""Bias correction (toolkit/quantization/bias.py and the quantize pass's use of it): a hand-built
convolution and InnerProduct whose int8 weights each round down by 0.4 of a step, so that the
mean error of their int8 outputs is a known amount per output channel, computed here in numpy;
with the correction the int8 outputs' mean error over the calibration data is gone (to within the
int32 bias's rounding), without it it is the known amount. Inputs are integers 0..255, which
uint8 holds exactly at minmax's scale 1, so that all the error is the weights'. Then the option:
``--no-bias-correction`` leaves the record false and the section without corrections, the
explain line says which layers were corrected, and a correction of the wrong length is one line."""
from __future__ import annotations

import numpy as np
import pytest
import yaml
from safetensors.numpy import save_file

import toolkit
from tests.train.train_helpers import cli
from toolkit.quantization.model import quantize_model
from toolkit.zoo.resolve import load_net

NET = """name: corrected
inputs:
  data: {shape: [N, 2, 5, 5], dtype: float32}
layers:
  - {name: conv1, type: Convolution, bottom: data, top: conv1, num_output: 3, kernel_size: 3, pad: 1}
outputs: [conv1]
"""
IP_NET = """name: corrected_ip
inputs:
  data: {shape: [N, 6], dtype: float32}
layers:
  - {name: ip1, type: InnerProduct, bottom: data, top: ip1, num_output: 4, bias_term: false}
outputs: [ip1]
"""


def rounding_down(shape, seed) -> tuple[np.ndarray, np.ndarray]:
    """Weights whose per-channel int8 form is each weight 0.4 of a step lower (one weight a row
    at the peak, 127 steps, exact): (weights, the error per weight, weights minus their int8 form)."""
    rng = np.random.default_rng(seed)
    steps = rng.uniform(0.002, 0.02, shape[0])
    w = rng.integers(-100, 100, shape).astype(np.float64) + 0.4
    rows = w.reshape(shape[0], -1)
    rows[:, 0] = 127.0                                     # the peak: exactly representable
    error = np.where(np.arange(rows.shape[1]) == 0, 0.0, 0.4)[None, :] * steps[:, None]
    return (rows * steps[:, None]).reshape(shape).astype(np.float32), error.reshape(shape)


def pixels(shape, seed) -> np.ndarray:
    """Integers 0..255 with 0 and 255 present: minmax's uint8 scale is 1, each value exact. Each
    channel has another mean, so the error differs from channel to channel."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, shape).astype(np.float64)
    if len(shape) == 4:
        x[:, 1] = np.minimum(x[:, 1] + 100, 255)
    flat = x.reshape(len(x), -1)
    flat[0, 0], flat[0, 1] = 0, 255
    return x.astype(np.float32)


def conv_pad1(x, w):
    """3x3, pad 1, in float64, by explicit windows."""
    n, c, h, wd = x.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    y = np.zeros((n, w.shape[0], h, wd))
    for i in range(3):
        for j in range(3):
            y += np.einsum("nchw,oc->nohw", xp[:, :, i:i + h, j:j + wd], w[:, :, i, j].astype(np.float64))
    return y


@pytest.fixture
def conv_model(tmp_path):
    net_file = tmp_path / "net.yaml"
    net_file.write_text(NET)
    w, error = rounding_down((3, 2, 3, 3), 1)
    bias = np.float32([0.5, -1.0, 2.0])
    save_file({"conv1.weight": w, "conv1.bias": bias}, str(tmp_path / "w.safetensors"))
    return net_file, tmp_path / "w.safetensors", w, bias, error


def quantized_output(net_file, weights, x, out, corrected: bool):
    model = quantize_model(load_net(str(net_file)), weights, {"data": x}, out, data_name="arrays",
                           max_examples=len(x), bias_correction=corrected)
    section = yaml.safe_load(model.net_file.read_text())["quantization"]
    y = toolkit.load(model.net_file, weights=str(model.weights_file)).infer(data=x)
    return next(iter(y.values())).astype(np.float64), section


def test_a_convolutions_known_mean_error_is_removed_through_its_bias(conv_model, tmp_path):
    net_file, weights, w, bias, error = conv_model
    x = pixels((40, 2, 5, 5), 2)
    float32 = conv_pad1(x, w) + bias[None, :, None, None]
    # what the int8 weights lose, per output channel, on these inputs (padding included)
    known = conv_pad1(x, error).mean(axis=(0, 2, 3))
    assert np.all(np.abs(known) > 1.0)

    plain, section = quantized_output(net_file, weights, x, tmp_path / "plain", corrected=False)
    assert section["calibration"]["bias_correction"] is False and "bias_correction" not in section
    assert section["activations"]["data"]["scale"] == 1.0
    np.testing.assert_allclose((float32 - plain).mean(axis=(0, 2, 3)), known, rtol=1e-3)

    fixed, section = quantized_output(net_file, weights, x, tmp_path / "fixed", corrected=True)
    assert section["calibration"]["bias_correction"] is True
    np.testing.assert_allclose(section["bias_correction"]["conv1"], known, rtol=1e-5)
    # what is left: the int32 bias's rounding, at most half a step of 1 x the channel's weight step
    steps = np.abs(w).reshape(3, -1).max(axis=1) / 127
    left = np.abs((float32 - fixed).mean(axis=(0, 2, 3)))
    assert np.all(left <= steps / 2 + 1e-4), (left, known)


def test_an_inner_product_without_a_bias_is_given_one(tmp_path):
    net_file = tmp_path / "ip.yaml"
    net_file.write_text(IP_NET)
    w, error = rounding_down((4, 6), 3)
    save_file({"ip1.weight": w}, str(tmp_path / "w.safetensors"))
    x = pixels((64, 6), 4)
    float32 = x.astype(np.float64) @ w.T.astype(np.float64)
    known = (x.astype(np.float64) @ error.T).mean(axis=0)
    plain, _ = quantized_output(net_file, tmp_path / "w.safetensors", x, tmp_path / "plain", corrected=False)
    np.testing.assert_allclose((float32 - plain).mean(axis=0), known, rtol=1e-3)
    fixed, section = quantized_output(net_file, tmp_path / "w.safetensors", x, tmp_path / "fixed", corrected=True)
    np.testing.assert_allclose(section["bias_correction"]["ip1"], known, rtol=1e-5)
    steps = np.abs(w).max(axis=1) / 127
    assert np.all(np.abs((float32 - fixed).mean(axis=0)) <= steps / 2 + 1e-4)


def test_the_option_the_record_and_the_explain_line(conv_model, tmp_path):
    net_file, weights, *_ = conv_model
    np.savez(tmp_path / "calib.npz", data=pixels((16, 2, 5, 5), 5))
    for flag, on in (("--bias-correction", True), ("--no-bias-correction", False)):
        out = tmp_path / flag
        r = cli("quantize", net_file, "--weights", weights, "--calibrate", tmp_path / "calib.npz", "--out", out, flag)
        assert r.status == 0, r.err
        section = yaml.safe_load((out / "net.yaml").read_text())["quantization"]
        assert section["calibration"]["bias_correction"] is on and ("bias_correction" in section) is on
        assert ("bias correction: 1 convolutions and InnerProducts corrected" in r.out) is on
        r = cli("compile", out / "net.yaml", "--weights", out / "model.safetensors", "--explain")
        assert r.status == 0, r.err
        said = "quantize: conv1: int8: qconv2d, bias corrected, uint8 in, float32 out"
        assert (said in r.out) is on and ("quantize: conv1: int8: qconv2d, uint8 in" in r.out) is not on, r.out
    r = cli("quantize", net_file, "--weights", weights, "--calibrate", tmp_path / "calib.npz", "--out",
            tmp_path / "x", "--bias-correction=yes")
    assert r.status == 2 and r.err.count("\n") == 1 and "--bias-correction" in r.err, r.err
    # a correction that does not fit its layer is one line when the net is compiled
    text = (tmp_path / "--bias-correction" / "net.yaml").read_text()
    start = text.index("    conv1: [")
    end = text.index("]", start)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "net.yaml").write_text(text[:start] + "    conv1: [1.0, 2.0" + text[end:])
    r = cli("compile", broken / "net.yaml", "--weights", tmp_path / "--bias-correction" / "model.safetensors")
    assert r.status == 2 and r.err == ("error: quantization.bias_correction.conv1: 2 amounts for a layer "
                                       "of 3 output channels\n"), r.err
    (broken / "net.yaml").write_text(text[:start] + "    conv9: [1.0, 2.0" + text[end:])
    r = cli("compile", broken / "net.yaml")
    assert r.status == 2 and r.err.count("\n") == 1 and "quantization.bias_correction: the infer phase has no " \
        "layer 'conv9'" in r.err, r.err
