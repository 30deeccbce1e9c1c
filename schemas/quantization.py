"""The ``quantization`` section of a net (docs/spec.md section 10): int8 post-training
quantization of the infer phase.

    quantization:
      activations:                    # top (or input) -> its scale and zero point
        data:  {scale: 0.0039, zero_point: 0}            # dtype: uint8 (the default) or int8
        conv1: {scale: 0.0627, zero_point: 0, dtype: uint8}
      float:                          # layers that stay float, each with why (a name alone: "listed")
        - prob
        - {layer: ip2, reason: measured better in float}
      bias_correction:                # layer -> added to its bias, one amount per output channel
        conv1: [0.0012, -0.0031]
      equalized:                      # layer whose output channels were scaled -> the layers reading them
        conv1: [conv2]
      calibration:                    # for the record: what produced the scales
        {method: minmax, examples: 256, data: heldout.npz, dtype: uint8, bias_correction: true,
         equalization: true, files: [{file: heldout.npz, rows: 359}], toolkit_version: 0.1.0}

What the schema cannot say (a zero point in its dtype's range, a top or layer the net has) is
checked against the net when it loads (toolkit/frontend/quant_checks.py), at the key's line.
"""
from __future__ import annotations

from typing import Annotated, Literal, Optional, Union

from pydantic import Field, StrictInt

from .base import Name, PositiveInt, Strict

# a finite positive number: inf or nan is no scale
Scale = Annotated[float, Field(gt=0, allow_inf_nan=False)]
Reason = Annotated[str, Field(min_length=1)]
Percentile = Annotated[float, Field(gt=0, le=100, allow_inf_nan=False)]

# the range of each activation dtype (ONNX QuantizeLinear's saturation bounds)
QUANT_RANGES: dict[str, tuple[int, int]] = {"uint8": (0, 255), "int8": (-128, 127)}


class ActivationScale(Strict):
    """One top's quantization: real = (q - zero_point) * scale, q in the dtype's range."""
    scale: Scale
    zero_point: StrictInt = 0
    dtype: Literal["uint8", "int8"] = "uint8"


class FloatLayer(Strict):
    """A layer kept in float, and why (shown by ``toolkit compile --explain``)."""
    layer: Name
    reason: Reason


class CalibrationFile(Strict):
    """One file of the calibration data and how many rows (examples) it held."""
    file: Annotated[str, Field(min_length=1)]
    rows: Annotated[StrictInt, Field(ge=0)]


class CalibrationRecord(Strict):
    """How the scales were found: recorded, not acted on (``toolkit quantize`` writes it, a zoo
    card carries it)."""
    method: Literal["minmax", "percentile", "entropy", "mse"]
    examples: PositiveInt
    data: Annotated[str, Field(min_length=1)]
    percentile: Optional[Percentile] = None
    dtype: Optional[Literal["uint8", "int8"]] = None          # the activations'
    files: list[CalibrationFile] = []                         # the data's files, each with its rows
    toolkit_version: Optional[Annotated[str, Field(min_length=1)]] = None
    bias_correction: Optional[bool] = None                    # whether bias_correction was measured
    equalization: Optional[bool] = None                       # whether the weights were equalized first


class QuantizationSpec(Strict):
    activations: Annotated[dict[Name, ActivationScale], Field(min_length=1)]
    # ``float`` is the key in the file; the attribute has another name so that the builtin type
    # stays usable in this class's annotations
    float_layers: list[Union[Name, FloatLayer]] = Field([], alias="float")
    calibration: Optional[CalibrationRecord] = None
    # a quantized convolution's or InnerProduct's layer -> what its int8 form adds to its bias, per
    # output channel: the mean error its int8 weights and input put into its output over the
    # calibration data (empirical bias correction, toolkit/quantization/bias.py)
    bias_correction: dict[Name, list[Annotated[float, Field(allow_inf_nan=False)]]] = {}
    # a layer whose output channels cross-layer equalization scaled -> the layers reading them, whose
    # input channels it scaled back (toolkit/quantization/equalize.py): for the record and --explain,
    # the weights file holds the scaled weights
    equalized: dict[Name, list[Name]] = {}

    def float_reasons(self) -> dict[str, str]:
        """Layer name -> why it stays float."""
        return {(f if isinstance(f, str) else f.layer): ("listed float" if isinstance(f, str)
                                                         else f"listed float: {f.reason}")
                for f in self.float_layers}
