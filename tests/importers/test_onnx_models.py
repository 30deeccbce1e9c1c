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

from tests.train.test_loop import cli  # noqa: E402


def export(model: nn.Module, example: torch.Tensor, path, dynamic=("N",)) -> str:
    import warnings
    model.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, example, str(path), dynamo=False, input_names=["x"], output_names=["y"],
                          dynamic_axes={"x": {0: "N"}, "y": {0: "N"}} if dynamic else None, opset_version=17)
    return str(path)


class Block(nn.Module):
    """ResNet's basic block (two 3x3 convolutions, BatchNorm, a projection when the shape changes)."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)
        self.c2, self.b2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
        self.skip = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)) \
            if stride != 1 or cin != cout else nn.Identity()

    def forward(self, x):
        return torch.relu(self.b2(self.c2(torch.relu(self.b1(self.c1(x))))) + self.skip(x))


def resnet18(classes=10):
    widths = [16, 32, 64, 128]          # ResNet-18's layout at a quarter of its width
    layers, cin = [nn.Conv2d(3, 16, 7, 2, 3, bias=False), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(3, 2, 1)], 16
    for i, w in enumerate(widths):
        layers += [Block(cin, w, 1 if i == 0 else 2), Block(w, w, 1)]
        cin = w
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes))


class Bottleneck(nn.Module):
    """ResNet-50's bottleneck: 1x1 reduce, 3x3, 1x1 expand by 4, a projection where the shape changes."""

    def __init__(self, cin, mid, stride):
        super().__init__()
        cout = 4 * mid
        self.body = nn.Sequential(nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU(),
                                  nn.Conv2d(mid, mid, 3, stride, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU(),
                                  nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.skip = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)) \
            if stride != 1 or cin != cout else nn.Identity()

    def forward(self, x):
        return torch.relu(self.body(x) + self.skip(x))


def resnet50(classes=10):
    """ResNet-50's layout (3, 4, 6, 3 bottlenecks) at an eighth of its width."""
    layers, cin = [nn.Conv2d(3, 8, 7, 2, 3, bias=False), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(3, 2, 1)], 8
    for i, (count, mid) in enumerate(zip((3, 4, 6, 3), (8, 16, 32, 64))):
        for j in range(count):
            layers.append(Bottleneck(cin, mid, 2 if j == 0 and i > 0 else 1))
            cin = 4 * mid
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes))


class Inverted(nn.Module):
    """MobileNetV2's inverted residual: 1x1 expand, 3x3 depthwise, 1x1 project, ReLU6."""

    def __init__(self, cin, cout, stride, expand):
        super().__init__()
        mid = cin * expand
        self.body = nn.Sequential(nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU6(),
                                  nn.Conv2d(mid, mid, 3, stride, 1, groups=mid, bias=False), nn.BatchNorm2d(mid),
                                  nn.ReLU6(), nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        return x + self.body(x) if self.residual else self.body(x)


def mobilenet_v2(classes=10):
    return nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU6(),
                         Inverted(16, 16, 1, 1), Inverted(16, 24, 2, 6), Inverted(24, 24, 1, 6),
                         Inverted(24, 32, 2, 6), Inverted(32, 32, 1, 6), nn.Conv2d(32, 128, 1, bias=False),
                         nn.BatchNorm2d(128), nn.ReLU6(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.2),
                         nn.Linear(128, classes))


class Encoder(nn.Module):
    """A small BERT-style encoder: token and position embeddings, two post-norm layers of
    multi-head self-attention with a padding mask, GELU feed-forward, a classifier on token 0."""

    def __init__(self, vocab=50, width=32, heads=4, length=12):
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, width), nn.Embedding(length, width)
        layer = nn.TransformerEncoderLayer(width, heads, 64, dropout=0.0, activation="gelu", batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(width, 3)

    def forward(self, ids, mask):
        positions = torch.arange(ids.shape[1]).unsqueeze(0)
        h = self.tokens(ids) + self.positions(positions)
        h = self.encoder(h, src_key_padding_mask=mask > 0.5)
        return self.head(h[:, 0])


class Tagger(nn.Module):
    """An LSTM tagger: embeddings, a two-layer bidirectional LSTM, a tag score per token."""

    def __init__(self, vocab=40, width=16, hidden=12, tags=5):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.lstm = nn.LSTM(width, hidden, num_layers=2, bidirectional=True, batch_first=True)
        self.out = nn.Linear(2 * hidden, tags)

    def forward(self, ids):
        return self.out(self.lstm(self.embed(ids))[0])


def _randomize_batchnorm(model: nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.2)
            m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            m.weight.data.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            m.bias.data.copy_(torch.randn(m.num_features, generator=g) * 0.1)


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
    _randomize_batchnorm(model, 1)
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


def exported_tagger(path):
    """A Tagger with seed 0's weights, exported with its batch and length dynamic."""
    import warnings
    torch.manual_seed(0)
    model = Tagger().eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, torch.randint(0, 40, (2, 7)), str(path), dynamo=False, input_names=["ids"],
                          output_names=["y"], dynamic_axes={"ids": {0: "N", 1: "T"}, "y": {0: "N", 1: "T"}},
                          opset_version=17)
    return model


def test_an_lstm_tagger_over_any_length(tmp_path):
    path = tmp_path / "tagger.onnx"
    model = exported_tagger(path)
    rng = np.random.default_rng(2)
    for batch, length in ((2, 7), (3, 11)):
        _three_way(str(path), model, {"ids": rng.integers(0, 40, (batch, length)).astype(np.int64)})


def test_infer_and_import_take_an_onnx_file(tmp_path):
    torch.manual_seed(0)
    model = resnet18()
    _randomize_batchnorm(model, 2)
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
