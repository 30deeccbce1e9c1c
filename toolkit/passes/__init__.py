"""Graph passes: plain functions Graph -> Graph, each with a one-line contract."""
from .prune import eliminate_dead_code

__all__ = ["eliminate_dead_code"]
