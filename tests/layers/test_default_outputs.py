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
    "  - {name: mid, type: Flatten, bottom: ip1, top: mid}\n  - {name: last, type: Reshape, bottom: mid, top: last, shape: [0, 3]}",
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
