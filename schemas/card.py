"""Pydantic model of a zoo model card: the YAML front matter of ``zoo/NAME/README.md``.

Depends on pydantic only. File names in a card are plain names inside the model's folder, so a
card can never point a download or a copy outside it.
"""
from __future__ import annotations

from typing import Annotated, Optional

from pydantic import Field, StrictInt, model_validator

from .base import Strict
from .quantization import CalibrationRecord

# A model's name is also a folder name: no leading dot (hidden, or '..'), no slash.
ZooName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$", max_length=100)]
FileName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$", max_length=200)]
Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
Text = Annotated[str, Field(min_length=1)]


class CardMetric(Strict):
    """What ``toolkit test`` measures on the net's test data with the default weights."""

    name: Text
    value: Annotated[float, Field(allow_inf_nan=False)]
    split: Text = "test"
    tolerance: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 0.001   # absolute


class CardFile(Strict):
    file: FileName
    sha256: Sha256
    bytes: Annotated[StrictInt, Field(ge=0)]


class ModelCard(Strict):
    """The front matter of a model card; the first weights file is the default weights."""

    name: ZooName
    description: Text
    task: Text
    data: Text
    metric: CardMetric
    licence: Text
    config: CardFile
    weights: Annotated[list[CardFile], Field(min_length=1)]
    reproduce: Text
    toolkit_version: Text
    # what the inputs were (an image folder's class names, a CSV's columns): input.json
    input: Optional[CardFile] = None
    # how many class names input.json carries (a labels file given at import, or an image
    # folder's subfolders), one per class score in index order
    classes: Optional[Annotated[StrictInt, Field(ge=1)]] = None
    # the training data, bundled so that others can reproduce and verify the metric
    data_files: list[CardFile] = []
    # an int8 model's calibration (its net's quantization.calibration): method, examples, dtype,
    # the data's files and rows, the toolkit that quantized it
    calibration: Optional[CalibrationRecord] = None

    @model_validator(mode="after")
    def _distinct_files(self) -> "ModelCard":
        names = [f.file for f in self.files]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"file {', '.join(repeated)} is listed twice (config, weights, input and data are "
                             "distinct files)")
        if "README.md" in names:
            raise ValueError("README.md is the card itself, not a config or weights file")
        if self.classes is not None and self.input is None:
            raise ValueError("'classes' counts the class names of the input description: the card needs 'input'")
        return self

    @property
    def files(self) -> list[CardFile]:
        """The config, every weights file, the input description and the data files."""
        return [self.config, *self.weights, *([self.input] if self.input else []), *self.data_files]
