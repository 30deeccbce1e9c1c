"""The loop-program expressions: ``//`` is integer division of index expressions (C's ``/``,
which is Python's floor for the non-negative values kernels divide) and is refused on floats,
where C's ``/`` would not be floor division."""
from __future__ import annotations

import numpy as np
import pytest

from toolkit import settings
from toolkit.codegen import toolchain
from toolkit.codegen.loops import Bin, Buf, For, Kernel, Names, Store, Var, lift
from toolkit.codegen.native import Linked, NativeCall
from toolkit.codegen.render import CDialect


def test_floor_division_of_integers_renders_as_c_division():
    i = Var("i", "int64")
    q = i // 3
    assert isinstance(q, Bin) and q.op == "/" and q.dtype == "int64"
    names = Names()
    out = Buf("out", "int64", 20, const=False)
    j = names.var("i")
    kernel = Kernel("quotients", [out], [For(j, lift(0, "int64"), lift(20, "int64"), [Store(out, j, j // 3)])])
    assert "out[i1] = (i1 / 3L);" in CDialect().unit([kernel])


@pytest.mark.parametrize("left,right", [("float32", "int64"), ("int64", "float64"), ("float64", "float64")])
def test_floor_division_is_refused_on_floats(left, right):
    with pytest.raises(TypeError, match="only integer index expressions divide"):
        Var("a", left) // Var("b", right)
    with pytest.raises(TypeError, match="only integer index expressions divide"):
        Var("a", left) // (2.0 if right.startswith("float") else 2)


@pytest.mark.skipif(toolchain.compiler() is None, reason="needs a C compiler for the generated kernel")
def test_compiled_quotients_equal_python_floor_division(tmp_path):
    names = Names()
    out = Buf("out", "int64", 50, const=False)
    i = names.var("i")
    kernel = Kernel("quotients", [out],
                    [For(i, lift(0, "int64"), lift(50, "int64"), [Store(out, i, (i * 7 + 3) // 5)])])
    result = np.zeros(50, np.int64)
    with settings.use(native=True, cache=tmp_path):       # the suite runs the numpy kernels otherwise
        Linked([NativeCall(kernel, [result])], [[0]]).segment(0)()
    np.testing.assert_array_equal(result, (np.arange(50) * 7 + 3) // 5)
