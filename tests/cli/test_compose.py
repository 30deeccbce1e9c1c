"""Composition (docs/spec.md section 1): ``base:`` merging semantics, ``toolkit render``, and every
composition error at the FILE:LINE:COL of the file that wrote the offending key."""
from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest
import yaml
from cli_helpers import REPO, col_of, expect_error, line_of, run_cli, write_net

from toolkit import settings
from toolkit.errors import SpecError
from toolkit.frontend import Net
from toolkit.zoo.resolve import load_net

ZOO_LENET = REPO / "zoo" / "lenet" / "net.yaml"

BASE = """
name: small
inputs:
  data: {shape: [N, 1, 8, 8]}
  label: {shape: [N], dtype: int64}
layers:
  - {name: conv1, type: Convolution, bottom: data, top: conv1, num_output: 4, kernel_size: 3}
  - {name: relu1, type: ReLU, bottom: conv1, top: conv1}
  - {name: ip1, type: InnerProduct, bottom: conv1, top: ip1, num_output: 10,
     weight_filler: {type: gaussian, std: 0.01}}
  - {name: loss, type: SoftmaxWithLoss, bottom: [ip1, label], top: loss, phase: [train, test]}
  - {name: prob, type: Softmax, bottom: ip1, top: prob, phase: infer}
outputs: [prob]
train:
  data: {source: "builtin:digits", batch_size: 16, scale: 0.0625}
  solver: {type: sgd, base_lr: 0.05, momentum: 0.9, weight_decay: 0.0005,
           lr_policy: {type: step, gamma: 0.5, step_size: 10}}
  max_iter: 30
"""


@pytest.fixture
def base(tmp_path) -> Path:
    (tmp_path / "base").mkdir()
    return write_net(tmp_path / "base", BASE)


def layer_names(net: Net) -> list[str]:
    return [layer.name for layer in net.spec.layers]


def layer(net: Net, name: str):
    return next(candidate for candidate in net.spec.layers if candidate.name == name)


# -- semantics -------------------------------------------------------------------------------
def test_layers_merge_by_name_keys_win_and_order_is_the_bases(tmp_path, base):
    derived = write_net(tmp_path, """
        base: base/net.yaml
        name: wide
        layers:
          - {name: ip1, num_output: 10, bias_term: false}
          - {name: conv1, num_output: 8}
    """)
    net = Net.load(str(derived))
    assert net.name == "wide"
    assert layer_names(net) == ["conv1", "relu1", "ip1", "loss", "prob"]     # the base's order
    conv1 = layer(net, "conv1")
    assert (conv1.num_output, conv1.kernel_size, conv1.bottom) == (8, 3, "data")   # untouched keys kept
    assert layer(net, "ip1").bias_term is False
    assert layer(net, "ip1").weight_filler.std == 0.01                       # nested mapping kept
    assert net.files == [str(derived), str(derived.parent / "base/net.yaml")]


def test_new_layers_are_placed_after_before_or_at_the_end(tmp_path, base):
    derived = write_net(tmp_path, """
        base: base/net.yaml
        layers:
          - {name: drop1, type: Dropout, bottom: conv1, top: conv1, after: relu1}
          - {name: drop0, type: Dropout, bottom: data, top: data, before: conv1}
          - {name: sig, type: Sigmoid, bottom: ip1, top: sig, phase: infer}
    """)
    net = Net.load(str(derived))
    assert layer_names(net) == ["drop0", "conv1", "relu1", "drop1", "ip1", "loss", "prob", "sig"]


def test_a_named_layer_can_be_moved_and_deleted(tmp_path, base):
    derived = write_net(tmp_path, """
        base: base/net.yaml
        layers:
          - {name: relu1, delete: true}
          - {name: prob, before: loss}
    """)
    net = Net.load(str(derived))
    assert layer_names(net) == ["conv1", "ip1", "prob", "loss"]


def test_mappings_merge_key_by_key_and_lists_replace(tmp_path, base):
    derived = write_net(tmp_path, """
        base: base/net.yaml
        inputs:
          data: {dtype: float64}
        layers:
          - {name: loss, phase: train}
        outputs: [prob, ip1]
        train: {solver: {base_lr: 0.02}, max_iter: 5}
    """)
    net = Net.load(str(derived))
    assert net.spec.inputs["data"].shape == ["N", 1, 8, 8] and net.spec.inputs["data"].dtype == "float64"
    assert layer(net, "loss").phase == "train"                      # a list replaced by a scalar
    assert net.spec.outputs == ["prob", "ip1"]
    solver = net.spec.train.solver
    assert (solver.type, solver.base_lr, solver.momentum, solver.weight_decay) == ("sgd", 0.02, 0.9, 0.0005)
    assert solver.lr_policy.step_size == 10
    assert net.spec.train.max_iter == 5 and net.spec.train.data.batch_size == 16


def test_a_mapping_whose_type_changes_is_replaced_not_merged(tmp_path, base):
    derived = write_net(tmp_path, """
        base: base/net.yaml
        layers:
          - {name: ip1, weight_filler: {type: constant, value: 0.5}}
          - {name: relu1, type: Sigmoid, bottom: conv1, top: conv1}
        train: {solver: {type: adam, base_lr: 0.001}}
    """)
    net = Net.load(str(derived))
    filler = layer(net, "ip1").weight_filler
    assert (filler.type, filler.value) == ("constant", 0.5)        # gaussian's std did not leak in
    assert layer(net, "relu1").type == "Sigmoid" and layer_names(net)[1] == "relu1"
    solver = net.spec.train.solver
    assert (solver.type, solver.base_lr, solver.momentum, solver.weight_decay) == ("adam", 0.001, 0.0, None)


def test_bases_merge_first_to_last_then_the_file_then_set(tmp_path, base):
    write_net(tmp_path, "train: {solver: {base_lr: 0.3, momentum: 0.5}, max_iter: 7}\n", "fast.yaml")
    write_net(tmp_path, "train: {solver: {base_lr: 0.4}}\n", "faster.yaml")
    derived = write_net(tmp_path, """
        base: [base/net.yaml, fast.yaml, faster.yaml]
        train: {max_iter: 9}
    """)
    net = Net.load(str(derived))
    solver = net.spec.train.solver
    assert (solver.base_lr, solver.momentum, net.spec.train.max_iter) == (0.4, 0.5, 9)
    net = Net.load(str(derived), [(("train", "max_iter"), 11), (("layers", "conv1", "num_output"), 6)])
    assert net.spec.train.max_iter == 11 and layer(net, "conv1").num_output == 6


def test_bases_chain_with_paths_relative_to_each_file(tmp_path, base):
    (tmp_path / "mid").mkdir()
    write_net(tmp_path / "mid", """
        base: ../base/net.yaml
        layers: [{name: conv1, num_output: 6}]
    """)
    derived = write_net(tmp_path, """
        base: mid/            # a folder means its net.yaml
        layers: [{name: ip1, num_output: 10, bias_term: false}]
    """)
    net = Net.load(str(derived))
    assert layer(net, "conv1").num_output == 6 and layer(net, "ip1").bias_term is False
    assert len(net.files) == 3


def test_a_base_fragment_need_not_be_a_whole_net(tmp_path, base):
    """OpenMMLab-style fragments: a solver file, a layer tweak; only the merged net is validated."""
    write_net(tmp_path, "layers: [{name: conv1, num_output: 12}]\n", "tweak.yaml")
    derived = write_net(tmp_path, "base: [base/net.yaml, tweak.yaml]\n")
    assert layer(Net.load(str(derived)), "conv1").num_output == 12


def test_zoo_base(tmp_path):
    derived = write_net(tmp_path, """
        base: zoo:lenet
        name: lenet-narrow
        layers: [{name: conv1, num_output: 8}]
    """)
    net = load_net(str(derived))
    assert layer(net, "conv1").num_output == 8 and net.name == "lenet-narrow"
    assert Path(net.files[1]).resolve() == ZOO_LENET.resolve()
    # the front end knows no zoo: without the zoo's resolver a zoo: base is one clear error
    with pytest.raises(SpecError, match=r"net.yaml:1:7: error: base 'zoo:lenet': .*needs the model zoo"):
        Net.load(str(derived))


def test_render_prints_a_net_that_loads_to_the_same_spec(tmp_path, base):
    derived = write_net(tmp_path, """
        base: base/net.yaml
        name: wide
        layers:
          - {name: conv1, num_output: 8}
          - {name: drop1, type: Dropout, bottom: conv1, top: conv1, after: relu1}
        train: {solver: {base_lr: 0.02}}
    """)
    result = run_cli("render", derived, "--set", "train.max_iter=3")
    assert result.status == 0, result.err
    rendered = write_net(tmp_path / "base", result.out, "rendered.yaml")
    assert "base" not in yaml.safe_load(result.out) and "after" not in result.out
    again = Net.load(str(rendered))
    expected = Net.load(str(derived), [(("train", "max_iter"), 3)])
    assert again.spec == expected.spec


def test_data_paths_in_a_base_are_relative_to_that_base(tmp_path, base):
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "base" / "train.npz", data=rng.random((20, 1, 8, 8), dtype=np.float32),
             label=rng.integers(0, 10, 20))
    text = (tmp_path / "base" / "net.yaml").read_text().replace('"builtin:digits"', "train.npz")
    (tmp_path / "base" / "net.yaml").write_text(text)
    derived = write_net(tmp_path, "base: base/net.yaml\ntrain: {max_iter: 2, test_interval: 1}\n")
    result = run_cli("train", derived, "--out", tmp_path / "run")
    assert result.status == 0, result.err
    rendered = run_cli("render", derived).out
    assert "source: base/train.npz" in rendered


def test_train_writes_the_rendered_net_into_its_run_folder(tmp_path, base):
    derived = write_net(tmp_path, "base: base/net.yaml\nname: derived\ntrain: {max_iter: 3}\n")
    result = run_cli("train", derived, "--out", tmp_path / "run")
    assert result.status == 0, result.err
    saved = Net.load(str(tmp_path / "run" / "net.yaml"))
    assert saved.spec == Net.load(str(derived)).spec


# -- errors, each in the file that wrote it -------------------------------------------------
def test_missing_base_is_reported_at_the_base_key(tmp_path):
    text = """
        name: x
        base: [../nowhere.yaml]
    """
    derived = write_net(tmp_path, text)
    expect_error(run_cli("check", derived), "base '../nowhere.yaml': no such file",
                 file=derived, line=line_of(text, "../nowhere"), col=col_of(text, "../nowhere"))


def test_a_base_that_includes_itself(tmp_path):
    a_text, b_text = "base: b.yaml\nname: a\n", "base: [x.yaml, a.yaml]\n"
    a = write_net(tmp_path, a_text, "a.yaml")
    b = write_net(tmp_path, b_text, "b.yaml")
    write_net(tmp_path, "name: x\n", "x.yaml")
    expect_error(run_cli("check", a), "base 'a.yaml' includes itself", "a.yaml -> b.yaml -> a.yaml",
                 file=b, line=1, col=col_of(b_text, "a.yaml"))
    self_text = "base: self.yaml\n"
    own = write_net(tmp_path, self_text, "self.yaml")
    expect_error(run_cli("check", own), "includes itself", file=own, line=1, col=7)


def test_merges_naming_no_base_layer(tmp_path, base):
    text = """
        base: base/net.yaml
        layers:
          - {name: conv2, num_output: 8}
          - {name: relu2, delete: true}
          - {name: drop, type: Dropout, bottom: conv1, top: conv1, after: reluu1}
          - {name: d2, type: Dropout, bottom: conv1, top: conv1, after: relu1, before: ip1}
          - {name: loss, delete: true, phase: test}
          - {name: prob, delete: yes please}
    """
    derived = write_net(tmp_path, text)
    result = run_cli("check", derived)
    expect_error(result, "layer 'conv2' is in no base", "did you mean 'conv1'?",
                 file=derived, line=line_of(text, "conv2"), col=col_of(text, "conv2"))
    expect_error(result, "delete: no layer 'relu2'", "did you mean 'relu1'?", file=derived, line=line_of(text, "relu2"))
    expect_error(result, "after: no layer 'reluu1'", "did you mean 'relu1'?",
                 file=derived, line=line_of(text, "reluu1"), col=col_of(text, "reluu1"))
    expect_error(result, "give 'after' or 'before', not both", file=derived, line=line_of(text, "before: ip1"),
                 col=col_of(text, "before: ip1"))
    expect_error(result, "a deleted layer takes no other keys", "'phase'", file=derived,
                 line=line_of(text, "phase: test"), col=col_of(text, "phase: test"))
    expect_error(result, "'delete' is true or false", file=derived, line=line_of(text, "yes please"))


def test_a_bad_value_points_into_the_file_that_wrote_it(tmp_path, base):
    text = """
        base: base/net.yaml
        layers:
          - {name: conv1, num_output: -3}
          - {name: sig, type: Sigmoid, bottom: nothing, top: sig}
        train: {solver: {base_lr: 0.01, momentun: 0.9}}
    """
    derived = write_net(tmp_path, text)
    result = run_cli("check", derived)
    expect_error(result, "layer 'conv1'", "num_output", file=derived, line=line_of(text, "-3"), col=col_of(text, "-3"))
    expect_error(result, "unknown key 'momentun'", "did you mean 'momentum'?", file=derived,
                 line=line_of(text, "momentun"), col=col_of(text, "momentun"))
    expect_error(result, "unknown bottom 'nothing'", file=derived, line=line_of(text, "nothing"))

    # a mistake left in the base is reported in the base, at its own line
    base_text = BASE.replace("kernel_size: 3}", "kernel_size: 3, strid: 2}")
    base.write_text(textwrap.dedent(base_text).lstrip("\n"))
    derived.write_text("base: base/net.yaml\nname: fine\n")
    expect_error(run_cli("check", derived), "unknown key 'strid'", file=base, line=line_of(base_text, "strid"),
                 col=col_of(base_text, "strid"))


def test_deleting_a_layer_others_need_names_the_deletion(tmp_path, base):
    text = "base: base/net.yaml\nlayers:\n  - {name: conv1, delete: true}\n"
    derived = write_net(tmp_path, text)
    base_text = BASE
    line = expect_error(run_cli("check", derived), "unknown bottom 'conv1'", file=base,
                        line=line_of(base_text, "bottom: conv1"))
    assert f"deleted at {derived}:3:" in line


def test_base_syntax_errors_and_odd_bases(tmp_path):
    broken_text = "name: b\nlayers: [\n"
    broken = write_net(tmp_path, broken_text, "broken.yaml")
    derived = write_net(tmp_path, "base: broken.yaml\n")
    result = run_cli("check", derived)
    expect_error(result, "YAML syntax", file=broken)

    write_net(tmp_path, "- just\n- a list\n", "list.yaml")
    text = "base: [list.yaml, 7, []]\nname: n\n"
    derived = write_net(tmp_path, text)
    result = run_cli("check", derived)
    expect_error(result, "base 'list.yaml' is not a net file", file=derived, line=1, col=8)
    expect_error(result, "base: expected a path, zoo:NAME, or a list of them", file=derived, line=1, col=19)

    derived = write_net(tmp_path, "base: []\nname: n\n")
    expect_error(run_cli("check", derived), "base: the list is empty", file=derived, line=1)


def test_a_layer_named_twice_in_one_derived_file(tmp_path, base):
    text = """
        base: base/net.yaml
        layers:
          - {name: conv1, num_output: 8}
          - {name: conv1, num_output: 9}
    """
    derived = write_net(tmp_path, text)
    expect_error(run_cli("check", derived), "layer name 'conv1' is already used",
                 f"(line {line_of(text, 'num_output: 8')})", file=derived, line=line_of(text, "num_output: 9"))


def test_unknown_zoo_base(tmp_path):
    text = "base: zoo:lenett\n"
    derived = write_net(tmp_path, text)
    with settings.use(cache=tmp_path / "cache", zoo=()):
        result = run_cli("check", derived)
    expect_error(result, "base 'zoo:lenett'", "did you mean 'lenet'?", file=derived, line=1, col=7)


def test_errors_raise_spec_errors_from_the_library(tmp_path):
    derived = write_net(tmp_path, "base: gone.yaml\n")
    with pytest.raises(SpecError) as caught:
        Net.load(str(derived))
    assert str(caught.value).startswith(f"{derived}:1:7: error: base 'gone.yaml'")


def test_the_acceptance_derived_lenet_renders_checks_and_trains(tmp_path):
    """The zoo lenet with other widths and another solver, written as a base: file."""
    text = f"""
        base: {ZOO_LENET}
        name: lenet-wide
        layers:
          - {{name: conv1, num_output: 32}}
          - {{name: ip1, num_output: 128}}
        train:
          solver: {{type: adam, base_lr: 0.002}}
          max_iter: 40
    """
    derived = write_net(tmp_path, text)
    assert run_cli("render", derived).status == 0
    checked = run_cli("check", derived)
    assert checked.status == 0 and "lenet-wide" in checked.out
    trained = run_cli("train", derived, "--out", tmp_path / "run")
    assert trained.status == 0, trained.err
    assert (tmp_path / "run" / "model.safetensors").is_file()


def test_a_bad_set_value_is_the_flags_error_not_the_files(tmp_path, base):
    derived = write_net(tmp_path, "base: base/net.yaml\n")
    result = run_cli("check", derived, "--set", "layers.conv1.num_output=-2", "--set", "train.solver.momentun=1",
                     "--set", "layers.ip1.bottom=nope")
    expect_error(result, "--set layers.conv1.num_output: layer 'conv1'", "num_output")
    expect_error(result, "--set train.solver.momentun: unknown key 'momentun'")
    expect_error(result, "--set layers.ip1.bottom: layer 'ip1'", "unknown bottom 'nope'")
    assert str(base) not in result.err and str(derived) not in result.err


def test_setting_a_new_solver_type_replaces_the_solver_as_a_base_would():
    """--set train.solver.type=adam on an sgd net: sgd's momentum and step policy do not carry over
    (Adam has no momentum), in whichever order the flags come; a layer's type change keeps its
    wiring (layers merge by name, not by type)."""
    net = load_net(str(REPO / "zoo" / "lenet" / "net.yaml"),
                   [(("train", "solver", "base_lr"), 0.001), (("train", "solver", "type"), "adam")])
    solver = net.spec.train.solver
    assert (solver.type, solver.base_lr, solver.momentum, solver.lr_policy.type) == ("adam", 0.001, 0.0, "fixed")
    same = load_net(str(REPO / "zoo" / "lenet" / "net.yaml"), [(("train", "solver", "type"), "sgd")])
    assert same.spec.train.solver.momentum == 0.9                     # the same type: merged key by key
    policy = load_net(str(REPO / "zoo" / "lenet" / "net.yaml"), [(("train", "solver", "lr_policy", "type"), "cosine")])
    assert policy.spec.train.solver.lr_policy.step_size is None
    layer = load_net(str(REPO / "zoo" / "lenet" / "net.yaml"), [(("layers", "relu1", "type"), "Sigmoid")])
    relu1 = next(entry for entry in layer.spec.layers if entry.name == "relu1")
    assert (relu1.type, relu1.bottom, relu1.top) == ("Sigmoid", "conv1", "conv1")
