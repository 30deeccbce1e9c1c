"""Observers that turn named tensors, fed batch by batch, into the range each is quantized over:
MinMax (the running minimum and maximum), Percentile (a histogram's central ``percentile``),
Entropy (the clipping threshold whose quantized histogram is nearest the float one in KL
divergence, TensorRT's method) and MSE (the range whose 8-bit quantization of the histogram has
the least squared error, the criterion of PyTorch's HistogramObserver, searched here over the
values' range scaled by 0.30, 0.31, .. 1.00). Each holds a few numbers or a histogram per tensor,
never the activations, so memory stays flat however many batches are fed.

The results of the first three equal ONNX Runtime's calibrators' (onnxruntime/quantization/calibrate.py:
``MinMaxCalibrater`` and ``HistogramCollector``) fed the same arrays in the same batches: the
same histograms, grown the same way when a later batch reaches further, and the same
float32 arithmetic in the KL search. ORT's ``EntropyCalibrater`` defaults to 128 bins, which
leaves its search one candidate (the whole range); here entropy keeps TensorRT's 2048 bins a
side (4096 over the values' symmetric range).

One difference from ORT, on by default (``one_sided``): a tensor with no negative value (a
ReLU's output, quantized to uint8 over [0, t]) is searched one-sided, windows [0, t] quantized
to 256 levels, as TensorRT's and ORT's own entropy calibrators do for unsigned data. ORT's
HistogramCollector searches every tensor over symmetric windows [-t, t] of 128 levels, which
for a ReLU output leaves 64 levels on the side the values are on, and so picks a threshold
several times narrower than the one the 256 levels of uint8 can afford. A signed tensor is
searched symmetric with 128 levels, as ORT does."""
from __future__ import annotations

from typing import Mapping

import numpy as np

from ..errors import UserError

METHODS = ("minmax", "percentile", "entropy", "mse")
DEFAULT_PERCENTILE = 99.999
DEFAULT_BINS = {"percentile": 2048, "entropy": 4096, "mse": 8192}
# mse: the candidate ranges, the values' [min, max] (zero included) scaled by each of these
MSE_FRACTIONS = np.round(np.linspace(0.3, 1.0, 71), 2)
QUANTIZED_BINS = 128
# an unsigned tensor's levels (uint8's 256) when entropy searches it one-sided
UNSIGNED_QUANTIZED_BINS = 256
# a histogram widened past this many bins (a batch reaching thousands of times past the first
# one's range) is refused rather than grown: ORT would grow it without bound
MAX_BINS = 1 << 22


class MinMaxObserver:
    """The running min and max of each tensor; ``symmetric``: (-m, m) with m the larger
    magnitude (ORT's MinMaxCalibrater without its moving average)."""

    method = "minmax"

    def __init__(self, symmetric: bool = False):
        self.symmetric = symmetric
        self.seen: dict[str, tuple[np.float32, np.float32]] = {}

    def update(self, arrays: Mapping[str, np.ndarray]) -> None:
        for name, array in arrays.items():
            array = np.asarray(array)
            if array.size == 0:
                continue
            lo, hi = np.nanmin(array), np.nanmax(array)
            if name in self.seen:
                lo, hi = min(self.seen[name][0], lo), max(self.seen[name][1], hi)
            self.seen[name] = (lo, hi)

    def ranges(self) -> dict[str, tuple[float, float]]:
        out = {}
        for name, (lo, hi) in self.seen.items():
            if self.symmetric:
                m = max(abs(lo), abs(hi))
                lo, hi = -m, m
            out[name] = (float(lo), float(hi))
        return out


class HistogramObserver:
    """A histogram per tensor; ``ranges`` reads the percentile or entropy range off it.
    Percentile with ``symmetric`` bins the magnitudes from their smallest to largest and keeps
    (-t, t); otherwise the histogram is of the values over (-t, t) with t the largest
    magnitude seen, widened by whole bins of the same width when a batch reaches past it (the
    counts so far keep their bins). Either range is then clipped to the values' min and max."""

    def __init__(self, method: str = "percentile", symmetric: bool = False, num_bins: int | None = None,
                 num_quantized_bins: int = QUANTIZED_BINS, percentile: float = DEFAULT_PERCENTILE,
                 one_sided: bool = True):
        if method not in ("percentile", "entropy", "mse"):
            raise UserError(f"histogram calibration method '{method}' is not 'percentile', 'entropy' or 'mse'")
        if not 0 <= percentile <= 100:
            raise UserError(f"percentile {percentile} is not between 0 and 100")
        self.method, self.symmetric, self.percentile = method, symmetric, percentile
        self.num_bins = DEFAULT_BINS[method] if num_bins is None else int(num_bins)
        self.num_quantized_bins = int(num_quantized_bins)
        # entropy: a tensor with no negative value searched over [0, t] with 256 levels (False: ORT's
        # symmetric windows for every tensor)
        self.one_sided = bool(one_sided)
        if self.num_bins < 1 or self.num_quantized_bins < 1:
            raise UserError("a histogram needs at least one bin")
        # name -> (counts, edges, min, max[, threshold])
        self.histograms: dict[str, tuple] = {}

    @property
    def _of_magnitudes(self) -> bool:
        return self.method == "percentile" and self.symmetric

    def update(self, arrays: Mapping[str, np.ndarray]) -> None:
        for name, array in arrays.items():
            flat = np.asarray(array).reshape(-1)
            if flat.dtype == np.float64:
                flat = flat.astype(np.float32)     # ORT's histograms are of float32 tensors
            if self._of_magnitudes:
                self._add_magnitudes(name, flat)
            else:
                self._add_values(name, flat)

    def _add_magnitudes(self, name: str, flat: np.ndarray) -> None:
        lo, hi = _min_max(flat)
        flat = np.absolute(flat)
        if name not in self.histograms:
            counts, edges = np.histogram(flat, bins=self.num_bins)
            self.histograms[name] = (counts, edges.astype(flat.dtype), lo, hi)
            return
        old_counts, edges, old_lo, old_hi = self.histograms[name]
        top = np.nanmax(flat)
        if top > edges[-1]:
            width = edges[1] - edges[0]
            # more bins of the same width up to the new largest magnitude (np.arange may add one past it)
            _check_bins(name, int((top - edges[-1]) / width) + len(edges))
            edges = np.hstack((edges, np.arange(edges[-1] + width, top + width, width)))
        counts, edges = np.histogram(flat, bins=edges)
        counts[:len(old_counts)] += old_counts
        self.histograms[name] = (counts, edges.astype(flat.dtype), min(old_lo, lo), max(old_hi, hi))

    def _add_values(self, name: str, flat: np.ndarray) -> None:
        lo, hi = _min_max(flat)
        threshold = np.array(max(abs(lo), abs(hi)), dtype=flat.dtype)
        if name not in self.histograms:
            counts, edges = np.histogram(flat, self.num_bins, range=(-threshold, threshold))
            self.histograms[name] = (counts, edges, lo, hi, threshold)
            return
        old_counts, old_edges, old_lo, old_hi, old_threshold = self.histograms[name]
        lo, hi = min(old_lo, lo), max(old_hi, hi)
        if threshold <= old_threshold:
            counts, _ = np.histogram(flat, len(old_counts), range=(-old_threshold, old_threshold))
            self.histograms[name] = (counts + old_counts, old_edges, lo, hi, old_threshold)
            return
        if old_threshold == 0:
            counts, edges = np.histogram(flat, len(old_counts), range=(-threshold, threshold))
            counts += old_counts
        else:
            # widen both sides by whole bins of the old width, so the old counts keep their bins
            old_bins = len(old_counts)
            stride = 2 * old_threshold / old_bins
            half = int((threshold - old_threshold) // stride + 1)
            bins = old_bins + 2 * half
            _check_bins(name, bins)
            threshold = half * stride + old_threshold
            counts, edges = np.histogram(flat, bins, range=(-threshold, threshold))
            counts[half:bins - half] += old_counts
        self.histograms[name] = (counts, edges, lo, hi, threshold)

    def ranges(self) -> dict[str, tuple[float, float]]:
        if self.method == "percentile":
            return {name: self._percentile_range(h) for name, h in self.histograms.items()}
        if self.method == "mse":
            return {name: _mse_range(h, self.symmetric) for name, h in self.histograms.items()}
        return {name: _entropy_range(h, self.num_quantized_bins, self.one_sided)
                for name, h in self.histograms.items()}

    def _percentile_range(self, histogram: tuple) -> tuple[float, float]:
        counts, edges, lo, hi = histogram[:4]
        total = counts.sum()
        if total == 0:
            return float(lo), float(hi)
        cdf = np.cumsum(counts / total)
        if self.symmetric:
            right = edges[np.searchsorted(cdf, self.percentile / 100.0)]
            left = -right
        else:
            cut = (100.0 - self.percentile) / 200.0
            left, right = edges[np.searchsorted(cdf, cut)], edges[np.searchsorted(cdf, 1.0 - cut)]
        return float(max(left, lo)), float(min(right, hi))


def _mse_range(histogram: tuple, symmetric: bool = False) -> tuple[float, float]:
    """The range, of the values' [min, max] (zero included) scaled by each of MSE_FRACTIONS, whose
    8-bit quantization of the histogram's bin centres has the least squared error summed over the
    counts (the first of equal errors): 256 levels with a zero point, or 255 symmetric about zero
    (``symmetric``). Values past a range saturate to its ends, as quantize_linear does."""
    counts, edges, lo, hi = histogram[:4]
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    if hi <= lo:
        return lo, hi
    centres = (edges[:-1].astype(np.float64) + edges[1:]) / 2
    weights = counts.astype(np.float64)
    best, best_error = (lo, hi), None
    for fraction in MSE_FRACTIONS:
        a, b = lo * fraction, hi * fraction
        if symmetric:
            m = max(-a, b)
            step, zero, levels = 2 * m / 254, 0.0, (-127, 127)
        else:
            step = (b - a) / 255
            zero, levels = np.round(-a / step), (0, 255)
        q = (np.clip(np.round(centres / step) + zero, *levels) - zero) * step
        error = float(np.dot(weights, (q - centres) ** 2))
        if best_error is None or error < best_error:
            best, best_error = (a, b) if not symmetric else (-max(-a, b), max(-a, b)), error
    return float(best[0]), float(best[1])


def _check_bins(name: str, bins: int) -> None:
    if bins > MAX_BINS:
        raise UserError(f"calibration of '{name}': a batch reaches so far past the first batches' range that its "
                        f"histogram would need {bins} bins (at most {MAX_BINS}); calibrate with minmax, or with "
                        "larger batches")


def _min_max(flat: np.ndarray):
    if flat.size == 0:
        return np.array(0, dtype=flat.dtype), np.array(0, dtype=flat.dtype)
    return np.nanmin(flat), np.nanmax(flat)


def _smooth(p: np.ndarray, eps: float = 0.0001) -> np.ndarray | None:
    """Zero bins given ``eps``, taken off the others (the KL divergence needs no zero in q)."""
    is_zeros = (p == 0).astype(np.float32)
    is_nonzeros = (p != 0).astype(np.float32)
    n_zeros = is_zeros.sum()
    n_nonzeros = p.size - n_zeros
    if not n_nonzeros:
        return None
    eps1 = eps * float(n_zeros) / float(n_nonzeros)
    smoothed = p.astype(np.float32)
    smoothed += eps * is_zeros + (-eps1) * is_nonzeros
    return smoothed


def _kl(p: np.ndarray, q: np.ndarray) -> np.float32:
    """sum p log(p / q) of the two normalised, in float32."""
    p = p / np.sum(p, axis=0, keepdims=True)
    q = q / np.sum(q, axis=0, keepdims=True)
    terms = np.empty(p.shape, dtype=p.dtype)
    terms[:] = p * np.log(p / q)
    terms[(p == 0) & (q >= 0)] = 0
    terms[~((p > 0) & (q > 0))] = np.inf
    return np.sum(terms, axis=0).astype(np.float32)


def _entropy_range(histogram: tuple, num_quantized_bins: int, one_sided: bool = False) -> tuple[float, float]:
    """The window of the histogram whose clipped distribution p is nearest (KL) its quantization
    q, then clipped to the values' min and max: symmetric windows centred on the zero bin,
    ``num_quantized_bins`` levels over the window; or, ``one_sided`` and no value below zero,
    windows [0, t] of 256 levels (uint8's), as TensorRT searches unsigned data."""
    counts, edges, lo, hi = histogram[:4]
    bins = counts.size
    zero_bin = bins // 2
    if one_sided and lo >= 0 and bins >= 2:
        levels = UNSIGNED_QUANTIZED_BINS
        if zero_bin + 1 < bins:
            # a ReLU's exact zeros are no distribution to fit (zero is exact in any window): their
            # spike would make every window that merges bins look worse, so the zero bin counts as
            # its neighbour does (TensorRT's calibrator does the same)
            counts = counts.copy()
            counts[zero_bin] = counts[zero_bin + 1]
        # the histogram spans (-t, t): the values' bins are the upper half
        candidates = [(zero_bin, zero_bin + i) for i in range(min(levels, bins - zero_bin), bins - zero_bin + 1)]
    else:
        levels = num_quantized_bins
        candidates = [(zero_bin - i, min(zero_bin + i + 1, bins)) for i in range(levels // 2, zero_bin + 1)]
    best, best_div = (np.float32(0), np.float32(0)), None
    for start, end in candidates:
        div = _window_divergence(counts, start, end, levels)
        if best_div is None or div < best_div:       # the first of equal divergences, as argmin
            best, best_div = (edges[start], edges[end]), div
    left, right = best
    return float(max(left, lo)), float(min(right, hi))


def _window_divergence(counts: np.ndarray, start: int, end: int, levels: int) -> np.float32:
    """KL divergence of the histogram clipped to bins [start, end) (what the window clips joins
    its end bins) from that window quantized to ``levels`` levels (ORT's arithmetic)."""
    sliced = counts[start:end]
    p = sliced.copy()
    p[0] += counts[:start].sum()
    p[-1] += counts[end:].sum()
    nonzeros = (p != 0).astype(np.int64)
    merged = sliced.size // levels
    whole = levels * merged
    quantized = sliced[:whole].reshape(levels, merged).sum(axis=1) if merged else np.zeros(levels, dtype=np.int64)
    quantized[-1] += sliced[whole:].sum()
    # each level spread over its bins that p has counts in (to an integer, as ORT stores it)
    norm = nonzeros[:whole].reshape(levels, merged).sum(axis=1) if merged else np.zeros(levels, dtype=np.int64)
    spread = np.zeros(levels, dtype=np.int64)
    used = norm != 0
    spread[used] = (quantized[used] / norm[used]).astype(np.int64)
    q = np.zeros(p.size, dtype=np.int64)
    q[:whole] = np.repeat(spread, merged)
    p, q = _smooth(p), _smooth(q)
    return np.float32(np.inf) if p is None or q is None else _kl(p, q)


def make_observer(method: str = "minmax", symmetric: bool | None = None, **options):
    """An observer for ``method`` (one of METHODS); ``options``: ``num_bins``, ``one_sided``,
    ``num_quantized_bins``, ``percentile`` of the histogram methods. ``symmetric`` None: ONNX
    Runtime's defaults (create_calibrator): percentile of the magnitudes, the others not."""
    if method not in METHODS:
        raise UserError(f"calibration method '{method}' is not one of {', '.join(METHODS)}")
    if symmetric is None:
        symmetric = method == "percentile"
    if method == "minmax":
        if options:
            raise UserError(f"minmax calibration takes no {', '.join(sorted(options))}")
        return MinMaxObserver(symmetric)
    return HistogramObserver(method, symmetric, **options)
