"""Symbolic tensor dimensions: integer polynomials over named symbols such as ``N`` or ``T``.

A dimension is either a plain ``int`` or a ``Sym`` (a polynomial with integer coefficients).
Shape rules do ordinary arithmetic on dimensions; anything a polynomial cannot represent
exactly (``(N - 1) // 2``) raises ``DimError``, which shape inference turns into a clear error.
"""
from __future__ import annotations

from typing import Mapping, Union

Monomial = tuple[str, ...]  # sorted symbol names, repeated for powers: ("N", "N") is N^2


class DimError(ValueError):
    """An arithmetic result that cannot be written as an integer polynomial of the symbols."""


class Sym:
    """An integer polynomial over dimension symbols; immutable and hashable."""

    __slots__ = ("terms",)

    def __init__(self, terms: Mapping[Monomial, int]):
        self.terms = {m: c for m, c in terms.items() if c != 0}

    @staticmethod
    def named(name: str) -> "Sym":
        return Sym({(name,): 1})

    # -- conversions -------------------------------------------------------------
    @staticmethod
    def lift(value: "Dim") -> "Sym":
        if isinstance(value, Sym):
            return value
        return Sym({(): int(value)})

    def simplify(self) -> "Dim":
        """Collapse to ``int`` when no symbol is left."""
        if not self.terms:
            return 0
        if set(self.terms) == {()}:
            return self.terms[()]
        return self

    @property
    def symbols(self) -> set[str]:
        return {s for m in self.terms for s in m}

    def evaluate(self, bindings: Mapping[str, int]) -> int:
        total = 0
        for mono, coeff in self.terms.items():
            term = coeff
            for name in mono:
                if name not in bindings:
                    raise DimError(f"dimension '{name}' has no value")
                term *= bindings[name]
            total += term
        return total

    # -- arithmetic ----------------------------------------------------------------
    def __add__(self, other: "Dim") -> "Dim":
        out = dict(self.terms)
        for m, c in Sym.lift(other).terms.items():
            out[m] = out.get(m, 0) + c
        return Sym(out).simplify()

    __radd__ = __add__

    def __neg__(self) -> "Dim":
        return Sym({m: -c for m, c in self.terms.items()}).simplify()

    def __sub__(self, other: "Dim") -> "Dim":
        return self + (-Sym.lift(other))

    def __rsub__(self, other: "Dim") -> "Dim":
        return Sym.lift(other) + (-self)

    def __mul__(self, other: "Dim") -> "Dim":
        out: dict[Monomial, int] = {}
        for m1, c1 in self.terms.items():
            for m2, c2 in Sym.lift(other).terms.items():
                m = tuple(sorted(m1 + m2))
                out[m] = out.get(m, 0) + c1 * c2
        return Sym(out).simplify()

    __rmul__ = __mul__

    def __floordiv__(self, other: "Dim") -> "Dim":
        """Exact division only: by an int dividing every coefficient, or by a monomial factor."""
        if isinstance(other, int):
            if other != 0 and all(c % other == 0 for c in self.terms.values()):
                return Sym({m: c // other for m, c in self.terms.items()}).simplify()
            raise DimError(f"{self} is not divisible by {other}")
        other = Sym.lift(other)
        if len(other.terms) == 1:
            (om, oc), = other.terms.items()
            out = {}
            for m, c in self.terms.items():
                rest = list(m)
                for s in om:
                    if s not in rest:
                        raise DimError(f"{self} is not divisible by {other}")
                    rest.remove(s)
                if c % oc:
                    raise DimError(f"{self} is not divisible by {other}")
                out[tuple(rest)] = c // oc
            return Sym(out).simplify()
        if self == other:
            return 1
        raise DimError(f"{self} is not divisible by {other}")

    def __rfloordiv__(self, other: "Dim") -> "Dim":
        return Sym.lift(other) // self

    def __mod__(self, other: "Dim") -> "Dim":
        try:
            self // other
            return 0
        except DimError:
            raise DimError(f"{self} mod {other} depends on the value of {', '.join(sorted(self.symbols))}")

    # -- comparison ----------------------------------------------------------------
    def __eq__(self, other: object) -> bool:
        if isinstance(other, (int, Sym)):
            return Sym.lift(other).terms == self.terms
        return NotImplemented

    def __hash__(self) -> int:
        return hash(frozenset(self.terms.items()))

    def _undecidable(self, other: object):
        raise DimError(f"cannot compare {self} with {other}: it depends on {', '.join(sorted(self.symbols))}")

    __lt__ = __le__ = __gt__ = __ge__ = _undecidable

    def __repr__(self) -> str:
        return format_dim(self)


Dim = Union[int, Sym]


def format_dim(d: Dim) -> str:
    if isinstance(d, int):
        return str(d)
    parts = []
    for mono, coeff in sorted(d.terms.items(), key=lambda mc: (-len(mc[0]), mc[0])):
        sym = "*".join(mono)
        if not mono:
            text = str(abs(coeff))
        elif abs(coeff) == 1:
            text = sym
        else:
            text = f"{abs(coeff)}*{sym}"
        sign = "-" if coeff < 0 else "+"
        parts.append((sign, text))
    out = ("-" if parts[0][0] == "-" else "") + parts[0][1]
    for sign, text in parts[1:]:
        out += f" {sign} {text}"
    return out


def as_dim(value: int | str) -> Dim:
    """A YAML dimension: an int, or a symbol name."""
    return Sym.named(value) if isinstance(value, str) else int(value)


def is_static(d: Dim) -> bool:
    return isinstance(d, int)


def evaluate(d: Dim, bindings: Mapping[str, int]) -> int:
    return d if isinstance(d, int) else d.evaluate(bindings)


def product(dims) -> Dim:
    out: Dim = 1
    for d in dims:
        out = out * d
    return out


def human(n: float) -> str:
    """A count in three significant digits with a k, M or G suffix."""
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:.3g}" if isinstance(n, float) else str(n)


def format_count(d: Dim) -> str:
    """FLOPs or sizes as '2.29M*N' for symbolic counts, '1.5k' for fixed ones."""
    if isinstance(d, int):
        return human(d)
    parts = []
    for mono, coeff in sorted(d.terms.items(), key=lambda mc: -len(mc[0])):
        sym = "*".join(mono)
        parts.append(f"{human(coeff)}*{sym}" if mono else human(coeff))
    return " + ".join(parts)
