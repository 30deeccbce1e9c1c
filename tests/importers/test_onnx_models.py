"""ONNX models where a net is expected: ``toolkit infer model.onnx``, ``toolkit import onnx``, the
ONNX layer inside a net (a new head trained on a frozen imported backbone), and real models built
in PyTorch, exported with ``torch.onnx.export``, imported and run equal to PyTorch and to ONNX
Runtime at two batch sizes (the batch exported dynamic)."""
from __future__ import annotations

import numpy as np
import pytest
import yaml

onnx = pytest.importorskip("onnx", reason="the onnx extra reads the models")
ort = pytest.importorskip("onnxruntime", reason="the onnx extra's runtime is the reference")
torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from tests.importers.torch_models import (  # noqa: E402
    Encoder,
    export,
    exported_tagger,
    mobilenet_v2,
    randomize_batchnorm,
    resnet18,
    resnet50,
)
from tests.train.train_helpers import cli  # noqa: E402


def _three_way(path: str, model: nn.Module, feeds: dict, tol: float = 1e-4) -> float:
    import toolkit
    ours = toolkit.load(path).infer(**{k: v for k, v in feeds.items()})
    (name, got), = ours.items()
    with torch.no_grad():
        want = model(*[torch.from_numpy(v) for v in feeds.values()]).numpy()
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    theirs = session.run(None, feeds)[0]
    scale = float(np.abs(want).max())
    err_torch, err_ort = float(np.abs(got - want).max()) / scale, float(np.abs(got - theirs).max()) / scale
    assert err_torch < tol and err_ort < tol, (err_torch, err_ort)
    return max(err_torch, err_ort)


@pytest.mark.parametrize("build", [resnet18, resnet50, mobilenet_v2], ids=["resnet18", "resnet50", "mobilenet_v2"])
def test_a_pytorch_cnn_exported_runs_equal_to_pytorch_and_onnx_runtime(tmp_path, build):
    torch.manual_seed(0)
    model = build()
    randomize_batchnorm(model, 1)
    path = export(model, torch.randn(1, 3, 64, 64), tmp_path / "m.onnx")
    rng = np.random.default_rng(0)
    for batch in (1, 3):
        _three_way(path, model, {"x": rng.standard_normal((batch, 3, 64, 64)).astype(np.float32)})


def test_a_bert_style_encoder_with_a_padding_mask(tmp_path):
    import warnings
    torch.manual_seed(0)
    model = Encoder().eval()
    ids = torch.randint(0, 50, (2, 12))
    mask = torch.zeros(2, 12)
    mask[1, 8:] = 1.0
    path = tmp_path / "enc.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (ids, mask), str(path), dynamo=False, input_names=["ids", "mask"],
                          output_names=["y"], dynamic_axes={"ids": {0: "N"}, "mask": {0: "N"}, "y": {0: "N"}},
                          opset_version=17)
    rng = np.random.default_rng(1)
    for batch in (2, 5):
        m = np.zeros((batch, 12), np.float32)
        m[0, 6:] = 1.0
        _three_way(str(path), model, {"ids": rng.integers(0, 50, (batch, 12)).astype(np.int64), "mask": m})


def test_an_lstm_tagger_over_any_length(tmp_path):
    path = tmp_path / "tagger.onnx"
    model = exported_tagger(path)
    rng = np.random.default_rng(2)
    for batch, length in ((2, 7), (3, 11)):
        _three_way(str(path), model, {"ids": rng.integers(0, 40, (batch, length)).astype(np.int64)})


def test_infer_and_import_take_an_onnx_file(tmp_path):
    torch.manual_seed(0)
    model = resnet18()
    randomize_batchnorm(model, 2)
    path = export(model, torch.randn(1, 3, 32, 32), tmp_path / "r.onnx")
    x = np.random.default_rng(0).standard_normal((4, 3, 32, 32)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    r = cli("infer", path, "--input", tmp_path / "x.npy", "--output", tmp_path / "y.npy")
    assert r.status == 0, r.err
    with torch.no_grad():
        want = model(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    r = cli("import", "onnx", path, "--out", tmp_path / "imp")
    assert r.status == 0, r.err
    assert "49 ONNX nodes as 49 layers" in r.out and "checked on random inputs" in r.out
    net = yaml.safe_load((tmp_path / "imp" / "net.yaml").read_text())
    assert net["name"] == "r" and net["inputs"]["x"]["shape"] == ["N", 3, 32, 32]
    kinds = [layer["type"] for layer in net["layers"]]
    assert kinds[0] == "Convolution" and kinds[-1] == "InnerProduct"      # the exporter folds BatchNorm in
    assert {"ReLU", "Pooling", "Eltwise", "Flatten"} <= set(kinds)
    r = cli("infer", tmp_path / "imp" / "net.yaml", "--weights", tmp_path / "imp" / "model.safetensors",
            "--input", tmp_path / "x.npy", "--output", tmp_path / "y2.npy")
    assert r.status == 0, r.err
    np.testing.assert_allclose(np.load(tmp_path / "y2.npy"), np.load(tmp_path / "y.npy"), rtol=1e-5,
                               atol=1e-5 * np.abs(want).max())
    r = cli("import", "onnx", path, "--out", tmp_path / "imp")
    assert r.status == 2 and "choose another --out, or pass --force" in r.err


def test_a_model_whose_nodes_are_not_all_layers_imports_as_one_onnx_layer(tmp_path):
    """An LSTM has no layer of the catalog in ONNX's form: the net is one ONNX layer, the note says why."""
    path = tmp_path / "tagger.onnx"
    model = exported_tagger(path)
    r = cli("import", "onnx", path, "--out", tmp_path / "imp")
    assert r.status == 0, r.err
    assert "(LSTM): no layer of the catalog is an ONNX LSTM" in r.out
    net = yaml.safe_load((tmp_path / "imp" / "net.yaml").read_text())
    assert [layer["type"] for layer in net["layers"]] == ["ONNX"] and (tmp_path / "imp" / "tagger.onnx").is_file()
    ids = np.random.default_rng(0).integers(0, 40, (3, 9))
    import toolkit
    got = toolkit.load(str(tmp_path / "imp" / "net.yaml"), weights=str(tmp_path / "imp" / "model.safetensors"))
    with torch.no_grad():
        want = model(torch.from_numpy(ids)).numpy()
    np.testing.assert_allclose(got.infer(ids=ids)["y"], want, rtol=1e-4, atol=1e-5)


def test_a_new_head_trains_on_a_frozen_onnx_backbone(tmp_path):
    """The ONNX layer is a layer like any other: cut before the model's own classifier (outputs:),
    frozen with lr_mult 0, a new head after it trains and the backbone's weights stay."""
    from safetensors.numpy import load_file
    torch.manual_seed(0)
    backbone = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 8))
    export(backbone, torch.randn(1, 1, 6, 6), tmp_path / "backbone.onnx")
    features = onnx.load(str(tmp_path / "backbone.onnx")).graph.node[-1].input[0]     # what the classifier reads
    rng = np.random.default_rng(0)
    data = rng.standard_normal((64, 1, 6, 6)).astype(np.float32)
    label = (data.mean(axis=(1, 2, 3)) > 0).astype(np.int64)
    np.savez(tmp_path / "d.npz", data=data, label=label)
    (tmp_path / "net.yaml").write_text(yaml.safe_dump({
        "name": "head", "inputs": {"data": {"shape": ["N", 1, 6, 6]}, "label": {"shape": ["N"], "dtype": "int64"}},
        "layers": [{"name": "body", "type": "ONNX", "file": "backbone.onnx", "bottom": "data", "top": "feat",
                    "outputs": [features], "lr_mult": 0},
                   {"name": "head", "type": "InnerProduct", "bottom": "feat", "top": "score", "num_output": 2},
                   {"name": "loss", "type": "SoftmaxWithLoss", "bottom": ["score", "label"], "top": "loss",
                    "phase": "train"}],
        "train": {"data": {"source": "d.npz", "batch_size": 16, "test_fraction": 0}, "max_iter": 30, "display": 5,
                  "solver": {"type": "sgd", "base_lr": 0.1, "momentum": 0.9}}}, sort_keys=False))
    r = cli("train", tmp_path / "net.yaml", "--weights", tmp_path / "backbone.onnx", "--allow-missing",
            "--out", tmp_path / "run")
    assert r.status == 0, r.err
    trained = load_file(str(tmp_path / "run" / "model.safetensors"))
    start = onnx.load(str(tmp_path / "backbone.onnx"))
    kept = 0
    for init in start.graph.initializer:
        if f"body.{init.name}" in trained:
            np.testing.assert_array_equal(trained[f"body.{init.name}"], onnx.numpy_helper.to_array(init))
            kept += 1
    assert kept == 2 and trained["head.weight"].shape == (2, 4 * 6 * 6)   # the convolution's; the old classifier cut
    losses = [json_line["loss"] for json_line in map(__import__("json").loads,
                                                       (tmp_path / "run" / "metrics.jsonl").read_text().splitlines())
              if "loss" in json_line]
    assert losses[-1] < losses[0]


def test_a_mistake_in_an_onnx_layer_is_located(tmp_path):
    torch.manual_seed(0)
    export(nn.Sequential(nn.Conv2d(1, 2, 3)), torch.randn(1, 1, 6, 6), tmp_path / "c.onnx")
    (tmp_path / "net.yaml").write_text(yaml.safe_dump({
        "name": "bad", "inputs": {"data": {"shape": ["N", 3, 6, 6]}},
        "layers": [{"name": "body", "type": "ONNX", "file": "c.onnx", "bottom": "data", "top": "y"}]}))
    r = cli("check", tmp_path / "net.yaml")
    assert r.status == 2 and len(r.errors) == 1
    assert "layer 'body' (ONNX): the model's input 'x' has 1 on axis 1, the bottom is [N, 3, 6, 6]" in r.errors[0]
    (tmp_path / "net.yaml").write_text(yaml.safe_dump({
        "name": "bad", "inputs": {"data": {"shape": ["N", 1, 6, 6]}},
        "layers": [{"name": "body", "type": "ONNX", "file": "none.onnx", "bottom": "data", "top": "y"}]}))
    r = cli("check", tmp_path / "net.yaml")
    assert r.status == 2 and "none.onnx: no such file" in r.err and "Traceback" not in r.err
