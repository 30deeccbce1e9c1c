"""Implementations of the ``toolkit`` subcommands, one module each; cli.py's table says which
module runs which command and imports it only when that command runs. ``options.py``: the
options the commands share.

``toolkit.commands.run_NAME`` still hands out a command's function (importing its module then),
for callers that run a command without the parser's table at hand.
"""
from __future__ import annotations


def __getattr__(name: str):
    if name.startswith("run_"):
        from ..cli import BY_NAME, runner
        if name[4:] in BY_NAME:
            return runner(name[4:])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
