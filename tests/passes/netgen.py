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

``netgen_bounds.py`` holds the value bounds, ``netgen_layers.py`` one layer at a time with its
blob's shape and bounds, ``netgen_blocks.py`` the blocks, the heads and the whole net.
"""
from __future__ import annotations

from netgen_blocks import NetGenerator
from netgen_layers import GeneratedNet, catalog

__all__ = ["GENERATED_TYPES", "GeneratedNet", "catalog", "generate", "generate_net"]

# The layer types this generator writes (Scale only where layers/ registers it).
GENERATED_TYPES = frozenset({
    "Convolution", "Pooling", "InnerProduct", "ReLU", "Sigmoid", "TanH", "ELU", "Softplus", "AbsVal",
    "Exp", "Log", "GELU", "Softmax", "LogSoftmax", "Dropout", "BatchNorm", "Concat", "Slice", "Eltwise",
    "Flatten", "Reshape", "SoftmaxWithLoss", "EuclideanLoss", "SigmoidCrossEntropyLoss", "Accuracy", "Scale",
    "RNN", "LSTM", "GRU", "LayerNorm", "MultiHeadAttention", "Permute"})


def generate(seed: int) -> str:
    """The YAML text of a random valid net; deterministic for ``seed``."""
    return generate_net(seed).text


def generate_net(seed: int, train_dropout: bool = True) -> GeneratedNet:
    """A random valid net and how to feed it. ``train_dropout=False`` keeps Dropout out of the
    train phase (the layer then runs only in test and infer, where it is the identity)."""
    return NetGenerator(seed, train_dropout).build()
