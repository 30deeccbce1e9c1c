"""The observers' ranges against ONNX Runtime's own calibrators fed the same arrays in the same
batches: MinMaxCalibrater's ranges, and HistogramCollector's percentile and entropy thresholds,
symmetric and not, over data whose later batches reach past the first's range (so the
histogram grows as ORT grows it), with outliers, all positive, all zero, and a tensor of one
value."""
from __future__ import annotations

import numpy as np
import pytest

from toolkit.errors import UserError
from toolkit.quantization.calibrate import HistogramObserver, MinMaxObserver, make_observer

calibrate = pytest.importorskip("onnxruntime.quantization.calibrate")


def batches(seed=0, count=6):
    """name -> list of float32 batches of activations' shapes."""
    rng = np.random.default_rng(seed)
    out = {
        # a conv's output: normal, later batches wider
        "conv": [rng.normal(0.1, 1.0 + k, (4, 3, 5, 5)).astype(np.float32) for k in range(count)],
        # after a ReLU: all >= 0, mostly zeros, a long tail and one outlier
        "relu": [np.maximum(rng.standard_t(3, (4, 50)), 0).astype(np.float32) for _ in range(count)],
        # all negative, the first batch widest (the histogram never grows)
        "neg": [(-rng.exponential(2.0 / (k + 1), (8, 16)) - 0.5).astype(np.float32) for k in range(count)],
        "zero": [np.zeros((2, 3), np.float32) for _ in range(count)],
        "const": [np.full((3, 4), 1.5, np.float32) for _ in range(count)],
    }
    out["relu"][3][0, 0] = 80.0
    return out


def feed(observer, data):
    for k in range(len(next(iter(data.values())))):
        observer.update({name: arrays[k] for name, arrays in data.items()})
    return observer.ranges()


def ort_histogram(method, symmetric, data, num_bins, percentile=99.999, num_quantized_bins=128):
    collector = calibrate.HistogramCollector(method, symmetric, num_bins, num_quantized_bins, percentile, "same")
    for k in range(len(next(iter(data.values())))):
        collector.collect({name: arrays[k] for name, arrays in data.items()})
    return {name: (float(v[0]), float(v[1])) for name, v in collector.compute_collection_result().items()}


def assert_ranges(got, want):
    assert set(got) == set(want)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6, atol=0, err_msg=name)


def ort_calibrater(folder, method, data, **extra):
    """ONNX Runtime's own calibrater (create_calibrator) run over ``data``'s batches: an ONNX
    model of one Identity per tensor, its inputs the tensors, so that ORT calibrates them."""
    import onnx
    from onnx import TensorProto, helper
    names = list(data)
    graph = helper.make_graph([helper.make_node("Identity", [n], [n + "_out"]) for n in names], "calibrated",
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in names],
                              [helper.make_tensor_value_info(n + "_out", TensorProto.FLOAT, None) for n in names])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), folder / "m.onnx")

    class Reader(calibrate.CalibrationDataReader):
        def __init__(self):
            self.batches = iter(range(len(data[names[0]])))

        def get_next(self):
            k = next(self.batches, None)
            return None if k is None else {n: data[n][k] for n in names}

    calibrater = calibrate.create_calibrator(folder / "m.onnx", calibrate_method=method,
                                             augmented_model_path=str(folder / "augmented.onnx"), extra_options=extra)
    calibrater.collect_data(Reader())
    return {name: tuple(float(np.asarray(x).reshape(())) for x in v.range_value[:2])
            for name, v in calibrater.compute_data().data.items() if name in data}


@pytest.mark.parametrize("symmetric", [False, True])
def test_minmax_equals_onnx_runtimes_minmax_calibrater(symmetric, tmp_path):
    data = batches()
    got = feed(MinMaxObserver(symmetric), data)
    assert got == ort_calibrater(tmp_path, calibrate.CalibrationMethod.MinMax, data, symmetric=symmetric)
    assert got["relu"] == ((-80.0, 80.0) if symmetric else (0.0, 80.0))


@pytest.mark.parametrize("method,extra", [("Entropy", {"num_bins": 512}), ("Percentile", {"symmetric": False}),
                                          ("Percentile", {"symmetric": True, "percentile": 99.0})])
def test_histograms_of_all_batches_at_once_equal_onnx_runtimes_calibraters(method, extra, tmp_path):
    """ORT's histogram calibraters keep every batch and make one histogram of them all: the
    observer fed them as one array gives the same ranges."""
    data = batches(4)
    whole = {name: [np.stack(arrays)] for name, arrays in data.items()}
    observer = HistogramObserver(method.lower(), extra.get("symmetric", False), extra.get("num_bins"),
                                 percentile=extra.get("percentile", 99.999), one_sided=False)
    want = ort_calibrater(tmp_path, getattr(calibrate.CalibrationMethod, method), data, **extra)
    assert_ranges(feed(observer, whole), want)


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("percentile", [99.999, 99.0, 90.0])
def test_percentile_equals_onnx_runtimes_histogram_collector(symmetric, percentile):
    data = {k: v for k, v in batches(1).items() if k != "zero"}
    got = feed(HistogramObserver("percentile", symmetric, percentile=percentile), data)
    want = ort_histogram("percentile", symmetric, data, 2048, percentile)
    assert_ranges(got, want)
    # the percentile clips: the outlier 80 is outside relu's 99% range
    if percentile == 99.0:
        assert got["relu"][1] < 80.0


@pytest.mark.parametrize("num_bins,names,symmetric", [
    (2048, ("neg", "zero", "const"), False),       # TensorRT's 2048 bins, each histogram of one width
    (128, None, False),                             # few bins that the later batches' reach grows
    (128, None, True)])                             # (ORT's entropy ignores symmetric: so here)
def test_entropy_equals_onnx_runtimes_histogram_collector(num_bins, names, symmetric):
    data = {k: v for k, v in batches(2).items() if names is None or k in names}
    got = feed(HistogramObserver("entropy", symmetric, num_bins=num_bins, one_sided=False), data)
    want = ort_histogram("entropy", symmetric, data, num_bins)
    assert_ranges(got, want)
    if names is None:
        # the KL search clips relu's long tail: its threshold well inside the outlier
        assert 0 < got["relu"][1] < 40.0 and got["relu"][0] == 0.0
        assert got["conv"][0] < -5 and got["conv"][1] > 5


def test_entropy_of_sparse_heavy_tailed_samples_equals_onnx_runtimes():
    """Few values over many bins: each quantized level spread over its bins as an integer (ORT
    stores q as int64), which moves the threshold here."""
    data = {f"t{seed}": [np.random.default_rng(seed).standard_t(2, n).astype(np.float32)]
            for seed, n in ((2, 500), (35, 500), (37, 1000))}      # samples where rounding q would move it
    got = feed(HistogramObserver("entropy", num_bins=512, one_sided=False), data)
    assert_ranges(got, ort_histogram("entropy", False, data, 512))
    assert all(got[k][1] < v[0].max() and got[k][0] > v[0].min() for k, v in data.items())    # tails clipped


def _entropy_of(x: np.ndarray, **options) -> tuple[float, float]:
    observer = HistogramObserver("entropy", **options)
    for i in range(0, len(x), 50_000):
        observer.update({"t": x[i:i + 50_000]})
    return observer.ranges()["t"]


def test_entropy_of_a_relu_output_is_searched_one_sided_over_256_levels():
    """A ReLU's output (half exact zeros, then a normal's positive half) is quantized to uint8 over
    [0, t]: searched over windows [0, t] of 256 levels, its threshold is no longer far inside the
    99.999th percentile (ORT's symmetric 128-level search put it at 2.82, two thirds of it)."""
    x = np.maximum(np.random.default_rng(0).normal(0, 1, 1_000_000), 0).astype(np.float32)
    percentile = feed(HistogramObserver("percentile", True), {"t": [x]})["t"][1]
    assert 4.2 < percentile < 4.4
    lo, hi = _entropy_of(x)
    assert lo == 0.0 and hi >= 0.95 * percentile
    assert _entropy_of(x, one_sided=False, num_bins=2048)[1] < 0.7 * percentile     # ORT's search, as before


def test_entropy_thresholds_of_known_distributions():
    """Where the best window is known: uniform values (any window inside them clips mass that
    256 levels over all of them would hold, and a uniform level is quantized without loss), with a
    ReLU's spike of zeros and one far outlier, end at the uniform's top, the outlier clipped; a
    standard normal's symmetric 128-level window clips its tails near 4.2 sigma."""
    rng = np.random.default_rng(1)
    x = np.concatenate([np.zeros(200_000), rng.uniform(0, 1, 200_000), [3.0]]).astype(np.float32)
    rng.shuffle(x)
    lo, hi = _entropy_of(x)
    assert lo == 0.0 and 0.995 < hi < 1.01
    normal = rng.normal(0, 1, 1_000_000).astype(np.float32)
    lo, hi = _entropy_of(normal)
    assert -4.5 < lo < -3.9 and 3.9 < hi < 4.5 and abs(lo + hi) < 0.05


def test_histograms_hold_bins_not_activations():
    """Memory flat over many batches: what an observer holds does not grow with the batches fed
    while their range stays put (a histogram of the values, never the values)."""
    rng = np.random.default_rng(3)
    observer = HistogramObserver("entropy")
    sizes = []
    for k in range(200):
        observer.update({"t": np.clip(rng.normal(0, 1, (16, 64)), -4, 4).astype(np.float32)})
        if k in (10, 199):
            sizes.append(sum(np.asarray(x).nbytes for x in observer.histograms["t"]))
    assert sizes[0] == sizes[1] < 60_000       # 4096 int64 counts and their float32 edges
    assert observer.histograms["t"][0].sum() == 200 * 16 * 64


@pytest.mark.parametrize("method,symmetric", [("entropy", False), ("percentile", True)])
def test_a_histogram_that_would_grow_without_bound_is_refused_in_one_line(method, symmetric):
    observer = HistogramObserver(method, symmetric)
    observer.update({"t": np.linspace(-1e-3, 1e-3, 100, dtype=np.float32)})
    observer.update({"t": np.float32([0.5])})                       # 500 times as far: 1 million bins
    assert observer.histograms["t"][0].size > 500_000
    with pytest.raises(UserError, match="'t': a batch reaches so far past") as caught:
        observer.update({"t": np.float32([5.0])})                   # 5,000 times: 10 million bins
    assert "\n" not in str(caught.value)


def test_make_observer_checks_its_arguments():
    assert isinstance(make_observer("minmax"), MinMaxObserver)
    # ONNX Runtime's create_calibrator defaults: percentile of the magnitudes, the others not
    assert [make_observer(m).symmetric for m in ("minmax", "percentile", "entropy")] == [False, True, False]
    assert make_observer("entropy").num_bins == 4096 and make_observer("percentile").percentile == 99.999
    for method, options, said in [("kl", {}, "not one of minmax, percentile, entropy, mse"),
                                  ("minmax", {"num_bins": 3}, "takes no num_bins"),
                                  ("percentile", {"percentile": 101}, "not between 0 and 100")]:
        with pytest.raises(UserError, match=said):
            make_observer(method, **options)


def _quantization_error(values: np.ndarray, lo: float, hi: float) -> float:
    """The squared error of ``values`` quantized to uint8 over [lo, hi] (a zero point, saturating),
    computed on the values themselves in float64."""
    step = (hi - lo) / 255
    zero = np.round(-lo / step)
    q = (np.clip(np.round(values / step) + zero, 0, 255) - zero) * step
    return float(((q - values) ** 2).sum())


def test_mse_picks_the_candidate_range_with_the_least_error_on_the_values_themselves():
    """A ReLU-like tensor, many small values and a thin tail to 40: the range of least squared
    error, found on a histogram of 8192 bins, is the one a search over the raw values finds (among
    the same candidates: the range times 0.30 .. 1.00), and it clips the tail."""
    rng = np.random.default_rng(7)
    values = np.concatenate([rng.exponential(1.0, 200_000), [40.0]]).astype(np.float32)
    observer = make_observer("mse")
    for batch in np.array_split(values, 4):
        observer.update({"t": batch})
    (lo, hi), = observer.ranges().values()
    v = values.astype(np.float64)
    errors = {f: _quantization_error(v, 0.0, float(v.max()) * f) for f in np.round(np.linspace(0.3, 1.0, 71), 2)}
    best = min(errors, key=errors.get)
    assert lo == 0.0 and hi == pytest.approx(float(v.max()) * best, rel=1e-6), (hi, best)
    # measured: 0.79 of minmax's range, 0.797 of its error
    assert best == pytest.approx(0.79) and errors[best] / errors[1.0] == pytest.approx(0.797, abs=0.001)
    # a tensor with no tail keeps its whole range
    flat = make_observer("mse")
    flat.update({"t": rng.uniform(0, 1, 100_000).astype(np.float32)})
    assert flat.ranges()["t"][1] == pytest.approx(1.0, abs=1e-3)
