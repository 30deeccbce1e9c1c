"""fused_reduce: sums or means over every axis but the channels (axis 1 of [N, C, ...], or the last
of a channels-last [..., C]) of values an elementwise
program computes from its operands, the program evaluated inside the reduction so that no value
is written to memory, and every operand read once however many of the sums read it: BatchNorm's
variance (the mean of square(x - mean)), and its backward pass's sums of dy, dy * x_hat and
dy * xc in one pass over dy. Made after autodiff by the fuse_reductions pass
(passes/fuse_reductions.py), on a device whose kernel pays, so it needs no gradient rule.

Attributes: ``program`` as fused_elementwise's (ops/fused.py; no views); ``outputs``: what each
output reduces, a reference as a step's arguments are (``("t", j)`` a step, ``("x", i)`` an
operand as it is); ``means``: per output, whether it is divided by the reduced count; ``axes``
and ``keepdims`` as reduce_sum's, shared by every output; ``compute`` and ``in_dtypes`` as
fused_elementwise's (inputs stored in a narrower type than the sums' values).
"""
from __future__ import annotations

import numpy as np

from .base import OpDef, ShapeError, get_op, register
from .fused import computed_arrays, computed_types, program_types, run_program


def _reduced_values(attrs, inputs: list, steps: list) -> list:
    return [steps[ref[1]] if ref[0] == "t" else inputs[ref[1]] for ref in attrs["outputs"]]


def _infer(types, attrs):
    if not attrs["outputs"] or len(attrs["means"]) != len(attrs["outputs"]):
        raise ShapeError("a fused reduction needs outputs, and a mean flag for each")
    types = computed_types(list(types), attrs)
    steps = program_types(attrs["program"], types) if attrs["program"] else []
    values = _reduced_values(attrs, types, steps)
    if len({(t.shape, t.dtype) for t in values}) != 1:
        raise ShapeError(f"a fused reduction's values differ in shape or dtype: {values}")
    reduce = {"axes": attrs["axes"], "keepdims": attrs["keepdims"]}
    return [get_op("reduce_sum").infer([t], reduce)[0] for t in values]


def _reference(*arrays, program, outputs, means, axes, keepdims, compute=None, in_dtypes=()):
    arrays = computed_arrays(list(arrays), {"compute": compute} if compute is not None else {})
    steps = run_program(program, list(arrays)) if program else []
    results = tuple((np.mean if mean else np.sum)(value, axis=tuple(axes), keepdims=keepdims)
                    for value, mean in zip(_reduced_values({"outputs": outputs}, list(arrays), steps), means))
    return results if len(results) > 1 else results[0]


def _flops(ins, outs, attrs):
    program = attrs["program"]
    ins = computed_types(list(ins), attrs)
    steps = program_types(program, ins) if program else []
    elementwise = get_op("fused_elementwise").flops(ins, [], {"program": program}) if program else 0
    return elementwise + sum(t.numel for t in _reduced_values(attrs, list(ins), steps))


register(OpDef("fused_reduce", _infer, _reference, None, _flops, fused=True,
               doc="sums/means over every axis but the channels of values an elementwise program computes, "
                   "in one pass over its operands; made by the fuse_reductions pass"))
