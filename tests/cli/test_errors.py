"""User mistakes through the real CLI as a user sees them: ``python -m toolkit.cli`` in a
subprocess, its exit status 2 and stderr without a traceback; then the happy paths, which make
sure the checks are not false positives. The net-file mistakes are ``test_net_file_errors.py``,
the weights, inputs, outputs and flags ``test_run_errors.py`` (in-process, fast).
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from cli_helpers import LENET, expect_error, run_cli, run_subprocess, write_net
from cli_tiny_net import TINY

from toolkit.frontend import Net
from toolkit.weights import save_weights


def test_subprocess_unsafe_yaml_runs_nothing(tmp_path):
    marker = tmp_path / "code_ran"
    text = TINY.replace("name: tiny", f'name: !!python/object/apply:os.system ["touch {marker}"]')
    net = write_net(tmp_path, text)
    result = run_subprocess("check", net, cwd=tmp_path)
    expect_error(result, "unsafe YAML tag", file=net, line=1, col=7)
    assert not marker.exists()


def test_subprocess_spec_errors(tmp_path):
    net = write_net(tmp_path, TINY.replace("type: Convolution", "type: Convolutoin")
                    .replace("pool: max", "pool: maxx"))
    result = run_subprocess("check", net.name, cwd=tmp_path)
    expect_error(result, "did you mean 'Convolution'?", file="net.yaml", line=5, col=25)
    expect_error(result, "'max' or 'ave'", file="net.yaml", line=7)
    assert len(result.err_lines) == 2


def test_an_embed_index_outside_the_table_stops_infer_naming_the_layer(tmp_path):
    net = write_net(tmp_path, """
        name: emb
        inputs:
          tokens: {shape: [N, 3], dtype: int64}
        layers:
          - {name: emb, type: Embed, bottom: tokens, top: emb, input_dim: 7, num_output: 4}
        """)
    weights = tmp_path / "w.safetensors"
    save_weights(str(weights), Net.load(str(net)).init_weights())
    good, bad, out = tmp_path / "good.npz", tmp_path / "bad.npz", tmp_path / "out.npz"
    np.savez(good, tokens=np.array([[0, 6, 3]]))
    np.savez(bad, tokens=np.array([[0, 6, 3], [1, 9, 2]]))
    assert run_cli("infer", net, "--weights", weights, "--input", good).status == 0
    result = run_cli("infer", net, "--weights", weights, "--input", bad, "--output", out)
    expect_error(result, "layer 'emb'", "index 9 is outside [0, 7)")
    assert len(result.err_lines) == 1 and not out.exists()


def test_subprocess_runtime_and_flag_errors(tiny, tmp_path):
    bad = tmp_path / "w.safetensors"
    bad.write_bytes(b"\x00" * 64)
    out = tmp_path / "out.npz"
    result = run_subprocess("infer", tiny["net"], "--weights", bad, "--input", tiny["x"], "--output", out)
    expect_error(result, str(bad), "not a readable")
    assert not out.exists()
    expect_error(run_subprocess("bench", tiny["net"], "--batch", "0"), "--batch")
    expect_error(run_subprocess("frobnicate"), "frobnicate")


# ---------------------------------------------------------------------------------------------
# Happy paths
# ---------------------------------------------------------------------------------------------

def test_check_lenet_prints_shapes():
    result = run_cli("check", LENET)
    assert result.status == 0, result.err
    assert result.err == ""
    lines = result.out.splitlines()
    assert "is valid" in lines[0]
    rows = {line.split()[0]: line for line in lines[2:] if line and not line.startswith("total")}
    assert list(rows) == ["conv1", "pool1", "conv2", "pool2", "ip1", "relu1", "ip2", "loss", "accuracy", "prob"]
    assert "[N, 20, 24, 24]" in rows["conv1"] and "520" in rows["conv1"]
    assert "[N, 50, 4, 4]" in rows["pool2"]
    assert "[N, 500]" in rows["ip1"] and "400,500" in rows["ip1"]
    assert "[N, 10]" in rows["prob"]
    assert "431,080 parameters" in lines[-1]


def test_check_lenet_subprocess():
    result = run_subprocess("check", LENET)
    assert result.status == 0, result.err
    assert "[N, 20, 24, 24]" in result.out


@pytest.fixture(scope="module")
def lenet(tmp_path_factory):
    d = tmp_path_factory.mktemp("lenet")
    weights = Net.load(str(LENET)).init_weights()
    save_weights(str(d / "w.safetensors"), weights)
    save_weights(str(d / "w.npz"), weights)
    x = np.random.default_rng(3).standard_normal((70, 1, 28, 28)).astype(np.float32)
    return {"dir": d, "x": x, "weights": weights}


def _infer_lenet(lenet, tmp_path, x, *extra, weights="w.safetensors", output="out.npz"):
    xin = tmp_path / f"x{len(x)}.npy"
    np.save(xin, x)
    out = tmp_path / output
    result = run_cli("infer", LENET, "--weights", lenet["dir"] / weights, "--input", f"data={xin}",
                     "--output", out, *extra)
    assert result.status == 0, result.err
    assert f"wrote {out}" in result.out
    return out


@pytest.mark.parametrize("fmt", ["w.safetensors", "w.npz"])
def test_infer_lenet_weights_formats(lenet, tmp_path, fmt):
    out = _infer_lenet(lenet, tmp_path, lenet["x"][:5], weights=fmt)
    with np.load(out, allow_pickle=False) as data:
        assert data.files == ["prob"]
        prob = data["prob"]
    assert prob.shape == (5, 10) and prob.dtype == np.float32
    np.testing.assert_allclose(prob.sum(axis=1), 1.0, rtol=1e-5)
    ref = _infer_lenet(lenet, tmp_path, lenet["x"][:5], weights="w.npz", output="ref.npz")
    np.testing.assert_array_equal(prob, np.load(ref)["prob"])


def test_infer_lenet_npy_output_and_input_forms(lenet, tmp_path):
    x = lenet["x"][:3]
    out_npy = _infer_lenet(lenet, tmp_path, x, output="out.npy")
    prob = np.load(out_npy, allow_pickle=False)
    assert prob.shape == (3, 10)
    np.save(tmp_path / "bare.npy", x)        # a bare .npy goes to the net's only infer input
    np.savez(tmp_path / "named.npz", data=x, label=np.zeros(3, np.int64))   # label: not used by infer
    for form in (tmp_path / "bare.npy", tmp_path / "named.npz"):
        out = tmp_path / "o.npz"
        result = run_cli("infer", LENET, "--weights", lenet["dir"] / "w.npz", "--input", form, "--output", out)
        assert result.status == 0, result.err
        np.testing.assert_array_equal(np.load(out)["prob"], prob)
    result = run_cli("infer", LENET, "--weights", lenet["dir"] / "w.npz", "--input", tmp_path / "bare.npy")
    assert result.status == 0 and "prob [3, 10] float32" in result.out


@pytest.mark.parametrize("rows", [5, 70])
def test_infer_buckets_match_row_by_row(lenet, tmp_path, rows):
    """5 rows run padded in bucket 8; 70 rows are cut into 64 + 6 (padded to 8)."""
    x = lenet["x"][:rows]
    batched = np.load(_infer_lenet(lenet, tmp_path, x))["prob"]
    assert batched.shape == (rows, 10)
    one_by_one = np.concatenate([np.load(_infer_lenet(lenet, tmp_path, x[i:i + 1], output=f"r{i}.npz"))["prob"]
                                 for i in range(rows)])
    np.testing.assert_allclose(batched, one_by_one, rtol=1e-5, atol=1e-6)
    exact = np.load(_infer_lenet(lenet, tmp_path, x, "--buckets", str(rows), output="exact.npz"))["prob"]
    np.testing.assert_allclose(batched, exact, rtol=1e-5, atol=1e-6)
    # rows differ from each other, so a misplaced row would be caught
    assert np.abs(np.diff(batched, axis=0)).max() > 1e-4


def test_schema_is_json_with_every_layer_type():
    from layers import LAYERS
    result = run_cli("schema")
    assert result.status == 0, result.err
    schema = json.loads(result.out)
    types = {d["properties"]["type"].get("const") for d in schema["$defs"].values()
             if "type" in d.get("properties", {}) and isinstance(d["properties"]["type"], dict)}
    assert set(LAYERS) <= types
    assert {"Convolution", "Pooling", "InnerProduct", "SoftmaxWithLoss"} <= types


@pytest.mark.parametrize("train", [False, True])
def test_bench_json_keys(train):
    argv = ["bench", LENET, "--batch", "2", "--iters", "2", "--warmup", "0", "--json"] + (["--train"] if train else [])
    result = run_cli(*argv)
    assert result.status == 0, result.err
    report = json.loads(result.out)
    for key in ("median_ms", "p10_ms", "p90_ms", "items_per_s"):
        assert isinstance(report[key], (int, float)) and report[key] > 0, key
    assert report["p10_ms"] <= report["median_ms"] <= report["p90_ms"]
    assert report["mode"] == ("train" if train else "infer") and report["batch"] == 2


def test_help_and_version_exit_zero():
    assert run_cli("--help").status == 0
    result = run_cli("--version")
    assert result.status == 0 and "toolkit" in result.out
