"""Implementations of the ``toolkit`` subcommands, one module each; cli.py only dispatches."""
from .bench import run_bench
from .check import run_check, run_render, run_schema
from .compile_cmd import run_compile
from .graph_cmd import run_graph
from .export_cmd import run_export
from .import_cmd import run_import
from .infer import run_infer
from .serve_cmd import run_serve
from .train_cmd import run_data, run_test, run_train
from .zoo_cmd import run_zoo

__all__ = ["run_bench", "run_check", "run_render", "run_compile", "run_graph", "run_infer", "run_schema", "run_serve", "run_import", "run_export", "run_test", "run_train", "run_data",
           "run_zoo"]
