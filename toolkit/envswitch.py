"""The on/off reading of a ``TOOLKIT_*`` variable for the one reader still asking by variable
name (runtime/plan.py's ``TOOLKIT_RUN_TIME_SIZES``); it answers from toolkit/settings.py, where
every knob now lives. This module goes once that reader asks ``settings.current()`` itself."""
from __future__ import annotations

from .settings import current, knob_for_variable


def switch(name: str, default: bool = True) -> bool:
    """The setting of the on/off knob whose variable is ``name`` (``default`` is the table's)."""
    return getattr(current(), knob_for_variable(name).name)
