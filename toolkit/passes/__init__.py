"""Graph passes: plain functions Graph -> Graph, each with a one-line contract; PIPELINE lists them."""
from .fuse import fuse_conv_max_pool
from .pipeline import PIPELINE, run_pipeline
from .prune import eliminate_dead_code

__all__ = ["PIPELINE", "eliminate_dead_code", "fuse_conv_max_pool", "run_pipeline"]
