"""Kernel priority is stated, not implied by import order: a kernel that takes another's place
declares a higher priority (``KernelRegistry.specialise`` or ``register(priority=)``), so the
registry's table is the same whatever order the kernel modules are imported in, and two
kernels for one key at one priority are refused."""
from __future__ import annotations

import itertools
import json
import subprocess
import sys
import textwrap

import pytest

from tests.runtime.gpu_stand_in import ROOT, STAND_IN
from toolkit.backend.registry import PORTABLE, SPECIALISED, KernelRegistry

# the GPU modules whose kernels share keys: dispatched.py and arrays.py register the array
# programs, rows.py, dnn.py and channel_reductions.py specialise some of them
SHARING = ("dispatched", "arrays", "rows", "dnn", "channel_reductions")
# the GPU modules whose kernels have keys of their own, imported before or after the others
OWN_KEYS = ("blas", "collective", "cuda", "fused", "lt", "nhwc", "quant")

# One child process with the CuPy stand-in: the common imports once, then one forked process
# per order. Each makes the GPU package without running its __init__ (which imports every module
# in one fixed order), imports the modules in its order, and prints its table:
# (op, device, dtype) -> the factory's module.qualname and the chain of registrations behind it.
ORDERS_SCRIPT = STAND_IN + textwrap.dedent("""
    import importlib, json, os, types
    import toolkit.kernels, toolkit.kernels.cpu, toolkit.kernels.native
    from toolkit.backend.registry import KERNELS, load_kind

    def table():
        return {"|".join(key): [f"{e.factory.__module__}.{e.factory.__qualname__}",
                                list(getattr(KERNELS, "chains", {}).get(key, ()))]
                for key, e in sorted(KERNELS.entries.items())}

    def in_child(load):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            load()
            os.write(write, json.dumps(table()).encode())
            os._exit(0)
        os.close(write)
        chunks = []
        while chunk := os.read(read, 1 << 20):
            chunks.append(chunk)
        os.waitpid(pid, 0)
        return json.loads(b"".join(chunks))

    def import_in_order(order):
        package = types.ModuleType("toolkit.kernels.gpu")
        package.__path__ = [os.path.join(os.path.dirname(toolkit.kernels.__file__), "gpu")]
        sys.modules["toolkit.kernels.gpu"] = package
        toolkit.kernels.gpu = package
        for name in order:
            importlib.import_module(f"toolkit.kernels.gpu.{name}")
        from toolkit.kernels import control
        control.register("gpu")

    orders = json.loads(sys.argv[1])
    tables = {"load_kind": in_child(lambda: load_kind("gpu"))}
    for order in orders:
        tables[" ".join(order)] = in_child(lambda: import_in_order(order))
    print(json.dumps(tables))
""")


def test_every_import_order_gives_one_registry():
    orders = [list(p) + list(OWN_KEYS) for p in itertools.permutations(SHARING)]
    orders += [list(OWN_KEYS) + list(reversed(SHARING)), list(reversed(OWN_KEYS)) + list(SHARING)]
    done = subprocess.run([sys.executable, "-c", ORDERS_SCRIPT, json.dumps(orders)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    tables = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(tables) == len(orders) + 1 == 123       # 5! orders of SHARING, two more, and load_kind's
    reference = tables.pop("load_kind")
    gpu = {key: value for key, value in reference.items() if "|gpu|" in key}
    assert len(gpu) > 60, len(gpu)
    for order, table in tables.items():
        differ = sorted(k for k in set(table) | set(reference) if table.get(k) != reference.get(k))
        assert not differ, f"importing {order}: {len(differ)} entries differ, e.g. {differ[:3]}"
    # the specialised kernels are the ones in place, each over the array program it falls back on
    conv = gpu["conv2d|gpu|*"]
    assert conv[1] == ["toolkit.kernels.gpu.arrays._over_cupy.<locals>.factory",
                       "toolkit.kernels.gpu.dnn.cudnn_over_im2col[conv2d]"], conv
    assert conv[0] == "toolkit.kernels.gpu.dnn._choosing.<locals>.factory"
    nll = gpu["nll_loss|gpu|*"]
    assert nll[1][0] == "toolkit.kernels.gpu.arrays.nll_loss_gpu" and len(nll[1]) == 2, nll
    assert nll[0].startswith("toolkit.kernels.gpu.rows.") and nll[1][1].startswith("toolkit.kernels.gpu.rows."), nll
    # an op the CPU shares with the GPU has the CPU's plain kernel
    assert gpu["exp|gpu|*"][0] == reference["exp|cpu|*"][0]


def _factory(name):
    def factory(ctx):
        return name
    factory.__qualname__ = name
    return factory


def _specialiser(name):
    def make(below):
        def factory(ctx):
            return f"{name}({below(ctx)})"
        return factory
    make.__qualname__ = name
    return make


def _registrations(registry):
    return [lambda: registry.register("conv", "gpu")(_factory("plain")),
            lambda: registry.register("conv", "gpu", "float16")(_factory("plain16")),
            lambda: registry.specialise("conv", "gpu", SPECIALISED)(_specialiser("fast")),
            lambda: registry.specialise("conv", "gpu", SPECIALISED + 5)(_specialiser("faster")),
            lambda: registry.register("conv", "gpu", priority=SPECIALISED + 1)(_factory("replacement"))]


def test_the_table_follows_priorities_not_the_order_of_registration():
    seen = set()
    for order in itertools.permutations(range(5)):
        registry = KernelRegistry()
        steps = _registrations(registry)
        for index in order:
            steps[index]()
        seen.add(tuple((key, registry.entries[key].factory(None), registry.chains[key])
                       for key in sorted(registry.entries)))
    assert len(seen) == 1
    (wild, _w, wild_chain), (half, _h, half_chain) = [(k, f, c) for k, f, c in seen.pop()]
    assert wild[2] == "*" and half[2] == "float16"
    # the wildcard key: its plain kernel, specialised, then replaced outright, then specialised again
    assert _w == "faster(replacement)" and wild_chain[0].endswith("replacement")
    assert _h == "faster(fast(plain16))" and [c.rsplit(".", 1)[-1] for c in half_chain] == \
        ["plain16", "fast", "faster"]


def test_a_specialiser_needs_a_kernel_below_it():
    registry = KernelRegistry()
    registry.specialise("conv", "gpu")(_specialiser("fast"))
    assert registry.entries == {}
    registry.register("conv", "cpu")(_factory("plain"))
    assert registry.entries[("conv", "cpu", "*")].factory(None) == "plain"     # another device's


def test_two_kernels_at_one_priority_are_a_maintainers_mistake():
    registry = KernelRegistry()
    registry.register("conv", "gpu")(_factory("one"))
    with pytest.raises(RuntimeError, match=r"\('conv', 'gpu', '\*'\) registered twice at priority 0"):
        registry.register("conv", "gpu")(_factory("two"))
    registry.specialise("conv", "gpu")(_specialiser("fast"))
    with pytest.raises(RuntimeError, match="registered twice at priority 10"):
        registry.specialise("conv", "gpu")(_specialiser("other"))
    with pytest.raises(RuntimeError, match="registered twice at priority 10"):
        registry.register("conv", "gpu", "float32", priority=SPECIALISED)(_factory("clash"))
    assert registry.entries[("conv", "gpu", "*")].factory(None) == "fast(one)"
    assert registry.portable("conv", "gpu")[("*")].factory.__qualname__ == "one"
    assert PORTABLE < SPECIALISED
