"""Images as float32 [C, H, W] arrays (grey or RGB, resized), one file or a folder of them, or
one encoded in a database record. An image's size is read from its header and held to a pixel
limit before a pixel is decoded (a small file can claim a huge image)."""
from __future__ import annotations

import contextlib

import numpy as np

from ..errors import UserError
from ..fileio import open_regular
from ..settings import current
from .files import list_folder
from .rows import Rows

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")


def max_pixels() -> int:
    """The most pixels an image may claim: the ``max_image_pixels`` setting (PIL's own limit for a
    decompression bomb unless ``TOOLKIT_MAX_IMAGE_PIXELS`` raises or lowers it)."""
    return current().max_image_pixels


def image_layout(path: str, name: str, shape: tuple) -> tuple[int, int, int]:
    """(C, H, W) of the input ``name`` of ``shape`` that images at ``path`` are to feed:
    [N, C, H, W] with C 1 (grey) or 3 (RGB) and fixed sizes."""
    example = tuple(shape[1:])
    if len(shape) != 4 or not all(isinstance(d, int) for d in example) or example[0] not in (1, 3):
        raise UserError(f"{path}: images feed an input shaped [N, 1 or 3, H, W] with fixed sizes; input '{name}' "
                        f"is [{', '.join(str(d) for d in shape)}]")
    return example


def image_files(folder: str) -> list[str]:
    """The image files of a folder in the order of their names (other files and hidden ones skipped)."""
    return [str(p) for p in list_folder(folder)
            if p.suffix.lower() in IMAGE_SUFFIXES and not p.name.startswith(".") and p.is_file()]


@contextlib.contextmanager
def _decoding(path: str):
    from PIL import Image, UnidentifiedImageError
    try:
        yield
    except (UnidentifiedImageError, OSError, Image.DecompressionBombError) as e:
        raise UserError(f"{path}: not a readable image ({e})") from None


def read_image(path: str, layout: tuple[int, int, int]) -> np.ndarray:
    """One image converted to grey (C 1) or RGB (C 3) and resized to H x W, as [C, H, W]."""
    c, h, w = layout

    def warp(img) -> np.ndarray:
        arr = np.asarray(img.convert("L" if c == 1 else "RGB").resize((w, h)), dtype=np.float32)
        return arr[None] if c == 1 else arr.transpose(2, 0, 1)
    return read_decoded(path, warp)


def read_decoded(path, prepare):
    """``prepare`` (a decoded PIL image -> an array) of the image file at ``path`` (or of an image
    already in memory: a binary file object, as a request's encoded image), its size held to the
    pixel limit first."""
    from PIL import Image
    limit = max_pixels()
    # the check below replaces PIL's own (which would refuse twice its default in its own words,
    # and let a user's raised limit be overruled); this module is PIL's only user in the toolkit
    Image.MAX_IMAGE_PIXELS = None
    # a path is opened as a regular file first: PIL's own open of a FIFO would wait for a writer
    source = contextlib.nullcontext(path) if hasattr(path, "read") else open_regular(path)
    with _decoding(path), source as f, Image.open(f) as img:
        return _within_limit(img, path, limit, prepare)


def decode_image(data: bytes, where: str, prepare):
    """``prepare`` of the image encoded in ``data`` (a database record's PNG or JPEG), held to the
    same pixel limit as a file; ``where`` names the record in errors."""
    import io

    from PIL import Image, UnidentifiedImageError
    limit = max_pixels()
    Image.MAX_IMAGE_PIXELS = None                 # as read_decoded: the check is ours
    with _decoding(where):
        try:
            img = Image.open(io.BytesIO(data))
        except UnidentifiedImageError:            # its message names the BytesIO object, not the record
            raise UserError(f"{where}: not an image in a format Pillow reads (PNG, JPEG, ...)") from None
        with img:
            return _within_limit(img, where, limit, prepare)


def _within_limit(img, where: str, limit: int, prepare):
    # img.size is what the file claims, read from its header before any pixel is decoded
    width, height = img.size
    if width * height > limit:
        raise UserError(f"{where}: an image of {width} x {height} pixels ({width * height:,}), over the limit "
                        f"of {limit:,} (set TOOLKIT_MAX_IMAGE_PIXELS to raise it)")
    return prepare(img)


class ImageRows(Rows):
    """Image files, one row each, read only when their rows are."""

    def __init__(self, paths: list[str], layout: tuple[int, int, int], read=None):
        # ``read``: path -> [C, H, W] of ``layout`` (an input transform's resize and crop), else warped
        self.paths, self.layout = paths, layout
        self.read_one = read or (lambda path: read_image(path, layout))
        self.rows, self.row_shape, self.dtype = len(paths), tuple(layout), np.dtype(np.float32)

    def read(self, start: int, stop: int) -> np.ndarray:
        if stop <= start:
            return np.empty((0,) + self.row_shape, np.float32)
        return np.stack([self.read_one(p) for p in self.paths[start:stop]])
