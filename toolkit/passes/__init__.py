"""Graph passes: functions (graph, PassContext) -> whether they changed it, each with a one-line
contract; PIPELINE lists them."""
from .constants import dedup_constants, fold_constants, freeze_weights
from .cse import eliminate_common
from .fuse import fuse_conv_max_pool
from .pipeline import PIPELINE, pass_names, run_pipeline
from .prune import eliminate_dead_code
from .simplify import simplify

__all__ = ["PIPELINE", "dedup_constants", "eliminate_common", "eliminate_dead_code", "fold_constants",
           "freeze_weights", "fuse_conv_max_pool", "pass_names", "run_pipeline", "simplify"]
