"""Small PyTorch models (ResNet-18 and -50, MobileNetV2, a BERT-style encoder, an LSTM tagger) and
their ONNX export, for the tests that import PyTorch's exports and hold them to PyTorch and ONNX
Runtime. Imported only by test modules that have already skipped themselves without torch."""
from __future__ import annotations

import warnings

import torch
from torch import nn


def export(model: nn.Module, example: torch.Tensor, path, dynamic=("N",)) -> str:
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


def randomize_batchnorm(model: nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.2)
            m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            m.weight.data.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            m.bias.data.copy_(torch.randn(m.num_features, generator=g) * 0.1)


def exported_tagger(path):
    """A Tagger with seed 0's weights, exported with its batch and length dynamic."""
    torch.manual_seed(0)
    model = Tagger().eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, torch.randint(0, 40, (2, 7)), str(path), dynamo=False, input_names=["ids"],
                          output_names=["y"], dynamic_axes={"ids": {0: "N", 1: "T"}, "y": {0: "N", 1: "T"}},
                          opset_version=17)
    return model
