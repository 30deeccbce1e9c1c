"""``toolkit quantize`` and ``toolkit.quantize``: zoo:lenet calibrated on its training split
(as `toolkit data` writes it) and scored on its held-out split, which calibration never sees.
The folder is a model folder as any other (infer and toolkit.load take it); its int8 net's
held-out accuracy is within 0.5 points of the float net's; every mistake is one line, exit 2,
and nothing is written. The net's outputs that no layer reads get no scale and are computed in float."""
from __future__ import annotations

import numpy as np
import pytest
import yaml

import toolkit
from tests.train.train_helpers import cli
from toolkit.training.data import load_digits

FLOAT_ACCURACY = 0.9861


@pytest.fixture(scope="module")
def splits(tmp_path_factory):
    folder = tmp_path_factory.mktemp("digits")
    for split in ("train", "test"):
        r = cli("data", "zoo:lenet", "--split", split, "--out", folder / f"{split}.csv")
        assert r.status == 0, r.err
    table = np.loadtxt(folder / "test.csv", delimiter=",", skiprows=1, dtype=np.float32)
    return folder, table[:, :64].reshape(-1, 1, 8, 8), table[:, 64].astype(np.int64)


def _accuracy(net_file, weights, x, y) -> float:
    return float((toolkit.load(net_file, weights=weights).infer(data=x)["prob"].argmax(axis=1) == y).mean())


def test_the_command_writes_a_model_folder_whose_int8_net_scores_as_the_float_one(splits, tmp_path):
    folder, x, y = splits
    out = tmp_path / "lenet-int8"
    r = cli("quantize", "zoo:lenet", "--calibrate", folder / "train.csv", "--out", out)
    assert r.status == 0, r.err
    assert "7 tops calibrated by mse over 256 examples of train.csv" in r.out
    assert "float layers: prob (softmax: probabilities stay float)" in r.out
    assert sorted(p.name for p in out.iterdir()) == ["model.safetensors", "net.yaml"]
    section = yaml.safe_load((out / "net.yaml").read_text())["quantization"]
    # the output (prob) has no scale: the net's outputs stay float
    assert list(section["activations"]) == ["data", "conv1", "pool1", "conv2", "pool2", "ip1", "ip2"]
    # the input transform scales the pixels to [0, 1]: uint8 steps of 1/255 from zero
    assert section["activations"]["data"] == {"scale": np.float32(1 / 255).item(), "zero_point": 0, "dtype": "uint8"}
    assert section["calibration"] == {"method": "mse", "examples": 256, "data": "train.csv", "dtype": "uint8",
                                      "bias_correction": True, "equalization": True,
                                      "files": [{"file": "train.csv", "rows": 1438}],
                                      "toolkit_version": toolkit.__version__}
    assert section["float"] == [{"layer": "prob", "reason": "softmax: probabilities stay float"}]
    # each int8 convolution and InnerProduct has a correction per output channel
    assert {k: len(v) for k, v in section["bias_correction"].items()} == {"conv1": 16, "conv2": 32, "ip1": 64,
                                                                          "ip2": 10}
    assert "bias correction: 4 convolutions and InnerProducts corrected" in r.out
    # conv1's output channels scaled against conv2's weights, ip1's against ip2's (pool2 to ip1 is a
    # flattening, which equalization does not look through)
    assert section["equalized"] == {"conv1": ["conv2"], "ip1": ["ip2"]}
    assert "equalization: 2 layers' output channels scaled against the weights of the 2 layers that read them" \
        in r.out
    int8 = _accuracy(out / "net.yaml", str(out / "model.safetensors"), x, y)
    float32 = _accuracy("zoo:lenet", None, x, y)
    assert float32 == pytest.approx(FLOAT_ACCURACY, abs=1e-4) and abs(int8 - float32) <= 0.005, (int8, float32)
    r = cli("compile", out / "net.yaml", "--explain")
    assert r.status == 0 and "quantize: conv1: int8: qconv2d + relu, bias corrected, equalized, uint8 in, uint8 out" \
        in r.out, r.out
    r = cli("infer", out / "net.yaml", "--weights", out / "model.safetensors", "--input", folder / "test.csv",
            "--output", tmp_path / "p.csv")
    assert r.status == 0, r.err


@pytest.mark.parametrize("method", ["percentile", "entropy"])
def test_every_method_and_int8_activations_from_python(splits, tmp_path, method):
    folder, x, y = splits
    train_x, train_y = load_digits()
    result = toolkit.quantize("zoo:lenet", calibrate={"data": train_x[:512]}, out=tmp_path / method,
                              method=method, dtype="int8", examples=128)
    section = yaml.safe_load(result.net_file.read_text())["quantization"]
    assert section["calibration"] == {"method": method, "examples": 128, "data": "arrays", "dtype": "int8",
                                      "bias_correction": True, "equalization": True,
                                      "toolkit_version": toolkit.__version__}
    assert all(a["dtype"] == "int8" and a["zero_point"] == 0 for a in section["activations"].values())
    int8 = _accuracy(result.net_file, str(result.weights_file), x, y)
    assert abs(int8 - FLOAT_ACCURACY) <= 0.005, (method, int8)


def test_mistakes_are_one_line_and_write_nothing(splits, tmp_path):
    folder, _, _ = splits
    train = folder / "train.csv"
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    cases = [
        (("--out", taken), f"error: --out {taken}: exists and is not an empty folder; name a new folder\n"),
        (("--out", tmp_path / "a", "--float", "softmax"),
         "error: --float softmax: the net has no layer of that name\n"),
    ]
    for extra, said in cases:
        r = cli("quantize", "zoo:lenet", "--calibrate", train, *extra)
        assert (r.status, r.err) == (2, said)
    assert not (tmp_path / "a").exists() and sorted(p.name for p in taken.iterdir()) == ["notes.txt"]
    done = tmp_path / "done"
    assert cli("quantize", "zoo:lenet", "--calibrate", train, "--out", done, "--examples", "32").status == 0
    r = cli("quantize", done / "net.yaml", "--weights", done / "model.safetensors", "--calibrate", train,
            "--out", tmp_path / "twice")
    assert r.status == 2 and r.err.count("\n") == 1 and "is quantized already" in r.err, r.err
    from safetensors.numpy import load_file
    np.savez(tmp_path / "w.npz", **load_file(done / "model.safetensors"))
    r = cli("quantize", "zoo:lenet", "--weights", tmp_path / "w.npz", "--calibrate", train, "--out", tmp_path / "c")
    assert (r.status, r.err) == (2, f"error: {tmp_path / 'w.npz'}: write the weights as .safetensors to quantize "
                                    "them (a model folder's weights file)\n")
    assert not (tmp_path / "c").exists()
    with pytest.raises(toolkit.UserError, match=r"calibrate='x\.csv': give arrays by input name or an \.npz"):
        toolkit.quantize("zoo:lenet", calibrate="x.csv", out=tmp_path / "b")


# -- the record: what produced a quantized model, in its folder and on its zoo card -------------------
def test_the_zoo_card_of_a_quantized_model_carries_its_calibration(splits, tmp_path):
    import re

    from toolkit import settings
    from toolkit.zoo.card import read_card
    folder, _, _ = splits
    np.savez(tmp_path / "calib.npz", data=np.loadtxt(folder / "train.csv", delimiter=",", skiprows=1,
                                                    dtype=np.float32)[:100, :64].reshape(-1, 1, 8, 8))
    out = tmp_path / "lenet-int8"
    r = cli("quantize", "zoo:lenet", "--calibrate", tmp_path / "calib.npz", "--out", out, "--examples", "64",
            "--method", "percentile", "--dtype", "int8")
    assert r.status == 0, r.err
    record = yaml.safe_load((out / "net.yaml").read_text())["quantization"]["calibration"]
    assert record == {"method": "percentile", "examples": 64, "data": "calib.npz", "dtype": "int8",
                      "bias_correction": True, "equalization": True, "files": [{"file": "calib.npz", "rows": 100}],
                      "toolkit_version": toolkit.__version__}
    zoo = tmp_path / "zoo"
    r = cli("zoo", "publish", out, "--to", zoo, "--name", "lenet-int8", "--licence", "CC0-1.0", "--task", "digits")
    assert r.status == 0, r.err
    card, _ = read_card(zoo / "lenet-int8" / "README.md")
    assert card.calibration.model_dump(exclude_none=True) == record
    assert "\ncalibration:\n  method: percentile\n  examples: 64\n" in (zoo / "lenet-int8" / "README.md").read_text()
    r = cli("zoo", "verify", zoo / "lenet-int8", "--no-test")
    assert r.status == 0, r.out + r.err
    with settings.use(zoo=(str(zoo),)):
        r = cli("zoo", "show", "lenet-int8")
    assert r.status == 0, r.err
    assert re.search(rf"calibration: int8: int8 activations, scales by percentile over 64 examples of calib\.npz "
                     rf"\(100 rows\); toolkit {re.escape(toolkit.__version__)}\n", r.out), r.out
    # a float model's card has no calibration
    r = cli("zoo", "show", "lenet")
    assert r.status == 0 and "calibration:" not in r.out


def test_bench_names_int8_in_its_heading(splits, tmp_path):
    folder, _, _ = splits
    out = tmp_path / "lenet-int8"
    r = cli("quantize", "zoo:lenet", "--calibrate", folder / "train.csv", "--out", out, "--examples", "32")
    assert r.status == 0, r.err
    r = cli("bench", out / "net.yaml", "--weights", out / "model.safetensors", "--batch", "2", "--iters", "2")
    # conv1, pool1, conv2, pool2, ip1 and ip2 run in int8 (relu3 folded into ip1); prob stays float
    assert r.status == 0 and "lenet infer batch 2 on cpu (int8: 6 of 7 layers; float32 elsewhere): median" in r.out, \
        r.out + r.err
    r = cli("bench", out / "net.yaml", "--weights", out / "model.safetensors", "--batch", "2", "--iters", "2",
            "--disable", "quantize")
    assert r.status == 0 and "(float32): median" in r.out, r.out
    r = cli("bench", "zoo:lenet", "--batch", "2", "--iters", "2", "--json")
    assert r.status == 0 and "int8_layers" not in r.out


# -- held-out accuracy of a net with residual adds ------------------------------------------------------
RESNET_FLOAT_ACCURACY = 0.988858


def test_zoo_resnet_int8_scores_as_its_float_net_on_held_out_digits(tmp_path):
    """zoo:resnet (BatchNorm folded, two residual adds, global average pooling) calibrated on its
    training split and scored on its held-out split: every layer but the softmax in int8, the
    accuracy within 0.5 points of the float net's."""
    for split in ("train", "test"):
        assert cli("data", "zoo:resnet", "--split", split, "--out", tmp_path / f"{split}.csv").status == 0
    table = np.loadtxt(tmp_path / "test.csv", delimiter=",", skiprows=1, dtype=np.float32)
    x, y = table[:, :64].reshape(-1, 1, 8, 8), table[:, 64].astype(np.int64)
    out = tmp_path / "resnet-int8"
    r = cli("quantize", "zoo:resnet", "--calibrate", tmp_path / "train.csv", "--out", out)
    assert r.status == 0, r.err
    r = cli("compile", out / "net.yaml", "--explain")
    assert r.status == 0, r.err
    for line in ("res1: int8: qadd + relu, uint8 + uint8 in, uint8 out", "res2: int8: qadd + relu, uint8 + uint8 in",
                 "pool: int8: qglobal_avg_pool, uint8 in, uint8 out", "res1_relu: int8: folded into res1"):
        assert f"quantize: {line}" in r.out, r.out
    ops_line = next(line for line in r.out.splitlines() if line.startswith("ops:"))
    assert "quantize_linear 1," in ops_line and "dequantize_linear" not in ops_line, ops_line
    int8 = _accuracy(out / "net.yaml", str(out / "model.safetensors"), x, y)
    float32 = _accuracy("zoo:resnet", None, x, y)
    assert float32 == pytest.approx(RESNET_FLOAT_ACCURACY, abs=1e-4) and abs(int8 - float32) <= 0.005, (int8, float32)


def test_toolkit_test_of_a_quantized_model_scores_the_int8_net(splits, tmp_path):
    """The test phase is quantized too: its loss is the int8 net's (the mean -log of the infer
    phase's int8 probabilities of the true digits), not the float net's, so a published card's
    metric is the int8 model's."""
    import json
    folder, x, y = splits
    out = tmp_path / "lenet-int8"
    # minmax without equalization, so that the int8 net's loss is clearly another than the float net's
    # (with the defaults, LeNet's int8 loss is within 1e-4 of the float loss)
    r = cli("quantize", "zoo:lenet", "--calibrate", folder / "train.csv", "--out", out, "--examples", "64",
            "--method", "minmax", "--no-equalize")
    assert r.status == 0, r.err
    r = cli("test", out / "net.yaml", "--weights", out / "model.safetensors")
    assert r.status == 0, r.err
    int8 = json.loads(r.out)
    float32 = json.loads(cli("test", "zoo:lenet").out)
    prob = toolkit.load(out / "net.yaml", weights=str(out / "model.safetensors")).infer(data=x)["prob"]
    loss = float(-np.log(prob[np.arange(len(y)), y].astype(np.float64)).mean())
    assert int8["loss"] == pytest.approx(loss, abs=2e-6) and abs(int8["loss"] - float32["loss"]) > 1e-4, \
        (int8, float32, loss)
    assert int8["accuracy"] == pytest.approx(float((prob.argmax(axis=1) == y).mean()), abs=1e-6)
    r = cli("compile", out / "net.yaml", "--phase", "test", "--explain")
    assert r.status == 0 and "quantize: conv1: int8: qconv2d + relu, bias corrected, uint8 in, uint8 out" in r.out, \
        r.out


# -- the net's outputs stay float ----------------------------------------------------------------------

POOLED = """name: pooled
inputs:
  data: {shape: [N, 2, 4, 4], dtype: float32}
layers:
  - {name: conv1, type: Convolution, bottom: data, top: conv1, num_output: 3, kernel_size: 1}
  - {name: relu1, type: ReLU, bottom: conv1, top: conv1}
  - {name: pool, type: Pooling, bottom: conv1, top: pool, pool: ave, global_pooling: true}
outputs: [pool]
"""


def test_the_nets_output_gets_no_scale_and_is_computed_in_float(tmp_path):
    """The output (a global average pooling no layer reads) is not rounded to 8 bits: it has no
    scale, the pooling runs in float on the convolution's float32 output, and the int8 net's output
    is the float one's up to the convolution's own rounding (its input and weights)."""
    net_file = tmp_path / "net.yaml"
    net_file.write_text(POOLED)
    rng = np.random.default_rng(5)
    from safetensors.numpy import save_file
    save_file({"conv1.weight": rng.normal(0, 1, (3, 2, 1, 1)).astype(np.float32),
               "conv1.bias": np.float32([0.5, 1.0, 2.0])}, str(tmp_path / "w.safetensors"))
    calibrate = {"data": rng.uniform(0, 1, (32, 2, 4, 4)).astype(np.float32)}
    r = toolkit.quantize(str(net_file), weights=tmp_path / "w.safetensors", calibrate=calibrate, out=tmp_path / "q")
    section = yaml.safe_load(r.net_file.read_text())["quantization"]
    assert list(section["activations"]) == ["data", "conv1"]
    explained = cli("compile", r.net_file, "--explain").out
    assert "quantize: conv1: int8: qconv2d + relu, bias corrected, uint8 in, float32 out" in explained, explained
    assert "quantize: pool: float: no scale for its output" in explained, explained
