"""The ``transform`` section of a net (docs/spec.md section 3): how images and arrays become the
net's input, declared once for a net without ``train.data``'s transform (a deploy net, an
imported model). Presets name the published values; keys given beside a preset override it."""
from __future__ import annotations

from typing import Annotated, Literal, Optional, Union

from pydantic import Field, model_validator

from .base import Name, Number, PositiveInt, Strict

PositivePair = Annotated[list[PositiveInt], Field(min_length=2, max_length=2)]
PositiveNumber = Annotated[float, Field(gt=0)]

# The published preprocessing of two families of ImageNet models (docs/spec.md section 3).
PRESETS: dict[str, dict] = {
    # Caffe's python/caffe/classify.py: images warped to 256 x 256 (its image_dims), the centre
    # crop of the net's input size, RGB -> BGR, minus the mean of ilsvrc_2012_mean.npy averaged
    # over its pixels (classify.py's mean_file .mean(1).mean(1)), in 0..255
    "caffe-imagenet": {"channel_order": "bgr", "resize": [256, 256], "interpolation": "bilinear",
                       "crop_offset": "floor",
                       "mean": [104.0069879317889, 116.66876761696767, 122.6789143406786]},
    # torchvision's ImageNet classification preset: Resize(256) (the shorter side), CenterCrop(224),
    # ToTensor (/255), Normalize(mean, std)
    "torchvision-imagenet": {"channel_order": "rgb", "resize": 256, "interpolation": "bilinear",
                             "crop_size": 224, "crop_offset": "round", "raw_scale": 1 / 255,
                             "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]},
}


class TransformSpec(Strict):
    """Steps in this order: decode (an image file: RGB, or grey for one channel) -> channel order
    -> resize (an image file) -> centre crop -> ((x * raw_scale) - mean) / std * scale."""
    preset: Optional[Literal["caffe-imagenet", "torchvision-imagenet"]] = None
    inputs: Optional[list[Name]] = None                 # default: every float input
    channel_order: Optional[Literal["rgb", "bgr"]] = None     # what the net wants; images and arrays come RGB
    resize: Optional[Union[PositiveInt, PositivePair]] = None  # shorter side to S, or warp to [H, W]
    interpolation: Optional[Literal["nearest", "bilinear", "bicubic"]] = None
    crop_size: Optional[Union[PositiveInt, PositivePair]] = None   # default after a resize: the input's H x W
    crop_offset: Optional[Literal["floor", "round"]] = None   # (H - crop) / 2 rounded down, or half to even
    raw_scale: Optional[PositiveNumber] = None
    mean: Optional[Union[Number, list[Number]]] = None
    mean_file: Optional[str] = None                     # a mean image [C, H, W] (.npy), relative to the net
    std: Optional[Union[PositiveNumber, list[PositiveNumber]]] = None
    scale: Optional[Number] = None

    @model_validator(mode="after")
    def _one_mean(self):
        if self.mean is not None and self.mean_file is not None:
            raise ValueError("give one of mean and mean_file, not both")
        return self

    def resolved(self) -> dict:
        """The preset's values with the keys given here over them (preset and None left out)."""
        values = dict(PRESETS[self.preset]) if self.preset else {}
        for key in type(self).model_fields:
            value = getattr(self, key)
            if key != "preset" and value is not None:
                values[key] = value
        if "mean_file" in values:            # a mean file given beside a preset replaces its mean
            values.pop("mean", None)
        return values
