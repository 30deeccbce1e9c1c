"""User mistakes through the real CLI (docs/spec.md sections 1, 2, 4 and 6): each prints
``FILE:LINE:COL: error: MESSAGE`` (net files) or ``error: MESSAGE`` (data, weights, flags), one
line per problem, exits 2, never shows a traceback, and writes or runs nothing. The happy paths
at the end make sure the checks are not false positives.

Most cases call ``toolkit.cli.main`` in-process (fast); a few run ``python -m toolkit.cli`` in a
subprocess to prove the real exit status and the absence of a traceback.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pytest

from cli_helpers import (ERROR_LINE, LENET, assert_clean_failure, col_of, expect_error, line_of, run_cli,
                         run_subprocess, write_net)
from toolkit.frontend import Net
from toolkit.weights import save_weights

TINY = """
name: tiny
inputs:
  data: {shape: [N, 3, 8, 8], dtype: float32}
layers:
  - {name: conv1, type: Convolution, bottom: data, top: conv1, num_output: 4, kernel_size: 3}
  - {name: relu1, type: ReLU, bottom: conv1, top: conv1}
  - {name: pool1, type: Pooling, bottom: conv1, top: pool1, pool: max, kernel_size: 2, stride: 2}
  - {name: ip1, type: InnerProduct, bottom: pool1, top: ip1, num_output: 5}
  - {name: prob, type: Softmax, bottom: ip1, top: prob}
outputs: [prob]
"""

HEAD = """
name: tiny
inputs:
  data: {shape: [N, 3, 8, 8], dtype: float32}
layers:
"""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A valid small net with matching weights (both formats) and a 5-row input."""
    d = tmp_path_factory.mktemp("tiny")
    net_path = write_net(d, TINY, "tiny.yaml")
    weights = Net.load(str(net_path)).init_weights()
    save_weights(str(d / "w.safetensors"), weights)
    save_weights(str(d / "w.npz"), weights)
    np.save(d / "x.npy", np.random.default_rng(0).standard_normal((5, 3, 8, 8)).astype(np.float32))
    return {"dir": d, "net": net_path, "weights": weights, "st": d / "w.safetensors", "npz": d / "w.npz",
            "x": d / "x.npy"}


# ---------------------------------------------------------------------------------------------
# Net-file errors, through `toolkit check` and `toolkit infer`
# ---------------------------------------------------------------------------------------------

@dataclass
class Expect:
    at: str                      # text whose (nth) occurrence starts where the error points
    words: tuple[str, ...]
    col: bool = True             # also check the column
    nth: int = 1


@dataclass
class Case:
    id: str
    text: str
    expects: list[Expect]
    exact: bool = True           # no other error lines (no cascades)


SPEC_CASES = [
    Case("unknown_layer_type", TINY.replace("type: Convolution", "type: Convolutoin"),
         [Expect("Convolutoin", ("conv1", "unknown layer type 'Convolutoin'", "did you mean 'Convolution'?"))]),
    Case("unknown_key", HEAD + """\
  - name: conv1
    type: Convolution
    bottom: data
    top: conv1
    num_output: 4
    kernel_size: 3
    strid: 2
""", [Expect("strid:", ("conv1", "unknown key 'strid'", "did you mean 'stride'?"))]),
    Case("missing_num_output", TINY.replace("top: ip1, num_output: 5", "top: ip1"),
         [Expect("{name: ip1", ("ip1", "InnerProduct", "missing required key 'num_output'"))]),
    Case("negative_kernel_size", HEAD + """\
  - name: conv1
    type: Convolution
    bottom: data
    top: conv1
    num_output: 4
    kernel_size: -1
""", [Expect("-1", ("conv1", "'kernel_size'", "greater than 0"))]),
    Case("string_kernel_size", HEAD + """\
  - name: conv1
    type: Convolution
    bottom: data
    top: conv1
    num_output: 4
    kernel_size: three
""", [Expect("three", ("conv1", "'kernel_size'", "integer"))]),
    Case("bad_enum", TINY.replace("pool: max", "pool: maxx"),
         [Expect("maxx", ("pool1", "'pool'", "'max' or 'ave'"))]),
    Case("dangling_bottom", TINY.replace("bottom: pool1", "bottom: pol1"),
         [Expect("pol1", ("ip1", "unknown bottom 'pol1'", "did you mean 'pool1'?"))]),
    Case("in_place_bottom_never_produced", HEAD + """\
  - {name: relu, type: ReLU, bottom: lstm1, top: lstm1}
""", [Expect("lstm1", ("relu", "unknown bottom 'lstm1': no layer above produces it", "writes it in place"))]),
    Case("bottom_produced_below", HEAD + """\
  - {name: ip0, type: InnerProduct, bottom: feat, top: ip0, num_output: 5}
  - {name: conv1, type: Convolution, bottom: data, top: feat, num_output: 4, kernel_size: 3}
""", [Expect("feat", ("ip0", "'feat'", "produced only below", "layer 'conv1' (line 6)"))]),
    Case("duplicate_layer_name", TINY.replace("name: relu1", "name: conv1"),
         [Expect("conv1, type: ReLU", ("layer name 'conv1' is already used", "(line 5)"))]),
    Case("shapes_ip_then_conv", HEAD + """\
  - {name: ip1, type: InnerProduct, bottom: data, top: ip1, num_output: 5}
  - {name: conv1, type: Convolution, bottom: ip1, top: conv1, num_output: 4, kernel_size: 3}
""", [Expect("bottom: ip1, top: conv1", ("conv1", "Convolution", "4-d", "[N, 5]"))]),
    Case("shapes_concat", """
name: cat
inputs:
  a: {shape: [N, 3, 8, 8]}
  b: {shape: [N, 3, 4, 4]}
layers:
  - {name: cat, type: Concat, bottom: [a, b], top: cat}
""", [Expect("{name: cat", ("cat", "Concat", "[N, 3, 8, 8]", "[N, 3, 4, 4]"))]),
    Case("scale_axis_out_of_range", HEAD + """\
  - {name: sc, type: Scale, bottom: data, top: sc, axis: 4}
""", [Expect("axis: 4", ("layer 'sc' (Scale)", "axis 4 is out of range", "[N, 3, 8, 8]"))]),
    Case("scale_num_axes_past_the_input", HEAD + """\
  - {name: sc, type: Scale, bottom: data, top: sc, axis: -2, num_axes: 3}
""", [Expect("num_axes: 3", ("layer 'sc' (Scale)", "num_axes 3 from axis -2 runs past the input [N, 3, 8, 8]"))]),
    Case("scale_num_axes_below_minus_one", HEAD + """\
  - {name: sc, type: Scale, bottom: data, top: sc, num_axes: -2}
""", [Expect("num_axes: -2", ("layer 'sc' (Scale)", "num_axes -2 must be -1", "or at least 0"))]),
    Case("scale_learned_over_the_batch_axis", HEAD + """\
  - {name: sc, type: Scale, bottom: data, top: sc, axis: 0}
""", [Expect("axis: 0", ("layer 'sc' (Scale)", "fixed number", "symbolic dimension N"))]),
    Case("scale_two_bottoms_shapes_differ", """
name: sc
inputs:
  data: {shape: [N, 3, 8, 8]}
  s: {shape: [8]}
layers:
  - {name: sc, type: Scale, bottom: [data, s], top: sc}
""", [Expect("bottom: [data, s]", ("layer 'sc' (Scale)", "the scale bottom [8]", "input [N, 3, 8, 8]",
                                  "from axis 1, which are [3]"))]),
    Case("scale_two_bottoms_past_the_input", """
name: sc
inputs:
  data: {shape: [N, 3, 8, 8]}
  s: {shape: [8, 8, 2]}
layers:
  - {name: sc, type: Scale, bottom: [data, s], top: sc, axis: 2}
""", [Expect("bottom: [data, s]", ("layer 'sc' (Scale)", "[8, 8, 2] has 3 axes", "only 2 from axis 2"))]),
    Case("scale_bias_over_a_symbolic_scale_bottom", """
name: sc
inputs:
  data: {shape: [N, 3, 8, 8]}
  s: {shape: [N, 3]}
layers:
  - {name: sc, type: Scale, bottom: [data, s], top: sc, axis: 0, bias_term: true}
""", [Expect("bias_term: true", ("layer 'sc' (Scale)", "dimension 0 of the bias", "[N, 3]", "fixed number"))]),
    Case("yaml_syntax_unclosed_list", TINY.replace("bottom: pool1,", "bottom: [pool1,"),
         [Expect("}\n  - {name: prob", ("YAML syntax", "']'"))]),     # at the '}' closing the ip1 line
    Case("yaml_syntax_tab", TINY.replace("  data: {", "\tdata: {"),
         [Expect("\tdata", ("YAML syntax", "'\\t'"))]),
    Case("yaml_syntax_unclosed_mapping", TINY.replace("dtype: float32}", "dtype: float32"),
         [Expect("layers:", ("YAML syntax", "line 3"), col=False)]),
    Case("unsafe_tag_apply", TINY.replace("name: tiny", 'name: !!python/object/apply:os.system ["touch MARKER"]'),
         [Expect("!!python", ("unsafe YAML tag", "python/object/apply:os.system"))]),
    Case("unsafe_tag_name", HEAD + """\
  - name: conv1
    type: !!python/name:os.system
    bottom: data
    top: conv1
""", [Expect("!!python", ("unsafe YAML tag", "python/name:os.system"))]),
    Case("unsafe_tag_on_mapping", HEAD + """\
  - !!python/object/new:os.system {args: [touch MARKER]}
""", [Expect("!!python", ("unsafe YAML tag", "python/object/new:os.system"))]),
    Case("empty_file", "", [Expect("", ("empty",))]),
    Case("only_comments", "# nothing here\n", [Expect("#", ("empty",))]),
    Case("not_a_mapping", "- conv1\n- pool1\n", [Expect("- conv1", ("mapping",))]),
    Case("duplicate_yaml_keys", TINY.replace("num_output: 5}", "num_output: 5, num_output: 6}") + "name: again\n",
         [Expect("num_output", ("duplicate key 'num_output'",), nth=3),
          Expect("name: again", ("duplicate key 'name'",))]),
    Case("several_schema_errors", HEAD + """\
  - {name: conv1, type: Convolutoin, bottom: data, top: conv1, num_output: 4, kernel_size: 3}
  - {name: pool1, type: Pooling, bottom: data, top: pool1, pool: maxx, kernel_size: 2}
  - {name: ip1, type: InnerProduct, bottom: pool1, top: ip1, num_outptu: 5}
  - {name: ip1, type: Softmax, bottom: ip1, top: prob}
""", [Expect("Convolutoin", ("unknown layer type",)),
      Expect("maxx", ("'pool'",)),
      Expect("num_outptu", ("unknown key 'num_outptu'", "did you mean 'num_output'?")),
      Expect("{name: ip1", ("missing required key 'num_output'",)),
      Expect("ip1, type: Softmax", ("layer name 'ip1' is already used",))]),
    Case("schema_and_wiring_errors_together", HEAD + """\
  - {name: conv1, type: Convolutoin, bottom: data, top: conv1, num_output: 4, kernel_size: 3}
  - {name: relu1, type: ReLU, bottom: conv1, top: conv1}
  - {name: ip1, type: InnerProduct, bottom: data, top: ip1, num_output: 5}
  - {name: relu2, type: ReLU, bottom: ip_1, top: r2}
  - {name: pool, type: Pooling, bottom: ip1, top: p, kernel_size: 2}
""", [Expect("Convolutoin", ("unknown layer type",)),              # relu1 reads the broken conv1: quiet
      Expect("ip_1", ("unknown bottom 'ip_1'", "did you mean 'ip1'?")),
      Expect("bottom: ip1, top: p", ("Pooling", "4-d"))]),
    Case("several_wiring_errors", HEAD + """\
  - {name: conv1, type: Convolution, bottom: data, top: conv1, num_output: 4, kernel_size: 3}
  - {name: ip1, type: InnerProduct, bottom: conv9, top: ip1, num_output: 5}
  - {name: ip2, type: InnerProduct, bottom: conv1, top: ip2, num_output: 5}
  - {name: ip2, type: ReLU, bottom: ip2, top: ip2}
  - {name: c2, type: Convolution, bottom: ip2, top: c2, num_output: 5, kernel_size: 1}
""", [Expect("conv9", ("unknown bottom 'conv9'", "did you mean 'conv1'?")),
      Expect("ip2, type: ReLU", ("layer name 'ip2' is already used", "(line 7)")),
      Expect("bottom: ip2, top: c2", ("c2", "4-d"))]),
    Case("extended_catalog_mistakes", HEAD + """\
  - {name: e, type: Embed, bottom: data, top: e, input_dim: 7, num_output: 4}
  - {name: p, type: Pad, bottom: data, top: p, pads: [[1, 1]]}
  - {name: q, type: Permute, bottom: data, top: q, order: [0, 1, 1, 2]}
  - {name: r, type: Pad, bottom: data, top: r, pads: [[9, 1], [0, 0]], mode: reflect}
  - {name: s, type: ArgMax, bottom: data, top: s, top_k: 9}
  - {name: t, type: Crop, bottom: [data, q2], top: t}
  - {name: u, type: Deconvolution, bottom: data, top: u, num_output: 4, kernel_size: 2, pad: 5}
  - {name: v, type: Reshape, bottom: data, top: v, shape: [0, 3, -1]}
  - {name: w, type: MultiHeadAttention, bottom: v, top: w, num_heads: 5}
  - {name: y, type: MultiHeadAttention, bottom: [v, v], top: y, num_heads: 2}
""", [Expect("bottom: data, top: e", ("layer 'e' (Embed)", "integer indices", "got float32")),
      Expect("pads: [[1, 1]]", ("layer 'p' (Pad)", "1 [before, after] pairs", "2 spatial axes")),
      Expect("order: [0, 1, 1, 2]", ("layer 'q' (Permute)", "not a permutation")),
      Expect("pads: [[9, 1]", ("layer 'r' (Pad)", "reflect padding of 9", "more than 8")),
      Expect("top_k: 9", ("layer 's' (ArgMax)", "top_k 9 is more than the 3 entries")),
      Expect("q2", ("unknown bottom 'q2'",)),
      Expect("pad: 5", ("layer 'u' (Deconvolution)", "pad 5 is too large")),
      Expect("num_heads: 5", ("layer 'w' (MultiHeadAttention)", "embedding size 64", "not divisible by num_heads 5")),
      Expect("bottom: [v, v]", ("layer 'y' (MultiHeadAttention)", "[q, k, v, key_padding_mask]"))]),
]


def _spec_argv(command: str, net, tiny, out):
    if command == "check":
        return ["check", net]
    return ["infer", net, "--weights", tiny["st"], "--input", tiny["x"], "--output", out]


@pytest.mark.parametrize("command", ["check", "infer"])
@pytest.mark.parametrize("case", SPEC_CASES, ids=lambda c: c.id)
def test_net_file_error(case: Case, command, tmp_path, tiny):
    marker = tmp_path / "code_ran"
    text = case.text.replace("MARKER", str(marker))
    net = write_net(tmp_path, text)
    out = tmp_path / "out.npz"
    result = run_cli(*_spec_argv(command, net, tiny, out))
    assert_clean_failure(result)
    lines = []
    for e in case.expects:
        at = e.at.replace("MARKER", str(marker))
        line = line_of(text, at, e.nth) if at else 1
        col = (col_of(text, at, e.nth) if at else 1) if e.col else None
        lines.append(expect_error(result, *e.words, file=net, line=line, col=col))
    if case.exact:
        assert len(result.err_lines) == len(case.expects), result.err
    if len(case.expects) > 1:      # all at once, one line each, in file order
        numbers = [int(ERROR_LINE.match(line).group("line")) for line in result.err_lines]
        assert numbers == sorted(numbers)
        assert len(set(lines)) == len(case.expects)
    assert not marker.exists(), "a YAML tag ran a command"
    assert not out.exists()
    assert result.out == ""


def test_missing_net_file(tmp_path, tiny):
    for argv in (["check", tmp_path / "nope.yaml"],
                 ["infer", tmp_path / "nope.yaml", "--weights", tiny["st"], "--input", tiny["x"]]):
        result = run_cli(*argv)
        expect_error(result, str(tmp_path / "nope.yaml"), "no such file")
        assert len(result.err_lines) == 1


def test_net_path_is_a_directory(tmp_path):
    expect_error(run_cli("check", tmp_path), str(tmp_path), "is a folder, not a file")


def test_net_not_utf8(tmp_path):
    net = tmp_path / "net.yaml"
    net.write_bytes(b"name: \xff\xfe\n")
    expect_error(run_cli("check", net), str(net), "UTF-8")


def test_net_with_control_character(tmp_path):
    net = tmp_path / "net.yaml"
    net.write_bytes(b"name: tiny\nlayers: []\x00\n")
    expect_error(run_cli("check", net), "YAML", file=net, line=2)


def test_deeply_nested_yaml_is_an_error_not_a_crash(tmp_path):
    net = write_net(tmp_path, "name: " + "[" * 5000 + "]" * 5000 + "\n")
    expect_error(run_cli("check", net), "nested", file=net, line=1)


# ---------------------------------------------------------------------------------------------
# Run-time errors: weights, inputs, outputs, flags
# ---------------------------------------------------------------------------------------------

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


# ---------------------------------------------------------------------------------------------
# Real processes: exit status and stderr as a user sees them
# ---------------------------------------------------------------------------------------------

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

