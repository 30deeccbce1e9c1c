"""What the user is told: errors, raised as UserError and printed as one line per problem with
exit status 2, and notes (``note: ...`` on stderr) that are not errors.

SpecError carries FILE:LINE:COL; the CLI prints ``FILE:LINE:COL: error: MESSAGE``. Any other
exception is a bug in the toolkit (exit 1).
"""
from __future__ import annotations

import difflib
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Location:
    file: str
    line: int      # 1-based
    col: int       # 1-based

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


@dataclass(frozen=True)
class Problem:
    message: str
    location: Location | None = None

    def __str__(self) -> str:
        if self.location is None:
            return f"error: {one_line(self.message)}"
        return f"{one_line(str(self.location))}: error: {one_line(self.message)}"


def one_line(text: str) -> str:
    """``text`` with its line breaks and other unprintable characters written as escapes (``\\n``,
    ``\\x1b``): a name read from a file may hold any character, and must neither split a problem's
    line nor drive the terminal."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


class UserError(Exception):
    """A mistake in what the user gave (net, data, weights, flags). Carries every problem found."""

    def __init__(self, *problems: "Problem | str"):
        self.problems = [p if isinstance(p, Problem) else Problem(p) for p in problems]
        super().__init__("\n".join(str(p) for p in self.problems))


class SpecError(UserError):
    """Problems in a net file, each with its location."""


def did_you_mean(word: str, candidates) -> str:
    """``; did you mean 'X'?`` for the closest of ``candidates`` to a misspelt ``word``, else ''."""
    # the word itself is never a suggestion (a layer that writes its own missing bottom in place)
    match = difflib.get_close_matches(str(word), [str(c) for c in candidates if str(c) != str(word)], n=1,
                                      cutoff=0.6)
    return f"; did you mean '{match[0]}'?" if match else ""


_noticed: set[str] = set()


def notice(message: str, once: str | None = None) -> None:
    """A one-line ``note: MESSAGE`` on stderr: something the user should know that is not an
    error. With ``once`` (a key), a note whose key was already used in this process is dropped."""
    if once is not None:
        if once in _noticed:
            return
        _noticed.add(once)
    print(f"note: {message}", file=sys.stderr)
