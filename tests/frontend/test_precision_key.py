"""The net file's ``precision`` key (docs/spec.md, "float32 math on the GPU"): strict or tf32,
reaching every graph of the net (and the copies the passes make); any other value is one problem
at its line and column; a net without it says nothing (the kernels then take strict)."""
from __future__ import annotations

import pytest

from toolkit.errors import SpecError
from toolkit.frontend import Net
from toolkit.ir.graph import copy_graph

NET = """\
name: p
inputs:
  data: {shape: [N, 1, 8, 8], dtype: float32}
  label: {shape: [N], dtype: int64}
layers:
  - {name: conv1, type: Convolution, bottom: data, top: conv1, num_output: 4, kernel_size: 3, pad: 1}
  - {name: ip1, type: InnerProduct, bottom: conv1, top: ip1, num_output: 10}
  - {name: loss, type: SoftmaxWithLoss, bottom: [ip1, label], top: loss, phase: train}
  - {name: prob, type: Softmax, bottom: ip1, top: prob, phase: infer}
"""


@pytest.mark.parametrize("policy", ["strict", "tf32"])
def test_the_key_reaches_every_phase_graph_and_its_copies(policy):
    net = Net.load("p.yaml", text=NET + f"precision: {policy}\n")
    assert net.spec.precision == policy
    for phase in ("infer", "train"):
        graph = net.graph(phase)
        assert graph.precision == policy and copy_graph(graph).precision == policy, phase


def test_without_the_key_the_graph_says_nothing():
    assert Net.load("p.yaml", text=NET).graph("infer").precision is None


def test_a_bad_value_is_one_problem_at_its_line_and_column():
    text = NET + "precision: fp16\n"
    with pytest.raises(SpecError) as e:
        Net.load("p.yaml", text=text)
    [problem] = e.value.problems
    assert (problem.location.line, problem.location.col) == (text.count("\n"), len("precision: ") + 1)
    assert problem.message == "bad 'precision': input should be 'strict' or 'tf32'", problem.message
