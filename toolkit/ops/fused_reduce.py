"""fused_reduce: a sum or mean over every axis but the channels (axis 1) of an elementwise
program's one output, the program evaluated inside the reduction so that its result is never
written to memory: BatchNorm's variance (the mean of square(x - mean)) and its backward pass's
sums (of dy * xc, of dy) read their operands once. Made after autodiff by the fuse_reductions
pass (passes/fuse_reductions.py), on a device whose kernel pays, so it needs no gradient rule.

Attributes: ``program`` and ``outputs`` (one step) as fused_elementwise's (ops/fused.py), no
views; ``axes`` and ``keepdims`` as reduce_sum's; ``mean`` (divide by the reduced count).
"""
from __future__ import annotations

import numpy as np

from .base import OpDef, ShapeError, get_op, register
from .fused import program_types, run_program


def _infer(types, attrs):
    if len(attrs["outputs"]) != 1:
        raise ShapeError("a fused reduction reduces one program output")
    steps = program_types(attrs["program"], list(types))
    group = steps[attrs["outputs"][0]]
    return get_op("reduce_sum").infer([group], {"axes": attrs["axes"], "keepdims": attrs["keepdims"]})


def _reference(*arrays, program, outputs, axes, keepdims, mean):
    value = run_program(program, list(arrays))[outputs[0]]
    reduce = np.mean if mean else np.sum
    return reduce(value, axis=tuple(axes), keepdims=keepdims)


def _flops(ins, outs, attrs):
    steps = program_types(attrs["program"], list(ins))
    return get_op("fused_elementwise").flops(ins, [], {"program": attrs["program"]}) + steps[-1].numel


register(OpDef("fused_reduce", _infer, _reference, None, _flops, fused=True,
               doc="reduce_sum/reduce_mean over every axis but the channels of an elementwise program's "
                   "output, computed inside the reduction; made by the fuse_reductions pass"))
