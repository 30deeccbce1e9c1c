"""Installed as ``sitecustomize`` for the examples marked ``<!-- example: dry-run: REASON -->``
(tests/docs/test_examples.py): every argparse parser of the process parses its command line as
usual, and the process then ends without doing the work, having written one line to the file
named by TOOLKIT_EXAMPLE_PARSE_LOG: ``ok ARGV`` for a command line that parses, ``error ARGV:
MESSAGE`` for one that does not. A benchmark that runs for minutes, or a command that needs a
GPU, is so still checked against the flags the code has."""
import argparse
import os
import sys

_LOG = os.environ.get("TOOLKIT_EXAMPLE_PARSE_LOG")


def _record(line: str) -> None:
    with open(_LOG, "a", encoding="utf-8") as log:
        log.write(line.replace("\n", " ") + "\n")


if _LOG:
    _parse_args = argparse.ArgumentParser.parse_args

    def parse_args(self, args=None, namespace=None):
        try:
            parsed = _parse_args(self, args, namespace)
        except SystemExit as stop:           # argparse's own error, or --help (status 0)
            if stop.code:
                _record(f"error {' '.join(sys.argv)}: exit status {stop.code}")
            raise
        except Exception as error:           # a parser whose error() raises (the toolkit's)
            _record(f"error {' '.join(sys.argv)}: {error}")
            raise
        _record(f"ok {' '.join(sys.argv)}")
        sys.stdout.flush()
        os._exit(0)        # no atexit work, no threads: the command's work never starts
        return parsed

    argparse.ArgumentParser.parse_args = parse_args
