"""Default outputs (docs/spec.md section 1: every top that nothing consumes), including a top whose
layer passes its bottom through unchanged (Flatten to the same shape, Dropout outside train,
Concat of one bottom): it is an output under its own name, once."""
from __future__ import annotations

import pytest

from toolkit.frontend import Net

HEAD = """\
name: tail
inputs:
  data: {shape: [N, 4], dtype: float32}
layers:
  - {name: ip1, type: InnerProduct, bottom: data, top: ip1, num_output: 3}
"""


@pytest.mark.parametrize("tail", [
    "  - {name: last, type: Flatten, bottom: ip1, top: last}",
    "  - {name: last, type: Dropout, bottom: ip1, top: last}",
    "  - {name: last, type: Concat, bottom: [ip1], top: last}",
    "  - {name: mid, type: Flatten, bottom: ip1, top: mid}\n"
    "  - {name: last, type: Reshape, bottom: mid, top: last, shape: [0, 3]}",
])
@pytest.mark.parametrize("phase", ["infer", "test"])
def test_a_pass_through_top_is_an_output(tmp_path, tail, phase):
    path = tmp_path / "net.yaml"
    path.write_text(HEAD + tail + "\n")
    assert list(Net.load(str(path)).graph(phase).outputs) == ["last"]


def test_a_top_read_later_is_not_an_output(tmp_path):
    path = tmp_path / "net.yaml"
    path.write_text(HEAD + "  - {name: flat, type: Flatten, bottom: ip1, top: flat}\n"
                           "  - {name: relu, type: ReLU, bottom: flat, top: out}\n")
    assert list(Net.load(str(path)).graph("infer").outputs) == ["out"]


def test_a_top_that_only_renames_an_input_is_an_output_and_a_copy(tmp_path):
    """In infer, Dropout passes the input through and the ReLU before it is train-only: the
    phase's whole work is the identity, and its output is still 'drop' (Caffe's would be),
    returned as the caller's values, not the caller's array."""
    import numpy as np

    import toolkit

    path = tmp_path / "net.yaml"
    path.write_text("name: identity\n"
                    "inputs:\n"
                    "  data: {shape: [N, 3], dtype: float64}\n"
                    "  target: {shape: [N, 3], dtype: float64}\n"
                    "layers:\n"
                    "  - {name: relu, type: ReLU, bottom: data, top: data, phase: train}\n"
                    "  - {name: drop, type: Dropout, bottom: data, top: drop}\n"
                    "  - {name: loss, type: EuclideanLoss, bottom: [target, drop], top: loss, phase: train}\n")
    net = Net.load(str(path))
    assert list(net.graph("infer").outputs) == ["drop"]
    assert list(net.graph("test").outputs) == ["drop"]
    assert list(net.graph("train").outputs) == ["loss", "@objective"]
    x = np.array([[-1.0, 2.0, 3.5], [4.0, -0.5, 6.0]])
    got = toolkit.load(str(path)).infer(data=x)["drop"]
    np.testing.assert_array_equal(got, x)
    assert not np.shares_memory(got, x)
