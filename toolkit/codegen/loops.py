"""Loop programs: the small, device-neutral IR that native kernels are written in.

A kernel is a list of statements over typed buffers: nested ``For`` loops (the outermost may be
marked ``parallel``), scalar ``Let``/``Set``, ``Store`` into a buffer (optionally accumulating),
``If``, and ``Gemm`` (a call into the BLAS library; a GPU dialect maps it to cuBLAS). Expressions
are trees of constants, variables, buffer loads, arithmetic, comparisons, ``select`` and math
functions. Shapes are numbers: a plan's shapes are fixed, so every extent is a compile-time
constant the C compiler can vectorise and unroll against.

Nothing here knows C or CUDA: ``render.py`` holds the dialects. Expressions overload Python's
arithmetic operators so that kernel definitions read like the loops they describe; comparisons
are methods (``a.lt(b)``), since ``==`` must stay identity for hashing.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

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


# -- helpers -----------------------------------------------------------------------------------
def lift(value, dtype: str) -> Expr:
    if isinstance(value, Expr):
        return value
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

