"""The input transform's steps for one input, as plain data, and their application: to image
files (decode, resize, centre crop) and to arrays (channel order, centre crop, arithmetic).

The order (docs/spec.md section 3) is Caffe's ``classify.py`` and torchvision's ImageNet preset
alike: decode (RGB, or grey for one channel) -> channel order -> resize -> centre crop ->
``((x * raw_scale) - mean) / std * scale``. Images and arrays come in RGB; ``channel_order: bgr``
reverses the channel axis (a Caffe model's BGR). The per-pixel steps commute with the crop, so
an image is cropped as it is read (images of different aspect ratios then stack), and a mean
image larger than what it is subtracted from is centre-cropped to it by the same rule.

``Steps.record()`` is the same description as JSON-ready data: what the ONNX exporter writes
as nodes and metadata, and what an import reads back (``Steps.from_record``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import UserError

INTERPOLATIONS = ("nearest", "bilinear", "bicubic")


def _pair(value) -> tuple[int, int] | None:
    if value is None:
        return None
    return (int(value), int(value)) if isinstance(value, (int, np.integer)) else (int(value[0]), int(value[1]))


def crop_offset(total: int, size: int, rule: str) -> int:
    """Where a centre crop of ``size`` starts in ``total``: (total - size) // 2 as Caffe's test
    crop and classify.py, or round((total - size) / 2) half to even as torchvision's CenterCrop."""
    if rule == "round":
        return int(round((total - size) / 2.0))
    return (total - size) // 2


@dataclass(frozen=True)
class Steps:
    """The transform of one input. ``resize``: an int resizes the shorter side to it (the other
    in proportion, rounded down, as torchvision's Resize), a pair (H, W) warps to it; None keeps
    an image's own size where there is a crop, else warps it to the input's H x W. ``crop``:
    (H, W) of the centre crop, None for none."""
    channel_order: str = "rgb"
    resize: int | tuple[int, int] | None = None
    interpolation: str = "bilinear"
    crop: tuple[int, int] | None = None
    crop_offset: str = "floor"
    raw_scale: float | None = None
    mean: object = None          # None, a number, one value per channel [C], or an image [C, H, W]
    std: object = None           # None, a number or one value per channel
    scale: float | None = None

    # -- image files ------------------------------------------------------------------------------
    def image_size(self, input_hw: tuple[int, int]) -> tuple[int, int]:
        """(H, W) of an image as read: the crop, or the input's size."""
        return self.crop or input_hw

    def prepare_image(self, img, channels: int, input_hw: tuple[int, int], where: str) -> np.ndarray:
        """A decoded PIL image -> [C, H, W] float32 in 0..255: grey or RGB, resized, centre-cropped."""
        from PIL import Image
        img = img.convert("L" if channels == 1 else "RGB")
        method = {"nearest": Image.NEAREST, "bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC}[self.interpolation]
        width, height = img.size
        if isinstance(self.resize, int):
            short, long = (width, height) if width <= height else (height, width)
            new_long = int(self.resize * long / short)
            size = (self.resize, new_long) if width <= height else (new_long, self.resize)
        elif self.resize is not None:
            size = (self.resize[1], self.resize[0])
        elif self.crop is None:
            size = (input_hw[1], input_hw[0])
        else:
            size = (width, height)           # Caffe's crop of an image read at its own size
        if size != (width, height):
            img = img.resize(size, method)
        arr = np.asarray(img, dtype=np.float32)
        arr = arr[None] if channels == 1 else arr.transpose(2, 0, 1)
        if self.crop is not None:
            h, w = arr.shape[1:]
            if h < self.crop[0] or w < self.crop[1]:
                raise UserError(f"{where}: the image is {w} x {h} after its resize, smaller than the centre crop "
                                f"{self.crop[1]} x {self.crop[0]}")
            arr = self.center_crop(arr[None])[0]
        return np.ascontiguousarray(arr)

    # -- arrays -------------------------------------------------------------------------------------
    def center_crop(self, arr: np.ndarray) -> np.ndarray:
        """The centre crop of [N, C, H, W] where it is at least the crop's size (others as given)."""
        if self.crop is None or arr.ndim != 4:
            return arr
        (h, w), (ch, cw) = arr.shape[2:], self.crop
        if (h, w) == (ch, cw) or h < ch or w < cw:
            return arr
        top, left = crop_offset(h, ch, self.crop_offset), crop_offset(w, cw, self.crop_offset)
        return np.ascontiguousarray(arr[:, :, top:top + ch, left:left + cw])

    def __call__(self, arr: np.ndarray, dtype: str, name: str) -> np.ndarray:
        """An input's array (RGB, raw values) -> the net's input, in ``dtype``."""
        arr = np.asarray(arr)
        if self.channel_order == "bgr":
            if arr.ndim < 2 or arr.shape[1] != 3:
                raise UserError(f"input '{name}': channel_order bgr reverses 3 channels on axis 1, the array is "
                                f"{list(arr.shape)}")
            arr = arr[:, ::-1]
        arr = self.center_crop(arr).astype(dtype)
        if self.raw_scale is not None:
            arr = arr * np.asarray(self.raw_scale, dtype=arr.dtype)
        if self.mean is not None:
            arr = arr - self._broadcast(self.mean, arr, name, "mean")
        if self.std is not None:
            arr = arr / self._broadcast(self.std, arr, name, "std")
        if self.scale is not None:
            arr = arr * np.asarray(self.scale, dtype=arr.dtype)
        return arr

    def _broadcast(self, value, arr: np.ndarray, name: str, what: str) -> np.ndarray:
        value = np.asarray(value, dtype=np.float64)
        if value.ndim == 1 and arr.ndim >= 2:                   # one value per channel
            value = value.reshape((1, -1) + (1,) * (arr.ndim - 2))
        elif value.ndim == 3:                                   # an image [C, H, W]
            if arr.ndim == 4 and value.shape[1:] != arr.shape[2:]:
                cropped = Steps(crop=tuple(arr.shape[2:]), crop_offset=self.crop_offset)
                value = cropped.center_crop(value[None])[0]
            value = value[None]
        value = value.astype(arr.dtype)
        try:
            np.broadcast_shapes(value.shape, arr.shape)
        except ValueError:
            raise UserError(f"the transform's {what} has shape {list(value.shape[1:]) or 'a number'}, input '{name}' "
                            f"has examples of shape {list(arr.shape[1:])}") from None
        return value

    # -- as plain data --------------------------------------------------------------------------------
    def record(self) -> dict:
        """The steps as JSON-ready data (a mean image as nested lists)."""
        def plain(v):
            return None if v is None else np.asarray(v, dtype=np.float64).tolist()
        return {"channel_order": self.channel_order, "resize": list(self.resize) if isinstance(self.resize, tuple)
                else self.resize, "interpolation": self.interpolation,
                "crop": list(self.crop) if self.crop else None, "crop_offset": self.crop_offset,
                "raw_scale": self.raw_scale, "mean": plain(self.mean), "std": plain(self.std), "scale": self.scale,
                "formula": "((x * raw_scale) - mean) / std * scale"}

    @classmethod
    def from_record(cls, record: dict, where: str) -> "Steps":
        """Steps from ``record()``'s data, read from a file: every field checked."""
        def fail(what: str):
            raise UserError(f"{where}: the input transform's {what}")
        if not isinstance(record, dict):
            fail("description is not a JSON object")

        def number(key, positive=False):
            v = record.get(key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                                  or not np.isfinite(v) or (positive and v <= 0)):
                fail(f"{key} is not a {'positive ' if positive else ''}number")
            return v

        def values(key, max_rank):
            v = record.get(key)
            if v is None:
                return None
            try:
                arr = np.asarray(v, dtype=np.float64)
            except (TypeError, ValueError):
                fail(f"{key} is not numbers")
            if arr.ndim > max_rank or not np.all(np.isfinite(arr)):
                fail(f"{key} is not a number or {'a list of numbers' if max_rank == 1 else 'numbers per channel'}")
            return float(arr) if arr.ndim == 0 else arr

        def size(key, allow_int):
            v = record.get(key)
            if v is None:
                return None
            if allow_int and isinstance(v, int) and not isinstance(v, bool) and v > 0:
                return v
            if isinstance(v, list) and len(v) == 2 and all(isinstance(d, int) and not isinstance(d, bool) and d > 0
                                                            for d in v):
                return (v[0], v[1])
            fail(f"{key} is not {'a size or ' if allow_int else ''}[H, W] of positive whole numbers")

        order = record.get("channel_order", "rgb")
        if order not in ("rgb", "bgr"):
            fail("channel_order is not rgb or bgr")
        interpolation = record.get("interpolation", "bilinear")
        if interpolation not in INTERPOLATIONS:
            fail(f"interpolation is not one of {', '.join(INTERPOLATIONS)}")
        offset = record.get("crop_offset", "floor")
        if offset not in ("floor", "round"):
            fail("crop_offset is not floor or round")
        std = values("std", 1)
        if std is not None and np.any(np.asarray(std) <= 0):
            fail("std is not positive")
        return cls(channel_order=order, resize=size("resize", True), interpolation=interpolation,
                   crop=size("crop", False), crop_offset=offset, raw_scale=number("raw_scale", True),
                   mean=values("mean", 3), std=std, scale=number("scale"))

    def describe(self) -> str:
        def short(v):
            arr = np.asarray(v)
            if arr.ndim == 3:
                return f"an image {list(arr.shape)}"
            return np.array2string(arr, precision=4, separator=", ") if arr.ndim else f"{float(arr):g}"
        parts = []
        if self.channel_order == "bgr":
            parts.append("RGB -> BGR")
        if isinstance(self.resize, int):
            parts.append(f"images' shorter side to {self.resize}")
        elif self.resize:
            parts.append(f"images resized to {self.resize[0]} x {self.resize[1]}")
        if self.crop:
            parts.append(f"centre crop {self.crop[0]} x {self.crop[1]}")
        arithmetic = "x"
        if self.raw_scale is not None:
            arithmetic = f"{arithmetic} * {self.raw_scale:g}"
        if self.mean is not None:
            arithmetic = f"({arithmetic} - mean {short(self.mean)})"
        if self.std is not None:
            arithmetic = f"{arithmetic} / std {short(self.std)}"
        if self.scale is not None:
            arithmetic = f"{arithmetic} * {self.scale:g}"
        if arithmetic != "x":
            parts.append(arithmetic)
        return ", ".join(parts) or "nothing"
