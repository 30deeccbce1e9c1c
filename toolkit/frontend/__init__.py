"""Front end: net file -> validated NetSpec -> per-phase graphs (with FILE:LINE:COL errors)."""
from .lower import OBJECTIVE
from .net import Net

__all__ = ["Net", "OBJECTIVE"]
