"""The quantization section's rules that need the net (schemas/quantization.py holds the rest),
each problem located at the key it is about (``FILE:LINE:COL``): a zero point outside its
dtype's range, a top the infer phase does not make, a float or bias-corrected layer the infer phase does not have.
The section is about the infer phase only: that is the graph the quantize pass rewrites.
"""
from __future__ import annotations

from ..errors import Problem, did_you_mean
from .yaml_loader import Positions


def quantization_problems(spec, positions: Positions, infer_blobs: dict | None) -> list[Problem]:
    """Problems of ``spec.quantization`` against the net; ``infer_blobs`` (top name -> value of
    the infer phase's lowering) is None where that phase failed to lower (its own problems are
    reported already: no second error for a top it would have made)."""
    from schemas.quantization import QUANT_RANGES
    section = spec.quantization
    if section is None:
        return []
    problems = []
    for top, act in section.activations.items():
        low, high = QUANT_RANGES[act.dtype]
        if not low <= act.zero_point <= high:
            problems.append(Problem(
                f"quantization.activations.{top}: zero_point {act.zero_point} is outside {act.dtype}'s "
                f"range {low}..{high}", positions.locate(("quantization", "activations", top, "zero_point"))))
    if infer_blobs is not None:
        tops = set(infer_blobs) | set(spec.inputs)
        for top in section.activations:
            if top not in tops:
                problems.append(Problem(
                    f"quantization.activations: the infer phase has no top or input '{top}'"
                    f"{did_you_mean(top, tops)}", positions.locate(("quantization", "activations", top))))
    layers = {layer.name for layer in spec.layers if "infer" in layer.phases}
    for j, item in enumerate(section.float_layers):
        name = item if isinstance(item, str) else item.layer
        if name not in layers:
            path = ("quantization", "float", j) + (() if isinstance(item, str) else ("layer",))
            problems.append(Problem(f"quantization.float: the infer phase has no layer '{name}'"
                                    f"{did_you_mean(name, layers)}", positions.locate(path, prefer_key=False)))
    for name in section.bias_correction:
        if name not in layers:
            problems.append(Problem(f"quantization.bias_correction: the infer phase has no layer '{name}'"
                                    f"{did_you_mean(name, layers)}",
                                    positions.locate(("quantization", "bias_correction", name))))
    for name, readers in section.equalized.items():
        for j, layer in enumerate([name, *readers]):
            if layer not in layers:
                path = ("quantization", "equalized", name) + (() if j == 0 else (j - 1,))
                problems.append(Problem(f"quantization.equalized: the infer phase has no layer '{layer}'"
                                        f"{did_you_mean(layer, layers)}", positions.locate(path, prefer_key=j == 0)))
    return problems
