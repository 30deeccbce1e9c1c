"""Helpers for CLI tests: run ``toolkit`` in-process or in a subprocess, write nets, find lines.

(Named ``cli_helpers`` rather than ``helpers`` so that it cannot clash with a helper module of
another test folder under pytest's default ``prepend`` import mode.)
"""
from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

from toolkit.cli import main

REPO = Path(__file__).resolve().parents[2]
LENET = REPO / "benchmarks" / "nets" / "lenet.yaml"

# Every line a user error prints: `FILE:LINE:COL: error: MESSAGE` or `error: MESSAGE`.
ERROR_LINE = re.compile(r"^(?:(?P<file>.+):(?P<line>\d+):(?P<col>\d+): )?error: (?P<message>\S.*)$")


@dataclass
class Result:
    status: int
    out: str
    err: str

    @property
    def err_lines(self) -> list[str]:
        return [line for line in self.err.splitlines() if line.strip()]


def run_cli(*args) -> Result:
    """``toolkit ARGS`` in this process. An exception escaping ``main`` is a toolkit bug and
    propagates, so the test fails with its traceback."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main([str(a) for a in args])
        except SystemExit as e:          # argparse's --help / --version
            status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return Result(status, out.getvalue(), err.getvalue())


def run_subprocess(*args, cwd: Path | None = None, timeout: float = 60) -> Result:
    """``python -m toolkit.cli ARGS`` in a fresh process: the real exit status and stderr."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    proc = subprocess.run([sys.executable, "-m", "toolkit.cli", *[str(a) for a in args]], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout, env=env)
    return Result(proc.returncode, proc.stdout, proc.stderr)


def write_net(directory: Path, text: str, name: str = "net.yaml") -> Path:
    path = directory / name
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def line_of(text: str, needle: str, nth: int = 1) -> int:
    """1-based number of the line holding the ``nth`` occurrence of ``needle``."""
    return _position(text, needle, nth)[0]


def col_of(text: str, needle: str, nth: int = 1) -> int:
    """1-based column where the ``nth`` occurrence of ``needle`` starts."""
    return _position(text, needle, nth)[1]


def _position(text: str, needle: str, nth: int) -> tuple[int, int]:
    text = textwrap.dedent(text).lstrip("\n")
    start = -1
    for _ in range(nth):
        start = text.find(needle, start + 1)
        assert start >= 0, f"{needle!r} occurs fewer than {nth} times in the net text"
    line = text.count("\n", 0, start) + 1
    col = start - (text.rfind("\n", 0, start) + 1) + 1
    return line, col


def assert_clean_failure(result: Result) -> None:
    """Exit 2, no traceback, and every stderr line shaped like a user error."""
    assert "Traceback" not in result.err, result.err
    assert result.status == 2, f"exit status {result.status}, stderr:\n{result.err}"
    assert result.err_lines, "no error printed"
    for line in result.err_lines:
        assert ERROR_LINE.match(line), f"not an error line: {line!r}\nstderr:\n{result.err}"


def expect_error(result: Result, *words: str, file: Path | str | None = None, line: int | None = None,
                 col: int | None = None) -> str:
    """Asserts a clean failure with a line at FILE:LINE(:COL) (or a plain ``error:`` line when
    ``file`` is None) whose message holds every word; returns that line."""
    assert_clean_failure(result)
    candidates = []
    for text in result.err_lines:
        m = ERROR_LINE.match(text)
        if file is None:
            if m.group("file") is not None:
                continue
        else:
            if m.group("file") != str(file) or (line is not None and int(m.group("line")) != line):
                continue
            if col is not None and int(m.group("col")) != col:
                continue
        candidates.append(text)
    for text in candidates:
        if all(w in text for w in words):
            return text
    where = "a plain 'error:' line" if file is None else f"{file}:{line}" + (f":{col}" if col else "")
    raise AssertionError(f"expected {where} with {words!r}; stderr was:\n{result.err}")
