"""Environment switches: the ``TOOLKIT_*`` variables that turn a behaviour on or off
(``TOOLKIT_RUN_TIME_SIZES``, ``TOOLKIT_ADAPTIVE_THREADS``, ``TOOLKIT_CUDA_GRAPHS``,
``TOOLKIT_CONCURRENT``), read the same way everywhere."""
from __future__ import annotations

import os

OFF = ("0", "off", "no", "false")
ON = ("1", "on", "yes", "true")


def switch(name: str, default: bool = True) -> bool:
    """The setting of the variable ``name``: off for 0/off/no/false, on for 1/on/yes/true (any
    case, spaces ignored), else (unset, or any other text) ``default``."""
    value = os.environ.get(name, "").strip().lower()
    if value in OFF:
        return False
    if value in ON:
        return True
    return default
