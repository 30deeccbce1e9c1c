"""``toolkit graph NET.yaml [--phase P] [--optimized] -o FILE.svg|.dot`` (docs/spec.md section 4) and the
DOT writer behind it (``toolkit.commands.dot``).

The DOT text is checked by parsing it here (one statement per line is the writer's invariant):
quoted strings balanced, braces balanced, one DOT node per graph node, input, weight, output and
update, and one edge per use of a value plus one per output and update. The SVG path runs where
Graphviz's ``dot`` is installed and skips elsewhere; its failure modes (no ``dot``, a ``dot``
that fails) are simulated so they are tested everywhere. The built-in SVG layout, used where
``dot`` is not installed, is tested in test_svg_layout.py.
"""
from __future__ import annotations

import os
import re
import shutil
from typing import get_args
from xml.etree import ElementTree

import pytest
from cli_helpers import LENET, assert_clean_failure, col_of, expect_error, line_of, run_cli, write_net

from toolkit.commands.dot import FUSED_FILL, SOLVER_TYPES, _role, to_dot
from toolkit.compile import optimize, train_graph
from toolkit.frontend import Net
from toolkit.ir import Graph, Node, TensorType, Value, Weight

# A convolution read only by a max pooling (fusable), a loss for train, an accuracy for test.
NET = """
name: three
inputs:
  data:  {shape: [N, 1, 12, 12], dtype: float32}
  label: {shape: [N], dtype: int64}
layers:
  - {name: conv1, type: Convolution, bottom: data, top: conv1, num_output: 4, kernel_size: 3}
  - {name: pool1, type: Pooling, bottom: conv1, top: pool1, pool: max, kernel_size: 2, stride: 2}
  - {name: ip1, type: InnerProduct, bottom: pool1, top: ip1, num_output: 10}
  - {name: loss, type: SoftmaxWithLoss, bottom: [ip1, label], top: loss, phase: train}
  - {name: accuracy, type: Accuracy, bottom: [ip1, label], top: accuracy, phase: test}
  - {name: prob, type: Softmax, bottom: ip1, top: prob, phase: infer}
outputs: [prob]
train:
  solver: {type: sgd, momentum: 0.9}
"""

HAVE_DOT = shutil.which("dot") is not None
SVG = "{http://www.w3.org/2000/svg}"
needs_dot = pytest.mark.skipif(not HAVE_DOT, reason="Graphviz's dot program is not installed")


@pytest.fixture
def net(tmp_path):
    return write_net(tmp_path, NET)


# ---------------------------------------------------------------------------------------------
# A small DOT reader for the writer's own output
# ---------------------------------------------------------------------------------------------

QUOTED = re.compile(r'"(?:[^"\\\n]|\\.)*"')
NODE_STMT = re.compile(r"^\s*([A-Za-z_]\w*)\s*\[")
EDGE_STMT = re.compile(r"^\s*([A-Za-z_]\w*)\s*->\s*([A-Za-z_]\w*)\s*\[")
KEYWORDS = {"graph", "node", "edge", "subgraph", "digraph"}


def unquote(text: str) -> str:
    """A DOT quoted string back to the text Graphviz shows (the writer's escapes: \\\\ \\" \\n)."""
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), text[1:-1])


def attr(line: str, key: str) -> str | None:
    m = re.search(rf'[\[ ,]{key}=("(?:[^"\\]|\\.)*")', line)
    return unquote(m.group(1)) if m else None


def parse_dot(text: str) -> dict:
    """Checks that ``text`` is well-formed DOT as the writer lays it out, and returns its nodes
    ({id: line}), edges ([(tail, head, label)]) and clusters ({name: [node ids]})."""
    lines = text.splitlines()
    assert lines[0].startswith("digraph ") and lines[0].endswith("{"), lines[0]
    assert lines[-1] == "}"
    depth = 0
    nodes: dict[str, str] = {}
    edges: list[tuple[str, str, str]] = []
    clusters: dict[str, list[str]] = {}
    cluster = None
    for line in lines:
        bare = QUOTED.sub('""', line)
        assert '"' not in bare.replace('""', ""), f"unbalanced quotes: {line!r}"
        for ch in bare:
            depth += {"{": 1, "}": -1}.get(ch, 0)
            assert depth >= 0, f"'}}' without '{{': {line!r}"
        if m := re.match(r"^\s*subgraph (cluster_\w+) \{$", bare):
            cluster = m.group(1)
            clusters[cluster] = []
        elif bare.strip() == "}" and cluster is not None:
            cluster = None
        elif m := EDGE_STMT.match(bare):
            assert bare.rstrip().endswith("];"), line
            edges.append((m.group(1), m.group(2), attr(line, "label")))
        elif (m := NODE_STMT.match(bare)) and m.group(1) not in KEYWORDS:
            assert bare.rstrip().endswith("];"), line
            assert m.group(1) not in nodes, f"node {m.group(1)} declared twice"
            nodes[m.group(1)] = line
            if cluster is not None:
                clusters[cluster].append(m.group(1))
    assert depth == 0, "unbalanced braces"
    for tail, head, _ in edges:
        assert tail in nodes and head in nodes, f"edge {tail} -> {head} names an undeclared node"
    return {"nodes": nodes, "edges": edges, "clusters": clusters}


def build(path, phase: str, optimized: bool) -> Graph:
    """The graph the command draws, built here the documented way."""
    n = Net.load(str(path))
    graph = train_graph(n) if phase == "train" else n.graph(phase)
    if not optimized:
        return graph
    # infer and test graphs are optimised with the weights frozen in (the fillers' by default)
    return optimize(graph, (), None if phase == "train" else n.init_weights())


def drawn(tmp_path, net, *flags) -> tuple[str, dict, str]:
    out = tmp_path / "g.dot"
    result = run_cli("graph", net, *flags, "-o", out)
    assert result.status == 0, result.err
    text = out.read_text()
    return text, parse_dot(text), result.out


def op_label(line: str) -> str:
    return attr(line, "label").split("\n")[0]


# ---------------------------------------------------------------------------------------------
# The DOT text
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("optimized", [False, True], ids=["lowered", "optimized"])
@pytest.mark.parametrize("phase", ["infer", "test", "train"])
def test_dot_has_one_node_per_graph_node_and_one_edge_per_use(tmp_path, net, phase, optimized):
    text, dot, out = drawn(tmp_path, net, "--phase", phase, *(["--optimized"] if optimized else []))
    graph = build(net, phase, optimized)
    ops = sorted((n for n in dot["nodes"] if re.fullmatch(r"n\d+", n)), key=lambda n: int(n[1:]))   # clusters reorder
    assert [op_label(dot["nodes"][n]) for n in ops] == [node.op for node in graph.nodes]
    for prefix, expected in (("in", len(graph.inputs)), ("w", len(graph.weights)),
                             ("out", len(graph.outputs)), ("upd", len(graph.updates))):
        assert len([n for n in dot["nodes"] if re.fullmatch(rf"{prefix}\d+", n)]) == expected, prefix
    total = len(graph.nodes) + len(graph.inputs) + len(graph.weights) + len(graph.outputs) + len(graph.updates)
    assert len(dot["nodes"]) == total

    uses = sum(len(consumers) for consumers in graph.consumers().values())
    assert len(dot["edges"]) == uses + len(graph.outputs) + len(graph.updates)
    types = {str(v.type) for node in graph.nodes for v in node.outputs} | {str(v.type) for v in graph.graph_values()}
    for _, _, label in dot["edges"]:
        assert re.sub(r"^out\d+: ", "", label) in types, label
    first_op = f"n{[node.op for node in graph.nodes].index(graph.consumers()[graph.inputs['data'].id][0].op)}"
    assert ("in0", first_op, "f32[N, 1, 12, 12]") in dot["edges"]      # data into conv1

    assert out.startswith("wrote ") and str(tmp_path / "g.dot") in out and f"{len(graph.nodes)} op nodes" in out
    assert len(out.splitlines()) == 1


def test_pydot_reads_the_dot_text(tmp_path, net):
    pydot = pytest.importorskip("pydot")
    text, dot, _ = drawn(tmp_path, net, "--phase", "train")
    (parsed,) = pydot.graph_from_dot_data(text)
    names = {n.get_name() for n in parsed.get_nodes()}
    for sub in parsed.get_subgraphs():
        names |= {n.get_name() for n in sub.get_nodes()}
    assert set(dot["nodes"]) <= names
    assert len(parsed.get_edges()) == len(dot["edges"])


def test_output_is_deterministic(tmp_path, net):
    # value ids differ between the two builds (a process-wide counter); the text must not
    first, _, _ = drawn(tmp_path, net, "--phase", "train", "--optimized")
    second, _, _ = drawn(tmp_path, net, "--phase", "train", "--optimized")
    assert first == second


def test_optimized_shows_the_fused_conv_pool_and_fewer_nodes(tmp_path, net):
    _, before, _ = drawn(tmp_path, net)
    _, after, _ = drawn(tmp_path, net, "--optimized")
    ops_before = [op_label(line) for n, line in before["nodes"].items() if n.startswith("n")]
    ops_after = {n: op_label(line) for n, line in after["nodes"].items() if n.startswith("n")}
    assert "conv2d_max_pool2d" not in ops_before
    assert {"conv2d", "max_pool2d"} <= set(ops_before)
    fused = [n for n, op in ops_after.items() if op == "conv2d_max_pool2d"]
    assert len(fused) == 1
    line = after["nodes"][fused[0]]
    assert attr(line, "fillcolor") == FUSED_FILL and attr(line, "peripheries") == "2"
    assert "conv1+pool1" in attr(line, "label")           # the layers it came from
    unfused = [n for n, op in ops_after.items() if not op.startswith("fused_") and op != "conv2d_max_pool2d"]
    assert all(attr(after["nodes"][n], "fillcolor") != FUSED_FILL for n in unfused)
    computing = [op for op in ops_after.values() if op != "constant"]    # frozen weights are constants
    assert len(computing) < len(ops_before)
    assert len(after["nodes"]) < len(before["nodes"])


@pytest.mark.parametrize("optimized", [False, True], ids=["lowered", "optimized"])
def test_train_phase_draws_backward_and_solver_nodes(tmp_path, net, optimized):
    _, dot, out = drawn(tmp_path, net, "--phase", "train", *(["--optimized"] if optimized else []))
    backward = dot["clusters"].get("cluster_backward", [])
    solver = dot["clusters"].get("cluster_solver", [])
    assert backward and solver
    scopes = {n: attr(line, "label").split("\n")[1] for n, line in dot["nodes"].items() if n.startswith("n")}
    assert all(".grad" in scopes[n] or scopes[n] == "autodiff" for n in backward)
    assert all(".sgd" in scopes[n] for n in solver)
    forward = set(scopes) - set(backward) - set(solver)
    assert forward and not any(".grad" in scopes[n] or ".sgd" in scopes[n] for n in forward)
    assert any(op_label(dot["nodes"][n]).endswith("_grad") for n in backward)   # e.g. conv2d_grad_weight
    labels = [attr(line, "label") for line in dot["nodes"].values()]
    assert "update conv1.weight" in labels and "update conv1.weight@momentum" in labels
    assert "input @lr\nf32[]" in labels
    assert "three train graph" in out


def test_every_solver_lands_in_the_solver_cluster(tmp_path):
    path = write_net(tmp_path, NET.replace("{type: sgd, momentum: 0.9}", "{type: adam, clip_gradients: 1.0}"))
    _, dot, _ = drawn(tmp_path, path, "--phase", "train")
    solver = {attr(dot["nodes"][n], "label").split("\n")[1] for n in dot["clusters"]["cluster_solver"]}
    assert "clip_gradients" in solver and "conv1.adam" in solver and "ip1.adam" in solver
    backward = {attr(dot["nodes"][n], "label").split("\n")[1] for n in dot["clusters"]["cluster_backward"]}
    assert not backward & solver


@pytest.mark.parametrize("scope, role", [
    ("conv1", "forward"), ("conv1+pool1", "forward"), ("ip1+folded+ip1+folded+1 more", "forward"),
    ("objective", "forward"), ("conv1.grad", "backward"), ("autodiff", "backward"),
    ("ip2.grad+relu1.grad", "backward"), ("loss+loss.grad", "backward"), ("conv1.sgd", "solver"),
    ("conv1.adamw+3 more", "solver"), ("clip_gradients", "solver"), ("ip1.grad+ip1.rmsprop", "solver"),
])
def test_role_of_a_scope(scope, role):
    assert _role(Node("add", [], {}, scope)) == role


def test_infer_phase_has_no_backward_or_solver(tmp_path, net):
    _, dot, _ = drawn(tmp_path, net)
    assert not dot["clusters"]
    assert not [n for n in dot["nodes"] if n.startswith("upd")]


def test_labels_are_escaped(tmp_path):
    """Quotes, backslashes, newlines and angle brackets in names survive as plain text."""
    nasty = 'a"b\\c\nd<e>{f}\\N'
    graph = Graph("infer")
    x = Value(TensorType((2, 3), "float32"), name="x")
    graph.inputs[nasty] = x
    w = Value(TensorType((3,), "float32"), name="w")
    graph.weights["w"] = Weight("w", w, True, {"type": "constant", "value": 0.0})
    node = Node("add", [x, w], {"note": nasty, "pair": (("k", 1.5),)}, scope=nasty)
    y = Value(TensorType((2, 3), "float32"), node)
    node.outputs.append(y)
    graph.nodes.append(node)
    graph.outputs[nasty] = y
    text = to_dot(graph, title=nasty)
    dot = parse_dot(text)                 # quotes and braces balanced, one statement per line
    assert attr(dot["nodes"]["in0"], "label") == f"input {nasty}\nf32[2, 3]"
    assert attr(dot["nodes"]["out0"], "label") == f"output {nasty}"
    assert attr(dot["nodes"]["n0"], "label").startswith(f"add\n{nasty}\n")
    assert "pair=(k=1.5)" in attr(dot["nodes"]["n0"], "label")
    assert attr(text.splitlines()[1], "label") == nasty
    assert len(dot["edges"]) == 3
    if HAVE_DOT:
        import subprocess
        svg = subprocess.run([shutil.which("dot"), "-Tsvg"], input=text, capture_output=True, text=True, check=True)
        assert "d&lt;e&gt;{f}" in svg.stdout and "\\N" in svg.stdout


def test_solver_types_match_the_schema():
    from schemas.train import SolverSpec
    assert set(SOLVER_TYPES) == set(get_args(SolverSpec.model_fields["type"].annotation))


# ---------------------------------------------------------------------------------------------
# SVG
# ---------------------------------------------------------------------------------------------

@needs_dot
@pytest.mark.parametrize("flags", [[], ["--optimized"], ["--phase", "train", "--optimized"]],
                         ids=["infer", "optimized", "train"])
def test_svg_is_written_with_graphviz(tmp_path, net, flags):
    out = tmp_path / "g.svg"
    result = run_cli("graph", net, *flags, "-o", out)
    assert result.status == 0, result.err
    svg = out.read_text()
    assert svg.lstrip().startswith(("<?xml", "<svg")) and "</svg>" in svg
    assert "conv1" in svg
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.svg", "net.yaml"]   # no temporary left


@needs_dot
def test_svg_of_lenet(tmp_path):
    out = tmp_path / "lenet.svg"
    result = run_cli("graph", LENET, "--optimized", "-o", out)
    assert result.status == 0, result.err
    assert "conv2d_max_pool2d" in out.read_text()


def test_svg_without_graphviz_uses_the_builtin_layout(tmp_path, net, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda *args, **kwargs: None)
    out = tmp_path / "g.svg"
    result = run_cli("graph", net, "-o", out)
    assert result.status == 0, result.err
    assert "laid out by the built-in layout" in result.out
    root = ElementTree.parse(out).getroot()
    assert root.tag == SVG + "svg" and "conv1" in out.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.svg", "net.yaml"]   # no temporary left


def test_layout_dot_without_graphviz_is_one_error_and_no_file(tmp_path, net, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda *args, **kwargs: None)
    out = tmp_path / "g.svg"
    result = run_cli("graph", net, "-o", out, "--layout", "dot")
    line = expect_error(result, "--layout dot needs Graphviz's 'dot' program", "not installed")
    assert result.err_lines == [line]
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["net.yaml"]


def test_layout_builtin_is_used_even_where_graphviz_is_installed(tmp_path, net, monkeypatch):
    def no_dot_run(*args, **kwargs):
        raise AssertionError("Graphviz's dot was run")
    monkeypatch.setattr(shutil, "which", lambda name, *args, **kwargs: "/usr/bin/dot")
    monkeypatch.setattr("subprocess.run", no_dot_run)
    out = tmp_path / "g.svg"
    result = run_cli("graph", net, "--phase", "train", "-o", out, "--layout", "builtin")
    assert result.status == 0, result.err
    ElementTree.parse(out)


def test_layout_of_a_dot_file_is_a_user_error(tmp_path, net):
    result = run_cli("graph", net, "-o", tmp_path / "g.dot", "--layout", "builtin")
    line = expect_error(result, "--layout builtin", ".dot file has no layout", "FILE.svg")
    assert result.err_lines == [line]
    assert not (tmp_path / "g.dot").exists()


@pytest.mark.skipif(os.name == "nt", reason="the stand-in dot is a shell script")
def test_failing_dot_is_one_error_and_keeps_the_old_file(tmp_path, net, monkeypatch):
    fake = tmp_path / "bin" / "dot"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\nwhile read -r line; do :; done\necho 'Error: <stdin>: syntax error in line 1' >&2\n"
                    "echo 'second line' >&2\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setattr(shutil, "which", lambda name, *args, **kwargs: str(fake) if name == "dot" else None)
    out = tmp_path / "g.svg"
    out.write_text("previous drawing")
    result = run_cli("graph", net, "-o", out)
    line = expect_error(result, "Graphviz's dot failed", "exit status 3", "syntax error in line 1")
    assert result.err_lines == [line]
    assert out.read_text() == "previous drawing"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin", "g.svg", "net.yaml"]


# ---------------------------------------------------------------------------------------------
# User mistakes
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["g.png", "g", "g.dot.txt"])
def test_bad_extension_is_a_user_error(tmp_path, net, name):
    result = run_cli("graph", net, "-o", tmp_path / name)
    line = expect_error(result, ".svg", ".dot")
    assert result.err_lines == [line]
    assert not (tmp_path / name).exists()


def test_missing_folder_is_a_user_error(tmp_path, net):
    result = run_cli("graph", net, "-o", tmp_path / "nowhere" / "g.dot")
    expect_error(result, "nowhere", "does not exist")


def test_missing_output_flag_is_a_user_error(net):
    assert_clean_failure(run_cli("graph", net))


def test_bad_net_file_points_at_the_mistake(tmp_path):
    text = NET.replace("type: Convolution", "type: Convolutoin")
    path = write_net(tmp_path, text)
    out = tmp_path / "g.dot"
    result = run_cli("graph", path, "-o", out)
    expect_error(result, "unknown layer type 'Convolutoin'", "did you mean 'Convolution'?", file=path,
                 line=line_of(text, "Convolutoin"), col=col_of(text, "Convolutoin"))
    assert not out.exists()


def test_train_phase_without_a_loss_is_a_user_error(tmp_path):
    path = write_net(tmp_path, NET.replace("phase: train}", "phase: test}").replace(
        "  - {name: accuracy", "  - {name: accuracy2, type: Accuracy, bottom: [ip1, label], top: acc2, phase: train}\n"
        "  - {name: accuracy"))
    result = run_cli("graph", path, "--phase", "train", "-o", tmp_path / "g.dot")
    assert_clean_failure(result)
    assert "loss" in result.err
    assert not (tmp_path / "g.dot").exists()
