"""The smallest kernel the toolchain builds, for the tests of its cache and of concurrent builds
(some in child processes, which import it from here)."""
from __future__ import annotations

from toolkit.codegen.loops import Buf, For, Kernel, Names, Store, lift


def fill_kernel(value: float) -> Kernel:
    """``fill``: writes ``value`` to the 4 float32 values of its one buffer."""
    names = Names()
    out = Buf("out", "float32", 4, const=False)
    i = names.var("i")
    return Kernel("fill", [out], [For(i, lift(0, "int64"), lift(4, "int64"), [Store(out, i, lift(value, "float32"))])])
