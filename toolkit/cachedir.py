"""Where the toolkit keeps files between runs on this machine: the ``cache`` setting
(``$TOOLKIT_CACHE``), else the user's cache folder (``~/.cache/toolkit`` on Linux). The zoo keeps
fetched models under it and the code generator its compiled kernels."""
from __future__ import annotations

from pathlib import Path

from .settings import current


def cache_root() -> Path:
    chosen = current().cache
    if chosen is not None:
        return chosen
    import pooch
    return Path(pooch.os_cache("toolkit"))
