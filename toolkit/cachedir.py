"""Where the toolkit keeps files between runs on this machine: ``$TOOLKIT_CACHE``, else the
user's cache folder (``~/.cache/toolkit`` on Linux). The zoo keeps fetched models under it and
the code generator its compiled kernels."""
from __future__ import annotations

import os
from pathlib import Path

ENV_CACHE = "TOOLKIT_CACHE"


def cache_root() -> Path:
    env = os.environ.get(ENV_CACHE)
    if env:
        return Path(env).expanduser()
    import pooch
    return Path(pooch.os_cache("toolkit"))
