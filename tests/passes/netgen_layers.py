"""One layer at a time for the random nets of ``netgen.py``: ``LayerWriter`` adds a layer of each
type the generator writes (its parameters drawn at random, its top's shape and value bounds
recorded as a ``Blob``), with the bookkeeping (fresh names, inputs, lr/decay multipliers, fillers).
Also the generator's limits, ``Blob``, ``GeneratedNet`` and ``catalog``."""
from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import dataclass, field

from netgen_bounds import INF, activation_bounds, bounded_exp, product_bounds, scaled_bounds

# exp(3) ~ 20: Exp of anything bounded by this stays small, and so does Exp of Exp of TanH.
EXP_MAX_INPUT = 3.0
# Log's gradient is 1/x: a floor of 0.01 keeps it (and float32 rounding of it) moderate.
LOG_MIN_INPUT = 0.01
MAX_CHANNELS = 6


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


def catalog() -> set[str]:
    """The layer types registered in ``layers/`` (Scale is used only where it exists)."""
    from layers import LAYERS
    return set(LAYERS)


class LayerWriter:
    """Adds layers to one net being generated, reading and recording each blob by name, so that
    an in-place layer's effect is seen by everything below it. ``NetGenerator`` (netgen_blocks.py)
    builds the net from these."""

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
        lo, hi = activation_bounds(kind, params, x.lo, x.hi)
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
        floor = bounded_exp(x.lo - x.hi) / classes if math.isfinite(x.lo - x.hi) else 0.0
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
            parts = [scaled_bounds(c, lo, hi) for c, (lo, hi) in zip(coeff, bounds)]
            lo, hi = sum(p[0] for p in parts), sum(p[1] for p in parts)
        elif operation == "prod":
            lo, hi = product_bounds(bounds)
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
