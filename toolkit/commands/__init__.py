"""Implementations of the ``toolkit`` subcommands, one module each, and ``options.py``, the options
they share. toolkit/cli.py's table says which module runs which command (``runner``) and imports
it only when that command runs."""
