"""Cross-layer equalization (toolkit/quantization/equalize.py) on hand-built nets: which layers pair
up (through ReLU and max pooling, a value read by two convolutions, a concatenation's parts each
its own producer's; a residual add or a graph output leaves a producer alone); the float net's
outputs unchanged by the scaling; each channel's range after it, sqrt(a_i * T * w_i) computed here
by hand from the ranges measured before; and on a net with one channel a hundred times the
others', the int8 net's error against float falls by a measured factor. Then the option: the
record, the section's ``equalized`` map, the explain line and the command's word."""
from __future__ import annotations

import numpy as np
import pytest
import yaml
from safetensors.numpy import save_file

import toolkit
from tests.train.train_helpers import cli
from toolkit.quantization.equalize import equalization_pairs, equalization_scales, equalize, measure_top_ranges
from toolkit.zoo.resolve import load_net

# a fire module: squeeze (1x1) read by two expands, their outputs concatenated and read by a last 1x1
FIRE = """name: fire
inputs:
  data: {shape: [N, 3, 6, 6], dtype: float32}
layers:
  - {name: conv1, type: Convolution, bottom: data, top: conv1, num_output: 4, kernel_size: 3, pad: 1}
  - {name: relu1, type: ReLU, bottom: conv1, top: conv1}
  - {name: pool1, type: Pooling, bottom: conv1, top: pool1, pool: max, kernel_size: 2, stride: 2}
  - {name: squeeze, type: Convolution, bottom: pool1, top: squeeze, num_output: 3, kernel_size: 1}
  - {name: relu_s, type: ReLU, bottom: squeeze, top: squeeze}
  - {name: e1, type: Convolution, bottom: squeeze, top: e1, num_output: 2, kernel_size: 1}
  - {name: relu_e1, type: ReLU, bottom: e1, top: e1}
  - {name: e3, type: Convolution, bottom: squeeze, top: e3, num_output: 3, kernel_size: 3, pad: 1}
  - {name: relu_e3, type: ReLU, bottom: e3, top: e3}
  - {name: cat, type: Concat, bottom: [e1, e3], top: cat}
  - {name: last, type: Convolution, bottom: cat, top: last, num_output: 2, kernel_size: 1}
  - {name: pool, type: Pooling, bottom: last, top: pool, pool: ave, global_pooling: true}
outputs: [pool]
"""


def fire_weights(seed=0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    shapes = {"conv1": (4, 3, 3, 3), "squeeze": (3, 4, 1, 1), "e1": (2, 3, 1, 1), "e3": (3, 3, 3, 3),
              "last": (2, 5, 1, 1)}
    out = {}
    for name, shape in shapes.items():
        out[f"{name}.weight"] = rng.normal(0, 1, shape).astype(np.float32)
        out[f"{name}.bias"] = rng.normal(0.5, 0.2, shape[0]).astype(np.float32)
    # channel ranges far apart: conv1's channel 2 and e3's channel 0 large, the rest small
    out["conv1.weight"][2] *= 30
    out["e3.weight"][0] *= 20
    return out


@pytest.fixture
def fire(tmp_path):
    net_file = tmp_path / "net.yaml"
    net_file.write_text(FIRE)
    return load_net(str(net_file)), net_file


def test_producers_pair_with_their_readers_through_relu_pooling_forks_and_concat(fire):
    net, _ = fire
    found = {p.layer: [(r.layer, r.offset, r.in_channels, r.top) for r in p.readers]
             for p in equalization_pairs(net.graph("infer", "float32"))}
    assert found == {"conv1": [("squeeze", 0, 4, "pool1")],
                     "squeeze": [("e1", 0, 3, "squeeze"), ("e3", 0, 3, "squeeze")],
                     "e1": [("last", 0, 5, "cat")],
                     "e3": [("last", 2, 5, "cat")]}      # 'last' feeds the graph's output: no producer


def test_a_residual_add_or_an_output_leaves_a_producer_alone(tmp_path):
    net_file = tmp_path / "res.yaml"
    net_file.write_text("""name: res
inputs:
  data: {shape: [N, 2, 4, 4], dtype: float32}
layers:
  - {name: a, type: Convolution, bottom: data, top: a, num_output: 2, kernel_size: 1}
  - {name: b, type: Convolution, bottom: a, top: b, num_output: 2, kernel_size: 1}
  - {name: sum, type: Eltwise, bottom: [a, b], top: sum}
  - {name: c, type: Convolution, bottom: sum, top: c, num_output: 2, kernel_size: 1}
  - {name: d, type: Convolution, bottom: c, top: d, num_output: 2, kernel_size: 1}
outputs: [d, c]
""")
    # a: read by b and by the add; b: by the add; c: a graph output; d: the other output
    assert equalization_pairs(load_net(str(net_file)).graph("infer", "float32")) == []


def test_layers_that_share_a_weight_are_left_alone(tmp_path):
    net_file = tmp_path / "tied.yaml"
    net_file.write_text("""name: tied
inputs:
  data: {shape: [N, 2, 4, 4], dtype: float32}
layers:
  - {name: a, type: Convolution, bottom: data, top: a, num_output: 2, kernel_size: 1}
  - {name: b, type: Convolution, bottom: a, top: b, num_output: 2, kernel_size: 1}
  - {name: c, type: Convolution, bottom: b, top: c, num_output: 2, kernel_size: 1}
  - {name: d, type: Convolution, bottom: c, top: d, num_output: 2, kernel_size: 1}
outputs: [d]
""")
    graph = load_net(str(net_file)).graph("infer", "float32")
    assert [(p.layer, [r.layer for r in p.readers]) for p in equalization_pairs(graph)] == \
        [("a", ["b"]), ("b", ["c"]), ("c", ["d"])]
    # b and c read one weight array (as a net with tied weights lowers): a (whose reader b is tied),
    # b and c are left alone
    tied = graph.weights["b.weight"].value
    c = next(n for n in graph.nodes if n.op == "conv2d" and n.scope == "c")
    c.inputs[1] = tied
    assert equalization_pairs(graph) == []


def test_equalization_keeps_the_float_outputs_and_evens_the_channel_ranges_as_computed(fire):
    net, net_file = fire
    weights = fire_weights()
    rng = np.random.default_rng(1)
    data = {"data": rng.uniform(-1, 1, (16, 3, 6, 6)).astype(np.float32)}
    producers = equalization_pairs(net.graph("infer", "float32"))
    before = measure_top_ranges(net, weights, data, producers)
    scaled, done = equalize(net, weights, data)
    assert done == {"conv1": ["squeeze"], "squeeze": ["e1", "e3"], "e1": ["last"], "e3": ["last"]}
    after = measure_top_ranges(net, scaled, data, producers)

    def run(w):
        save_file(w, str(net_file.parent / "w.safetensors"))
        return toolkit.load(str(net_file), weights=str(net_file.parent / "w.safetensors")).infer(data)["pool"]

    reference = run(weights)
    assert np.abs(run(scaled) - reference).max() <= 1e-5 * np.abs(reference).max()
    # by hand: s_i = sqrt(a_i / (T w_i)), so each channel's range becomes a_i / s_i = sqrt(a_i T w_i),
    # with T the tensor's largest range and w_i the largest |weight| reading channel i relative to its
    # row (a_i at least T / 255 and w_i at least 1 / 127 in s_i)
    for top, readers in {"pool1": ["squeeze"], "squeeze": ["e1", "e3"], "cat": ["last"]}.items():
        a, t = before[top].astype(np.float64), float(before[top].max())
        w = np.zeros(len(a))
        for r in readers:
            rw = np.abs(weights[f"{r}.weight"]).astype(np.float64)
            w = np.maximum(w, (rw / rw.max(axis=(1, 2, 3), keepdims=True)).max(axis=(0, 2, 3)))
        w = np.maximum(w, 1 / 127)
        s = np.sqrt(np.maximum(a, t / 255) / (t * w))
        np.testing.assert_allclose(after[top], a / s, rtol=1e-5)
    # the spread of conv1's channel ranges (the smallest over the largest) narrows six times: 0.0238
    # before, 0.1458 after (about its square root, times the readers' column ranges)
    spread = {k: float(v.min() / v.max()) for k, v in (("before", before["pool1"]), ("after", after["pool1"]))}
    assert spread["before"] == pytest.approx(0.0238, abs=1e-4) and spread["after"] == pytest.approx(0.1458, abs=1e-4)


def test_scales_balance_by_strength(fire):
    net, _ = fire
    producers = [p for p in equalization_pairs(net.graph("infer", "float32")) if p.layer == "conv1"]
    weights = {"squeeze.weight": np.ones((3, 4, 1, 1), np.float32)}          # w_i = 1 for every channel
    ranges = {"pool1": np.float32([1.0, 4.0, 16.0, 64.0])}
    # T = 64: s_i = (a_i / 64) ** strength
    for strength, expected in ((0.5, [0.125, 0.25, 0.5, 1.0]), (1.0, [1 / 64, 1 / 16, 0.25, 1.0])):
        got = equalization_scales(producers, weights, ranges, strength)["conv1"]
        np.testing.assert_allclose(got, expected, rtol=1e-6)


HUGE = """name: huge
inputs:
  data: {shape: [N, 2, 4, 4], dtype: float32}
layers:
  - {name: conv1, type: Convolution, bottom: data, top: conv1, num_output: 8, kernel_size: 1}
  - {name: relu1, type: ReLU, bottom: conv1, top: conv1}
  - {name: conv2, type: Convolution, bottom: conv1, top: conv2, num_output: 4, kernel_size: 1}
outputs: [conv2]
"""


def test_one_huge_channel_the_int8_error_falls(tmp_path):
    net_file = tmp_path / "net.yaml"
    net_file.write_text(HUGE)
    rng = np.random.default_rng(3)
    w1 = rng.normal(0, 1, (8, 2, 1, 1)).astype(np.float32)
    w1[0] *= 100                                      # channel 0's range a hundred times the others'
    weights = {"conv1.weight": w1, "conv1.bias": np.full(8, 0.1, np.float32),
               "conv2.weight": rng.normal(0, 1, (4, 8, 1, 1)).astype(np.float32),
               "conv2.bias": np.zeros(4, np.float32)}
    weights["conv2.weight"][:, 0] *= 0.01             # read back with small weights: the float net is ordinary
    save_file(weights, str(tmp_path / "w.safetensors"))
    calibrate = {"data": rng.uniform(-1, 1, (64, 2, 4, 4)).astype(np.float32)}
    test = {"data": rng.uniform(-1, 1, (64, 2, 4, 4)).astype(np.float32)}
    reference = toolkit.load(str(net_file), weights=str(tmp_path / "w.safetensors")).infer(test)["conv2"]
    errors = {}
    for equalized in (False, True):
        r = toolkit.quantize(str(net_file), weights=tmp_path / "w.safetensors", calibrate=calibrate,
                             out=tmp_path / f"q{equalized}", equalize=equalized, bias_correction=False)
        out = toolkit.load(str(r.net_file), weights=str(r.weights_file)).infer(test)["conv2"]
        errors[equalized] = float(np.sqrt(np.mean((out - reference) ** 2)))
    # measured: 1.252 without (the small channels' values are rounded to steps of 0.8, their range
    # a hundredth of the tensor's), 0.0154 with: 81 times smaller
    assert errors[False] == pytest.approx(1.252, rel=0.01) and errors[True] == pytest.approx(0.0154, rel=0.03), errors
    assert errors[False] / errors[True] > 75


def test_the_option_records_and_explains_it(fire, tmp_path):
    net, net_file = fire
    save_file(fire_weights(), str(tmp_path / "w.safetensors"))
    rng = np.random.default_rng(2)
    np.savez(tmp_path / "cal.npz", data=rng.uniform(-1, 1, (20, 3, 6, 6)).astype(np.float32))
    r = cli("quantize", net_file, "--weights", tmp_path / "w.safetensors", "--calibrate", tmp_path / "cal.npz",
            "--out", tmp_path / "q", "--equalize")
    assert r.status == 0, r.err
    assert "equalization: 4 layers' output channels scaled against the weights of the 4 layers that read them" \
        in r.out
    section = yaml.safe_load((tmp_path / "q" / "net.yaml").read_text())["quantization"]
    assert section["calibration"]["equalization"] is True
    assert section["equalized"] == {"conv1": ["squeeze"], "squeeze": ["e1", "e3"], "e1": ["last"], "e3": ["last"]}
    r = cli("compile", tmp_path / "q" / "net.yaml", "--explain")
    assert r.status == 0 and "quantize: squeeze: int8: qconv2d + relu, bias corrected, equalized, uint8 in" in r.out, \
        r.out
    # the folder's float weights are the equalized ones: the float net computes the same with them
    x = {"data": rng.uniform(-1, 1, (4, 3, 6, 6)).astype(np.float32)}
    given = toolkit.load(str(net_file), weights=str(tmp_path / "w.safetensors")).infer(x)["pool"]
    written = toolkit.load(str(net_file), weights=str(tmp_path / "q" / "model.safetensors")).infer(x)["pool"]
    assert np.abs(written - given).max() <= 1e-5 * np.abs(given).max()
    from safetensors.numpy import load_file
    scaled = load_file(tmp_path / "q" / "model.safetensors")["conv1.weight"]
    assert not np.array_equal(scaled, fire_weights()["conv1.weight"])
    r = cli("quantize", net_file, "--weights", tmp_path / "w.safetensors", "--calibrate", tmp_path / "cal.npz",
            "--out", tmp_path / "q2", "--no-equalize")
    assert r.status == 0, r.err
    section = yaml.safe_load((tmp_path / "q2" / "net.yaml").read_text())["quantization"]
    assert section["calibration"]["equalization"] is False and "equalized" not in section
    assert "equalization:" not in r.out
