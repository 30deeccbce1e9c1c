"""`toolkit infer` reads its inputs a chunk of rows at a time: the same outputs as one whole run,
inputs read in step, --verbose's report, and memory that stays flat on a large .npy."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import run_cli, write_net

from toolkit.commands.infer import RowProgress
from toolkit.commands.io import read_inputs
from toolkit.compile import optimize
from toolkit.frontend import Net
from toolkit.runtime.session import InferSession
from toolkit.training.data import load_digits
from toolkit.weights import save_weights

ROOT = Path(__file__).resolve().parents[2]
LENET = str(ROOT / "zoo" / "lenet" / "net.yaml")


@pytest.fixture(scope="module")
def lenet(tmp_path_factory):
    """LeNet's net, its seed-0 weights in a file, and an InferSession on the whole arrays."""
    net = Net.load(LENET)
    weights = net.init_weights(seed=0)
    path = tmp_path_factory.mktemp("lenet") / "w.safetensors"
    save_weights(str(path), weights)
    session = InferSession(optimize(net.graph("infer"), set(), weights, "cpu"), weights)
    return net, path, session


def _infer(lenet, tmp_path, *inputs, extra=()):
    out = tmp_path / "out.npy"
    flags = [part for item in inputs for part in ("--input", item)]
    # the inputs as given (--no-transform): these tests are about reading them in chunks
    result = run_cli("infer", LENET, "--weights", lenet[1], "--output", out, "--no-transform", *flags, *extra)
    assert result.status == 0, result.err
    return np.load(out), result


@pytest.mark.parametrize("kind", ["npy", "npz", "npz_compressed"])
def test_streamed_npy_equals_one_whole_run(lenet, tmp_path, kind):
    x = np.random.default_rng(0).random((2000, 1, 8, 8), dtype=np.float32)
    path = tmp_path / ("x.npy" if kind == "npy" else "x.npz")
    if kind == "npy":
        np.save(path, x)
    else:
        (np.savez if kind == "npz" else np.savez_compressed)(path, data=x)
    prob, result = _infer(lenet, tmp_path, str(path), extra=["--chunk-rows", "300"])   # not a multiple of 64
    assert result.err == ""                     # no progress off a terminal without --verbose
    assert prob.shape == (2000, 10)
    np.testing.assert_allclose(prob, lenet[2].run({"data": x})["prob"], rtol=0, atol=1e-6)


def test_streamed_image_folder_and_csv_equal_the_whole_read(lenet, tmp_path):
    from PIL import Image
    x, _ = load_digits()
    x = x[:45]
    folder = tmp_path / "digits"
    folder.mkdir()
    for i in reversed(range(len(x))):          # written out of order: read in the order of the names
        Image.fromarray(x[i, 0].astype(np.uint8)).save(folder / f"{i:03d}.png")
    (folder / "notes.txt").write_text("not an image")
    whole = read_inputs([str(folder)], ["data"], ["data", "label"], {"data": ("N", 1, 8, 8)})["data"]
    np.testing.assert_array_equal(whole, x.astype(np.float32))
    prob, _ = _infer(lenet, tmp_path, str(folder), extra=["--chunk-rows", "7"])
    # rounding only: a kernel splits its sums over as many cores as the machine has free then
    np.testing.assert_allclose(prob, lenet[2].run({"data": whole})["prob"], rtol=1e-5, atol=1e-6)

    rows = np.random.default_rng(1).random((1000, 64)).astype(np.float32)
    csv = tmp_path / "rows.csv"
    np.savetxt(csv, rows, delimiter=",", fmt="%.9g", header=",".join(f"p{i}" for i in range(64)), comments="")
    whole = read_inputs([str(csv)], ["data"], ["data", "label"], {"data": ("N", 1, 8, 8)})["data"]
    np.testing.assert_array_equal(whole, rows.reshape(1000, 1, 8, 8))
    prob, _ = _infer(lenet, tmp_path, f"data={csv}", extra=["--chunk-rows", "130"])
    np.testing.assert_allclose(prob, lenet[2].run({"data": whole})["prob"], rtol=0, atol=1e-6)


PAIR_NET = """
name: pair
inputs:
  a: {shape: [N, 4], dtype: float32}
  b: {shape: [N, 4], dtype: float32}
layers:
  - {name: sum, type: Eltwise, bottom: [a, b], top: s, operation: sum}
  - {name: ip, type: InnerProduct, bottom: s, top: ip, num_output: 3}
outputs: [ip]
"""


def test_inputs_with_different_row_counts_are_an_error(tmp_path):
    net = write_net(tmp_path, PAIR_NET)
    weights = tmp_path / "w.npz"
    save_weights(str(weights), Net.load(str(net)).init_weights())
    np.save(tmp_path / "a.npy", np.ones((50, 4), np.float32))
    np.savetxt(tmp_path / "b.csv", np.ones((49, 4)), delimiter=",")
    out = tmp_path / "out.npz"
    result = run_cli("infer", net, "--weights", weights, "--input", f"a={tmp_path / 'a.npy'}",
                     "--input", f"b={tmp_path / 'b.csv'}", "--output", out, "--chunk-rows", "16")
    assert result.status == 2 and "Traceback" not in result.err
    assert len(result.err_lines) == 1, result.err
    line = result.err_lines[0]
    assert line.startswith("error:") and "different numbers of rows" in line and "'a' 50" in line and "'b' 49" in line
    assert not out.exists()
    # in step, two inputs of the same rows run chunk by chunk as one whole run does
    np.savetxt(tmp_path / "b.csv", np.arange(200).reshape(50, 4) / 7, delimiter=",", fmt="%.9g")
    result = run_cli("infer", net, "--weights", weights, "--input", f"a={tmp_path / 'a.npy'}",
                     "--input", f"b={tmp_path / 'b.csv'}", "--output", out, "--chunk-rows", "16")
    assert result.status == 0, result.err
    n = Net.load(str(net))
    w = n.load_weights(str(weights))
    session = InferSession(optimize(n.graph("infer"), set(), w, "cpu"), w)
    b = np.loadtxt(tmp_path / "b.csv", delimiter=",", dtype=np.float32)
    want = session.run({"a": np.ones((50, 4), np.float32), "b": b})["ip"]
    np.testing.assert_allclose(np.load(out)["ip"], want, rtol=0, atol=1e-6)


def test_verbose_reports_buckets_rows_and_memory(lenet, tmp_path):
    np.save(tmp_path / "x.npy", np.random.default_rng(2).random((270, 1, 8, 8), dtype=np.float32))
    _, result = _infer(lenet, tmp_path, str(tmp_path / "x.npy"), extra=["--chunk-rows", "128", "--verbose", "--warm"])
    err = result.err_lines
    # chunks of 128, 128 and 14 rows: 64 + 64 twice, then 14 rows in a 16
    assert "buckets used: 64 x 4, 16 x 1" in err, result.err
    summary = next(line for line in err if line.startswith("rows:"))
    assert "rows: 270 in 3 chunk(s) of up to 128 rows" in summary and "rows/s" in summary and "peak RSS" in summary
    assert any(line.startswith("warm: 7 plan(s)") for line in err), result.err
    progress = [line for line in err if line.startswith("infer:")]     # off a terminal: tenths, with --verbose
    assert progress and progress[-1].startswith("infer: 270/270 rows (100%)")


def test_progress_bar_on_a_terminal():
    class Terminal(io.StringIO):
        def isatty(self):
            return True
    stream = Terminal()
    bar = RowProgress(1000, verbose=False, stream=stream)
    for _ in range(4):
        bar.update(250)
    bar.close()
    text = stream.getvalue()
    assert text.startswith("\r[") and "1000/1000 rows" in text and "rows/s" in text and text.endswith("\n")
    quiet = io.StringIO()                      # not a terminal, no --verbose: nothing
    RowProgress(1000, verbose=False, stream=quiet).update(1000)
    assert quiet.getvalue() == ""


FLAT_NET = """
name: flat
inputs:
  data: {shape: [N, 1, 28, 28], dtype: float32}
layers:
  - {name: ip, type: InnerProduct, bottom: data, top: ip, num_output: 10}
  - {name: prob, type: Softmax, bottom: ip, top: prob}
outputs: [prob]
"""

MEASURE = textwrap.dedent("""
    import json, resource, sys
    import numpy as np
    from toolkit.cli import main
    net, weights, small, big, out = sys.argv[1:]
    def peak():
        # ru_maxrss keeps the peak of the pytest process this one was started from (it survives
        # fork and exec), which would hide any growth below it; Linux's VmHWM is this process's own
        try:
            with open("/proc/self/status") as f:
                return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
        except OSError:
            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
    assert main(["infer", net, "--weights", weights, "--input", small, "--output", out]) == 0   # imports, native code
    before = peak()
    assert main(["infer", net, "--weights", weights, "--input", big, "--output", out, "--verbose"]) == 0
    after = peak()
    whole = np.load(big)          # the control: reading the file whole does show in the measure
    control = peak()
    print(json.dumps({"before": before, "after": after, "control": control, "sum": float(whole[:, 0, 0, 0].sum()),
                      "ru_maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
""")


def test_streaming_a_large_npy_keeps_memory_flat(tmp_path):
    net = write_net(tmp_path, FLAT_NET)
    weights = tmp_path / "w.npz"
    save_weights(str(weights), Net.load(str(net)).init_weights())
    rows = 20_000
    big = tmp_path / "big.npy"
    mapped = np.lib.format.open_memmap(big, mode="w+", dtype=np.float32, shape=(rows, 1, 28, 28))
    rng = np.random.default_rng(3)
    for start in range(0, rows, 2000):
        mapped[start: start + 2000] = rng.random((2000, 1, 28, 28), dtype=np.float32)
    mapped.flush()
    del mapped
    np.save(tmp_path / "small.npy", np.zeros((10, 1, 28, 28), np.float32))
    size = big.stat().st_size
    assert size > 60e6
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT)] + ([os.environ["PYTHONPATH"]]
                                                                     if os.environ.get("PYTHONPATH") else [])))
    proc = subprocess.run([sys.executable, "-c", MEASURE, str(net), str(weights), str(tmp_path / "small.npy"),
                           str(big), str(tmp_path / "out.npy")], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    growth = got["after"] - got["before"]
    assert "buckets used: 64 x 312, 32 x 1" in proc.stderr
    assert got["control"] - got["after"] > 0.5 * size, got       # the measure sees a whole read
    assert growth < 0.5 * size, (f"peak RSS grew by {growth / 2**20:.1f} MiB streaming a {size / 2**20:.1f} MiB "
                                 f"file: {proc.stderr}")
    assert np.load(tmp_path / "out.npy").shape == (rows, 10)
