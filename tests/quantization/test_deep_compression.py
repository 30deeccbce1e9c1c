"""benchmarks/deep_compression.py, the decoder of Deep Compression's packed SqueezeNet: a tiny
net packed by this file's own encoder (codebooks, 4-bit gaps with zero-code fillers for long
runs, low nibble first) decodes to exactly the weights it was built from, the channel counts
follow a concatenation, and the written caffemodel imports as those weights."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from toolkit.errors import UserError

ROOT = Path(__file__).resolve().parents[2]

PROTOTXT = """
name: "tiny"
input: "data"
input_dim: 1 input_dim: 3 input_dim: 8 input_dim: 8
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        convolution_param { num_output: 4 kernel_size: 3 stride: 2 } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1" pooling_param { pool: MAX kernel_size: 2 } }
layer { name: "fire/conv1x1" type: "Convolution" bottom: "pool1" top: "a"
        convolution_param { num_output: 5 kernel_size: 1 } }
layer { name: "fire/conv3x3" type: "Convolution" bottom: "pool1" top: "b"
        convolution_param { num_output: 3 pad: 1 kernel_size: 3 } }
layer { name: "fire/concat" type: "Concat" bottom: "a" bottom: "b" top: "cat" }
layer { name: "conv_final" type: "Convolution" bottom: "cat" top: "out"
        convolution_param { num_output: 6 kernel_size: 1 } }
"""
SHAPES = {"conv1": (4, 3, 3, 3), "fire/conv1x1": (5, 4, 1, 1), "fire/conv3x3": (3, 4, 3, 3), "conv_final": (6, 8, 1, 1)}


def _module():
    spec = importlib.util.spec_from_file_location("deep_compression", ROOT / "benchmarks" / "deep_compression.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _pack_nibbles(values: list[int]) -> bytes:
    values = values + [0] * (len(values) % 2)
    return bytes(lo | (hi << 4) for lo, hi in zip(values[0::2], values[1::2]))


def _encode_layer(codes: np.ndarray) -> tuple[list[int], list[int]]:
    """(gaps, codes) of the entries naming every non-zero code of the flat ``codes``: a gap over
    15 is bridged by entries of code 0 that each move 16 places."""
    gaps, entry_codes, last = [], [], -1
    for place in np.flatnonzero(codes):
        gap = int(place) - last - 1
        while gap > 15:
            gaps.append(15)
            entry_codes.append(0)
            gap -= 16
        gaps.append(gap)
        entry_codes.append(int(codes[place]))
        last = int(place)
    return gaps, entry_codes


def _packed_net(rng) -> tuple[bytes, dict]:
    """The packed bytes of random sparse weights on 256-value codebooks, and those weights."""
    header, body, expected = [], b"", {}
    for name, shape in SHAPES.items():
        codebook = np.concatenate([[0.0], rng.standard_normal(255)]).astype(np.float32)
        codes = rng.integers(1, 256, size=int(np.prod(shape)))
        codes[rng.random(codes.size) < 0.6] = 0                   # sparse, as pruning leaves them
        if codes.size > 45:
            codes[3:40] = 0                                       # a run longer than one 4-bit gap
        bias = rng.standard_normal(shape[0]).astype(np.float32)
        gaps, entry_codes = _encode_layer(codes)
        header.append(len(gaps))
        body += codebook.tobytes() + bias.tobytes() + bytes(entry_codes) + _pack_nibbles(gaps)
        expected[name] = (codebook[codes].reshape(shape), bias)
    return np.array(header, "<u4").tobytes() + body, expected


def test_the_weighted_layers_follow_channels_through_a_concatenation(tmp_path):
    (tmp_path / "net.prototxt").write_text(PROTOTXT)
    found = _module().weighted_layers(str(tmp_path / "net.prototxt"))
    assert [(name, shape, bias) for name, _, shape, bias in found] == \
        [(name, shape, shape[0]) for name, shape in SHAPES.items()]


def test_decoding_gives_back_exactly_the_packed_weights(tmp_path):
    (tmp_path / "net.prototxt").write_text(PROTOTXT)
    packed, expected = _packed_net(np.random.default_rng(0))
    (tmp_path / "net.bin").write_bytes(packed)
    decoded = _module().decode(str(tmp_path / "net.prototxt"), str(tmp_path / "net.bin"))
    assert list(decoded) == list(expected)
    for name, (weights, bias) in expected.items():
        np.testing.assert_array_equal(decoded[name][0], weights)
        np.testing.assert_array_equal(decoded[name][1], bias)
    # conv1's long run of zeros needed filler entries: it stores more entries than non-zeros
    assert np.frombuffer(packed[:4], "<u4")[0] > np.count_nonzero(expected["conv1"][0])


def test_a_file_for_another_net_is_refused(tmp_path):
    (tmp_path / "net.prototxt").write_text(PROTOTXT)
    packed, _ = _packed_net(np.random.default_rng(1))
    (tmp_path / "longer.bin").write_bytes(packed + b"\0\0\0\0")
    (tmp_path / "shorter.bin").write_bytes(packed[:-100])
    with pytest.raises(UserError, match="left over"):
        _module().decode(str(tmp_path / "net.prototxt"), str(tmp_path / "longer.bin"))
    with pytest.raises(UserError, match="ends inside a layer"):
        _module().decode(str(tmp_path / "net.prototxt"), str(tmp_path / "shorter.bin"))


def test_the_written_caffemodel_imports_as_the_decoded_weights(tmp_path):
    pytest.importorskip("google.protobuf")
    (tmp_path / "net.prototxt").write_text(PROTOTXT)
    packed, expected = _packed_net(np.random.default_rng(2))
    (tmp_path / "net.bin").write_bytes(packed)
    module = _module()
    assert module.main([str(tmp_path / "net.prototxt"), str(tmp_path / "net.bin"),
                        "--out", str(tmp_path / "net.caffemodel")]) == 0
    from toolkit.cli import main as cli
    assert cli(["import", "caffe", str(tmp_path / "net.prototxt"), "--weights", str(tmp_path / "net.caffemodel"),
                "--out", str(tmp_path / "imported")]) == 0
    from toolkit.weights import load_weights
    arrays = load_weights(str(tmp_path / "imported" / "model.safetensors"))
    conv1_keys = sorted(k for k in arrays if k.startswith("conv1"))
    assert len(conv1_keys) == 2
    weight = next(arrays[k] for k in conv1_keys if arrays[k].ndim == 4)
    bias = next(arrays[k] for k in conv1_keys if arrays[k].ndim == 1)
    np.testing.assert_array_equal(weight, expected["conv1"][0])
    np.testing.assert_array_equal(bias, expected["conv1"][1])
    sys.modules.pop("deep_compression", None)
