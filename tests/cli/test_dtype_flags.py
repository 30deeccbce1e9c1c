"""--dtype float16/bfloat16 on the CPU: the float32 kernels run, with a one-line notice, and the
numbers are the float32 run's."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from toolkit.cli import main

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_low_precision_on_cpu_runs_as_float32(tmp_path, capsys, monkeypatch, dtype):
    monkeypatch.setattr("toolkit.errors._noticed", set())     # the notice is once per process
    x = np.random.default_rng(0).random((3, 1, 8, 8), dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    outs = {}
    for flag in ("float32", dtype):
        out = tmp_path / f"{flag}.npy"
        assert main(["infer", "zoo:lenet", "--input", f"data={tmp_path / 'x.npy'}", "--dtype", flag,
                     "--output", str(out)]) == 0
        outs[flag] = np.load(out)
    err = capsys.readouterr().err
    assert f"note: {dtype} on cpu runs through the float32 kernels" in err and err.count("note:") == 1
    assert outs[dtype].dtype == np.float32
    np.testing.assert_array_equal(outs[dtype], outs["float32"])


def test_bench_reports_the_dtype_it_ran(capsys):
    assert main(["bench", str(ROOT / "zoo" / "lenet" / "net.yaml"), "--batch", "2", "--iters", "2",
                 "--dtype", "float16", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["dtype"] == "float32"
