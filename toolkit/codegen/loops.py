"""Loop programs: the small, device-neutral IR that native kernels are written in.

A kernel is a list of statements over typed buffers: nested ``For`` loops (the outermost may be
marked ``parallel``), scalar ``Let``/``Set``, ``Store`` into a buffer (optionally accumulating),
``If``, and ``Gemm`` (a call into the BLAS library; a GPU dialect maps it to cuBLAS). Expressions
are trees of constants, variables, buffer loads, arithmetic, comparisons, ``select`` and math
functions. Shapes are numbers: a plan's shapes are fixed, so every extent is a compile-time
constant the C compiler can vectorise and unroll against, except the symbolic dimensions that
builders registered for it take at run time (below).

Nothing here knows C or CUDA: ``render.py`` holds the dialects. Expressions overload Python's
arithmetic operators so that kernel definitions read like the loops they describe; comparisons
are methods (``a.lt(b)``), since ``==`` must stay identity for hashing.

Sizes that vary: a plan bound to a symbolic dimension (a sequence length T) may hand a builder
``SizeInt`` numbers instead of plain ints. A ``SizeInt`` is the bound number and also the
expression that computes it from the plan's run-time sizes (``Size("T") * 64``): arithmetic on
it keeps both, comparisons and ``range`` use the number. Where it reaches a kernel (through
``lift`` or a ``Const``), the dialect writes the expression, so the kernel's text is the same for
every T and one compiled library serves them all. A builder that turns one into a plain number
(``int()``, numpy) writes that number: its text differs per T, it is compiled per T, and it is
still right, because every text is run with the sizes of the plan that generated it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

SIZES_PARAM = "tk_sizes"            # the kernel parameter that holds its run-time sizes (sizes_used's order)
SCALAR_TYPES = ("float32", "float64", "int64", "int32", "bool")
INT_TYPES = ("int64", "int32")


class Expr:
    dtype: str

    def _bin(self, op, other, swap=False):
        other = lift(other, self.dtype)
        return Bin(op, other, self) if swap else Bin(op, self, other)

    def __add__(self, o): return self._bin("+", o)
    def __radd__(self, o): return self._bin("+", o, True)
    def __sub__(self, o): return self._bin("-", o)
    def __rsub__(self, o): return self._bin("-", o, True)
    def __mul__(self, o): return self._bin("*", o)
    def __rmul__(self, o): return self._bin("*", o, True)
    def __truediv__(self, o): return self._bin("/", o)
    def __rtruediv__(self, o): return self._bin("/", o, True)
    def __floordiv__(self, o): return self._floordiv(o)
    def __mod__(self, o): return self._bin("%", o)
    def __neg__(self): return Un("-", self)

    def _floordiv(self, other):
        """``//`` of integers, rendered as C's ``/``: C truncates toward zero, which is Python's
        floor for the non-negative index arithmetic kernels divide (a kernel dividing a value
        that may be negative selects the sign itself). On floats it would not be floor division,
        so it is refused there."""
        other = lift(other, self.dtype)
        if self.dtype not in INT_TYPES or other.dtype not in INT_TYPES:
            raise TypeError(f"'//' on {self.dtype} and {other.dtype}: only integer index expressions divide "
                            "with '//' (write '/' and call floor for floats)")
        return Bin("/", self, other)

    def lt(self, o): return Cmp("<", self, lift(o, self.dtype))
    def le(self, o): return Cmp("<=", self, lift(o, self.dtype))
    def gt(self, o): return Cmp(">", self, lift(o, self.dtype))
    def ge(self, o): return Cmp(">=", self, lift(o, self.dtype))
    def eq(self, o): return Cmp("==", self, lift(o, self.dtype))
    def ne(self, o): return Cmp("!=", self, lift(o, self.dtype))


@dataclass(eq=False)
class Const(Expr):
    value: Union[int, float]
    dtype: str


@dataclass(eq=False)
class Var(Expr):
    name: str
    dtype: str


@dataclass(eq=False)
class Size(Expr):
    """A symbolic dimension's value, read from the kernel's sizes argument when it runs."""
    name: str
    dtype: str = "int64"


class SizeInt(int):
    """An int that also carries how to compute it from run-time sizes (module docstring)."""

    # (no __slots__: int subclasses cannot have them)

    def __new__(cls, value: int, expr: Expr):
        out = super().__new__(cls, value)
        out.expr = expr
        return out

    @staticmethod
    def of(name: str, value: int) -> "SizeInt":
        return SizeInt(value, Size(name))

    def _combine(self, op: str, other: int, value: int, swap: bool = False):
        """``self op other`` (``other op self`` when ``swap``) whose number is ``value``."""
        if not isinstance(other, SizeInt):
            o = int(other)
            # identities keep the text short: x*1, x+0, x-0
            if (op == "+" and o == 0) or (op == "*" and o == 1) or (op == "-" and o == 0 and not swap):
                return SizeInt(value, self.expr)
            if op == "*" and o == 0:
                return 0
            b = Const(o, "int64")
        else:
            b = other.expr
        return SizeInt(value, Bin(op, b, self.expr) if swap else Bin(op, self.expr, b))

    # C's / and % truncate toward zero, Python's // and % floor: the same where the numerator is
    # not negative; a negative one (the ceiling idiom -(-m // t)) gets the floor written out.
    # Either way the text is right for the size it was built with, and for every other size
    # whose build chose the same text
    def _divide(self, op: str, other: int, value: int, swap: bool):
        num, den = (other, self) if swap else (self, other)
        if int(den) <= 0:
            return value
        if not swap and op == "/" and int(den) == 1:
            return SizeInt(value, self.expr)
        a = num.expr if isinstance(num, SizeInt) else Const(int(num), "int64")
        b = den.expr if isinstance(den, SizeInt) else Const(int(den), "int64")
        if int(num) >= 0:
            return SizeInt(value, Bin(op, a, b))
        if op == "/":                            # floor(a / b), b > 0, a < 0: -((-a + b - 1) / b)
            return SizeInt(value, Un("-", Bin("/", Bin("-", Bin("+", Un("-", a), b), Const(1, "int64")), b)))
        return SizeInt(value, Bin("%", Bin("+", Bin("%", a, b), b), b))     # ((a % b) + b) % b

    def __add__(self, o):
        return self._combine("+", o, int(self) + o) if isinstance(o, int) else NotImplemented

    def __radd__(self, o):
        return self._combine("+", o, o + int(self), True) if isinstance(o, int) else NotImplemented

    def __sub__(self, o):
        return self._combine("-", o, int(self) - o) if isinstance(o, int) else NotImplemented

    def __rsub__(self, o):
        return self._combine("-", o, o - int(self), True) if isinstance(o, int) else NotImplemented

    def __mul__(self, o):
        return self._combine("*", o, int(self) * o) if isinstance(o, int) else NotImplemented

    def __rmul__(self, o):
        return self._combine("*", o, o * int(self), True) if isinstance(o, int) else NotImplemented

    def __floordiv__(self, o):
        return self._divide("/", o, int(self) // o, False) if isinstance(o, int) else NotImplemented

    def __rfloordiv__(self, o):
        return self._divide("/", o, o // int(self), True) if isinstance(o, int) else NotImplemented

    def __mod__(self, o):
        return self._divide("%", o, int(self) % o, False) if isinstance(o, int) else NotImplemented

    def __rmod__(self, o):
        return self._divide("%", o, o % int(self), True) if isinstance(o, int) else NotImplemented

    def __neg__(self): return SizeInt(-int(self), Un("-", self.expr))
    def __pos__(self): return self
    def __abs__(self): return self if int(self) >= 0 else -self
    def __index__(self): return int(self)
    def __reduce__(self): return (int, (int(self),))         # a copy or a pickle is the number
    def __repr__(self): return f"SizeInt({int(self)}, {self.expr!r})"
    __str__ = int.__repr__


@dataclass(eq=False)
class Buf:
    """A kernel parameter: a pointer to ``size`` elements of ``dtype``."""
    name: str
    dtype: str
    size: int
    const: bool = True                 # read only

    def __getitem__(self, index) -> "Load":
        return Load(self, lift(index, "int64"))


@dataclass(eq=False)
class Load(Expr):
    buf: Buf
    index: Expr

    @property
    def dtype(self) -> str:                      # a float16 element is read as a float32
        return "float32" if self.buf.dtype == "float16" else self.buf.dtype


@dataclass(eq=False)
class Bin(Expr):
    op: str
    a: Expr
    b: Expr

    @property
    def dtype(self) -> str:
        return promote(self.a.dtype, self.b.dtype)


@dataclass(eq=False)
class Cmp(Expr):
    op: str
    a: Expr
    b: Expr
    dtype: str = "bool"


@dataclass(eq=False)
class Un(Expr):
    op: str                            # "-" or "!"
    a: Expr

    @property
    def dtype(self) -> str:
        return self.a.dtype


@dataclass(eq=False)
class Call(Expr):
    """A math function of the dialect's library: exp, log, tanh, sqrt, abs, expm1, log1p, erf,
    pow, min, max, floor (float arguments; the result has the first argument's dtype)."""
    fn: str
    args: tuple

    @property
    def dtype(self) -> str:
        return self.args[0].dtype


@dataclass(eq=False)
class Select(Expr):
    cond: Expr
    a: Expr
    b: Expr

    @property
    def dtype(self) -> str:
        return promote(self.a.dtype, self.b.dtype)


@dataclass(eq=False)
class Cast(Expr):
    dtype: str
    a: Expr


@dataclass(eq=False)
class ThreadIndex(Expr):
    """The index of the thread running the current parallel loop's iteration (for per-thread
    scratch); 0 outside a parallel loop."""
    dtype: str = "int64"


# -- statements --------------------------------------------------------------------------------
@dataclass(eq=False)
class For:
    var: Var
    start: Expr
    stop: Expr
    body: list
    parallel: bool = False             # iterations are independent: a dialect may run them at once
    step: int = 1
    reduction: "Var | None" = None     # a sum into this variable that may be reordered (vectorised)
    # iterations touch only their own elements (outputs alias inputs, if at all, element for
    # element), so a dialect may run several at once in vector lanes
    vector: bool = False


@dataclass(eq=False)
class Let:
    var: Var
    value: Expr


@dataclass(eq=False)
class Set:
    var: Var
    value: Expr


@dataclass(eq=False)
class Store:
    buf: Buf
    index: Expr
    value: Expr
    accumulate: bool = False


@dataclass(eq=False)
class If:
    cond: Expr
    then: list
    orelse: list = field(default_factory=list)


@dataclass(eq=False)
class Gemm:
    """C[c_off:] = alpha * op(A) @ op(B) + beta * C, row-major, through the BLAS library."""
    trans_a: bool
    trans_b: bool
    m: Expr
    n: Expr
    k: Expr
    a: Buf
    a_off: Expr
    lda: int
    b: Buf
    b_off: Expr
    ldb: int
    c: Buf
    c_off: Expr
    ldc: int
    alpha: float = 1.0
    beta: Union[float, Expr] = 0.0        # an expression: accumulate on all but the first call


@dataclass(eq=False)
class PackedGemm:
    """C[c_off:] (rows of ldc) = beta * C + W x B[b_off:] (rows of ldb), W's m rows [m, k] in the
    panels of codegen/microkernel.py starting at a_off (a panel boundary): the toolkit's own
    AVX-512 kernel (float32), where ``microkernel.available()``."""
    m: Expr
    n: Expr
    k: Expr
    a: Buf
    a_off: Expr
    b: Buf
    b_off: Expr
    ldb: int
    c: Buf
    c_off: Expr
    ldc: int
    beta: Union[float, Expr] = 0.0
    # the epilogue applied as C is stored: + bias[bias_off + row], + res[res_off + row*ldr + col],
    # then max(., 0)
    bias: "Buf | None" = None
    bias_off: Expr = None
    res: "Buf | None" = None
    res_off: Expr = None
    ldr: int = 0
    relu: bool = False


@dataclass(eq=False)
class Extern:
    """A call of a C function that a prelude defines: ``source`` (its text, included once per
    translation unit that calls it), ``fn`` its name, ``args`` in order: an Expr (a value), a
    ``(Buf, offset Expr)`` pair (a pointer into the buffer), or None (a NULL pointer). For the
    hand-vectorised kernels (codegen/blocked.py) that the loop language cannot state."""
    fn: str
    args: tuple
    source: str


@dataclass(eq=False)
class Kernel:
    """One function: ``params`` in order (the caller passes one pointer per param), ``body``."""
    name: str
    params: list
    body: list
    threads: int = 1                   # threads a parallel loop may use
    sizes: "tuple[str, ...] | None" = None   # sizes_used, once known (codegen.native.with_sizes)

    def uses_gemm(self) -> bool:
        return any(isinstance(s, Gemm) for s in walk(self.body))


def walk(body):
    for s in body:
        yield s
        if isinstance(s, For):
            yield from walk(s.body)
        elif isinstance(s, If):
            yield from walk(s.then)
            yield from walk(s.orelse)


def parallel_from(threads: int, work, minimum: int) -> bool:
    """Whether a loop doing ``work`` (elements) runs on ``threads``: from ``minimum`` on. A
    number, even where ``work`` is a run-time size: the lengths on either side of the threshold
    get texts (and libraries) of their own. Deciding as the kernel runs was tried: both forms
    written under an ``if`` saved one library of the decoder's seven for T=1..128, but each
    library took twice as long to compile (0.3 s to 0.8 s)."""
    return threads > 1 and work >= minimum


def as_size(d):
    """A shape's dimension as a size: a ``SizeInt`` kept, anything else (numpy ints) an int."""
    return d if isinstance(d, SizeInt) else int(d)


def size_product(dims):
    """The product of sizes, a ``SizeInt`` where one of them is (np.prod would drop it)."""
    out = 1
    for d in dims:
        out = out * as_size(d)
    return out


def unsized(value):
    """``value`` with every ``SizeInt`` inside (tuples, lists, dicts) made a plain int: for a
    builder whose kernels keep every size compiled in."""
    if isinstance(value, SizeInt):
        return int(value)
    if isinstance(value, tuple):
        return tuple(unsized(v) for v in value)
    if isinstance(value, list):
        return [unsized(v) for v in value]
    if isinstance(value, dict):
        return {k: unsized(v) for k, v in value.items()}
    return value


def exprs_of(stmt):
    """The expressions a statement holds directly (not those of its nested statements)."""
    if isinstance(stmt, For):
        return [stmt.start, stmt.stop]
    if isinstance(stmt, (Let, Set)):
        return [stmt.value]
    if isinstance(stmt, Store):
        return [stmt.index, stmt.value]
    if isinstance(stmt, If):
        return [stmt.cond]
    if isinstance(stmt, (Gemm, PackedGemm)):
        return [getattr(stmt, f) for f in ("m", "n", "k", "a_off", "b_off", "c_off", "beta", "bias_off", "res_off")
                if isinstance(getattr(stmt, f, None), Expr)]
    if isinstance(stmt, Extern):
        return [a[1] if isinstance(a, tuple) else a for a in stmt.args if a is not None]
    return []


def sizes_used(kernel: Kernel) -> list[str]:
    """The names of the run-time sizes a kernel reads, sorted: its sizes argument's order."""
    if kernel.sizes is not None:
        return list(kernel.sizes)
    names: set[str] = set()
    stack = [e for s in walk(kernel.body) for e in exprs_of(s)]
    while stack:
        e = stack.pop()
        if isinstance(e, Size):
            names.add(e.name)
        elif isinstance(e, Const) and isinstance(e.value, SizeInt):
            stack.append(e.value.expr)
        elif isinstance(e, (Bin, Cmp)):
            stack += [e.a, e.b]
        elif isinstance(e, (Un, Cast)):
            stack.append(e.a)
        elif isinstance(e, Load):
            stack.append(e.index)
        elif isinstance(e, Call):
            stack += list(e.args)
        elif isinstance(e, Select):
            stack += [e.cond, e.a, e.b]
    return sorted(names)


# -- helpers -----------------------------------------------------------------------------------
def lift(value, dtype: str) -> Expr:
    if isinstance(value, Expr):
        return value
    if isinstance(value, SizeInt):
        if dtype in INT_TYPES or dtype == "bool":
            return value.expr
        return Cast(dtype if dtype in ("float32", "float64") else "float64", value.expr)
    if isinstance(value, bool):
        return Const(int(value), "int64")
    if isinstance(value, int):
        return Const(value, "int64" if dtype in ("int64", "int32", "bool") else dtype)
    if isinstance(value, float):
        return Const(value, dtype if dtype in ("float32", "float64") else "float64")
    raise TypeError(f"cannot use {value!r} in a loop program")


def promote(a: str, b: str) -> str:
    order = ["bool", "int32", "int64", "float32", "float64"]
    return max(a, b, key=order.index)


def call(fn: str, *args) -> Call:
    return Call(fn, tuple(args))


def select(cond, a, b) -> Select:
    dtype = a.dtype if isinstance(a, Expr) else b.dtype if isinstance(b, Expr) else "float64"
    return Select(cond, lift(a, dtype), lift(b, dtype))


def maximum(a, b) -> Call:
    dtype = a.dtype if isinstance(a, Expr) else b.dtype
    return Call("max", (lift(a, dtype), lift(b, dtype)))


class Names:
    """Fresh variable names for one kernel."""

    def __init__(self):
        self.count = 0

    def var(self, stem: str, dtype: str = "int64") -> Var:
        self.count += 1
        return Var(f"{stem}{self.count}", dtype)

