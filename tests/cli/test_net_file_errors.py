"""Net-file mistakes through the real CLI (docs/spec.md section 1), through ``toolkit check`` and
``toolkit infer``: each prints ``FILE:LINE:COL: error: MESSAGE``, one line per problem (no
cascades), exits 2, never shows a traceback, and runs nothing.

The cases call ``toolkit.cli.main`` in-process (fast); ``test_errors.py`` runs ``python -m
toolkit.cli`` in a subprocess to prove the real exit status and the absence of a traceback.
"""
from __future__ import annotations

from dataclasses import dataclass

import pytest
from cli_helpers import ERROR_LINE, assert_clean_failure, col_of, expect_error, line_of, run_cli, write_net
from cli_tiny_net import TINY

HEAD = """
name: tiny
inputs:
  data: {shape: [N, 3, 8, 8], dtype: float32}
layers:
"""


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
