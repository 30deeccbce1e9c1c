"""User-facing errors: anything raised as UserError is printed as one line per problem, exit 2.

SpecError carries FILE:LINE:COL; the CLI prints ``FILE:LINE:COL: error: MESSAGE``. Any other
exception is a bug in the toolkit (exit 1).
"""
from __future__ import annotations

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
            return f"error: {self.message}"
        return f"{self.location}: error: {self.message}"


class UserError(Exception):
    """A mistake in what the user gave (net, data, weights, flags). Carries every problem found."""

    def __init__(self, *problems: "Problem | str"):
        self.problems = [p if isinstance(p, Problem) else Problem(p) for p in problems]
        super().__init__("\n".join(str(p) for p in self.problems))


class SpecError(UserError):
    """Problems in a net file, each with its location."""
