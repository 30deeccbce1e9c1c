"""The settings (toolkit/settings.py): every knob's environment variable read one way, good
values and bad (a one-line error naming the variable, the value and what is accepted), ``use()``
for a block (nested, restored, seen by other threads), a bad variable stopping a command before
any work, the switches that once ignored their off words, and the settings page as the table
generates it."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.bounded import ROOT, run_toolkit
from toolkit import settings
from toolkit.errors import UserError

# per kind: (text, value it gives) pairs that are accepted, and texts that are refused
GOOD = {
    "switch": [("1", True), ("on", True), ("YES", True), (" True ", True),
               ("0", False), ("off", False), ("No", False), ("FALSE", False)],
    "count": [("1", 1), ("12", 12), (" 3 ", 3)],
    "seconds": [("2.5", 2.5), ("300", 300.0), ("1e-3", 0.001)],
    "path": [("some/where", Path("some/where")), ("~/x", Path("~/x").expanduser())],
    "list": [("a", ("a",)), ("a, b,,c ", ("a", "b", "c"))],
    "choice": [("tf32", "tf32"), (" STRICT ", "strict")],      # the one choice knob: precision
}
BAD = {
    "switch": ["2", "maybe", "enabled"],
    "count": ["abc", "0", "-1", "1.5", "٣"],
    "seconds": ["abc", "0", "-5", "inf", "nan"],
    "path": [],
    "list": [],
    "choice": ["fp32", "tf", "1"],
}
ACCEPTED = {
    "switch": "on or off (1/0, on/off, yes/no, true/false)",
    "seconds": "a number of seconds above 0",
    "choice": "strict or tf32",
}


@pytest.mark.parametrize("knob", settings.KNOBS, ids=lambda k: k.variable)
def test_every_knob_reads_its_variable(knob):
    assert knob.variable.startswith("TOOLKIT_") and knob.help
    # unset or blank: the table's default
    assert getattr(settings.from_environment({}), knob.name) == knob.default
    assert getattr(settings.from_environment({knob.variable: "  "}), knob.name) == knob.default
    for text, value in GOOD[knob.kind]:
        assert getattr(settings.from_environment({knob.variable: text}), knob.name) == value, text
    for text in BAD[knob.kind]:
        with pytest.raises(UserError) as caught:
            settings.from_environment({knob.variable: text})
        accepted = ACCEPTED.get(knob.kind, f"a whole number from {knob.minimum}")
        assert str(caught.value) == f"error: {knob.variable}={text}: expected {accepted}"


def test_the_defaults_are_those_the_modules_had():
    s = settings.from_environment({})
    assert (s.threads, s.adaptive_threads, s.concurrent, s.native, s.run_time_sizes) == (None, True, False, True, True)
    assert (s.compile_timeout, s.winograd, s.packed_gemm, s.cuda_graphs, s.cudnn) == (300.0, True, True, True, True)
    assert (s.cublas_library, s.cublaslt_library, s.cudnn_library, s.cache) == (None, None, None, None)
    assert (s.max_image_pixels, s.zoo) == (89_478_485, ())
    # TOOLKIT_NATIVE=numpy meant the numpy kernels before the table, and still does
    assert settings.from_environment({"TOOLKIT_NATIVE": "numpy"}).native is False


def test_every_bad_variable_is_reported_at_once():
    with pytest.raises(UserError) as caught:
        settings.from_environment({"TOOLKIT_THREADS": "abc", "TOOLKIT_WINOGRAD": "maybe", "TOOLKIT_CUDNN": "1"})
    assert [str(p) for p in caught.value.problems] == [
        "error: TOOLKIT_THREADS=abc: expected a whole number from 1",
        "error: TOOLKIT_WINOGRAD=maybe: expected on or off (1/0, on/off, yes/no, true/false)"]


def test_the_off_words_that_were_once_ignored_switch_off():
    """``TOOLKIT_WINOGRAD=off`` kept Winograd (only "0" was off) and ``TOOLKIT_CUDNN=no`` kept cuDNN."""
    got = settings.from_environment({"TOOLKIT_WINOGRAD": "off", "TOOLKIT_CUDNN": "no", "TOOLKIT_PACKED_GEMM": "false"})
    assert (got.winograd, got.cudnn, got.packed_gemm) == (False, False, False)


def test_use_sets_knobs_for_a_block_nested_and_restored():
    before = settings.current()
    with settings.use(threads=2, winograd=False) as outer:
        assert settings.current() is outer and (outer.threads, outer.winograd) == (2, False)
        with settings.use(threads=3, cache="some/where") as inner:
            assert (inner.threads, inner.winograd, inner.cache) == (3, False, Path("some/where"))
        assert settings.current() is outer
        with pytest.raises(RuntimeError):
            with settings.use(threads=4):
                raise RuntimeError("a failure inside the block")
        assert settings.current() is outer
    assert settings.current() is before


def test_use_refuses_unknown_names_and_bad_values():
    with pytest.raises(TypeError, match="no setting 'thread'; did you mean 'threads'\\?"):
        with settings.use(thread=1):
            pass
    for name, value, accepted in (("threads", 0, "a whole number from 1"), ("winograd", "off", "on or off"),
                                  ("compile_timeout", -1, "a number of seconds above 0"), ("native", 1, "on or off")):
        with pytest.raises(UserError, match=f"setting {name}={value!r}: expected {accepted}"):
            with settings.use(**{name: value}):
                pass
    with settings.use(zoo="a, b") as given:                    # the variable's own form
        assert given.zoo == ("a", "b")


def test_the_settings_are_the_whole_process_s():
    """A plan runs its kernels on worker threads: they see the block's settings, not defaults."""
    seen = []
    with settings.use(threads=5):
        worker = threading.Thread(target=lambda: seen.append(settings.current().threads))
        worker.start()
        worker.join()
    assert seen == [5]


def test_a_bad_variable_stops_a_command_before_any_work():
    r = run_toolkit("check", "zoo:lenet", env={"TOOLKIT_THREADS": "abc"})
    assert r.status == 2 and r.out == "", r.err
    assert r.lines == ["error: TOOLKIT_THREADS=abc: expected a whole number from 1"]


def test_winograd_off_from_the_environment_keeps_3x3_convolutions_on_im2col(tmp_path):
    """The generated kernel of a 3x3 convolution that Winograd takes, built in a process started
    with TOOLKIT_WINOGRAD=off (and again with it on)."""
    from toolkit.codegen import toolchain
    if toolchain.compiler() is None:
        pytest.skip("no C compiler on this machine")
    script = (
        "import numpy as np\n"
        "from toolkit.ir.graph import Graph, TensorType, Value\n"
        "from toolkit.ops.base import Builder\n"
        "from toolkit.runtime.plan import Plan\n"
        "g = Graph('infer')\n"
        "x = Value(TensorType((1, 128, 12, 12), 'float32'), name='x')\n"
        "g.inputs['x'] = x\n"
        "w = np.zeros((128, 128, 3, 3), np.float32)\n"
        "b = Builder(g, 'conv')\n"
        "g.outputs['y'] = b.op('conv2d', x, b.op('constant', value=w), stride=(1, 1), pad=(1, 1), dilation=(1, 1),"
        " group=1)\n"
        "plan = Plan(g, {}, {}, threads=1)\n"
        "print('winograd' if 'wino_u' in plan.native_source else 'im2col')\n")
    answers = {}
    for value in ("off", "on"):
        env = dict(os.environ, PYTHONPATH=str(ROOT), TOOLKIT_NATIVE="1", TOOLKIT_CACHE=str(tmp_path),
                   TOOLKIT_WINOGRAD=value)
        proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=ROOT,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr
        answers[value] = proc.stdout.strip()
    assert answers == {"off": "im2col", "on": "winograd"}


def test_the_settings_page_is_the_table():
    # the site's settings page, made from the table when it builds (docs/hooks/generated_pages.py)
    page = settings.markdown()
    for knob in settings.KNOBS:
        assert f"| `{knob.name}` | `{knob.variable}` |" in page
