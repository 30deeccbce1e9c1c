"""A net's ranges over calibration data, on zoo:lenet's test digits as `toolkit data` writes
them (a CSV read by `toolkit infer`'s own input stream): 'data' is the transformed inputs'
min and max exactly; a later top's the min and max of what toolkit.load(...).infer computes
for it with that top as the net's output; the examples are a seeded draw; memory stays flat
over many batches."""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import toolkit
from toolkit.cli import main
from toolkit.commands.io import open_inputs
from toolkit.errors import UserError
from toolkit.quantization.calibrate import HistogramObserver
from toolkit.quantization.collect import calibration_batches, collect_ranges, float_tops
from toolkit.training.data import InputTransform
from toolkit.zoo.resolve import load_net

TOPS = ["data", "conv1", "pool1", "conv2", "pool2", "ip1", "ip2", "prob"]


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    """The 359 test digits' CSV (data_0..data_63,label) and its pixels as [N, 1, 8, 8]."""
    path = tmp_path_factory.mktemp("calib") / "digits.csv"
    assert main(["data", "zoo:lenet", "--split", "test", "--out", str(path)]) == 0
    table = np.loadtxt(path, delimiter=",", skiprows=1, dtype=np.float32)
    return path, table[:, :64].reshape(-1, 1, 8, 8)


def stream(path):
    net = load_net("zoo:lenet")
    return open_inputs([str(path)], ["data"], list(net.spec.inputs), {"data": ("N", 1, 8, 8)},
                       drop_columns={"label"}, image_reader=InputTransform.of(net).image_reader)


def test_the_tops_are_the_infer_phases_float_blobs_in_order():
    assert float_tops(load_net("zoo:lenet")) == TOPS


def test_minmax_ranges_are_the_inputs_and_the_tops_as_infer_computes_them(digits):
    path, pixels = digits
    with stream(path) as rows:
        got = collect_ranges("zoo:lenet", None, rows, max_examples=1000, batch_size=50)
    assert list(got) == TOPS
    scaled = pixels * np.float32(0.0625)                 # the net's train.data scale, as infer applies it
    assert got["data"] == (float(scaled.min()), float(scaled.max())) == (0.0, 1.0)
    for top in ("conv2", "ip2"):
        model = toolkit.load(toolkit.Net("zoo:lenet", set={"outputs": [top]}))
        values = model.infer(pixels)[top]
        np.testing.assert_allclose(got[top], (values.min(), values.max()), rtol=1e-6, atol=1e-6, err_msg=top)
    assert got["conv2"][0] == 0.0 and got["conv2"][1] > 1      # after the in-place ReLU
    assert got["ip2"][0] < -1 and got["ip2"][1] > 1


def test_the_examples_are_a_seeded_draw_and_histograms_see_each_batch(digits):
    path, pixels = digits
    arrays = {"data": pixels}
    with stream(path) as rows:
        drawn = [b["data"] for b in calibration_batches(rows, max_examples=40, batch_size=16, seed=5)]
    assert [len(b) for b in drawn] == [16, 16, 8]
    order = np.random.default_rng(5).permutation(len(pixels))[:40]
    np.testing.assert_array_equal(np.concatenate(drawn), pixels[order])
    # the same draw from arrays; the percentile ranges are those of an observer fed those batches
    got = collect_ranges("zoo:lenet", None, arrays, ["data", "ip1"], "percentile", max_examples=40,
                         batch_size=16, seed=5, percentile=99.0)
    model = toolkit.load(toolkit.Net("zoo:lenet", set={"outputs": ["ip1"]}))
    observer = HistogramObserver("percentile", True, percentile=99.0)      # ORT's default: of the magnitudes
    for batch in drawn:
        observer.update({"data": batch * np.float32(0.0625), "ip1": model.infer(batch)["ip1"]})
    want = observer.ranges()
    assert got["data"] == want["data"]
    np.testing.assert_allclose(got["ip1"], want["ip1"], rtol=1e-5)
    other = collect_ranges("zoo:lenet", None, arrays, ["ip1"], max_examples=40, seed=6)
    assert other != collect_ranges("zoo:lenet", None, arrays, ["ip1"], max_examples=40, seed=5)


def test_memory_stays_flat_over_many_batches(digits):
    """1,000 examples in 32 batches need no more memory than 64 in 2: the activations of one
    batch and the histograms, never all of them (conv1's alone would be 4 MB)."""
    _path, pixels = digits
    many = {"data": np.tile(pixels, (3, 1, 1, 1))[:1000]}
    # imports and caches first, the plans of both batch sizes included (1,000 ends with a batch of
    # 8, whose plan would otherwise be built, and its kernels compiled, inside the measurement)
    collect_ranges("zoo:lenet", None, many, method="percentile", max_examples=1000, batch_size=32)
    # each size twice, in turn, and the smaller peak of the two: what the interpreter allocates now
    # and then for the whole process (a table of its own rebuilt, megabytes in a test worker that
    # has imported much) lands in one run at most, while memory that grows with the batches is
    # in both
    peaks: dict[int, list[int]] = {64: [], 1000: []}
    for examples in (64, 1000, 64, 1000):
        tracemalloc.start()
        collect_ranges("zoo:lenet", None, many, method="percentile", max_examples=examples, batch_size=32)
        peaks[examples].append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    few, lots = min(peaks[64]), min(peaks[1000])
    assert lots < 1.2 * few + 500_000 and lots < 4_000_000, peaks


@pytest.mark.parametrize("call,said", [
    (dict(tops=["conv9"]), "no float top named 'conv9'"),
    (dict(method="kl"), "not one of minmax, percentile, entropy"),
    (dict(max_examples=0), "at least one example"),
    (dict(data={"data": np.zeros((0, 1, 8, 8), np.float32)}), "has no rows")])
def test_a_mistake_is_one_line(call, said):
    args = dict(net="zoo:lenet", weights=None, data={"data": np.zeros((4, 1, 8, 8), np.float32)}) | call
    with pytest.raises(UserError, match=said) as caught:
        collect_ranges(**args)
    assert "\n" not in str(caught.value)


def test_calibrated_scales_quantize_lenet_to_the_fp32_accuracy(digits, tmp_path):
    """The ranges of 256 seeded examples, as the net file's quantization section: the int8 net
    (the quantize pass) predicts the 359 held-out digits as the fp32 net does."""
    import yaml

    from toolkit.quantization.scales import quantization_section
    from toolkit.training.feeding import load_data, train_spec
    net = load_net("zoo:lenet")
    train, test = load_data(net, train_spec(net))              # transformed: pixels / 16
    raw = {"data": train.arrays["data"] * np.float32(16)}
    ranges = collect_ranges("zoo:lenet", None, raw, TOPS[:-1], "percentile", max_examples=256)
    section = quantization_section(ranges, calibration={"method": "percentile", "examples": 256, "data": "train"})
    section["float"] = [{"layer": "prob", "reason": "softmax"}]
    path = tmp_path / "lenet_int8.yaml"
    path.write_text(open(net.file).read() + yaml.safe_dump({"quantization": section}))
    weights = net.weights_or_published(None)
    pixels = test.arrays["data"] * np.float32(16)
    fp32 = toolkit.load("zoo:lenet").infer(pixels)["prob"]
    int8 = toolkit.load(str(path), weights=weights).infer(pixels)["prob"]
    assert 0 < np.abs(int8 - fp32).max() < 0.1
    assert np.mean(int8.argmax(1) == fp32.argmax(1)) >= 0.99
    assert np.mean(int8.argmax(1) == test.arrays["label"]) >= 0.98
