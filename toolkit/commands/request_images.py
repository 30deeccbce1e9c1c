"""Encoded image files sent to ``toolkit serve`` (BYTES elements of a request) read as
``toolkit infer`` reads image files: the same decoder and pixel limit (arrayfiles.images), the
same image steps of the net's input transform (resize, centre crop), so that a photo sent to the
server and the same file given to ``toolkit infer`` give equal scores."""
from __future__ import annotations

import io

import numpy as np

from ..arrayfiles import image_layout, read_image
from ..errors import UserError


class _Encoded(io.BytesIO):
    """An encoded image in memory, named as the request gives it: the readers of image files
    take it for a path (PIL opens either) and their messages name it by this name."""

    def __init__(self, data: bytes, name: str):
        super().__init__(data)
        self.label = name

    def __str__(self) -> str:
        return self.label                      # and so f"{path}" in their messages

    def __repr__(self) -> str:
        return "of the request"                # PIL's "cannot identify image file %r"


def image_decoder(model):
    """(input name, [encoded image bytes, ...]) -> [N, C, H, W] float32 pixels, as `toolkit
    infer` reads image files for ``model``'s input (before the transform's tensor steps, which
    the model applies to every input); each image's claimed size checked against the pixel limit
    before it is decoded."""
    infos = {t.name: t for t in model.inputs}
    transform = model.transform

    def decode(name: str, images: list[bytes]) -> np.ndarray:
        info = infos[name]
        layout = image_layout(f"input '{name}'", name, (None,) + tuple(info.shape[1:]))
        reader = None
        if transform is not None:
            layout, reader = transform.image_reader(name, layout)
        read = reader or (lambda f: read_image(f, layout))
        out = []
        for i, data in enumerate(images):
            where = f"input '{name}' image {i}"
            if not isinstance(data, bytes) or not data:
                raise UserError(f"{where}: empty, not an encoded image")
            try:
                out.append(read(_Encoded(data, where)))
            except UserError:
                raise
            except Exception as e:                  # PIL's other complaints about a malformed file
                raise UserError(f"{where}: not a readable image ({type(e).__name__}: {e})") from None
        return np.stack(out)
    return decode
