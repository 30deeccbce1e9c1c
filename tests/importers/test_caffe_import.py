"""`toolkit import caffe`: real prototxts as their authors published them import to nets whose
parameter counts are the published ones; a net of many Caffe constructs, with a caffemodel
written from known weights, imports and runs to the outputs of a PyTorch reference written out
with Caffe's semantics; problems are reported at their line and column, all in one pass."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.train.train_helpers import cli

DATA = Path(__file__).resolve().parents[1] / "data" / "caffe"
torch = pytest.importorskip("torch", reason="the test extra's torch is the reference")
pytest.importorskip("google.protobuf", reason="the caffe extra (protobuf) reads caffemodels")

# the parameters Caffe and PyTorch count for these nets (running statistics aside)
DEPLOY = [
    ("examples_mnist_lenet.prototxt", 431_080, [10]),
    ("examples_cifar10_cifar10_quick.prototxt", 145_578, [10]),
    ("examples_cifar10_cifar10_full.prototxt", 89_578, [10]),         # LRN within a channel
    ("models_bvlc_alexnet_deploy.prototxt", 60_965_224, [1000]),
    ("models_bvlc_reference_caffenet_deploy.prototxt", 60_965_224, [1000]),
    ("models_bvlc_googlenet_deploy.prototxt", 6_998_552, [1000]),
    ("resnet50_deploy.prototxt", 25_557_096, [1000]),
    ("squeezenet1.0_deploy.prototxt", 1_248_424, [1000, 1, 1]),
    ("squeezenet1.1_deploy.prototxt", 1_235_496, [1000, 1, 1]),
    ("mobilenet_deploy.prototxt", 4_231_976, [1000, 1, 1]),
]


def _imported(tmp_path, *args) -> tuple[object, dict]:
    r = cli("import", "caffe", *args, "--out", tmp_path / "out")
    return r, (yaml.safe_load((tmp_path / "out" / "net.yaml").read_text()) if r.status == 0 else {})


@pytest.mark.parametrize("file, params, classes", DEPLOY, ids=[d[0].split(".prototxt")[0] for d in DEPLOY])
def test_a_published_deploy_net_imports_with_its_parameter_count(tmp_path, file, params, classes):
    r, _net = _imported(tmp_path, DATA / file)
    assert r.status == 0, r.err
    assert f"{params:,} parameters" in r.out
    check = cli("check", tmp_path / "out" / "net.yaml")
    assert check.status == 0, check.err
    assert f"total: {params:,} parameters" in check.out
    assert any("[N, " + ", ".join(map(str, classes)) + "]" in line for line in check.out.splitlines()), check.out


def test_mobilenet_v2_imports_and_checks(tmp_path):
    r, net = _imported(tmp_path, DATA / "mobilenet_v2_deploy.prototxt")
    assert r.status == 0, r.err
    assert cli("check", tmp_path / "out" / "net.yaml").status == 0
    assert sum(1 for layer in net["layers"] if layer["type"] == "Convolution" and layer.get("group")) == 17


TRAIN_VAL = [
    ("examples_mnist_lenet_train_test.prototxt", "data=1,28,28", 431_080),
    ("examples_cifar10_cifar10_quick_train_test.prototxt", "data=3,32,32", 145_578),
    ("examples_cifar10_cifar10_full_train_test.prototxt", "data=3,32,32", 89_578),
    ("models_bvlc_alexnet_train_val.prototxt", "data=3,227,227", 60_965_224),
    ("models_bvlc_reference_caffenet_train_val.prototxt", "data=3,227,227", 60_965_224),
    ("models_bvlc_googlenet_train_val.prototxt", "data=3,224,224", 13_378_280),   # with its two side heads
    ("squeezenet1.0_train_val.prototxt", "data=3,227,227", 1_248_424),
    ("squeezenet1.1_train_val.prototxt", "data=3,227,227", 1_235_496),
]


@pytest.mark.parametrize("file, shape, params", TRAIN_VAL, ids=[t[0].split(".prototxt")[0] for t in TRAIN_VAL])
def test_a_published_train_val_net_imports_with_its_phases(tmp_path, file, shape, params):
    r, net = _imported(tmp_path, DATA / file, "--input-shape", shape)
    assert r.status == 0, r.err
    assert f"{params:,} parameters" in r.out
    assert net["inputs"]["label"] == {"shape": ["N"], "dtype": "int64"}
    phases = {layer["name"]: layer.get("phase") for layer in net["layers"]}
    losses = [layer["name"] for layer in net["layers"] if layer["type"] == "SoftmaxWithLoss"]
    accuracies = [layer["name"] for layer in net["layers"] if layer["type"] == "Accuracy"]
    # losses and accuracies read the label: never in the infer phase; every other layer is
    assert losses and accuracies and all(phases[n] in ("train", "test", ["train", "test"]) for n in losses + accuracies)
    assert all(phases[layer["name"]] is None for layer in net["layers"]
               if layer["type"] not in ("SoftmaxWithLoss", "Accuracy") and not layer["name"].startswith("loss"))
    assert net["train"]["data"]["source"].endswith("_lmdb")  # its LMDB, which train.data reads
    assert cli("check", tmp_path / "out" / "net.yaml").status == 0


def test_a_data_layer_without_its_shape_says_how_to_give_it(tmp_path):
    r = cli("import", "caffe", DATA / "examples_mnist_lenet_train_test.prototxt", "--out", tmp_path / "out")
    assert r.status == 2 and not (tmp_path / "out").exists()
    file = DATA / "examples_mnist_lenet_train_test.prototxt"
    assert r.errors == [f"{file}:2:1: error: layer 'mnist': the shape of what a Data layer reads is in its data; "
                        "give it with --input-shape data=C,H,W",
                        f"{file}:19:1: error: layer 'mnist': the shape of what a Data layer reads is in its data; "
                        "give it with --input-shape data=C,H,W"]


def test_a_solver_becomes_the_train_section(tmp_path):
    r, net = _imported(tmp_path, DATA / "examples_mnist_lenet_train_test.prototxt", "--input-shape", "data=1,28,28",
                       "--solver", DATA / "examples_mnist_lenet_solver.prototxt")
    assert r.status == 0, r.err
    train = net["train"]
    assert train["solver"] == {"type": "sgd", "base_lr": 0.01, "momentum": 0.9, "momentum_convention": "caffe",
                               "weight_decay": 0.0005, "lr_policy": {"type": "inv", "gamma": 0.0001, "power": 0.75}}
    assert (train["max_iter"], train["test_interval"], train["display"], train["snapshot"]) == (10000, 500, 100, 5000)
    assert train["data"]["scale"] == 0.00390625 and train["data"]["batch_size"] == 64


def test_what_cannot_be_expressed_is_reported_at_its_place_all_at_once(tmp_path):
    broken = tmp_path / "broken.prototxt"
    broken.write_text('name: "x"\ninput: "data"\ninput_shape { dim: 1 dim: 3 dim: 4 dim: 4 }\n'
                      'layer { name: "p" type: "Im2col" bottom: "data" top: "p" }\n'
                      'layer { name: "c" type: "Convolution" bottom: "p" top: "c"\n'
                      '  convolution_param { num_output: 2 kernel_size: 1 kernel_size: 1 kernel_size: 1 } }\n')
    r = cli("import", "caffe", broken, "--out", tmp_path / "out")
    assert r.status == 2 and "Traceback" not in r.err and not (tmp_path / "out").exists()
    line = '  convolution_param { num_output: 2 kernel_size: 1 kernel_size: 1 kernel_size: 1 } }'
    assert r.errors == [f"{broken}:4:19: error: layer 'p': the Caffe layer type Im2col has no counterpart here yet",
                        f"{broken}:6:{line.rindex('kernel_size') + 1}: error: kernel_size: only 2-D convolutions "
                        "are expressed here"]
    syntax = tmp_path / "syntax.prototxt"
    syntax.write_text('name: "x"\nlayer {\n  name: "a"\n  type: "ReLU"\n')
    r = cli("import", "caffe", syntax, "--out", tmp_path / "out")
    assert r.errors == [f"{syntax}:2:1: error: '}}' expected before the end of the file (opened here)"]


# -- a round trip through a caffemodel written from known weights --------------------------------

NET = """
name: "constructs"
input: "data"
input_shape { dim: 2 dim: 3 dim: 12 dim: 12 }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  param { lr_mult: 1 } param { lr_mult: 2 }
  convolution_param { num_output: 8 kernel_size: 3 pad: 1 } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" relu_param { negative_slope: 0.1 } }
layer { name: "prelu1" type: "PReLU" bottom: "conv1" top: "conv1" }
layer { name: "mvn1" type: "MVN" bottom: "conv1" top: "conv1" }
layer { name: "bias1" type: "Bias" bottom: "conv1" top: "conv1" }
layer { name: "bn1" type: "BatchNorm" bottom: "conv1" top: "conv1" batch_norm_param { use_global_stats: true } }
layer { name: "scale1" type: "Scale" bottom: "conv1" top: "conv1" scale_param { bias_term: true } }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1"
  pooling_param { pool: MAX kernel_size: 3 stride: 2 } }          # Caffe rounds up: 6 x 6, not 5 x 5
layer { name: "conv2" type: "Convolution" bottom: "pool1" top: "conv2"
  convolution_param { num_output: 8 kernel_size: 3 pad: 1 group: 2 } }
layer { name: "split" type: "Split" bottom: "conv2" top: "conv2_a" top: "conv2_b" }
layer { name: "sum" type: "Eltwise" bottom: "pool1" bottom: "conv2_a" top: "sum"
  eltwise_param { operation: SUM coeff: 1 coeff: -0.5 } }
layer { name: "silence" type: "Silence" bottom: "conv2_b" }
layer { name: "norm" type: "LRN" bottom: "sum" top: "norm" lrn_param { local_size: 3 alpha: 0.01 beta: 0.75 k: 2 } }
layer { name: "pool2" type: "Pooling" bottom: "norm" top: "pool2" pooling_param { pool: AVE kernel_size: 2 stride: 2 } }
layer { name: "ip1" type: "InnerProduct" bottom: "pool2" top: "ip1" inner_product_param { num_output: 10 } }
layer { name: "bnll" type: "BNLL" bottom: "ip1" top: "soft" }
layer { name: "exp" type: "Exp" bottom: "soft" top: "exp" exp_param { base: 2 scale: 0.5 shift: 0.25 } }
layer { name: "log" type: "Log" bottom: "exp" top: "log" log_param { base: 10 shift: 1 } }
layer { name: "power" type: "Power" bottom: "log" top: "power" power_param { power: 2 scale: 3 shift: 0.5 } }
layer { name: "prob" type: "Softmax" bottom: "power" top: "prob" }
layer { name: "train_only" type: "Dropout" bottom: "prob" top: "dropped" include { phase: TRAIN } }
"""


def _write_caffemodel(path: Path, blobs: dict[str, list[np.ndarray]], v1: bool = False) -> None:
    from toolkit.importers.caffe.proto import classes
    c = classes()
    net = c["NetParameter"](name="constructs")
    for name, arrays in blobs.items():
        layer = net.layers.add(name=name, type=4) if v1 else net.layer.add(name=name, type="unused")
        for a in arrays:
            blob = layer.blobs.add()
            blob.shape.dim.extend(a.shape)
            blob.data.extend(a.astype(np.float32).ravel().tolist())
    path.write_bytes(net.SerializeToString())


def test_a_net_of_caffe_constructs_runs_to_caffes_outputs(tmp_path):
    import torch.nn.functional as F

    import toolkit
    rng = np.random.default_rng(0)
    w = {
        "conv1": [rng.standard_normal((8, 3, 3, 3)) * 0.3, rng.standard_normal(8) * 0.1],
        "prelu1": [rng.random(8) * 0.5],
        "bias1": [rng.standard_normal(8) * 0.2],
        # Caffe's BatchNorm stores sums scaled by a factor: mean / factor, var / factor are the statistics
        "bn1": [rng.standard_normal(8) * 0.5, rng.random(8) * 2 + 0.5, np.array([0.5])],
        "scale1": [rng.random(8) + 0.5, rng.standard_normal(8) * 0.1],
        "conv2": [rng.standard_normal((8, 4, 3, 3)) * 0.3, rng.standard_normal(8) * 0.1],
        "ip1": [rng.standard_normal((10, 72)) * 0.3, rng.standard_normal(10) * 0.1],
        "not_in_the_net": [rng.standard_normal(3)],
    }
    (tmp_path / "net.prototxt").write_text(NET)
    _write_caffemodel(tmp_path / "w.caffemodel", w)
    r = cli("import", "caffe", tmp_path / "net.prototxt", "--weights", tmp_path / "w.caffemodel",
            "--out", tmp_path / "out")
    assert r.status == 0, r.err
    assert "1 layer(s) of" in r.out and "not_in_the_net" in r.out
    net = yaml.safe_load((tmp_path / "out" / "net.yaml").read_text())
    assert next(x for x in net["layers"] if x["name"] == "train_only")["phase"] == "train"
    model = toolkit.load(tmp_path / "out" / "net.yaml", weights=str(tmp_path / "out" / "model.safetensors"))
    x = rng.standard_normal((2, 3, 12, 12)).astype(np.float32)
    got = model.infer(data=x)["prob"]

    t = {k: [torch.tensor(a, dtype=torch.float64) for a in v] for k, v in w.items()}
    h = F.conv2d(torch.tensor(x, dtype=torch.float64), t["conv1"][0], t["conv1"][1], padding=1)
    h = F.leaky_relu(h, 0.1)
    h = F.prelu(h, t["prelu1"][0])
    h = h - h.mean(dim=(2, 3), keepdim=True)
    h = h / (h.pow(2).mean(dim=(2, 3), keepdim=True).sqrt() + 1e-9)
    h = h + t["bias1"][0][None, :, None, None]
    mean, var = t["bn1"][0] / 0.5, t["bn1"][1] / 0.5
    h = (h - mean[None, :, None, None]) / torch.sqrt(var[None, :, None, None] + 1e-5)
    h = h * t["scale1"][0][None, :, None, None] + t["scale1"][1][None, :, None, None]
    pool1 = F.max_pool2d(h, 3, 2, ceil_mode=True)
    assert pool1.shape[-1] == 6
    conv2 = F.conv2d(pool1, t["conv2"][0], t["conv2"][1], padding=1, groups=2)
    s = pool1 - 0.5 * conv2
    norm = F.local_response_norm(s, 3, alpha=0.01, beta=0.75, k=2.0)
    pool2 = F.avg_pool2d(norm, 2, 2, ceil_mode=True)
    ip1 = F.linear(pool2.flatten(1), t["ip1"][0], t["ip1"][1])
    soft = torch.log1p(torch.exp(ip1))
    e = torch.pow(2.0, 0.25 + 0.5 * soft)
    lg = torch.log10(1.0 + e)
    p = (0.5 + 3 * lg) ** 2
    want = torch.softmax(p, dim=1).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_v1_layers_file_with_its_caffemodel(tmp_path):
    """Old Caffe files: `layers` with enum types and blobs_lr, and V1 layers in the caffemodel."""
    import toolkit
    (tmp_path / "v1.prototxt").write_text(
        'name: "old"\ninput: "data"\ninput_dim: 1\ninput_dim: 2\ninput_dim: 5\ninput_dim: 5\n'
        'layers { name: "conv" type: CONVOLUTION bottom: "data" top: "conv" blobs_lr: 1 blobs_lr: 2\n'
        '  convolution_param { num_output: 3 kernel_size: 3 } }\n'
        'layers { name: "relu" type: RELU bottom: "conv" top: "conv" }\n'
        'layers { name: "prob" type: SOFTMAX bottom: "conv" top: "prob" }\n')
    rng = np.random.default_rng(1)
    conv = [rng.standard_normal((3, 2, 3, 3)), rng.standard_normal(3)]
    _write_caffemodel(tmp_path / "v1.caffemodel", {"conv": conv}, v1=True)
    r = cli("import", "caffe", tmp_path / "v1.prototxt", "--weights", tmp_path / "v1.caffemodel",
            "--out", tmp_path / "o")
    assert r.status == 0, r.err
    net = yaml.safe_load((tmp_path / "o" / "net.yaml").read_text())
    assert net["layers"][0]["lr_mult"] == [1, 2] and net["inputs"]["data"]["shape"] == ["N", 2, 5, 5]
    x = rng.standard_normal((1, 2, 5, 5)).astype(np.float32)
    got = toolkit.load(tmp_path / "o" / "net.yaml", weights=str(tmp_path / "o" / "model.safetensors")).infer(data=x)
    ref = torch.softmax(torch.relu(torch.nn.functional.conv2d(torch.tensor(x),
                                                              torch.tensor(conv[0], dtype=torch.float32),
                                                              torch.tensor(conv[1], dtype=torch.float32))), dim=1)
    np.testing.assert_allclose(got["prob"], ref.numpy(), rtol=1e-5, atol=1e-6)


def test_stages_select_layers_as_caffe_does(tmp_path):
    (tmp_path / "s.prototxt").write_text(
        'input: "data"\ninput_shape { dim: 1 dim: 4 }\n'
        'layer { name: "a" type: "ReLU" bottom: "data" top: "a" include { phase: TEST stage: "deploy" } }\n'
        'layer { name: "b" type: "Sigmoid" bottom: "data" top: "b" exclude { stage: "deploy" } }\n'
        'layer { name: "c" type: "TanH" bottom: "data" top: "c" include { not_stage: "deploy" min_level: 0 } }\n')
    r = cli("import", "caffe", tmp_path / "s.prototxt", "--out", tmp_path / "plain")
    assert r.status == 0, r.err
    names = [x["name"] for x in yaml.safe_load((tmp_path / "plain" / "net.yaml").read_text())["layers"]]
    assert names == ["b", "c"]
    r = cli("import", "caffe", tmp_path / "s.prototxt", "--stage", "deploy", "--out", tmp_path / "deploy")
    assert r.status == 0, r.err
    layers = yaml.safe_load((tmp_path / "deploy" / "net.yaml").read_text())["layers"]
    assert [(x["name"], x.get("phase")) for x in layers] == [("a", ["test", "infer"])]


def test_adadelta_sigmoid_l1_and_iter_size_solvers(tmp_path):
    r, net = _imported(tmp_path, DATA / "examples_mnist_lenet_train_test.prototxt", "--input-shape", "data=1,28,28",
                       "--solver", DATA / "examples_mnist_lenet_adadelta_solver.prototxt")
    assert r.status == 0, r.err
    assert net["train"]["solver"] == {"type": "adadelta", "base_lr": 1.0, "rho": 0.95, "weight_decay": 0.0005,
                                      "eps": 1e-6}
    solver = tmp_path / "s.prototxt"
    solver.write_text('base_lr: 0.1\nlr_policy: "sigmoid"\ngamma: -0.01\nstepsize: 100\n'
                      'regularization_type: "L1"\nweight_decay: 0.001\niter_size: 4\nmax_iter: 100\n')
    r = cli("import", "caffe", DATA / "examples_mnist_lenet_train_test.prototxt", "--input-shape", "data=1,28,28",
            "--solver", solver, "--out", tmp_path / "s")
    assert r.status == 0, r.err
    train = yaml.safe_load((tmp_path / "s" / "net.yaml").read_text())["train"]
    assert train["solver"]["lr_policy"] == {"type": "sigmoid", "gamma": -0.01, "step_size": 100}
    assert train["solver"]["regularization"] == "l1" and train["data"]["batch_size"] == 256    # 64 x iter_size 4
    assert "iter_size 4" in r.out
    assert cli("check", tmp_path / "s" / "net.yaml").status == 0


def test_twin_layers_of_one_name_in_two_phases_share_their_weights(tmp_path):
    """Caffe's test net takes the trained layers of the same name: here the TEST twin gets a name
    of its own and shares the TRAIN one's weights; a loss layer without a top gets its own."""
    (tmp_path / "twins.prototxt").write_text(
        'input: "data"\ninput_shape { dim: 2 dim: 4 }\ninput: "label"\ninput_shape { dim: 2 }\n'
        'layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" include { phase: TRAIN }\n'
        '  inner_product_param { num_output: 3 } }\n'
        'layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" include { phase: TEST }\n'
        '  inner_product_param { num_output: 3 } }\n'
        'layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" }\n')
    r = cli("import", "caffe", tmp_path / "twins.prototxt", "--out", tmp_path / "o")
    assert r.status == 0, r.err
    layers = yaml.safe_load((tmp_path / "o" / "net.yaml").read_text())["layers"]
    assert [(x["name"], x.get("share"), x.get("phase")) for x in layers] == [
        ("ip", None, "train"), ("ip_test", "ip", ["test", "infer"]), ("loss", None, ["train", "test"])]
    assert layers[2]["top"] == "loss"


def test_caffes_own_lstm_with_its_weights(tmp_path):
    """Caffe's LSTM layer (time-major x, cont) and its blobs W_xc, b_c, W_hc: imported as CaffeLSTM,
    run to the step formula written out in numpy."""
    import toolkit
    (tmp_path / "lstm.prototxt").write_text(
        'input: "x"\ninput_shape { dim: 4 dim: 2 dim: 3 }\ninput: "cont"\ninput_shape { dim: 4 dim: 2 }\n'
        'layer { name: "lstm" type: "LSTM" bottom: "x" bottom: "cont" top: "h" recurrent_param { num_output: 5 } }\n')
    rng = np.random.default_rng(7)
    w_x, b, w_h = rng.standard_normal((20, 3)) * 0.5, rng.standard_normal(20) * 0.1, rng.standard_normal((20, 5)) * 0.5
    _write_caffemodel(tmp_path / "lstm.caffemodel", {"lstm": [w_x, b, w_h]})
    r = cli("import", "caffe", tmp_path / "lstm.prototxt", "--weights", tmp_path / "lstm.caffemodel",
            "--out", tmp_path / "o")
    assert r.status == 0, r.err
    net = yaml.safe_load((tmp_path / "o" / "net.yaml").read_text())
    assert net["layers"][0]["type"] == "CaffeLSTM" and net["inputs"]["x"]["shape"] == [4, "N", 3]
    # cont's batch is the second axis: the toolkit's N is the first; these inputs' shapes are fixed
    x = rng.standard_normal((4, 2, 3)).astype(np.float32)
    cont = np.array([[0, 0], [1, 1], [1, 0], [1, 1]], np.float32)
    got = toolkit.load(tmp_path / "o" / "net.yaml", weights=str(tmp_path / "o" / "model.safetensors"),
                       buckets=[4]).infer(x=x, cont=cont)["h"]
    sig = lambda v: 1 / (1 + np.exp(-v))       # noqa: E731
    h, c, want = np.zeros((2, 5)), np.zeros((2, 5)), []
    for t in range(4):
        k = cont[t][:, None]
        gates = x[t] @ w_x.T + b + (k * h) @ w_h.T
        i, f, o, g = sig(gates[:, :5]), sig(gates[:, 5:10]), sig(gates[:, 10:15]), np.tanh(gates[:, 15:])
        c = k * f * c + i * g
        h = o * np.tanh(c)
        want.append(h)
    np.testing.assert_allclose(got, np.stack(want), rtol=1e-5, atol=1e-6)


def test_param_names_share_blobs_one_by_one(tmp_path):
    """Caffe's param { name } shares single blobs: a layer sharing only its weight keeps its own
    bias (share: {weight: a}); one sharing both shares the layer; the weight is used by both."""
    import toolkit
    (tmp_path / "shared.prototxt").write_text(
        'input: "data"\ninput_shape { dim: 2 dim: 3 }\n'
        'layer { name: "a" type: "InnerProduct" bottom: "data" top: "a" param { name: "w" } param { name: "ab" }\n'
        '  inner_product_param { num_output: 3 } }\n'
        'layer { name: "b" type: "InnerProduct" bottom: "a" top: "b" param { name: "w" } param { name: "bb" }\n'
        '  inner_product_param { num_output: 3 } }\n'
        'layer { name: "c" type: "InnerProduct" bottom: "b" top: "c" param { name: "w" } param { name: "ab" }\n'
        '  inner_product_param { num_output: 3 } }\n')
    rng = np.random.default_rng(3)
    w, ab, bb = rng.standard_normal((3, 3)), rng.standard_normal(3), rng.standard_normal(3)
    _write_caffemodel(tmp_path / "s.caffemodel", {"a": [w, ab], "b": [w, bb], "c": [w, ab]})
    r = cli("import", "caffe", tmp_path / "shared.prototxt", "--weights", tmp_path / "s.caffemodel",
            "--out", tmp_path / "o")
    assert r.status == 0, r.err
    layers = {x["name"]: x for x in yaml.safe_load((tmp_path / "o" / "net.yaml").read_text())["layers"]}
    assert "share" not in layers["a"] and layers["b"]["share"] == {"weight": "a"} and layers["c"]["share"] == "a"
    x = rng.standard_normal((2, 3)).astype(np.float32)
    got = toolkit.load(tmp_path / "o" / "net.yaml", weights=str(tmp_path / "o" / "model.safetensors")).infer(data=x)
    want = ((x @ w.T + ab) @ w.T + bb) @ w.T + ab
    np.testing.assert_allclose(got["c"], want, rtol=1e-5, atol=1e-5)


def test_an_infogain_matrix_from_its_file_becomes_the_layers_fixed_weight(tmp_path):
    """infogain_loss_param.source (a binaryproto H) is written as the layer's own weight
    NAME.infogain, which training never updates; the loss is Caffe's formula with that H; the
    matrix missing is a note and H starts as the identity."""
    from toolkit.frontend import OBJECTIVE, Net
    from toolkit.importers.caffe.proto import classes
    from toolkit.ops.interpreter import interpret
    from toolkit.weights import load_weights
    rng = np.random.default_rng(5)
    h = rng.random((4, 4)).astype(np.float32)
    blob = classes()["BlobProto"](num=1, channels=1, height=4, width=4)
    blob.data.extend(h.ravel().tolist())
    (tmp_path / "H.binaryproto").write_bytes(blob.SerializeToString())
    text = ('input: "data"\ninput_shape { dim: 3 dim: 6 }\ninput: "label"\ninput_shape { dim: 3 }\n'
            'layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" inner_product_param { num_output: 4 } }\n'
            'layer { name: "gain" type: "InfogainLoss" bottom: "ip" bottom: "label" top: "loss"\n'
            '  infogain_loss_param { source: "H.binaryproto" } }\n')
    (tmp_path / "net.prototxt").write_text(text)
    r = cli("import", "caffe", tmp_path / "net.prototxt", "--out", tmp_path / "o")
    assert r.status == 0, r.err
    assert "gain.infogain from the prototxt's files" in r.out
    weights = load_weights(str(tmp_path / "o" / "model.safetensors"))
    np.testing.assert_array_equal(weights["gain.infogain"], h)

    net = Net.load(str(tmp_path / "o" / "net.yaml"))
    graph = net.graph("train", "float64")
    x, label = rng.standard_normal((3, 6)), np.array([0, 3, 2])
    arrays = {k: v.astype(np.float64) for k, v in weights.items()}
    got = interpret(graph, {"data": x, "label": label}, arrays)[0][OBJECTIVE]
    scores = x @ arrays["ip.weight"].T + arrays["ip.bias"]
    logp = scores - scores.max(1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(1, keepdims=True))
    np.testing.assert_allclose(got, -(h[label] * logp).sum(1).mean(), rtol=1e-6)
    assert net.declared["gain.infogain"][0] == (4, 4)
    assert "gain.infogain" not in {w.name for w in graph.weights.values() if w.trainable}

    (tmp_path / "H.binaryproto").unlink()
    r = cli("import", "caffe", tmp_path / "net.prototxt", "--out", tmp_path / "o2")
    assert r.status == 0, r.err
    assert "H.binaryproto is not here: 'gain.infogain' starts as the identity" in r.out
    np.testing.assert_array_equal(Net.load(str(tmp_path / "o2" / "net.yaml")).init_weights()["gain.infogain"],
                                  np.eye(4, dtype=np.float32))


def test_embed_with_caffes_bias_and_a_scaled_reduction(tmp_path):
    """Embed's bias_term (Caffe's default, true) imports with its bias blob; Reduction's coeff
    scales the result."""
    import toolkit
    (tmp_path / "e.prototxt").write_text(
        'input: "word"\ninput_shape { dim: 2 dim: 3 }\n'
        'layer { name: "emb" type: "Embed" bottom: "word" top: "emb" embed_param { input_dim: 6 num_output: 4 } }\n'
        'layer { name: "red" type: "Reduction" bottom: "emb" top: "red" reduction_param { axis: 2 coeff: -2 } }\n')
    rng = np.random.default_rng(9)
    table, bias = rng.standard_normal((6, 4)), rng.standard_normal(4)
    _write_caffemodel(tmp_path / "e.caffemodel", {"emb": [table, bias]})
    r = cli("import", "caffe", tmp_path / "e.prototxt", "--weights", tmp_path / "e.caffemodel",
            "--out", tmp_path / "o")
    assert r.status == 0, r.err
    layers = yaml.safe_load((tmp_path / "o" / "net.yaml").read_text())["layers"]
    assert layers[0]["bias_term"] is True and layers[1]["coeff"] == -2
    word = np.array([[0, 5, 2], [3, 3, 1]])
    model = toolkit.load(tmp_path / "o" / "net.yaml", weights=str(tmp_path / "o" / "model.safetensors"))
    got = model.infer(word=word)
    np.testing.assert_allclose(got["red"], -2 * (table[word] + bias).sum(-1), rtol=1e-5, atol=1e-5)
