"""``toolkit compile`` (--explain, --json as docs/spec.md section 4 shapes it) and the pass switches of
every command that builds a plan: --no-optimize, --disable PASS (unknown names are errors that
list the passes) and ``optimize: {disable: [...]}`` in the net file (located errors)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import LENET, col_of, expect_error, line_of, run_cli, write_net

from toolkit import settings
from toolkit.passes.pipeline import pass_names

BN_NET = """
name: bnnet
inputs:
  data: {shape: [N, 1, 8, 8]}
  label: {shape: [N], dtype: int64}
layers:
  - {name: conv, type: Convolution, bottom: data, top: conv, num_output: 4, kernel_size: 3, pad: 1}
  - {name: bn, type: BatchNorm, bottom: conv, top: conv}
  - {name: relu, type: ReLU, bottom: conv, top: conv}
  - {name: pool, type: Pooling, bottom: conv, top: pool, pool: ave, global_pooling: true}
  - {name: ip, type: InnerProduct, bottom: pool, top: ip, num_output: 10}
  - {name: loss, type: SoftmaxWithLoss, bottom: [ip, label], top: loss, phase: [train, test]}
  - {name: accuracy, type: Accuracy, bottom: [ip, label], top: accuracy, phase: test}
  - {name: prob, type: Softmax, bottom: ip, top: prob, phase: infer}
"""


def compile_json(*args) -> dict:
    result = run_cli("compile", *args, "--json")
    assert result.status == 0, result.err
    return json.loads(result.out)


@pytest.mark.parametrize("phase", ["infer", "test", "train"])
def test_json_has_the_spec_keys(phase):
    report = compile_json(LENET, "--phase", phase, "--batch", "8")
    assert report["phase"] == phase
    for p in report["passes"]:
        assert set(p) >= {"name", "nodes_before", "nodes_after", "ms"} and p["name"] in pass_names()
    assert report["ops"] and all(isinstance(v, int) and v > 0 for v in report["ops"].values())
    assert isinstance(report["flops"], int) and report["flops"] > 0
    memory = report["memory"]
    assert memory["batch"] == 8
    assert (0 < memory["lower_bound_bytes"] <= memory["naive_bytes"]
            and 0 < memory["peak_bytes"] <= memory["naive_bytes"])


@pytest.mark.parametrize("batch, gathered", [(1, 1), (64, 0)])
def test_json_and_explain_count_the_concatenations_gathered_in_place(batch, gathered):
    """branchnet's four branches meet in a concatenation: at batch 1 each branch is one run of
    its output and is written there in place; at 64 the branches' rows are strided in it and
    their elementwise kernels write contiguous arrays, so it copies."""
    net = str(Path(__file__).resolve().parents[2] / "zoo" / "branchnet" / "net.yaml")
    report = compile_json(net, "--phase", "infer", "--batch", str(batch))
    assert report["memory"]["gathered_concats"] == gathered
    explain = run_cli("compile", net, "--phase", "infer", "--batch", str(batch), "--explain")
    assert ("1 concatenation(s) gathered in place" in explain.out) == bool(gathered), explain.out


def test_batch_norm_leaves_no_arithmetic_in_infer(tmp_path):
    net = write_net(tmp_path, BN_NET)
    report = compile_json(net, "--phase", "infer")
    assert not {"sub", "mul", "rsqrt", "add", "div"} & set(report["ops"])
    for members in report["fused"].values():
        assert not {"sub", "mul", "rsqrt", "div"} & set(members)
    plain = compile_json(net, "--phase", "infer", "--no-optimize")
    assert {"sub", "mul", "rsqrt"} <= set(plain["ops"]) and plain["passes"][0]["name"] == "eliminate_dead_code"
    assert {p["name"] for p in plain["passes"]} == {"eliminate_dead_code", "place_devices", "schedule_collectives"}


def test_explain_lists_changes_memory_and_the_passes(tmp_path):
    result = run_cli("compile", write_net(tmp_path, BN_NET), "--explain", "--batch", "4")
    assert result.status == 0, result.err
    assert "fold_batch_norm: bn into conv" in result.out
    assert "memory at N=4: planned" in result.out and "lower bound" in result.out
    for name in pass_names():
        assert f"  {name} " in result.out


def test_disable_switches_one_pass_off(tmp_path):
    net = write_net(tmp_path, BN_NET)
    report = compile_json(net, "--disable", "fold_batch_norm")
    assert "rsqrt" not in report["ops"]                    # folded to a constant: weights are frozen
    assert not any(p["name"] == "fold_batch_norm" for p in report["passes"])
    assert report["disabled"] == ["fold_batch_norm"]


@pytest.mark.parametrize("command", ["compile", "infer", "bench", "train", "test", "graph"])
def test_unknown_pass_is_an_error_listing_the_passes(tmp_path, command):
    extra = {"compile": [], "infer": ["--weights", "w.npz", "--input", "x.npy"], "bench": ["--batch", "1"],
             "train": [], "test": ["--weights", "w.npz"], "graph": ["-o", tmp_path / "g.dot"]}[command]
    result = run_cli(command, LENET, *extra, "--disable", "fuse_evrything")
    expect_error(result, "--disable", "unknown pass 'fuse_evrything'", "fuse_elementwise", "plan_memory")


def test_net_file_can_disable_passes(tmp_path):
    net = write_net(tmp_path, BN_NET.replace("layers:",
                                             "optimize: {disable: [fold_batch_norm, fuse_epilogue]}\nlayers:"))
    report = compile_json(net)
    assert set(report["disabled"]) == {"fold_batch_norm", "fuse_epilogue"} and "fused_epilogue" not in report["ops"]


def test_net_file_unknown_pass_is_located(tmp_path):
    text = BN_NET.replace("layers:", "optimize: {disable: [fuse_elementwise, fold_batchnorm]}\nlayers:")
    net = write_net(tmp_path, text)
    result = run_cli("check", net)
    expect_error(result, "optimize.disable: unknown pass 'fold_batchnorm'", "did you mean 'fold_batch_norm'",
                 file=net, line=line_of(text, "fold_batchnorm"), col=col_of(text, "fold_batchnorm"))


def test_every_plan_command_runs_with_and_without_the_optimiser(tmp_path):
    net = write_net(tmp_path, BN_NET + "train: {max_iter: 3, display: 1, test_interval: 100, snapshot: 100}\n")
    for flags in ([], ["--no-optimize"], ["--disable", "fuse_elementwise", "--disable", "plan_memory"]):
        out = tmp_path / ("run" + "".join(flags))
        result = run_cli("train", net, "--out", out, *flags)
        assert result.status == 0, result.err
        weights = out / "model.safetensors"
        assert run_cli("test", net, "--weights", weights, *flags).status == 0
        assert run_cli("bench", net, "--batch", "2", "--iters", "2", "--warmup", "0", *flags).status == 0
    x = np.random.default_rng(0).normal(size=(5, 1, 8, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    outputs = []
    for flags in ([], ["--no-optimize"]):
        target = tmp_path / f"out{len(outputs)}.npy"
        result = run_cli("infer", net, "--weights", tmp_path / "run" / "model.safetensors", "--input",
                         tmp_path / "x.npy", "--output", target, *flags)
        assert result.status == 0, result.err
        outputs.append(np.load(target))
    np.testing.assert_allclose(outputs[0], outputs[1], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("value,words", [("{disable: fuse_all}", ("bad 'disable'", "valid list")),
                                         ("{disable: [simplify], enable: [x]}", ("unknown key 'enable'",))])
def test_net_file_optimize_key_is_validated(tmp_path, value, words):
    text = BN_NET.replace("layers:", f"optimize: {value}\nlayers:")
    net = write_net(tmp_path, text)
    needle = "fuse_all" if "fuse_all" in value else "enable"
    expect_error(run_cli("check", net), *words, file=net, line=line_of(text, needle), col=col_of(text, needle))


LAYOUT_NET = """
name: blocks
inputs:
  data: {shape: [N, 4, 14, 14]}
layers:
  - {name: stem, type: Convolution, bottom: data, top: stem, num_output: 32, kernel_size: 3, pad: 1, group: 2}
  - {name: dw, type: Convolution, bottom: stem, top: dw, num_output: 32, group: 32, kernel_size: 3, pad: 1}
  - {name: relu, type: ReLU, bottom: dw, top: dw}
  - {name: pw, type: Convolution, bottom: dw, top: pw, num_output: 512, kernel_size: 1}
  - {name: pool, type: Pooling, bottom: pw, top: pool, pool: ave, global_pooling: true}
  - {name: ip, type: InnerProduct, bottom: pool, top: ip, num_output: 10}
"""


@pytest.fixture
def native_kernels():
    """The suite's default is the numpy kernels."""
    with settings.use(native=True):
        yield


def test_explain_says_what_the_layout_pass_chose_and_disable_keeps_nchw(tmp_path, native_kernels):
    from toolkit.codegen import microkernel, toolchain
    if toolchain.compiler() is None or not microkernel.available():
        pytest.skip("the blocked layout needs a C compiler and an AVX-512 processor")
    net = write_net(tmp_path, LAYOUT_NET)
    result = run_cli("compile", net, "--explain")
    assert result.status == 0, result.err
    assert ("choose_layout: 2 of 3 convolutions in NCHW16c (1 dense, 1 depthwise), 2 op(s) follow the layout; "
            "reorders: 1 to NCHW16c, 0 back to NCHW") in result.out
    assert "choose_layout: kept NCHW: stem (group 2, 2 -> 16 channels a group: not whole blocks)" in result.out
    assert "conv2d_blocked" in json.dumps(compile_json(net))
    off = compile_json(net, "--disable", "choose_layout")
    assert "blocked" not in json.dumps(off["ops"]) + json.dumps(off.get("fused", {}))
