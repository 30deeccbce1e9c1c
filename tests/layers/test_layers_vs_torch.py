"""Every catalog layer against PyTorch (peers.torch_net), in float32 and float64.

Each case is a small net exercising one layer kind with non-default parameters. With random
weights (biases and BatchNorm statistics perturbed away from 0 and 1) loaded into both sides:
- infer phase: every blob, through the reference interpreter and through a compiled Plan;
- train phase: the objective, each loss top, the gradient of the objective with respect to every
  trainable parameter (compile.add_gradients) and every float input, and the running statistics
  after the step (graph.updates), through the interpreter and a Plan.
Tolerances: 1e-4 relative in float32, 1e-7 in float64 (elementwise, with an absolute floor of the
same fraction of the largest expected magnitude).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field

import numpy as np
import pytest
import yaml

torch = pytest.importorskip("torch")

from layers import LAYERS  # noqa: E402
from layers.control import BLOCK_TYPES  # noqa: E402
from toolkit.ops.autodiff import differentiate  # noqa: E402
from toolkit.compile import add_gradients  # noqa: E402
from toolkit.frontend import OBJECTIVE, Net  # noqa: E402
from toolkit.ir.graph import FLOAT_DTYPES  # noqa: E402
from peers.torch_net import SUPPORTED, TorchNet, to_numpy  # noqa: E402
from toolkit.ir.binding import bind_symbols  # noqa: E402
from toolkit.ops.interpreter import interpret  # noqa: E402
from toolkit.runtime.plan import Plan  # noqa: E402

from numeric_asserts import TOL, assert_close  # noqa: E402  (tests/ is on the path)
BATCH = 3


# -- comparison --------------------------------------------------------------------------------
# -- nets, weights and inputs ------------------------------------------------------------------
@dataclass
class Case:
    id: str
    inputs: dict                     # name -> (shape, dtype)
    layers: list                     # layer mappings, in order
    gens: dict = field(default_factory=dict)   # input name -> fn(rng, shape, dtype) -> array
    # parameters whose gradient is zero in exact arithmetic (a bias right before a BatchNorm in
    # batch-statistics mode): both sides must give rounding noise only, far below the others
    zero_grads: tuple = ()

    def text(self) -> str:
        doc = {"name": self.id,
               "inputs": {k: {"shape": list(s), "dtype": d} for k, (s, d) in self.inputs.items()},
               "layers": self.layers}
        return yaml.safe_dump(doc, sort_keys=False)


def L(name, type, bottom, top=None, **params):
    return {"name": name, "type": type, "bottom": bottom, "top": top or name, **params}


def head(bottom, classes=5):
    """InnerProduct to ``classes`` scores and a train-phase SoftmaxWithLoss on ``label``: a
    generic objective behind the layers under test."""
    return [L("head", "InnerProduct", bottom, num_output=classes),
            L("loss", "SoftmaxWithLoss", ["head", "label"], phase="train")]


IMG = {"data": (["N", 3, 5, 6], "float32"), "label": (["N"], "int64")}


def normal(scale=1.0, shift=0.0):
    return lambda rng, shape, dtype: (rng.normal(shift, scale, size=shape)).astype(dtype)


def uniform(lo, hi):
    return lambda rng, shape, dtype: rng.uniform(lo, hi, size=shape).astype(dtype)


def labels(classes):
    return lambda rng, shape, dtype: rng.integers(0, classes, size=shape).astype(dtype)


def key_padding(ratio=0.4):
    """A bool [N, S] key_padding_mask (true: ignored) that never masks key 0, so that no query
    (causal ones included) has every key masked."""
    def gen(rng, shape, dtype):
        mask = rng.random(shape) < ratio
        mask[:, 0] = False
        return mask
    return gen


def activation(id, type, gen=None, **params):
    layers = [L("act", type, "data", **params)] + head("act")
    return Case(id, dict(IMG), layers, {"data": gen} if gen else {})


CASES = [
    Case("conv_grouped_dilated_strided_padded",
         {"data": (["N", 4, 9, 11], "float32"), "label": (["N"], "int64")},
         [L("conv", "Convolution", "data", num_output=6, kernel_size=[3, 2], stride=[2, 1], pad=[1, 2],
            dilation=[2, 3], group=2)] + head("conv")),
    Case("conv_depthwise_nobias_then_1x1",
         {"data": (["N", 3, 8, 8], "float32"), "label": (["N"], "int64")},
         [L("conv1", "Convolution", "data", num_output=6, kernel_size=3, stride=2, pad=1, group=3,
            bias_term=False),
          L("relu", "ReLU", "conv1", "conv1"),
          L("conv2", "Convolution", "conv1", num_output=4, kernel_size=1, dilation=2)] + head("conv2")),
    Case("pool_max_padded_ceil",
         {"data": (["N", 3, 8, 9], "float32"), "label": (["N"], "int64")},
         [L("pool1", "Pooling", "data", pool="max", kernel_size=3, stride=2, pad=1, ceil_mode=True),
          L("pool2", "Pooling", "pool1", pool="max", kernel_size=[2, 3], stride=[1, 2], pad=[0, 1]),
          L("pool3", "Pooling", "pool2", pool="max", kernel_size=2)] + head("pool3")),
    Case("pool_ave_padded_ceil_include_pad",
         {"data": (["N", 3, 8, 9], "float32"), "label": (["N"], "int64")},
         [L("pool", "Pooling", "data", pool="ave", kernel_size=3, stride=2, pad=1, ceil_mode=True)]
         + head("pool")),
    Case("pool_ave_padded_ceil_exclude_pad",
         {"data": (["N", 3, 7, 9], "float32"), "label": (["N"], "int64")},
         [L("pool", "Pooling", "data", pool="ave", kernel_size=[3, 2], stride=[2, 2], pad=[1, 1],
            ceil_mode=True, count_include_pad=False),
          L("pool2", "Pooling", "pool", pool="ave", kernel_size=2, pad=1, count_include_pad=False)]
         + head("pool2")),
    Case("pool_global",
         dict(IMG),
         [L("gmax", "Pooling", "data", pool="max", global_pooling=True),
          L("gave", "Pooling", "data", pool="ave", global_pooling=True),
          L("cat", "Concat", ["gmax", "gave"])] + head("cat")),
    Case("inner_product_axes",
         {"data": (["N", 3, 4, 5], "float32"), "label": (["N"], "int64")},
         [L("ip1", "InnerProduct", "data", num_output=7, axis=2),
          L("ip2", "InnerProduct", "ip1", num_output=4, axis=-1, bias_term=False)] + head("ip2")),
    Case("relu_inplace", dict(IMG), [L("relu", "ReLU", "data", "data")] + head("data")),
    activation("relu_leaky", "ReLU", negative_slope=0.2),
    activation("sigmoid", "Sigmoid", normal(3.0)),
    activation("tanh", "TanH", normal(2.0)),
    activation("elu", "ELU", normal(2.0), alpha=0.7),
    activation("softplus_past_threshold", "Softplus", normal(15.0)),
    activation("absval", "AbsVal"),
    activation("exp", "Exp"),
    activation("log", "Log", uniform(0.3, 4.0)),
    activation("exp_base", "Exp", normal(1.0), base=2.0, scale=0.5, shift=0.25),
    activation("log_base", "Log", uniform(0.3, 4.0), base=10.0, scale=2.0, shift=0.5),
    activation("gelu_erf", "GELU", normal(2.0)),
    activation("gelu_tanh", "GELU", normal(2.0), approximate="tanh"),
    Case("activations_at_kinks",
         dict(IMG),
         [L("relu", "ReLU", "data"), L("leaky", "ReLU", "data", negative_slope=0.3),
          L("abs", "AbsVal", "data"), L("elu", "ELU", "data", alpha=2.0),
          L("sum", "Eltwise", ["relu", "leaky", "abs", "elu"], coeff=[1.0, -0.5, 0.25, 2.0])] + head("sum"),
         {"data": lambda rng, shape, dtype: rng.integers(-2, 3, size=shape).astype(dtype)}),
    Case("pool_max_ties",
         {"data": (["N", 2, 7, 7], "float32"), "label": (["N"], "int64")},
         [L("pool", "Pooling", "data", pool="max", kernel_size=3, stride=2, pad=1, ceil_mode=True),
          L("pool2", "Pooling", "data", pool="max", kernel_size=2),
          L("max", "Eltwise", ["data", "data"], operation="max"),
          L("cat", "Concat", ["pool", "pool"], axis=2),
          L("f1", "Flatten", "cat"), L("f2", "Flatten", "pool2"), L("f3", "Flatten", "max"),
          L("all", "Concat", ["f1", "f2", "f3"])] + head("all"),
         {"data": lambda rng, shape, dtype: rng.integers(-1, 2, size=shape).astype(dtype)}),
    Case("softmax_axes",
         {"data": (["N", 5, 4], "float32"), "label": (["N"], "int64")},
         [L("sm1", "Softmax", "data"),
          L("sm2", "Softmax", "data", axis=-1),
          L("lsm", "LogSoftmax", "data", axis=2),
          L("lsm1", "LogSoftmax", "data"),
          L("sum", "Eltwise", ["sm1", "sm2", "lsm", "lsm1"], coeff=[1.0, 2.0, 0.5, -0.25])] + head("sum"),
         {"data": normal(2.0)}),
    Case("relu_inplace_on_input_dropout",
         {"data": (["N", 10], "float32"), "label": (["N"], "int64")},
         [L("relu", "ReLU", "data", "data"),
          L("ip", "InnerProduct", "data", num_output=12),
          L("drop", "Dropout", "ip", dropout_ratio=0.3),
          L("drop2", "Dropout", "drop", "drop")] + head("drop")),
    Case("batchnorm_conv_train_stats",
         {"data": (["N", 3, 5, 6], "float32"), "label": (["N"], "int64")},
         [L("conv", "Convolution", "data", num_output=4, kernel_size=3, pad=1),
          L("bn", "BatchNorm", "conv", momentum=0.3, eps=1e-3),
          L("relu", "ReLU", "bn", "bn")] + head("bn"),
         {"data": normal(1.5, 0.7)}, zero_grads=("conv.bias",)),
    Case("batchnorm_inplace_2d_no_affine",
         {"data": (["N", 6], "float32"), "label": (["N"], "int64")},
         [L("ip", "InnerProduct", "data", num_output=5),
          L("bn", "BatchNorm", "ip", "ip", affine=False)] + head("ip"), zero_grads=("ip.bias",)),
    Case("batchnorm_3d_default",
         {"data": (["N", 4, 7], "float32"), "label": (["N"], "int64")},
         [L("bn", "BatchNorm", "data")] + head("bn"), {"data": normal(2.0, -1.0)}),
    Case("batchnorm_global_stats_in_train",
         dict(IMG),
         [L("bn", "BatchNorm", "data", use_global_stats=True, eps=1e-4)] + head("bn")),
    Case("batchnorm_batch_stats_everywhere",
         dict(IMG),
         [L("bn", "BatchNorm", "data", use_global_stats=False, momentum=0.05)] + head("bn")),
    Case("concat_axes",
         {"a": (["N", 2, 4, 5], "float32"), "b": (["N", 3, 4, 5], "float32"), "label": (["N"], "int64")},
         [L("cat1", "Concat", ["a", "b"]),
          L("cat2", "Concat", ["a", "a", "a"], axis=3),
          L("cat3", "Concat", ["cat1", "cat1"], axis=-2),
          L("one", "Concat", ["cat2"]),
          L("f1", "Flatten", "cat3"), L("f2", "Flatten", "one"),
          L("cat4", "Concat", ["f1", "f2"])] + head("cat4")),
    Case("slice_points_and_equal",
         {"data": (["N", 6, 4], "float32"), "label": (["N"], "int64")},
         [L("sl", "Slice", "data", ["s1", "s2", "s3"], slice_point=[1, 4]),
          L("back", "Concat", ["s3", "s1", "s2"]),
          L("sl2", "Slice", "data", ["t1", "t2"], axis=2),
          L("prod", "Eltwise", ["t1", "t2"], operation="prod"),
          L("sl3", "Slice", "back", ["u1", "u2"], axis=-1, slice_point=[3]),
          L("cat", "Concat", ["back", "prod", "u2"], axis=2)] + head("cat")),
    Case("eltwise_ops",
         {"a": (["N", 3, 4], "float32"), "b": (["N", 3, 4], "float32"), "c": (["N", 3, 4], "float32"),
          "label": (["N"], "int64")},
         [L("sum", "Eltwise", ["a", "b", "c"], coeff=[0.5, -2.0, 1.5]),
          L("sum2", "Eltwise", ["a", "c"]),
          L("prod", "Eltwise", ["a", "b", "c"], operation="prod"),
          L("max", "Eltwise", ["a", "b", "c"], operation="max"),
          L("cat", "Concat", ["sum", "sum2", "prod", "max"])] + head("cat")),
    Case("flatten_axes",
         {"data": (["N", 2, 3, 4, 2], "float32"), "target": (["N", 3], "float32")},
         [L("f1", "Flatten", "data", axis=1, end_axis=2),
          L("f2", "Flatten", "f1", axis=2),
          L("f3", "Flatten", "data", axis=-3, end_axis=-2),
          L("f4", "Flatten", "f3", axis=0),
          L("ip", "InnerProduct", "f2", num_output=3, axis=1),
          L("loss", "EuclideanLoss", ["ip", "target"], phase="train")]),
    Case("reshape_copy_and_infer",
         {"data": (["N", 4, 6], "float32"), "label": (["N"], "int64")},
         [L("r1", "Reshape", "data", shape=[0, -1, 3]),
          L("r2", "Reshape", "r1", shape=[0, 2, 0, -1]),
          L("conv", "Convolution", "r2", num_output=3, kernel_size=[2, 3]),
          L("r3", "Reshape", "conv", shape=[-1, 3]),
          L("r4", "Reshape", "r3", shape=[0, 0]),
          L("r5", "Reshape", "conv", shape=[0, -1])] + head("r5")),
    Case("softmax_loss_spatial_ignore_and_axis",
         {"data": (["N", 4, 3, 5], "float32"), "label": (["N", 3, 5], "int64"),
          "seq": (["N", 3, 6], "float32"), "label2": (["N", 3], "int64")},
         [L("score", "Convolution", "data", num_output=5, kernel_size=1),
          L("loss", "SoftmaxWithLoss", ["score", "label"], ignore_label=2),
          L("loss2", "SoftmaxWithLoss", ["seq", "label2"], axis=-1, loss_weight=0.7),
          L("acc", "Accuracy", ["score", "label"], phase=["test", "infer"])],
         {"label": labels(5), "label2": labels(6)}),
    Case("softmax_loss_caffe_normalizations",
         {"data": (["N", 4, 3, 5], "float32"), "label": (["N", 3, 5], "int64")},
         [L("score", "Convolution", "data", num_output=5, kernel_size=1),
          L("full", "SoftmaxWithLoss", ["score", "label"], ignore_label=2, normalization="full"),
          L("batch", "SoftmaxWithLoss", ["score", "label"], ignore_label=1, normalization="batch_size",
            loss_weight=0.3),
          L("none", "SoftmaxWithLoss", ["score", "label"], normalization="none", loss_weight=0.01),
          L("acc", "Accuracy", ["score", "label"], ignore_label=2, phase=["test", "infer"]),
          L("acc3", "Accuracy", ["score", "label"], ignore_label=0, top_k=3, phase=["test", "infer"])],
         {"label": labels(5)}),
    Case("caffe_probability_losses",
         {"data": (["N", 6], "float32"), "label": (["N"], "int64"), "gain": ([4, 4], "float32")},
         [L("ip", "InnerProduct", "data", num_output=4),
          L("prob", "Softmax", "ip"),
          L("mlog", "MultinomialLogisticLoss", ["prob", "label"]),
          L("infogain", "InfogainLoss", ["ip", "label", "gain"], loss_weight=0.5),
          L("infogain_own", "InfogainLoss", ["ip", "label"], loss_weight=0.4),   # H a fixed weight
          L("hinge", "HingeLoss", ["ip", "label"], loss_weight=0.3),
          L("hinge2", "HingeLoss", ["ip", "label"], norm="l2", loss_weight=0.2)],
         {"label": labels(4), "gain": uniform(0.0, 1.0)}),
    Case("caffe_contrastive_loss",
         {"a": (["N", 5], "float32"), "b": (["N", 5], "float32"), "similar": (["N"], "float32")},
         [L("pa", "InnerProduct", "a", num_output=3),
          L("pb", "InnerProduct", "b", num_output=3),
          L("contrastive", "ContrastiveLoss", ["pa", "pb", "similar"], margin=2.0),
          L("legacy", "ContrastiveLoss", ["pa", "pb", "similar"], legacy_version=True, loss_weight=0.5)],
         {"similar": lambda rng, shape, dtype: rng.integers(0, 2, size=shape).astype(dtype)}),
    Case("caffe_spp",
         {"data": (["N", 3, 7, 6], "float32"), "label": (["N"], "int64")},
         [L("spp", "SPP", "data", pyramid_height=3),
          L("spp_ave", "SPP", "data", pyramid_height=2, pool="ave"),
          L("cat", "Concat", ["spp", "spp_ave"])] + head("cat")),
    Case("caffe_lstm_unit",
         {"c0": ([1, "N", 4], "float32"), "x": ([1, "N", 16], "float32"), "cont": ([1, "N"], "float32"),
          "label": (["N"], "int64")},
         [L("unit", "LSTMUnit", ["c0", "x", "cont"], ["c1", "h1"]),
          L("unit2", "LSTMUnit", ["c1", "x", "cont"], ["c2", "h2"]),
          L("both", "Concat", ["h2", "c2"], axis=2),
          L("flat", "Reshape", "both", shape=[-1, 8])] + head("flat"),
         {"cont": lambda rng, shape, dtype: rng.integers(0, 2, size=shape).astype(dtype)}),
    Case("caffe_lstm_and_rnn",
         {"x": ([5, "N", 3, 2], "float32"), "cont": ([5, "N"], "float32"), "static": (["N", 4], "float32"),
          "h0": ([1, "N", 3], "float32"), "c0": ([1, "N", 3], "float32"), "r0": ([1, "N", 2], "float32"),
          "label": (["N"], "int64")},
         [L("lstm", "CaffeLSTM", ["x", "cont"], num_output=4),
          L("lstm_s", "CaffeLSTM", ["x", "cont", "static", "h0", "c0"], ["seq_s", "h_s", "c_s"], num_output=3,
            expose_hidden=True),
          L("rnn", "CaffeRNN", ["x", "cont", "r0"], ["rnn", "r_last"], num_output=2, expose_hidden=True),
          L("cat", "Concat", ["lstm", "seq_s", "rnn"], axis=2),
          L("states", "Concat", ["h_s", "c_s", "r_last"], axis=2),
          L("last", "Slice", "cat", ["early", "final"], axis=0, slice_point=[4]),
          L("both", "Concat", ["final", "states"], axis=2),
          L("flat", "Reshape", "both", shape=[-1, 17])] + head("flat"),
         {"cont": lambda rng, shape, dtype: (rng.random(shape) > 0.3).astype(dtype)}),
    Case("euclidean_loss",
         {"data": (["N", 3, 4], "float32"), "target": (["N", 6], "float32")},
         [L("ip", "InnerProduct", "data", num_output=6),
          L("loss", "EuclideanLoss", ["ip", "target"], loss_weight=0.5),
          L("loss2", "EuclideanLoss", ["data", "data"], phase="infer")]),
    Case("sigmoid_cross_entropy_loss",
         {"data": (["N", 2, 4, 4], "float32"), "target": (["N", 3, 4, 4], "float32"),
          "hard": (["N", 3, 4, 4], "int64")},
         [L("score", "Convolution", "data", num_output=3, kernel_size=3, pad=1),
          L("loss", "SigmoidCrossEntropyLoss", ["score", "target"]),
          L("loss2", "SigmoidCrossEntropyLoss", ["score", "hard"], loss_weight=2.0)],
         {"data": normal(2.0), "target": uniform(0.0, 1.0), "hard": labels(2)}),
    Case("accuracy_top_k",
         {"data": (["N", 6], "float32"), "label": (["N"], "int64"), "seq": (["N", 4, 3], "float32"),
          "label2": (["N", 3], "int64"), "label3": (["N", 4], "int64")},
         [L("acc1", "Accuracy", ["data", "label"]),
          L("acc3", "Accuracy", ["data", "label"], top_k=3),
          L("acc_seq", "Accuracy", ["seq", "label2"], top_k=2),
          L("acc_seq_axis", "Accuracy", ["seq", "label3"], axis=2, top_k=1, phase="infer")] + head("data"),
         {"label": labels(3), "label2": labels(4), "label3": labels(3)}),
    Case("scale_channels_bias",
         dict(IMG),
         [L("scale", "Scale", "data", bias_term=True),
          L("scale2", "Scale", "scale", axis=1, num_axes=1)] + head("scale2")),
    Case("scale_num_axes_2_and_all",
         dict(IMG),
         [L("s2", "Scale", "data", num_axes=2),
          L("s2b", "Scale", "data", axis=2, num_axes=2, bias_term=True),
          L("all", "Scale", "data", num_axes=-1, bias_term=True),
          L("all2", "Scale", "data", axis=3, num_axes=-1),
          L("sum", "Eltwise", ["s2", "s2b", "all", "all2"])] + head("sum")),
    Case("scale_scalar_num_axes_0",
         dict(IMG),
         [L("s0", "Scale", "data", num_axes=0),
          L("s0b", "Scale", "data", axis=3, num_axes=0, bias_term=True),
          L("cat", "Concat", ["s0", "s0b"])] + head("cat")),
    Case("scale_negative_axis",
         {"data": (["N", 3, 4, 5], "float32"), "label": (["N"], "int64")},
         [L("last", "Scale", "data", axis=-1, bias_term=True),
          L("mid", "Scale", "data", axis=-3, num_axes=2),
          L("rest", "Scale", "data", axis=-2, num_axes=-1, bias_term=True),
          L("sum", "Eltwise", ["last", "mid", "rest"], coeff=[1.0, -0.5, 2.0])] + head("sum")),
    Case("scale_inplace_after_batchnorm",     # Caffe's idiom: BatchNorm without affine, then Scale
         dict(IMG),
         [L("bn", "BatchNorm", "data", "data", affine=False),
          L("scale", "Scale", "data", "data", bias_term=True, lr_mult=[1, 2])] + head("data")),
    Case("scale_two_bottoms",
         {"data": (["N", 3, 5, 6], "float32"), "ch": ([3], "float32"), "hw": ([5, 6], "float32"),
          "nc": (["N", 3], "float32"), "one": ([], "float32"), "label": (["N"], "int64")},
         [L("by_ch", "Scale", ["data", "ch"]),
          L("by_hw", "Scale", ["data", "hw"], axis=-2, bias_term=True),
          L("by_nc", "Scale", ["data", "nc"], axis=0),
          L("by_one", "Scale", ["data", "one"], num_axes=3),       # num_axes: ignored with two bottoms
          L("sum", "Eltwise", ["by_ch", "by_hw", "by_nc", "by_one"])] + head("sum")),
    Case("share_and_frozen_bias",
         {"a": (["N", 2, 5, 5], "float32"), "b": (["N", 2, 5, 5], "float32"), "label": (["N"], "int64")},
         [L("conv_a", "Convolution", "a", num_output=3, kernel_size=3, lr_mult=[1, 0]),
          L("conv_b", "Convolution", "b", num_output=3, kernel_size=3, share="conv_a"),
          L("sum", "Eltwise", ["conv_a", "conv_b"], operation="max")] + head("sum")),
    # -- the extended catalog --
    Case("matmul_transposes_and_broadcast",
         {"a": (["N", 3, 4], "float32"), "b": (["N", 5, 4], "float32"), "m": ([4, 2], "float32"),
          "label": (["N"], "int64")},
         [L("ab", "MatMul", ["a", "b"], transpose_b=True),
          L("ta", "MatMul", ["ab", "a"], transpose_a=True),
          L("am", "MatMul", ["a", "m"]),
          L("f1", "Flatten", "ta"), L("f2", "Flatten", "am"),
          L("cat", "Concat", ["f1", "f2"])] + head("cat")),
    Case("permute", dict(IMG),
         [L("p1", "Permute", "data", order=[0, 2, 3, 1]),
          L("p2", "Permute", "p1", order=[0, 3, 1, 2]),
          L("sum", "Eltwise", ["p2", "data"], operation="prod")] + head("sum")),
    Case("tile_and_crop",
         {"data": (["N", 3, 5, 6], "float32"), "ref": (["N", 6, 3, 4], "float32"), "label": (["N"], "int64")},
         [L("tile", "Tile", "data", tiles=2),
          L("tile3", "Tile", "data", axis=-1, tiles=3),
          L("crop", "Crop", ["tile", "ref"], offset=[1, 2]),
          L("crop2", "Crop", ["tile", "ref"], axis=1, offset=[0, 2, 1]),
          L("sum", "Eltwise", ["crop", "crop2", "ref"], coeff=[1.0, -2.0, 0.5]),
          L("f1", "Flatten", "sum"), L("f2", "Flatten", "tile3"),
          L("cat", "Concat", ["f1", "f2"])] + head("cat")),
    Case("pad_modes", dict(IMG),
         [L("const", "Pad", "data", pads=[[1, 2], [0, 1]], value=0.5),
          L("zero", "Pad", "data", pads=[[1, 2], [0, 1]]),
          L("reflect", "Pad", "data", pads=[[2, 1], [1, 3]], mode="reflect"),
          L("replicate", "Pad", "data", pads=[[1, 1], [2, 0]], mode="replicate"),
          L("f1", "Flatten", "const"), L("f2", "Flatten", "zero"), L("f3", "Flatten", "reflect"),
          L("f4", "Flatten", "replicate"),
          L("cat", "Concat", ["f1", "f2", "f3", "f4"])] + head("cat")),
    Case("reduction_ops",
         {"data": (["N", 3, 4], "float32"), "label": (["N"], "int64")},
         [L("sum", "Reduction", "data", axis=1),
          L("asum", "Reduction", "data", operation="asum", axis=2, coeff=-0.5),
          L("sumsq", "Reduction", "data", operation="sumsq", axis=-1),
          L("mean", "Reduction", "data", operation="mean", axis=1),
          L("all", "Reduction", "data", operation="mean", coeff=3.0),
          L("scaled", "Scale", ["data", "all"]),
          L("r1", "Reshape", "sum", shape=[-1, 1]), L("r2", "Reshape", "mean", shape=[-1, 1]),
          L("fs", "Flatten", "scaled"),
          L("cat", "Concat", ["r1", "asum", "sumsq", "r2", "fs"])] + head("cat")),
    Case("argmax_indices_and_values",
         {"data": (["N", 6, 4], "float32"), "label": (["N"], "int64")},
         [L("top1", "ArgMax", "data", phase=["infer", "test"]),
          L("top3", "ArgMax", "data", axis=2, top_k=3, phase=["infer", "test"]),
          L("vals", "ArgMax", "data", top_k=2, out_max_val=True, phase=["infer", "test"])] + head("data")),
    Case("power",
         {"data": (["N", 3, 4], "float32"), "label": (["N"], "int64")},
         [L("sq", "Power", "data", power=2, scale=0.5, shift=1.0),
          L("root", "Power", "data", power=0.5, scale=2.0, shift=0.1),
          L("inv", "Power", "data", power=-1.5),
          L("same", "Power", "data", scale=-3.0),
          L("sum", "Eltwise", ["sq", "root", "inv", "same"])] + head("sum"),
         {"data": uniform(0.5, 2.0)}),
    Case("embed",
         {"idx": (["N", 4], "int64"), "one": (["N"], "int32"), "label": (["N"], "int64")},
         [L("emb", "Embed", "idx", input_dim=7, num_output=5),
          L("emb1", "Embed", "one", input_dim=3, num_output=4, bias_term=True),   # Caffe's bias row
          L("f", "Flatten", "emb"),
          L("cat", "Concat", ["f", "emb1"])] + head("cat"),
         {"idx": labels(7), "one": labels(3)}),
    Case("layer_norm",
         {"data": (["N", 4, 6], "float32"), "label": (["N"], "int64")},
         [L("ln", "LayerNorm", "data"),
          L("ln2", "LayerNorm", "data", axis=1, affine=False),
          L("ln3", "LayerNorm", "data", axis=-2, eps=1e-3),
          L("sum", "Eltwise", ["ln", "ln2", "ln3"], coeff=[1.0, 0.5, -1.0])] + head("sum"),
         {"data": normal(2.0, 0.5)}),
    Case("lrn",
         {"data": (["N", 7, 4, 5], "float32"), "label": (["N"], "int64")},
         [L("lrn", "LRN", "data"),
          L("lrn2", "LRN", "data", local_size=3, alpha=0.5, beta=0.6, k=2.0),
          L("lrn4", "LRN", "data", local_size=4, alpha=0.2),
          L("sum", "Eltwise", ["lrn", "lrn2", "lrn4"])] + head("sum"),
         {"data": normal(2.0)}),
    Case("caffe_reshape_axes_and_transposed_inner_product",
         {"data": (["N", 3, 4, 5], "float32"), "label": (["N"], "int64")},
         [L("r1", "Reshape", "data", shape=[2, 2], axis=2, num_axes=1),          # [N, 3, 2, 2, 5]
          L("r2", "Reshape", "r1", shape=[0, -1], axis=1, num_axes=2),          # [N, 3, 4, 5]
          L("r3", "Reshape", "r2", shape=[1], axis=-1, num_axes=0),             # [N, 3, 4, 5, 1]
          L("ip", "InnerProduct", "r3", num_output=6, transpose=True),
          L("ip2", "InnerProduct", "ip", num_output=4, transpose=True, bias_term=False)] + head("ip2")),
    Case("lrn_within_channel",
         {"data": (["N", 3, 5, 6], "float32"), "label": (["N"], "int64")},
         [L("lrn", "LRN", "data", norm_region="within_channel", local_size=3, alpha=0.5, beta=0.75, k=1.5),
          L("lrn5", "LRN", "data", norm_region="within_channel", local_size=5, alpha=1.0, beta=0.6),
          L("sum", "Eltwise", ["lrn", "lrn5"])] + head("sum"),
         {"data": normal(2.0)}),
    Case("caffe_activations",
         dict(IMG),
         [L("prelu", "PReLU", "data"),
          L("prelu1", "PReLU", "data", channel_shared=True),
          L("clip", "Clip", "data", min=-0.5, max=0.75),
          L("swish", "Swish", "data", beta=1.5),
          L("threshold", "Threshold", "data", threshold=0.2),
          L("sum", "Eltwise", ["prelu", "prelu1", "clip", "swish", "threshold"], coeff=[1.0, -0.5, 2.0, 1.0, 0.5])]
         + head("sum"),
         {"data": normal(1.5)}),
    Case("caffe_bias_and_mvn",
         {"data": (["N", 3, 4, 5], "float32"), "other": (["N", 3, 4, 5], "float32"), "label": (["N"], "int64")},
         [L("bias", "Bias", "data"),
          L("bias2", "Bias", "data", axis=2, num_axes=2),
          L("mvn", "MVN", "bias"),
          L("mvn_all", "MVN", "bias2", across_channels=True),
          L("mvn_mean", "MVN", "other", normalize_variance=False),
          L("sum", "Eltwise", ["mvn", "mvn_all", "mvn_mean"])] + head("sum"),
         {"data": normal(2.0, 0.5), "other": normal(1.0, 1.0)},
         zero_grads=("bias.bias",)),          # a per-channel bias before a per-channel mean is taken away
    Case("deconvolution",
         {"data": (["N", 4, 5, 5], "float32"), "label": (["N"], "int64")},
         [L("up", "Deconvolution", "data", num_output=6, kernel_size=3, stride=2, pad=1, group=2),
          L("up2", "Deconvolution", "data", num_output=3, kernel_size=[2, 3], dilation=2, bias_term=False),
          L("f1", "Flatten", "up"), L("f2", "Flatten", "up2"),
          L("cat", "Concat", ["f1", "f2"])] + head("cat")),
    Case("conv_channel_axis",      # Caffe's axis: leading axes are batch, [N, 2, C, H, W] with axis 2
         {"data": (["N", 2, 3, 5, 6], "float32"), "label": (["N"], "int64")},
         [L("conv", "Convolution", "data", num_output=4, kernel_size=3, pad=1, axis=2),
          L("up", "Deconvolution", "data", num_output=2, kernel_size=2, stride=2, axis=-3),
          L("f1", "Flatten", "conv"), L("f2", "Flatten", "up"),
          L("cat", "Concat", ["f1", "f2"])] + head("cat")),
    Case("attention_self",
         {"x": (["N", 5, 8], "float32"), "label": (["N"], "int64")},
         [L("attn", "MultiHeadAttention", "x", num_heads=2)] + head("attn")),
    Case("attention_causal_self",
         {"x": (["N", 5, 8], "float32"), "label": (["N"], "int64")},
         [L("attn", "MultiHeadAttention", "x", num_heads=4, causal=True)] + head("attn")),
    Case("attention_cross_qkv",
         {"q": (["N", 4, 6], "float32"), "k": (["N", 7, 6], "float32"), "v": (["N", 7, 6], "float32"),
          "label": (["N"], "int64")},
         [L("attn", "MultiHeadAttention", ["q", "k", "v"], num_heads=3),
          L("same", "MultiHeadAttention", ["k", "k", "k"], num_heads=2, causal=True),   # [x, x, x]: 3 GEMMs
          L("f1", "Flatten", "attn"), L("f2", "Flatten", "same"),
          L("cat", "Concat", ["f1", "f2"])] + head("cat")),
    Case("attention_key_padding_mask",
         {"x": (["N", 5, 8], "float32"), "pad": (["N", 5], "bool"),
          "q": (["N", 3, 8], "float32"), "kv": (["N", 6, 8], "float32"), "pad2": (["N", 6], "bool"),
          "label": (["N"], "int64")},
         [L("attn", "MultiHeadAttention", ["x", "pad"], num_heads=2),
          L("causal", "MultiHeadAttention", ["x", "pad"], num_heads=4, causal=True),
          L("cross", "MultiHeadAttention", ["q", "kv", "kv", "pad2"], num_heads=2),
          L("f1", "Flatten", "attn"), L("f2", "Flatten", "causal"), L("f3", "Flatten", "cross"),
          L("cat", "Concat", ["f1", "f2", "f3"])] + head("cat"),
         {"pad": key_padding(), "pad2": key_padding()}),
    Case("attention_no_bias_one_head",
         {"x": (["N", 4, 6], "float32"), "label": (["N"], "int64")},
         [L("attn", "MultiHeadAttention", "x", num_heads=1, bias_term=False, lr_mult=[1, 0.5]),
          L("attn2", "MultiHeadAttention", "attn", num_heads=6, bias_term=False)] + head("attn2")),
    Case("attention_dropout",        # dropout on the attention weights in train; identity in infer
         {"x": (["N", 5, 8], "float32"), "label": (["N"], "int64")},
         [L("attn", "MultiHeadAttention", "x", num_heads=2, dropout=0.3)] + head("attn")),
]
# Recurrent layers: PyTorch's weight names, gate order and batch-first layout. Each layer type is
# tested in both forms (unroll: true, the steps as separate ops; false, one loop node), and with
# a symbolic T (the loop, where unrolling cannot apply).
SEQ = {"data": (["N", 5, 3], "float32"), "label": (["N"], "int64")}
CASES += [
    Case("rnn", SEQ,
         [L("rnn", "RNN", "data", ["seq", "hn"], num_output=4),
          L("rnn2", "RNN", "data", num_output=3, num_layers=2, bidirectional=True, nonlinearity="relu",
            return_sequence=False, unroll=False),
          L("f1", "Flatten", "seq"), L("hp", "Permute", "hn", order=[1, 0, 2]), L("f2", "Flatten", "hp"),
          L("cat", "Concat", ["f1", "rnn2", "f2"])] + head("cat")),
    Case("lstm",
         {"data": (["N", 4, 3], "float32"), "h0": ([4, "N", 5], "float32"), "c0": ([4, "N", 5], "float32"),
          "label": (["N"], "int64")},
         [L("lstm", "LSTM", ["data", "h0", "c0"], ["seq", "hn", "cn"], num_output=5, num_layers=2,
            bidirectional=True),
          L("lstm2", "LSTM", "seq", num_output=3, return_sequence=False, unroll=False),
          L("lstm3", "LSTM", ["data", "h0", "c0"], ["seq3", "hn3", "cn3"], num_output=5, num_layers=2,
            bidirectional=True, unroll=False),
          L("f1", "Flatten", "seq"), L("f3", "Flatten", "seq3"),
          L("hs", "Eltwise", ["hn", "cn", "hn3", "cn3"]), L("hp", "Permute", "hs", order=[1, 0, 2]),
          L("f4", "Flatten", "hp"),
          L("cat", "Concat", ["f1", "lstm2", "f3", "f4"])] + head("cat")),
    Case("gru",
         {"data": (["N", 6, 3], "float32"), "h0": ([2, "N", 4], "float32"), "label": (["N"], "int64")},
         [L("gru", "GRU", ["data", "h0"], ["seq", "hn"], num_output=4, bidirectional=True),
          L("gru2", "GRU", ["data", "h0"], ["seq2", "hn2"], num_output=4, num_layers=2, unroll=False),
          L("gru3", "GRU", "seq", num_output=2, num_layers=2, return_sequence=False),
          L("f1", "Flatten", "seq"), L("f2", "Flatten", "seq2"),
          L("hs", "Eltwise", ["hn", "hn2"]), L("hp", "Permute", "hs", order=[1, 0, 2]), L("f3", "Flatten", "hp"),
          L("cat", "Concat", ["f1", "f2", "f3", "gru3"])] + head("cat")),
    Case("recurrent_symbolic_length",
         {"data": (["N", "T", 3], "float32"), "label": (["N"], "int64")},
         [L("gru", "GRU", "data", num_output=4, return_sequence=False),
          L("lstm", "LSTM", "data", ["y", "hn"], num_output=3, bidirectional=True, return_sequence=False),
          L("rnn", "RNN", "data", num_output=2, num_layers=2, return_sequence=False),
          L("hp", "Permute", "hn", order=[1, 0, 2]), L("f", "Flatten", "hp"),
          L("cat", "Concat", ["gru", "y", "f", "rnn"])] + head("cat")),
]
BY_ID = {c.id: c for c in CASES}


def load_net(tmp_path, case: Case) -> Net:
    path = tmp_path / f"{case.id}.yaml"
    path.write_text(case.text())
    return Net.load(str(path))


def layer_types(net: Net) -> dict[str, str]:
    return {layer.name: layer.type for layer in net.spec.layers}


def random_weights(net: Net, dtype: str, seed: int = 7) -> dict[str, np.ndarray]:
    """The net's fillers, then every bias, BatchNorm scale and running statistic moved away from
    the 0 / 1 it starts at, so that no term of the computation is trivially absent."""
    weights = net.init_weights(seed, dtype)
    rng = np.random.default_rng(seed + 1)
    types = layer_types(net)
    for key, arr in weights.items():
        layer = net.declared[key][1]              # the declaring layer: names may hold dots, as keys
        pname = key[len(layer) + 1:]              # 'weight', 'in_proj_bias', 'out_proj.bias', ...
        if pname == "bias" or pname.endswith(("_bias", ".bias")) or pname == "running_mean":
            arr[...] = rng.normal(0.0, 0.5, arr.shape)
        elif pname == "infogain":                 # a fixed matrix: not the identity it starts as
            arr[...] = rng.uniform(0.0, 1.0, arr.shape)
        elif pname == "running_var":
            arr[...] = rng.uniform(0.4, 2.5, arr.shape)
        elif pname == "weight" and types[layer] in ("BatchNorm", "Scale", "LayerNorm"):   # filled with 1
            arr[...] = rng.uniform(0.5, 1.5, arr.shape) * rng.choice([-1.0, 1.0], arr.shape)
    return weights


def random_inputs(net: Net, case: Case, dtype: str, seed: int = 11, batch: int = BATCH) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for name, spec in net.spec.inputs.items():
        shape = tuple(batch if isinstance(d, str) else d for d in spec.shape)
        kind = spec.dtype if spec.dtype not in FLOAT_DTYPES else dtype
        gen = case.gens.get(name) or (normal() if spec.dtype in FLOAT_DTYPES else labels(5))
        out[name] = gen(rng, shape, kind)
    return out


def tops_in(net: Net, phase: str) -> list[str]:
    names = []
    for layer in net.spec.layers:
        if phase in layer.phases:
            names += [t for t in layer.tops if t not in names]
    return names


def run_plan(graph, weights, inputs, names):
    plan = Plan(graph, bind_symbols(graph, {k: v.shape for k, v in inputs.items()}), weights)
    views = plan.run(inputs)
    return {n: np.array(views[n]) for n in names}


# -- tests ---------------------------------------------------------------------------------------
def test_translator_and_cases_cover_the_catalog():
    # If and Loop are blocks of other layers: tests/layers/test_blocks.py checks them against the
    # same layers written out; an ONNX layer runs a model file, checked against PyTorch and ONNX
    # Runtime on the same file in tests/importers/test_onnx_models.py
    catalog = set(LAYERS) - set(BLOCK_TYPES) - {"ONNX"}
    assert catalog <= SUPPORTED, f"no torch translation for {sorted(catalog - SUPPORTED)}"
    covered = {layer["type"] for case in CASES for layer in case.layers}
    assert catalog <= covered, f"layer types without a test case: {sorted(catalog - covered)}"


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case_id", list(BY_ID))
def test_infer_forward_matches_torch(tmp_path, case_id, dtype):
    case = BY_ID[case_id]
    net = load_net(tmp_path, case)
    weights = random_weights(net, dtype)
    inputs = random_inputs(net, case, dtype)
    names = tops_in(net, "infer")

    peer = TorchNet(net, "infer", dtype)
    peer.load(weights)
    expected = to_numpy(peer.forward(inputs))

    graph = net.graph("infer", dtype, outputs=names)
    interpreted, updates = interpret(graph, inputs, weights)
    assert updates == {}
    planned = run_plan(graph, copy.deepcopy(weights), inputs, names)
    for name in names:
        assert_close(interpreted[name], expected[name], dtype, f"{case_id}: blob '{name}' (interpreter)")
        assert_close(planned[name], expected[name], dtype, f"{case_id}: blob '{name}' (plan)")


def train_graph_with_gradients(net: Net, dtype: str):
    """The train graph plus outputs d(objective)/d(every trainable weight) and /d(every float input)."""
    graph = net.graph("train", dtype)
    weight_grads = add_gradients(graph)
    float_inputs = {k: v for k, v in graph.inputs.items() if v.dtype in FLOAT_DTYPES}
    input_grads = differentiate(graph, graph.outputs[OBJECTIVE], list(float_inputs.values()))
    for key, g in weight_grads.items():
        graph.outputs[f"grad:{key}"] = g
    for name, v in float_inputs.items():
        if input_grads[v.id] is not None:
            graph.outputs[f"dinput:{name}"] = input_grads[v.id]
    return graph


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case_id", list(BY_ID))
def test_train_step_matches_torch(tmp_path, case_id, dtype):
    case = BY_ID[case_id]
    net = load_net(tmp_path, case)
    weights = random_weights(net, dtype)
    inputs = random_inputs(net, case, dtype)

    peer = TorchNet(net, "train", dtype, dropout_rng=np.random.default_rng(0))
    peer.load(weights)
    objective, blobs = peer.train_step(inputs)
    torch_grads = peer.grads()
    torch_input_grads = peer.input_grads()
    torch_state = peer.state()

    graph = train_graph_with_gradients(net, dtype)
    names = list(graph.outputs)
    interpreted, updates = interpret(graph, inputs, weights, rng=np.random.default_rng(0))
    plan_weights = copy.deepcopy(weights)
    planned = run_plan(graph, plan_weights, inputs, names)

    grad_keys = {n.split(":", 1)[1] for n in names if n.startswith("grad:")}
    assert grad_keys == set(torch_grads), "parameters with a gradient differ from torch's"
    assert grad_keys, "the case trains no parameter"
    input_keys = {n.split(":", 1)[1] for n in names if n.startswith("dinput:")}
    assert input_keys == set(torch_input_grads), "float inputs with a gradient differ from torch's"
    assert set(updates) == set(graph.updates)

    for source, out in (("interpreter", interpreted), ("plan", planned)):
        assert_close(out[OBJECTIVE], objective.numpy(), dtype, f"{case_id}: objective ({source})")
        for top in peer.loss_weights:
            assert_close(out[top], blobs[top].detach().numpy(), dtype, f"{case_id}: loss '{top}' ({source})")
        for key in grad_keys - set(case.zero_grads):
            assert_close(out[f"grad:{key}"], torch_grads[key], dtype, f"{case_id}: d/d {key} ({source})")
        for key in case.zero_grads:
            noise = TOL[dtype] * max(np.abs(g).max() for g in torch_grads.values())
            assert np.abs(out[f"grad:{key}"]).max() <= noise, f"{case_id}: d/d {key} should vanish ({source})"
            assert np.abs(torch_grads[key]).max() <= noise, f"{case_id}: torch's d/d {key} should vanish"
        for name in input_keys:
            assert_close(out[f"dinput:{name}"], torch_input_grads[name], dtype,
                         f"{case_id}: d/d input '{name}' ({source})")
    # running statistics after the step: graph.updates (interpreter) / the plan's weights, and torch's buffers
    for key in graph.updates:
        assert_close(updates[key], torch_state[key], dtype, f"{case_id}: updated {key} (interpreter)")
        assert_close(plan_weights[key], torch_state[key], dtype, f"{case_id}: updated {key} (plan)")
    for key in peer.buffers:
        if key not in graph.updates:     # frozen statistics stay as loaded on both sides
            np.testing.assert_array_equal(torch_state[key], weights[key].astype(torch_state[key].dtype))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_batchnorm_running_statistics_over_steps(tmp_path, dtype):
    """Three train steps chaining the running statistics: each step's graph.updates fed back as
    weights equals torch's buffers after three forwards in train mode (momentum, unbiased var)."""
    case = BY_ID["batchnorm_conv_train_stats"]
    net = load_net(tmp_path, case)
    weights = random_weights(net, dtype)
    peer = TorchNet(net, "train", dtype)
    peer.load(weights)
    graph = net.graph("train", dtype)
    assert set(graph.updates) == {"bn.running_mean", "bn.running_var"}
    plan_weights = copy.deepcopy(weights)
    plan = None
    state = dict(weights)
    for step in range(3):
        inputs = random_inputs(net, case, dtype, seed=100 + step)
        peer.forward(inputs)
        _, updates = interpret(graph, inputs, state)
        state.update(updates)
        if plan is None:
            plan = Plan(graph, bind_symbols(graph, {k: v.shape for k, v in inputs.items()}), plan_weights)
        plan.run(inputs)
    torch_state = peer.state()
    for key in ("bn.running_mean", "bn.running_var"):
        assert not np.allclose(torch_state[key], weights[key]), "the statistics did not move"
        assert_close(state[key], torch_state[key], dtype, f"{key} after 3 steps (interpreter)")
        assert_close(plan_weights[key], torch_state[key], dtype, f"{key} after 3 steps (plan)")


def test_comparison_detects_a_small_mismatch(tmp_path):
    """The oracle is not vacuous: a 1% change of one weight, or average pooling's divisor rule
    flipped on the torch side, fails the comparison."""
    case = BY_ID["conv_grouped_dilated_strided_padded"]
    net = load_net(tmp_path, case)
    weights = random_weights(net, "float32")
    inputs = random_inputs(net, case, "float32")
    changed = copy.deepcopy(weights)
    changed["conv.weight"][1, 0, 1, 1] *= 1.01
    peer = TorchNet(net, "infer", "float32")
    peer.load(changed)
    expected = to_numpy(peer.forward(inputs))
    out, _ = interpret(net.graph("infer", "float32", outputs=["conv"]), inputs, weights)
    with pytest.raises(AssertionError):
        assert_close(out["conv"], expected["conv"], "float32", "conv")

    case = BY_ID["pool_ave_padded_ceil_exclude_pad"]
    flipped = copy.deepcopy(case)
    flipped.layers[0]["count_include_pad"] = True
    net = load_net(tmp_path, case)
    (tmp_path / "flipped").mkdir()
    other = load_net(tmp_path / "flipped", flipped)
    inputs = random_inputs(net, case, "float32")
    out, _ = interpret(net.graph("infer", "float32", outputs=["pool"]), inputs, {})
    expected = to_numpy(TorchNet(other, "infer").forward(inputs))
    with pytest.raises(AssertionError):
        assert_close(out["pool"], expected["pool"], "float32", "pool")


@pytest.mark.parametrize("case_id, phase, change", [
    ("attention_causal_self", "infer", lambda layers: layers[0].update(causal=False)),
    ("attention_key_padding_mask", "infer", lambda layers: layers[0].update(bottom=["x"])),
    ("attention_dropout", "train", lambda layers: layers[0].update(dropout=0.0)),
])
def test_attention_comparison_sees_masks_and_dropout(tmp_path, case_id, phase, change):
    """The attention cases are not vacuous: the causal mask, the key padding mask and the
    attention dropout each change the result (torch runs the net without it, the toolkit with)."""
    case = BY_ID[case_id]
    changed = copy.deepcopy(case)
    change(changed.layers)
    net = load_net(tmp_path, case)
    (tmp_path / "changed").mkdir()
    other = load_net(tmp_path / "changed", changed)
    weights = random_weights(net, "float64")
    inputs = random_inputs(net, case, "float64")
    peer = TorchNet(other, phase, "float64", dropout_rng=np.random.default_rng(0))
    peer.load(weights)
    expected = to_numpy(peer.forward(inputs))
    graph = net.graph(phase, "float64", outputs=["attn"])
    out, _ = interpret(graph, inputs, weights, rng=np.random.default_rng(0))
    with pytest.raises(AssertionError):
        assert_close(out["attn"], expected["attn"], "float64", "attn")


def test_torch_net_round_trips_weights_and_reports_keys(tmp_path):
    net = load_net(tmp_path, BY_ID["batchnorm_conv_train_stats"])
    weights = random_weights(net, "float64")
    peer = TorchNet(net, "train", "float64")
    peer.load(weights)
    assert set(peer.keys) == set(net.declared)
    state = peer.state()
    for key, arr in weights.items():
        np.testing.assert_array_equal(state[key], arr)
    with pytest.raises(KeyError, match="bn.running_var"):
        peer.load({k: v for k, v in weights.items() if k != "bn.running_var"})
    with pytest.raises(ValueError, match="conv.bias"):
        peer.load({**weights, "conv.bias": np.zeros(5)})
    assert peer.output_names == ["loss"]
    assert TorchNet(net, "infer").output_names == ["head"]
