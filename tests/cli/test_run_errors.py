"""Run-time mistakes through the real CLI (docs/spec.md sections 2, 4 and 6): weights, inputs,
outputs and flags each print ``error: MESSAGE``, one line per problem, exit 2, never show a
traceback, and write nothing.

The cases call ``toolkit.cli.main`` in-process (fast); ``test_errors.py`` runs ``python -m
toolkit.cli`` in a subprocess to prove the real exit status and the absence of a traceback.
"""
from __future__ import annotations

import numpy as np
import pytest
from cli_helpers import expect_error, run_cli, write_net

from toolkit.frontend import Net
from toolkit.weights import save_weights


def _infer(tiny, tmp_path, weights=None, inputs=None, output="out.npz", extra=()):
    out = tmp_path / output
    inputs = [tiny["x"]] if inputs is None else inputs
    argv = ["infer", tiny["net"], "--weights", weights or tiny["st"], "--output", out, *extra]
    for i in inputs:
        argv += ["--input", i]
    return run_cli(*argv), out


def _assert_nothing_written(result, out):
    assert not out.exists()
    assert not list(out.parent.glob(f".{out.name}*")), "a temporary output file was left behind"
    assert "wrote" not in result.out


def test_weights_missing_key(tiny, tmp_path):
    w = dict(tiny["weights"])
    del w["ip1.bias"]
    path = tmp_path / "w.safetensors"
    save_weights(str(path), w)
    result, out = _infer(tiny, tmp_path, weights=path)
    expect_error(result, str(path), "missing weight 'ip1.bias'", "[5]", "--allow-missing")
    assert len(result.err_lines) == 1
    _assert_nothing_written(result, out)
    # ... and with --allow-missing the filler starts it
    result, out = _infer(tiny, tmp_path, weights=path, extra=["--allow-missing"])
    assert result.status == 0, result.err
    assert out.exists()


def test_weights_extra_key_with_hint(tiny, tmp_path):
    w = dict(tiny["weights"])
    w["ip1.bais"] = w["ip1.bias"]
    path = tmp_path / "w.npz"
    save_weights(str(path), w)
    result, out = _infer(tiny, tmp_path, weights=path)
    expect_error(result, str(path), "unexpected weight 'ip1.bais'", "did you mean 'ip1.bias'?")
    assert len(result.err_lines) == 1
    _assert_nothing_written(result, out)


def test_weights_wrong_shape(tiny, tmp_path):
    w = dict(tiny["weights"])
    w["conv1.weight"] = np.zeros((4, 3, 5, 5), np.float32)
    path = tmp_path / "w.safetensors"
    save_weights(str(path), w)
    result, out = _infer(tiny, tmp_path, weights=path)
    expect_error(result, str(path), "'conv1.weight'", "[4, 3, 5, 5]", "[4, 3, 3, 3]")
    _assert_nothing_written(result, out)


def test_weights_several_problems_at_once(tiny, tmp_path):
    w = dict(tiny["weights"])
    del w["conv1.bias"]
    w["ip1.weight"] = np.zeros((5, 35), np.float32)
    w["ip2.weight"] = np.zeros((5, 36), np.float32)
    path = tmp_path / "w.safetensors"
    save_weights(str(path), w)
    result, out = _infer(tiny, tmp_path, weights=path)
    expect_error(result, "'conv1.bias'", "missing")
    expect_error(result, "'ip1.weight'", "[5, 35]")
    expect_error(result, "'ip2.weight'", "unexpected")
    assert len(result.err_lines) == 3
    _assert_nothing_written(result, out)


def test_weights_corrupt_safetensors(tiny, tmp_path):
    path = tmp_path / "w.safetensors"
    path.write_bytes(np.random.default_rng(0).bytes(300))
    result, out = _infer(tiny, tmp_path, weights=path)
    expect_error(result, str(path), "not a readable .safetensors file")
    _assert_nothing_written(result, out)


def test_weights_truncated_safetensors(tiny, tmp_path):
    path = tmp_path / "w.safetensors"
    data = tiny["st"].read_bytes()
    path.write_bytes(data[: len(data) - 40])
    result, out = _infer(tiny, tmp_path, weights=path)
    expect_error(result, str(path), "not a readable .safetensors file")
    _assert_nothing_written(result, out)


@pytest.mark.parametrize("keep", [0.5, 0.97])
def test_weights_truncated_npz(tiny, tmp_path, keep):
    path = tmp_path / "w.npz"
    data = tiny["npz"].read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    result, out = _infer(tiny, tmp_path, weights=path)
    expect_error(result, str(path), "not a readable .npz file")
    _assert_nothing_written(result, out)


def test_weights_random_bytes_npz_is_not_called_pickle(tiny, tmp_path):
    path = tmp_path / "w.npz"
    path.write_bytes(np.random.default_rng(1).bytes(500))
    result, out = _infer(tiny, tmp_path, weights=path)
    expect_error(result, str(path), "not a readable .npz file (not a zip archive)")
    _assert_nothing_written(result, out)


def test_weights_npz_that_is_really_an_npy(tiny, tmp_path):
    path = tmp_path / "w.npz"
    with open(path, "wb") as f:
        np.save(f, np.zeros(3, np.float32))
    result, out = _infer(tiny, tmp_path, weights=path)
    expect_error(result, str(path), "not a readable .npz file (it is an .npy array)")
    _assert_nothing_written(result, out)


def test_weights_npz_with_pickled_object_refused(tiny, tmp_path):
    path = tmp_path / "w.npz"
    w = dict(tiny["weights"])
    w["conv1.weight"] = np.array([{"payload": 1}], dtype=object)
    np.savez(path, **w)
    result, out = _infer(tiny, tmp_path, weights=path)
    expect_error(result, str(path), "array 'conv1.weight' holds pickled objects, which are refused")
    _assert_nothing_written(result, out)


def test_weights_unknown_format_and_missing_file(tiny, tmp_path):
    result, out = _infer(tiny, tmp_path, weights=tmp_path / "w.bin")
    expect_error(result, "w.bin", "unsupported weights format '.bin'", ".safetensors or .npz")
    result, out = _infer(tiny, tmp_path, weights=tmp_path / "absent.safetensors")
    expect_error(result, "absent.safetensors", "no such file")
    (tmp_path / "folder.npz").mkdir()
    result, out = _infer(tiny, tmp_path, weights=tmp_path / "folder.npz")
    expect_error(result, "folder.npz", "is a folder, not a file")
    _assert_nothing_written(result, out)


def test_input_wrong_channel_count(tiny, tmp_path):
    x = tmp_path / "x.npy"
    np.save(x, np.zeros((5, 2, 8, 8), np.float32))
    result, out = _infer(tiny, tmp_path, inputs=[x])
    expect_error(result, "input 'data'", "[5, 2, 8, 8]", "[N, 3, 8, 8]")
    assert len(result.err_lines) == 1
    _assert_nothing_written(result, out)


def test_input_wrong_rank_and_strings(tiny, tmp_path):
    x = tmp_path / "x.npy"
    np.save(x, np.zeros(5, np.float32))
    result, out = _infer(tiny, tmp_path, inputs=[x])
    expect_error(result, "input 'data'", "[5]")
    np.save(x, np.array(["a"] * 5))
    result, out = _infer(tiny, tmp_path, inputs=[x])
    expect_error(result, "input 'data'", "dtype")
    _assert_nothing_written(result, out)


LABEL_NET = """
name: labels
inputs:
  data: {shape: [N, 4], dtype: float32}
  label: {shape: [N], dtype: int64}
layers:
  - {name: ip, type: InnerProduct, bottom: data, top: ip, num_output: 3}
  - {name: loss, type: SoftmaxWithLoss, bottom: [ip, label], top: loss}
"""


def test_input_float_array_for_int_input(tmp_path):
    net = write_net(tmp_path, LABEL_NET)
    weights = tmp_path / "w.npz"
    save_weights(str(weights), Net.load(str(net)).init_weights())
    np.save(tmp_path / "d.npy", np.ones((3, 4), np.float32))
    np.save(tmp_path / "lf.npy", np.array([0.5, 1.0, 2.0]))
    out = tmp_path / "out.npz"
    result = run_cli("infer", net, "--weights", weights, "--input", f"data={tmp_path / 'd.npy'}",
                     "--input", f"label={tmp_path / 'lf.npy'}", "--output", out, "--buckets", "3")
    expect_error(result, "input 'label'", "float64", "int64")
    _assert_nothing_written(result, out)
    # the same call with integer labels works
    np.save(tmp_path / "li.npy", np.array([0, 1, 2]))
    result = run_cli("infer", net, "--weights", weights, "--input", f"data={tmp_path / 'd.npy'}",
                     "--input", f"label={tmp_path / 'li.npy'}", "--output", out, "--buckets", "3")
    assert result.status == 0, result.err
    # and a bare .npy is ambiguous when the net has two inputs
    result = run_cli("infer", net, "--weights", weights, "--input", tmp_path / "d.npy")
    expect_error(result, "say which input", "data", "label")


def test_input_missing_file(tiny, tmp_path):
    result, out = _infer(tiny, tmp_path, inputs=[tmp_path / "nope.npy"])
    expect_error(result, "nope.npy", "no such file")
    _assert_nothing_written(result, out)


def test_input_unknown_name(tiny, tmp_path):
    result, out = _infer(tiny, tmp_path, inputs=[f"image={tiny['x']}"])
    expect_error(result, "no input 'image'", "data")
    _assert_nothing_written(result, out)


def test_input_corrupt_npy_is_not_called_pickle(tiny, tmp_path):
    x = tmp_path / "x.npy"
    x.write_bytes(np.random.default_rng(2).bytes(200))
    result, out = _infer(tiny, tmp_path, inputs=[x])
    expect_error(result, str(x), "not a readable .npy file (no .npy header)")
    data = tiny["x"].read_bytes()
    x.write_bytes(data[: len(data) // 2])
    result, out = _infer(tiny, tmp_path, inputs=[x])
    expect_error(result, str(x), "not a readable .npy file (its header claims 3840 bytes of data, only")
    _assert_nothing_written(result, out)


def test_input_pickled_npy_refused(tiny, tmp_path):
    x = tmp_path / "x.npy"
    np.save(x, np.array([{"payload": 1}] * 5, dtype=object), allow_pickle=True)
    result, out = _infer(tiny, tmp_path, inputs=[x])
    expect_error(result, f"{x}: holds pickled objects, which are refused (they can run code)")
    _assert_nothing_written(result, out)


@pytest.mark.parametrize("name", ["out.txt", "out", "out.npz.bak"])
def test_output_wrong_extension(tiny, tmp_path, name):
    result, out = _infer(tiny, tmp_path, output=name)
    expect_error(result, "--output", ".npz, .npy or .csv")
    assert len(result.err_lines) == 1
    _assert_nothing_written(result, out)


def test_output_folder_missing(tiny, tmp_path):
    result, out = _infer(tiny, tmp_path, output="nodir/out.npz")
    expect_error(result, "--output", "does not exist")
    assert not (tmp_path / "nodir").exists()


def test_output_failure_is_reported_before_the_run(tiny, tmp_path, monkeypatch):
    """A bad --output is found before inference runs (nothing is computed and thrown away)."""
    from toolkit.runtime import session

    def boom(*args, **kwargs):
        raise AssertionError("inference ran")
    monkeypatch.setattr(session.InferSession, "run", boom)
    result, out = _infer(tiny, tmp_path, output="out.txt")
    expect_error(result, "--output", ".npz, .npy or .csv")


@pytest.mark.parametrize("argv, words", [
    (["bench", "NET", "--batch", "0"], ("--batch", "at least 1")),
    (["bench", "NET", "--batch", "two"], ("--batch", "'two'")),
    (["bench", "NET"], ("--batch",)),
    (["frobnicate", "NET"], ("invalid choice", "'frobnicate'")),
    ([], ("required", "COMMAND")),
    (["infer", "NET", "--input", "x.npy"], ("--weights",)),
    (["infer", "NET", "--weights", "w.npz", "--input", "x.npy", "--buckets", "0,4"], ("--buckets",)),
    (["infer", "NET", "--weights", "w.npz", "--input", "x.npy", "--dtype", "int8"], ("--dtype", "int8")),
    (["check", "NET", "--phase", "deploy"], ("--phase", "deploy")),
    (["check", "NET", "--no-such-flag"], ("--no-such-flag",)),
    (["bench", "NET", "--batch", "2", "--dim", "T"], ("--dim", "NAME=SIZE")),
], ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_bad_flags(argv, words, tiny):
    argv = [tiny["net"] if a == "NET" else a for a in argv]
    result = run_cli(*argv)
    expect_error(result, *words)
    assert len(result.err_lines) == 1
    assert result.out == ""
