"""Seeded random nets for the optimiser's differential test (``test_differential.py``).

``generate(seed)`` returns the YAML text of a valid net (docs/spec.md section 1) drawn from the layer
catalog in ``layers/``; ``generate_net(seed)`` returns the same text with what a test needs to
feed the net: which integer inputs are class labels (and how many classes every layer reading
them accepts) and which float inputs are probabilities. The same seed always gives the same net.

The nets are tiny (batch symbol N, spatial sizes 4..9, 1..6 channels) so that each one runs in
milliseconds, and they are made of what an optimiser rewrites: in-place layers, residual sums,
parallel Convolutions / InnerProducts on one bottom that are concatenated or summed,
Convolution + BatchNorm (running or batch statistics) + ReLU, Convolution + max pooling, chains
of elementwise activations, Slice / Concat and reshape round trips, duplicated computations,
shared parameters, lr_mult / decay_mult, layers that run only in some phases, float32 and float64.

Every net has a train-phase loss and an infer-phase output, and stays finite on standard-normal
inputs with any moderate weights: each blob carries an interval that bounds its values, Exp only
takes a blob bounded above by EXP_MAX_INPUT, and Log only a blob bounded below by LOG_MIN_INPUT.
The generator also avoids degenerate numerics that would make two correct evaluation orders
disagree by more than rounding (a Softmax over one class, batch statistics over one value).
"""
from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import dataclass, field

import yaml

INF = math.inf
# exp(3) ~ 20: Exp of anything bounded by this stays small, and so does Exp of Exp of TanH.
EXP_MAX_INPUT = 3.0
# Log's gradient is 1/x: a floor of 0.01 keeps it (and float32 rounding of it) moderate.
LOG_MIN_INPUT = 0.01
MAX_CHANNELS = 6

# The layer types this generator writes (Scale only where layers/ registers it).
GENERATED_TYPES = frozenset({
    "Convolution", "Pooling", "InnerProduct", "ReLU", "Sigmoid", "TanH", "ELU", "Softplus", "AbsVal",
    "Exp", "Log", "GELU", "Softmax", "LogSoftmax", "Dropout", "BatchNorm", "Concat", "Slice", "Eltwise",
    "Flatten", "Reshape", "SoftmaxWithLoss", "EuclideanLoss", "SigmoidCrossEntropyLoss", "Accuracy", "Scale",
    "RNN", "LSTM", "GRU", "LayerNorm", "MultiHeadAttention", "Permute"})

FILLERS = [
    {"type": "gaussian", "std": 0.2},
    {"type": "uniform", "min": -0.3, "max": 0.3},
    {"type": "msra"},
    {"type": "xavier", "variance_norm": "average"},
    {"type": "constant", "value": 0.1},
]


@dataclass
class Blob:
    """A named blob as the layers below its latest producer see it (all phases)."""

    name: str
    shape: tuple              # ("N", d1, d2, ...): the batch symbol, then fixed sizes
    lo: float = -INF          # every value lies in [lo, hi], in every phase
    hi: float = INF

    @property
    def rank(self) -> int:
        return len(self.shape)


@dataclass
class GeneratedNet:
    """A generated net's text and what feeding it takes."""

    seed: int
    text: str
    dtype: str                                            # the float type of every float input
    labels: dict[str, int] = field(default_factory=dict)  # integer input -> its values lie in [0, n)
    unit_inputs: list[str] = field(default_factory=list)  # float inputs fed with values in [0, 1]
    layer_types: set[str] = field(default_factory=set)


def generate(seed: int) -> str:
    """The YAML text of a random valid net; deterministic for ``seed``."""
    return generate_net(seed).text


def generate_net(seed: int, train_dropout: bool = True) -> GeneratedNet:
    """A random valid net and how to feed it. ``train_dropout=False`` keeps Dropout out of the
    train phase (the layer then runs only in test and infer, where it is the identity)."""
    return _Generator(seed, train_dropout).build()


def catalog() -> set[str]:
    """The layer types registered in ``layers/`` (Scale is used only where it exists)."""
    from layers import LAYERS
    return set(LAYERS)


# -- value bounds ---------------------------------------------------------------------------------
def _sigmoid(x: float) -> float:
    return 0.0 if x < -700 else 1.0 / (1.0 + math.exp(-min(x, 700)))


def _softplus(x: float) -> float:
    if x > 20:                 # linear above 20, as the layer
        return x
    return math.log1p(math.exp(x)) if x > -700 else 0.0


def _exp(x: float) -> float:
    return 0.0 if x == -INF else math.exp(min(x, 700))


def _activation_bounds(kind: str, params: dict, lo: float, hi: float) -> tuple[float, float]:
    """Bounds of an elementwise activation's output from its input's."""
    if kind == "ReLU":
        slope = params.get("negative_slope", 0.0)
        f = (lambda v: v if v >= 0 else (0.0 if slope == 0 else slope * v))
        return f(lo), f(hi)
    if kind == "Sigmoid":
        return _sigmoid(lo), _sigmoid(hi)
    if kind == "TanH":
        return math.tanh(lo), math.tanh(hi)
    if kind == "ELU":
        alpha = params.get("alpha", 1.0)
        f = (lambda v: v if v >= 0 else alpha * (_exp(v) - 1.0))
        return f(lo), f(hi)
    if kind == "Softplus":
        return _softplus(lo), _softplus(hi)
    if kind == "AbsVal":
        low = 0.0 if lo <= 0 <= hi else min(abs(lo), abs(hi))
        return low, max(abs(lo), abs(hi))
    if kind == "Exp":
        return _exp(lo), _exp(hi)
    if kind == "Log":
        return math.log(lo), (math.log(hi) if hi < INF else INF)
    if kind == "GELU":          # its minimum is about -0.17, at x ~ -0.75
        return (-0.2 if lo < 0 else 0.0), max(hi, 0.0)
    raise ValueError(kind)


def _scaled(c: float, lo: float, hi: float) -> tuple[float, float]:
    if c == 0:
        return 0.0, 0.0
    return (c * lo, c * hi) if c > 0 else (c * hi, c * lo)


def _product_bounds(bounds: list[tuple[float, float]]) -> tuple[float, float]:
    lo, hi = bounds[0]
    for b_lo, b_hi in bounds[1:]:
        if all(math.isfinite(v) for v in (lo, hi, b_lo, b_hi)):
            corners = [lo * b_lo, lo * b_hi, hi * b_lo, hi * b_hi]
            lo, hi = min(corners), max(corners)
        elif lo >= 0 and b_lo >= 0:
            lo, hi = lo * b_lo, INF
        else:
            lo, hi = -INF, INF
    return lo, hi


# -- the generator --------------------------------------------------------------------------------
class _Generator:
    """Builds one net: a trunk of random blocks on a data input, then one or two heads (a
    train loss each, with Accuracy for test and an infer output). Blocks and heads are methods;
    each reads blobs by name, so an in-place layer's effect is seen by everything below it."""

    def __init__(self, seed: int, train_dropout: bool):
        self.seed = seed
        self.rng = random.Random(seed)
        self.train_dropout = train_dropout
        self.dtype = "float64" if self.rng.random() < 0.4 else "float32"
        self.inputs: dict[str, dict] = {}
        self.layers: list[dict] = []
        self.blobs: dict[str, Blob] = {}
        self.labels: dict[str, int] = {}
        self.unit_inputs: list[str] = []
        self.counts: Counter = Counter()
        # (layer name, type, input shape, the parameters that fix its weights' shapes)
        self.owners: list[tuple[str, str, tuple, dict]] = []
        self.outputs: list[str] = []          # infer-phase blobs worth naming in `outputs`
        self.trunk_end = ""
        self.list_outputs = False             # write `outputs:` (else it is left out half the time)
        self.types = catalog()

    # -- bookkeeping -------------------------------------------------------------------------
    def fresh(self, prefix: str) -> str:
        self.counts[prefix] += 1
        return f"{prefix}{self.counts[prefix]}"

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def add(self, type_: str, bottom, top, prefix: str | None = None, **params) -> dict:
        # a layer writing one new blob takes the blob's name, as in Caffe's examples
        fresh_top = isinstance(top, str) and top != bottom and top not in self.blobs
        layer = {"name": top if fresh_top else self.fresh(prefix or type_.lower()), "type": type_,
                 "bottom": bottom if isinstance(bottom, str) or len(bottom) > 1 else bottom[0],
                 "top": top}
        layer.update({k: v for k, v in params.items() if v is not None})
        self.layers.append(layer)
        return layer

    def set_blob(self, name: str, shape: tuple, lo: float = -INF, hi: float = INF) -> str:
        self.blobs[name] = Blob(name, tuple(shape), lo, hi)
        return name

    def top_for(self, bottom: str, prefix: str, inplace_p: float) -> str:
        """The bottom itself (an in-place layer, as Caffe) with probability ``inplace_p``."""
        return bottom if self.chance(inplace_p) else self.fresh(prefix)

    def add_input(self, prefix: str, shape: tuple, dtype: str) -> str:
        name = self.fresh(prefix)
        self.inputs[name] = {"shape": list(shape), "dtype": dtype}
        return name

    def mults(self, n_params: int) -> dict:
        """lr_mult / decay_mult now and then: one number for all parameters or one each."""
        out = {}
        if self.chance(0.25):
            values = [self.rng.choice([0, 0.5, 1, 2]) for _ in range(n_params)]
            out["lr_mult"] = values if n_params > 1 and self.chance(0.6) else values[0]
        if self.chance(0.2):
            values = [self.rng.choice([0, 1, 2]) for _ in range(n_params)]
            out["decay_mult"] = values if n_params > 1 and self.chance(0.6) else values[0]
        return out

    def fillers(self, bias: bool) -> dict:
        out = {}
        if self.chance(0.2):
            out["weight_filler"] = dict(self.rng.choice(FILLERS))
        if bias and self.chance(0.15):
            out["bias_filler"] = {"type": "constant", "value": self.rng.choice([0.1, -0.2])}
        return out

    # -- layers with weights ---------------------------------------------------------------------
    def conv(self, bottom: str, num_output: int | None = None, same_size: bool = False,
             allow_share: bool = True) -> str:
        x = self.blobs[bottom]
        _, c, h, w = x.shape
        share = None
        if allow_share and self.chance(0.2):
            candidates = [owner for owner in self.owners
                          if owner[1] == "Convolution" and owner[2] == x.shape
                          and (num_output is None or owner[3]["num_output"] == num_output)
                          and (not same_size or self._keeps_size(owner[3]))]
            if candidates:
                share = self.rng.choice(candidates)
        if share is not None:
            owner, _, _, params = share
            params = dict(params)
            layer = self.add("Convolution", bottom, self.fresh("conv"), "conv", share=owner, **params)
        else:
            params = self._conv_params(c, h, w, num_output, same_size)
            bias = params.get("bias_term", True)
            layer = self.add("Convolution", bottom, self.fresh("conv"), "conv", **params,
                             **self.fillers(bias), **self.mults(2 if bias else 1))
            self.owners.append((layer["name"], "Convolution", x.shape, params))
        oh, ow = self._conv_out(h, w, params)
        return self.set_blob(layer["top"], ("N", params["num_output"], oh, ow))

    @staticmethod
    def _pair(value) -> tuple[int, int]:
        return (value, value) if isinstance(value, int) else tuple(value)

    def _keeps_size(self, params: dict) -> bool:
        kh, kw = self._pair(params["kernel_size"])
        ph, pw = self._pair(params.get("pad", 0))
        return (self._pair(params.get("stride", 1)) == (1, 1) and self._pair(params.get("dilation", 1)) == (1, 1)
                and kh == 2 * ph + 1 and kw == 2 * pw + 1)

    def _conv_out(self, h: int, w: int, params: dict) -> tuple[int, int]:
        (kh, kw), (sh, sw) = self._pair(params["kernel_size"]), self._pair(params.get("stride", 1))
        (ph, pw), (dh, dw) = self._pair(params.get("pad", 0)), self._pair(params.get("dilation", 1))
        return (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1, (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1

    def _conv_params(self, c: int, h: int, w: int, num_output: int | None, same_size: bool) -> dict:
        rng = self.rng
        o = num_output or rng.randint(1, MAX_CHANNELS)
        if same_size:
            k = rng.choice([1, 3, 3])
            params = {"num_output": o, "kernel_size": k, "pad": k // 2}
        else:
            params = {"num_output": o, "kernel_size": 1}
            for _ in range(20):
                kh = rng.choice([1, 2, 3, 3])
                kw = kh if self.chance(0.8) else rng.choice([1, 2, 3])
                trial = {"num_output": o, "kernel_size": kh if kh == kw else [kh, kw]}
                pad = rng.randint(0, max(kh, kw) // 2)
                if pad:
                    trial["pad"] = pad if self.chance(0.8) else [pad, rng.randint(0, pad)]
                if self.chance(0.3):
                    trial["stride"] = rng.choice([2, 2, [1, 2]])
                if self.chance(0.1):
                    trial["dilation"] = 2
                oh, ow = self._conv_out(h, w, trial)
                if oh >= 1 and ow >= 1:
                    params = trial
                    break
        groups = [g for g in range(2, MAX_CHANNELS + 1) if c % g == 0 and o % g == 0]
        if groups and self.chance(0.25):
            params["group"] = rng.choice(groups)
        if self.chance(0.25):
            params["bias_term"] = False
        return params

    def inner_product(self, bottom: str, num_output: int | None = None, axis: int | None = None,
                      allow_share: bool = True) -> str:
        x = self.blobs[bottom]
        o = num_output or self.rng.randint(1, 8)
        share = None
        if allow_share and self.chance(0.25):
            candidates = [owner for owner in self.owners
                          if owner[1] == "InnerProduct" and owner[2] == x.shape and owner[3].get("axis") == axis
                          and (num_output is None or owner[3]["num_output"] == num_output)]
            if candidates:
                share, _, _, params = self.rng.choice(candidates)
        if share is not None:
            layer = self.add("InnerProduct", bottom, self.fresh("ip"), "ip", share=share, **params)
            o = params["num_output"]
        else:
            params = {"num_output": o}
            if axis is not None:
                params["axis"] = axis
            if self.chance(0.2):
                params["bias_term"] = False
            bias = params.get("bias_term", True)
            layer = self.add("InnerProduct", bottom, self.fresh("ip"), "ip", **params, **self.fillers(bias),
                             **self.mults(2 if bias else 1))
            self.owners.append((layer["name"], "InnerProduct", x.shape, params))
        keep = (params.get("axis", 1)) % x.rank
        return self.set_blob(layer["top"], x.shape[:keep] + (o,))

    def batch_norm(self, bottom: str) -> str:
        x = self.blobs[bottom]
        params: dict = {}
        spatial = math.prod(x.shape[2:]) if x.rank > 2 else 1
        # batch statistics outside train only where a channel has several values even at batch 1
        choices = [None, None, None, True] + ([False] if spatial >= 4 else [])
        stats = self.rng.choice(choices)
        if stats is not None:
            params["use_global_stats"] = stats
        affine = not self.chance(0.25)
        if not affine:
            params["affine"] = False
        if self.chance(0.2):
            params["eps"] = self.rng.choice([1e-3, 1e-4])
        if self.chance(0.2):
            params["momentum"] = self.rng.choice([0.0, 0.5, 0.9])
        if affine:
            params.update(self.mults(2))
        top = self.top_for(bottom, "bn", 0.5)
        self.add("BatchNorm", bottom, top, "bn", **params)
        return self.set_blob(top, x.shape)

    def scale(self, bottom: str) -> str:
        """Scale with a learned weight over some of the axes (one bottom)."""
        x = self.blobs[bottom]
        options = [{}, {"bias_term": True}, {"num_axes": 0}, {"num_axes": -1, "bias_term": True}]
        if x.rank >= 3:
            options.append({"axis": 2, "num_axes": 1})
        params = dict(self.rng.choice(options))
        if self.chance(0.2):
            params["weight_filler"] = {"type": "uniform", "min": 0.5, "max": 1.5}
        n_params = 2 if params.get("bias_term") else 1
        params.update(self.mults(n_params))
        top = self.top_for(bottom, "scale", 0.4)
        self.add("Scale", bottom, top, "scale", **params)
        return self.set_blob(top, x.shape)

    # -- elementwise layers ----------------------------------------------------------------------
    def activation(self, bottom: str, kind: str | None = None, inplace_p: float = 0.5,
                   phase: list[str] | None = None) -> str:
        x = self.blobs[bottom]
        if kind is None:
            options = ["ReLU", "ReLU", "Sigmoid", "TanH", "ELU", "Softplus", "AbsVal", "GELU"]
            if x.hi <= EXP_MAX_INPUT:
                options += ["Exp", "Exp"]
            if x.lo >= LOG_MIN_INPUT:
                options += ["Log", "Log"]
            kind = self.rng.choice(options)
        params: dict = {}
        if kind == "ReLU" and self.chance(0.3):
            params["negative_slope"] = self.rng.choice([0.1, 0.01, 0.25])
        elif kind == "ELU" and self.chance(0.3):
            params["alpha"] = self.rng.choice([0.5, 2.0])
        elif kind == "GELU" and self.chance(0.6):
            params["approximate"] = self.rng.choice(["none", "tanh"])
        lo, hi = _activation_bounds(kind, params, x.lo, x.hi)
        if phase is not None:      # other phases see the blob unchanged
            lo, hi = min(lo, x.lo), max(hi, x.hi)
            top = bottom
        else:
            top = self.top_for(bottom, kind.lower(), inplace_p)
        self.add(kind, bottom, top, kind.lower(), phase=phase, **params)
        return self.set_blob(top, x.shape, lo, hi)

    def dropout(self, bottom: str) -> str:
        x = self.blobs[bottom]
        ratio = self.rng.choice([None, 0.1, 0.25, 0.5])
        if not self.train_dropout:
            # outside train Dropout is the identity; in place, the blob exists in every phase
            self.add("Dropout", bottom, bottom, "drop", dropout_ratio=ratio, phase=["test", "infer"])
            return bottom
        keep = 1.0 - (0.5 if ratio is None else ratio)
        top = self.top_for(bottom, "drop", 0.6)
        self.add("Dropout", bottom, top, "drop", dropout_ratio=ratio)
        # in train a kept value is divided by the keep probability and a dropped one is 0
        return self.set_blob(top, x.shape, min(0.0, x.lo / keep), max(0.0, x.hi / keep))

    def softmax(self, bottom: str, axis: int = 1, log: bool = False, phase=None, prefix=None) -> str:
        x = self.blobs[bottom]
        kind = "LogSoftmax" if log else "Softmax"
        params = {} if axis == 1 and self.chance(0.5) else {"axis": axis}
        top = self.fresh(prefix or kind.lower())
        self.add(kind, bottom, top, kind.lower(), phase=phase, **params)
        if log:
            return self.set_blob(top, x.shape, -INF, 0.0)
        classes = x.shape[axis]
        floor = _exp(x.lo - x.hi) / classes if math.isfinite(x.lo - x.hi) else 0.0
        return self.set_blob(top, x.shape, floor, 1.0)

    def eltwise(self, bottoms: list[str], operation: str | None = None) -> str:
        rng = self.rng
        operation = operation or rng.choice(["sum", "sum", "prod", "max"])
        params: dict = {}
        if operation != "sum" or self.chance(0.5):
            params["operation"] = operation
        bounds = [(self.blobs[b].lo, self.blobs[b].hi) for b in bottoms]
        if operation == "sum":
            coeff = [1.0] * len(bottoms)
            if self.chance(0.4):
                coeff = [rng.choice([1, 1, 0.5, -1, 2, 0, -0.25]) for _ in bottoms]
                if sum(coeff) == 0:
                    # equal bottoms (shared weights, duplicated layers) would cancel to exact 0:
                    # BatchNorm's batch statistics below would divide rounding noise by sqrt(eps)
                    coeff[0] += 1
                params["coeff"] = coeff
            parts = [_scaled(c, lo, hi) for c, (lo, hi) in zip(coeff, bounds)]
            lo, hi = sum(p[0] for p in parts), sum(p[1] for p in parts)
        elif operation == "prod":
            lo, hi = _product_bounds(bounds)
        else:
            lo, hi = max(b[0] for b in bounds), max(b[1] for b in bounds)
        top = self.fresh("elt")
        self.add("Eltwise", bottoms, top, "elt", **params)
        return self.set_blob(top, self.blobs[bottoms[0]].shape, lo, hi)

    def concat(self, bottoms: list[str], axis: int = 1) -> str:
        shapes = [self.blobs[b].shape for b in bottoms]
        shape = list(shapes[0])
        shape[axis] = sum(s[axis] for s in shapes)
        params = {} if axis == 1 and self.chance(0.5) else {"axis": axis}
        top = self.fresh("cat")
        self.add("Concat", bottoms, top, "cat", **params)
        return self.set_blob(top, shape, min(self.blobs[b].lo for b in bottoms),
                             max(self.blobs[b].hi for b in bottoms))

    def slice(self, bottom: str, axis: int, pieces: int) -> list[str]:
        x = self.blobs[bottom]
        size = x.shape[axis]
        params: dict = {} if axis == 1 and self.chance(0.5) else {"axis": axis}
        if size % pieces == 0 and self.chance(0.5):
            bounds = [size // pieces * i for i in range(pieces + 1)]
        else:
            points = sorted(self.rng.sample(range(1, size), pieces - 1))
            params["slice_point"] = points
            bounds = [0] + points + [size]
        tops = [self.fresh("part") for _ in range(pieces)]
        self.add("Slice", bottom, tops, "slice", **params)
        for top, lo, hi in zip(tops, bounds, bounds[1:]):
            shape = list(x.shape)
            shape[axis] = hi - lo
            self.set_blob(top, shape, x.lo, x.hi)
        return tops

    def reshape(self, bottom: str, shape: list[int], out_shape: tuple) -> str:
        x = self.blobs[bottom]
        top = self.fresh("reshape")
        self.add("Reshape", bottom, top, "reshape", shape=shape)
        return self.set_blob(top, out_shape, x.lo, x.hi)

    def flatten(self, bottom: str, axis: int = 1, end_axis: int = -1) -> str:
        x = self.blobs[bottom]
        end = end_axis % x.rank
        shape = x.shape[:axis] + (math.prod(x.shape[axis: end + 1]),) + x.shape[end + 1:]
        params = {}
        if axis != 1 or self.chance(0.3):
            params["axis"] = axis
        if end_axis != -1:
            params["end_axis"] = end_axis
        top = self.fresh("flat")
        self.add("Flatten", bottom, top, "flat", **params)
        return self.set_blob(top, shape, x.lo, x.hi)

    def pooling(self, bottom: str, pool: str | None = None, plain: bool = False) -> str:
        """A Pooling layer; ``plain``: an unpadded, floor-mode window (what fuses into a conv)."""
        x = self.blobs[bottom]
        _, c, h, w = x.shape
        rng = self.rng
        pool = pool or rng.choice(["max", "max", "ave"])
        params: dict = {"pool": pool} if pool == "ave" or self.chance(0.6) else {}
        lo, hi = x.lo, x.hi
        if not plain and self.chance(0.15):
            params["global_pooling"] = True
            top = self.top_for(bottom, "pool", 0.0)
            self.add("Pooling", bottom, top, "pool", **params)
            return self.set_blob(top, ("N", c, 1, 1), lo, hi)
        k = rng.choice([k for k in (2, 3) if k <= min(h, w)] or [1])
        stride = rng.choice([1, k]) if k > 1 else 1
        params["kernel_size"] = k
        if stride > 1:
            params["stride"] = stride
        pad = 0
        if not plain:
            if k > 1 and self.chance(0.3):
                pad = rng.randint(1, k // 2)
                params["pad"] = pad
            if self.chance(0.25):
                params["ceil_mode"] = True
            if pool == "ave" and self.chance(0.3):
                params["count_include_pad"] = False
        if pool == "ave" and pad and params.get("count_include_pad", True):
            # padded zeros enter the average: a window holds at least one real value of k*k
            lo = min(lo, 0.0) if lo <= 0 else lo / (k * k)
            hi = max(hi, 0.0) if hi >= 0 else hi / (k * k)
        ceil = params.get("ceil_mode", False)
        oh, ow = (self._pool_out(s, k, stride, pad, ceil) for s in (h, w))
        top = self.fresh("pool")
        self.add("Pooling", bottom, top, "pool", **params)
        return self.set_blob(top, ("N", c, oh, ow), lo, hi)

    @staticmethod
    def _pool_out(size: int, k: int, stride: int, pad: int, ceil: bool) -> int:
        span = size + 2 * pad - k
        if ceil:
            out = (span + stride - 1) // stride + 1
            return out - 1 if (out - 1) * stride >= size + pad else out
        return span // stride + 1

    # -- blocks: a few layers that form one structure ---------------------------------------------
    def block(self, x: str) -> str:
        rank = self.blobs[x].rank
        if rank == 4:
            table = [(self.conv_bn_relu, 5), (self.conv_pool, 4), (self.pool_block, 2),
                     (self.activation_chain, 3), (self.residual, 4), (self.parallel, 4),
                     (self.slice_concat, 2), (self.duplicate, 2), (self.positive_log, 2),
                     (self.dropout_block, 1), (self.reshape_roundtrip, 1), (self.phase_inplace, 2),
                     (self.gate, 1), (self.to_rank3, 3), (self.to_rank2, 2)]
            if "Scale" in self.types:
                table += [(self.bn_scale, 2), (self.squeeze_excite, 2)]
            if self.blobs[x].shape[2] * self.blobs[x].shape[3] <= 4:   # small already: flatten soon
                table.append((self.to_rank2, 6))
        elif rank == 3:
            table = [(self.activation_chain, 2), (self.ip_axis2, 3), (self.seq_softmax, 1),
                     (self.dropout_block, 1), (self.to_rank2, 3), (self.batch_norm, 1),
                     (self.recurrent, 3), (self.layer_norm, 1), (self.attention, 2), (self.permute_time, 1)]
        else:
            table = [(self.ip_block, 5), (self.activation_chain, 3), (self.residual, 3), (self.parallel, 4),
                     (self.slice_concat, 2), (self.duplicate, 2), (self.positive_log, 2),
                     (self.dropout_block, 1), (self.phase_inplace, 2), (self.gate, 1), (self.to_rank4, 1)]
            if "Scale" in self.types:
                table.append((self.scale, 1))
        blocks, weights = zip(*table)
        return self.rng.choices(blocks, weights)[0](x)

    def conv_bn_relu(self, x: str) -> str:
        h = self.conv(x)
        if self.chance(0.6):
            h = self.batch_norm(h)
        if self.chance(0.7):
            h = self.activation(h, "ReLU", inplace_p=0.8)
        return h

    def conv_pool(self, x: str) -> str:
        h = self.conv(x)
        if self.chance(0.3):           # a monotone activation between conv and max pooling
            h = self.activation(h, self.rng.choice(["ReLU", "TanH", "Sigmoid"]), inplace_p=0.7)
        if min(self.blobs[h].shape[2:]) < 2:
            return h
        return self.pooling(h, "max", plain=self.chance(0.7))

    def pool_block(self, x: str) -> str:
        return self.pooling(x)

    def activation_chain(self, x: str) -> str:
        for _ in range(self.rng.randint(1, 4)):
            x = self.activation(x)
        return x

    def positive_log(self, x: str) -> str:
        """Log of something bounded away from 0: Exp / Sigmoid / Softplus of a TanH, or |x| plus
        Exp of a TanH, or a Softmax of a TanH."""
        recipe = self.rng.choice(["exp", "sigmoid", "softplus", "abs_plus", "softmax"])
        t = self.activation(x, "TanH", inplace_p=0.3)
        if recipe == "abs_plus":
            a = self.activation(x, "AbsVal", inplace_p=0.0)
            e = self.activation(t, "Exp", inplace_p=0.0)
            p = self.eltwise([a, e], "sum")
        elif recipe == "softmax" and self.blobs[t].shape[1] >= 2:
            p = self.softmax(t, 1)
        else:
            kind = {"exp": "Exp", "sigmoid": "Sigmoid", "softplus": "Softplus"}.get(recipe, "Exp")
            p = self.activation(t, kind, inplace_p=0.5)
        if self.blobs[p].lo < LOG_MIN_INPUT:       # an Eltwise coeff may have spoiled the floor
            return p
        return self.activation(p, "Log", inplace_p=0.5)

    def residual(self, x: str) -> str:
        """y = x + branch(x) (Eltwise sum, sometimes weighted), then maybe an in-place ReLU."""
        b = self.blobs[x]
        if b.rank == 4:
            h = self.conv(x, b.shape[1], same_size=True)
            if self.chance(0.5):
                h = self.batch_norm(h)
            h = self.activation(h, "ReLU" if self.chance(0.6) else None)
            if self.chance(0.4):
                h = self.conv(h, b.shape[1], same_size=True)
        else:
            h = self.inner_product(x, b.shape[1])
            h = self.activation(h, "ReLU" if self.chance(0.6) else None)
        if self.chance(0.15):           # the trunk changes in place after the fork (Caffe order)
            self.activation(x, "ReLU", inplace_p=1.0)
        pair = [x, h] if self.chance(0.7) else [h, x]
        y = self.eltwise(pair, "sum")
        if self.chance(0.6):
            y = self.activation(y, "ReLU", inplace_p=0.8)
        return y

    def parallel(self, x: str) -> str:
        """Several Convolutions / InnerProducts reading one bottom, joined by Concat or Eltwise."""
        b = self.blobs[x]
        n = self.rng.randint(2, 3)
        join = self.rng.choice(["concat", "concat", "eltwise"])
        width = self.rng.randint(1, MAX_CHANNELS)
        branches = []
        for _ in range(n):
            out = width if join == "eltwise" or self.chance(0.3) else None
            if b.rank == 4:
                h = self.conv(x, out, same_size=True)
            else:
                h = self.inner_product(x, out)
            if self.chance(0.4):
                h = self.activation(h)
            branches.append(h)
        if join == "concat":
            return self.concat(branches)
        return self.eltwise(branches)

    def slice_concat(self, x: str) -> str:
        """Slice into pieces, treat some differently, join them again (or drop one: dead code)."""
        b = self.blobs[x]
        axes = [a for a in range(1, b.rank) if b.shape[a] >= 2]
        if not axes:
            return self.activation(x)
        axis = self.rng.choice(axes)
        pieces = min(self.rng.randint(2, 3), b.shape[axis])
        parts = self.slice(x, axis, pieces)
        parts = [self.activation(p) if self.chance(0.4) else p for p in parts]
        if len(parts) > 2 and self.chance(0.3):
            parts = parts[:-1]                    # the last piece is never read
        if self.chance(0.3):
            self.rng.shuffle(parts)
        shapes = {self.blobs[p].shape for p in parts}
        if len(shapes) == 1 and self.chance(0.4):
            return self.eltwise(parts)
        return self.concat(parts, axis)

    def duplicate(self, x: str) -> str:
        """The same computation twice on one bottom (what common-subexpression elimination
        merges), the results combined."""
        kind = self.rng.choice(["activation", "softmax", "pool"])
        b = self.blobs[x]
        if kind == "softmax" and b.shape[1] >= 2:
            a, c = self.softmax(x), self.softmax(x)
        elif kind == "pool" and b.rank == 4 and min(b.shape[2:]) >= 2:
            a = self.pooling(x, "max", plain=True)
            twin = dict(self.layers[-1])
            twin["name"] = twin["top"] = self.fresh("pool")
            self.layers.append(twin)
            c = self.set_blob(twin["top"], self.blobs[a].shape, self.blobs[a].lo, self.blobs[a].hi)
        else:
            a = self.activation(x, "TanH" if self.chance(0.5) else "Sigmoid", inplace_p=0.0)
            kind = self.layers[-1]["type"]
            c = self.activation(x, kind, inplace_p=0.0)
        return self.eltwise([a, c])

    def dropout_block(self, x: str) -> str:
        return self.dropout(x)

    def phase_inplace(self, x: str) -> str:
        """An in-place layer that runs only in some phases: later layers see a different blob
        in each phase."""
        phase = self.rng.choice([["train"], ["test", "infer"], ["infer"], ["train", "test"]])
        kind = self.rng.choice(["ReLU", "TanH", "Sigmoid", "AbsVal"])
        return self.activation(x, kind, phase=phase if len(phase) > 1 or self.chance(0.5) else phase[0])

    def gate(self, x: str) -> str:
        """x times a Sigmoid of a branch: Eltwise prod, or a two-bottom Scale where it exists."""
        b = self.blobs[x]
        if b.rank == 4:
            g = self.conv(x, b.shape[1], same_size=True)
        else:
            g = self.inner_product(x, b.shape[1])
        g = self.activation(g, "Sigmoid", inplace_p=0.7)
        if "Scale" in self.types and self.chance(0.5):
            top = self.fresh("gated")
            self.add("Scale", [x, g], top, "scale", axis=0)
            lo, hi = _product_bounds([(b.lo, b.hi), (self.blobs[g].lo, self.blobs[g].hi)])
            return self.set_blob(top, b.shape, lo, hi)
        return self.eltwise([x, g] if self.chance(0.5) else [g, x], "prod")

    def bn_scale(self, x: str) -> str:
        """Caffe's BatchNorm (affine false) + Scale (bias_term true), maybe + ReLU."""
        before = len(self.layers)
        h = self.batch_norm(x)
        self.layers[before]["affine"] = False
        for key in ("lr_mult", "decay_mult"):
            self.layers[before].pop(key, None)
        h = self.scale(h)
        if self.chance(0.5):
            h = self.activation(h, "ReLU", inplace_p=0.8)
        return h

    def squeeze_excite(self, x: str) -> str:
        """Global average pool -> InnerProduct -> ReLU -> InnerProduct -> Sigmoid, scaling x per
        channel through a two-bottom Scale over axes [0, 2) (its shape is [N, C])."""
        b = self.blobs[x]
        c = b.shape[1]
        top = self.fresh("pool")
        self.add("Pooling", x, top, "pool", pool="ave", global_pooling=True)
        self.set_blob(top, ("N", c, 1, 1), b.lo, b.hi)
        s = self.inner_product(top, self.rng.randint(1, 4), allow_share=False)
        s = self.activation(s, "ReLU", inplace_p=0.8)
        s = self.inner_product(s, c, allow_share=False)
        s = self.activation(s, "Sigmoid", inplace_p=0.8)
        out = self.fresh("se")
        self.add("Scale", [x, s], out, "scale", axis=0)
        lo, hi = _product_bounds([(b.lo, b.hi), (self.blobs[s].lo, self.blobs[s].hi)])
        return self.set_blob(out, b.shape, lo, hi)

    def reshape_roundtrip(self, x: str) -> str:
        """Reshape to [N, C*H*W] (or [N, C, H*W]) and back: a pair a simplifier can remove."""
        b = self.blobs[x]
        _, c, h, w = b.shape
        if self.chance(0.5):
            flat = self.reshape(x, [0, -1], ("N", c * h * w))
        else:
            flat = self.flatten(x, 2) if self.chance(0.5) else self.reshape(x, [0, c, -1], ("N", c, h * w))
        if self.chance(0.4):
            flat = self.activation(flat)
        return self.reshape(flat, [0, c, h, w] if self.chance(0.5) else [-1, c, h, w], b.shape)

    def to_rank3(self, x: str) -> str:
        b = self.blobs[x]
        _, c, h, w = b.shape
        choice = self.rng.choice(["spatial", "channels", "reshape"])
        if choice == "spatial":
            return self.flatten(x, 2)                      # [N, C, H*W]
        if choice == "channels":
            return self.flatten(x, 1, 2)                   # [N, C*H, W]
        return self.reshape(x, [0, c, h * w], ("N", c, h * w))

    def to_rank2(self, x: str) -> str:
        b = self.blobs[x]
        features = math.prod(b.shape[1:])
        choice = self.rng.choice(["flatten", "reshape", "reshape_n", "ip", "ip"])
        if choice == "flatten":
            return self.flatten(x)
        if choice == "reshape":
            return self.reshape(x, [0, -1], ("N", features))
        if choice == "reshape_n":
            return self.reshape(x, [-1, features], ("N", features))
        return self.ip_block(x)

    def to_rank4(self, x: str) -> str:
        """InnerProduct to C*H*W features, reshaped to [N, C, H, W]."""
        c, h, w = self.rng.randint(1, 4), self.rng.randint(2, 5), self.rng.randint(2, 5)
        y = self.inner_product(x, c * h * w, allow_share=False)
        return self.reshape(y, [0, c, h, w] if self.chance(0.6) else [-1, c, h, w], ("N", c, h, w))

    def ip_block(self, x: str) -> str:
        h = self.inner_product(x)
        if self.chance(0.3):
            h = self.batch_norm(h)
        if self.chance(0.7):
            h = self.activation(h)
        return h

    def ip_axis2(self, x: str) -> str:
        h = self.inner_product(x, axis=self.rng.choice([2, -1]))
        if self.chance(0.5):
            h = self.activation(h)
        return h

    def recurrent(self, x: str) -> str:
        """RNN, LSTM or GRU over axis 1 as time, as a loop or unrolled; the whole sequence, or
        (then rank 2) its last step."""
        kind = self.rng.choice(["RNN", "LSTM", "GRU"])
        params = {"num_output": self.rng.randint(1, 4)}
        if self.chance(0.3):
            params["num_layers"] = 2
        if self.chance(0.4):
            params["bidirectional"] = True
        if self.chance(0.5):
            params["unroll"] = self.chance(0.5)
        relu = kind == "RNN" and self.chance(0.4)
        if relu:
            params["nonlinearity"] = "relu"
        sequence = self.chance(0.7)
        if not sequence:
            params["return_sequence"] = False
        top = self.fresh(kind.lower())
        self.add(kind, x, top, kind.lower(), **params)
        width = params["num_output"] * (2 if params.get("bidirectional") else 1)
        shape = ("N", self.blobs[x].shape[1], width) if sequence else ("N", width)
        return self.set_blob(top, shape, 0.0 if relu else -1.0, INF if relu else 1.0)

    def layer_norm(self, x: str) -> str:
        params = {} if self.chance(0.7) else {"affine": False}
        if self.chance(0.3):
            params["axis"] = 1                     # the last two axes
        top = self.top_for(x, "ln", 0.4)
        self.add("LayerNorm", x, top, "ln", **params)
        return self.set_blob(top, self.blobs[x].shape)

    def attention(self, x: str) -> str:
        """Self-attention over axis 1 (heads dividing the features), maybe causal."""
        b = self.blobs[x]
        width = b.shape[2]
        heads = self.rng.choice([h for h in (1, 2, 3) if width % h == 0])
        params = {"num_heads": heads}
        if self.chance(0.4):
            params["causal"] = True
        if self.chance(0.2):
            params["bias_term"] = False
        top = self.fresh("att")
        self.add("MultiHeadAttention", x, top, "att", **params)
        return self.set_blob(top, b.shape)

    def permute_time(self, x: str) -> str:
        b = self.blobs[x]
        top = self.fresh("perm")
        self.add("Permute", x, top, "perm", order=[0, 2, 1])
        return self.set_blob(top, ("N", b.shape[2], b.shape[1]), b.lo, b.hi)

    def seq_softmax(self, x: str) -> str:
        if self.blobs[x].shape[2] < 2:
            return self.activation(x)
        return self.softmax(x, self.rng.choice([2, -1]), log=self.chance(0.3))

    def phase_list(self, options: list) -> str | list[str]:
        phase = self.rng.choice(options)
        return phase[0] if len(phase) == 1 and self.chance(0.6) else phase

    # -- heads: losses (train), Accuracy (test), outputs (infer) ----------------------------------
    def label_input(self, shape: tuple, classes: int) -> str:
        """An integer label input, shared with an earlier head of the same shape now and then."""
        for name, spec in self.inputs.items():
            if name in self.labels and tuple(spec["shape"]) == shape and self.chance(0.5):
                self.labels[name] = min(self.labels[name], classes)
                return name
        name = self.add_input("label", shape, self.rng.choice(["int64", "int64", "int32"]))
        self.labels[name] = classes
        return name

    def float_input(self, shape: tuple, unit: bool) -> str:
        name = self.add_input("target", shape, self.dtype)
        if unit:
            self.unit_inputs.append(name)
        return name

    def loss_phase(self):
        return self.phase_list([["train"], ["train"], ["train"], ["train", "test"]])

    def classify_head(self, x: str) -> None:
        """Logits of K >= 2 classes over axis 1 ([N, K] or per pixel [N, K, H, W]) or axis 2 of a
        rank-3 blob; SoftmaxWithLoss in train, Accuracy in test, Softmax for infer."""
        b = self.blobs[x]
        k = self.rng.randint(2, 6)
        axis = 1
        if b.rank == 4 and self.chance(0.3):
            logits = self.conv(x, k, same_size=self.chance(0.5), allow_share=False)
            label_shape = ("N",) + self.blobs[logits].shape[2:]
        elif b.rank == 3 and self.chance(0.6):
            logits = self.inner_product(x, k, axis=2, allow_share=False)
            axis = self.rng.choice([2, -1])
            label_shape = ("N", b.shape[1])
        else:
            logits = self.inner_product(x, k, allow_share=False)
            label_shape = ("N",)
        label = self.label_input(label_shape, k)
        params: dict = {} if axis == 1 else {"axis": axis}
        phase = self.loss_phase()
        if phase == "train" and self.chance(0.25):
            # an ignored class (train only: the batch there has several labels, not all ignored)
            params["ignore_label"] = self.rng.randrange(k)
        if self.chance(0.2):
            params["loss_weight"] = self.rng.choice([0.5, 2.0])
        self.add("SoftmaxWithLoss", [logits, label], self.fresh("loss"), "loss", phase=phase, **params)
        acc: dict = {"phase": self.phase_list([["test"], ["test"], ["train", "test"]])}
        if axis != 1:
            acc["axis"] = axis
        if k > 2 and self.chance(0.3):
            acc["top_k"] = 2
        self.add("Accuracy", [logits, label], self.fresh("accuracy"), "accuracy", **acc)
        prob = self.softmax(logits, axis, log=self.chance(0.2), phase="infer", prefix="prob")
        self.outputs.append(prob)

    def regress_head(self, x: str) -> None:
        """EuclideanLoss against a float target input; the prediction is the infer output."""
        b = self.blobs[x]
        pred = x if b.rank == 2 and x not in self.inputs and self.chance(0.3) else self.inner_product(x, self.rng.randint(1, 5),
                                                                              allow_share=False)
        target = self.float_input(self.blobs[pred].shape, unit=False)
        pair = [pred, target] if self.chance(0.7) else [target, pred]
        self.add("EuclideanLoss", pair, self.fresh("loss"), "loss", phase=self.loss_phase(),
                 loss_weight=self.rng.choice([None, None, 0.5]))
        self.outputs.append(pred)

    def sigmoid_head(self, x: str) -> None:
        """SigmoidCrossEntropyLoss against probabilities (a float input) or 0/1 integers."""
        logits = self.inner_product(x, self.rng.randint(1, 5), allow_share=False)
        shape = self.blobs[logits].shape
        if self.chance(0.3):
            target = self.label_input(shape, 2)
        else:
            target = self.float_input(shape, unit=True)
        self.add("SigmoidCrossEntropyLoss", [logits, target], self.fresh("loss"), "loss",
                 phase=self.loss_phase())
        prob = self.fresh("prob")
        self.add("Sigmoid", logits, prob, "sigmoid", phase="infer")
        self.set_blob(prob, shape, 0.0, 1.0)
        self.outputs.append(prob)

    def aux_loss(self) -> None:
        """A second, weighted loss between two same-shaped blobs of the trunk."""
        by_shape: dict[tuple, list[str]] = {}
        for name, blob in self.blobs.items():
            if name not in self.inputs:
                by_shape.setdefault(blob.shape, []).append(name)
        pairs = [names for names in by_shape.values() if len(names) >= 2]
        if not pairs:
            return
        a, b = self.rng.sample(self.rng.choice(pairs), 2)
        self.add("EuclideanLoss", [a, b], self.fresh("loss"), "loss", phase="train",
                 loss_weight=self.rng.choice([0.1, 0.5]))

    # -- the whole net ---------------------------------------------------------------------------
    def build(self) -> GeneratedNet:
        rng = self.rng
        if self.chance(0.7):
            shape = ("N", rng.randint(1, MAX_CHANNELS), rng.randint(4, 9), rng.randint(4, 9))
        else:
            shape = ("N", rng.randint(2, 12))
        x = self.set_blob(self.add_input("data", shape, self.dtype), shape)
        for _ in range(rng.randint(2, 7)):
            x = self.block(x)
        self.trunk_end = x
        trunk = dict(self.blobs)
        heads = [self.classify_head, self.regress_head, self.sigmoid_head]
        for head in rng.sample(heads, rng.choice([1, 1, 2])):
            head(x)
        if self.chance(0.25):
            self.blobs = {k: v for k, v in self.blobs.items() if k in trunk}
            self.aux_loss()
        return GeneratedNet(self.seed, self.text(), self.dtype, dict(self.labels), list(self.unit_inputs),
                            {layer["type"] for layer in self.layers})

    def text(self) -> str:
        lines = [f"name: diff{self.seed}", "inputs:"]
        for name, spec in self.inputs.items():
            lines.append(f"  {name}: {_flow(spec)}")
        lines.append("layers:")
        lines += [f"  - {_flow(layer)}" for layer in self.layers]
        if self.chance(0.5) or self.list_outputs:
            outputs = list(self.outputs)
            if self.chance(0.3):
                # a trunk blob as an extra output (it may also feed the heads)
                outputs.append(self.trunk_end)
            lines.append(f"outputs: {_flow(list(dict.fromkeys(outputs)))}")
        return "\n".join(lines) + "\n"


def _flow(value) -> str:
    """One line of YAML flow style, as the examples in docs/spec.md are written."""
    return yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=10_000).strip()
