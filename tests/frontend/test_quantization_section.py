"""The net file's ``quantization`` section (docs/spec.md section 10): a good one loads and reaches
the infer graph (and only it); each mistake is one problem at the line and column of the key it
is about (a scale that is not positive, a zero point outside its dtype's range, a top or float
layer the infer phase lacks, an unknown key)."""
from __future__ import annotations

import pytest

from toolkit.errors import SpecError
from toolkit.frontend import Net

NET = """\
name: q
inputs:
  data: {shape: [N, 1, 8, 8], dtype: float32}
layers:
  - {name: conv1, type: Convolution, bottom: data, top: conv1, num_output: 4, kernel_size: 3, pad: 1}
  - {name: relu1, type: ReLU, bottom: conv1, top: conv1}
  - {name: ip1, type: InnerProduct, bottom: conv1, top: ip1, num_output: 10}
  - {name: prob, type: Softmax, bottom: ip1, top: prob, phase: infer}
quantization:
  activations:
    data: {scale: 0.004, zero_point: 0}
    conv1: {scale: 0.05, zero_point: 3, dtype: uint8}
    ip1: {scale: 0.1, zero_point: -2, dtype: int8}
  float:
    - prob
    - {layer: ip1, reason: last layer measured better in float}
  calibration: {method: entropy, examples: 256, data: heldout.npz}
"""


def load(text: str) -> Net:
    return Net.load("q.yaml", text=text)


def problems(text: str) -> list[tuple[int, int, str]]:
    with pytest.raises(SpecError) as e:
        load(text)
    return [(p.location.line, p.location.col, p.message) for p in e.value.problems]


def test_a_good_section_loads_and_reaches_the_infer_and_test_graphs():
    net = load(NET)
    q = net.spec.quantization
    assert q.activations["conv1"].zero_point == 3 and q.activations["ip1"].dtype == "int8"
    assert q.activations["data"].dtype == "uint8"                     # the default
    assert q.float_reasons() == {"prob": "listed float",
                                 "ip1": "listed float: last layer measured better in float"}
    assert (q.calibration.method, q.calibration.examples, q.calibration.data) == ("entropy", 256, "heldout.npz")
    assert net.graph("infer").quantization is q
    assert net.graph("test", outputs=["ip1"]).quantization is q        # toolkit test scores the int8 net


def where(text: str, at: str) -> tuple[int, int]:
    """Line and column (1-based) where ``at`` starts in ``text``."""
    i = text.index(at)
    return text.count("\n", 0, i) + 1, i - text.rfind("\n", 0, i)


@pytest.mark.parametrize("old, new, at, words", [
    ("conv1: {scale: 0.05,", "conv1: {scale: 0,", "0,", "bad 'scale': input should be greater than 0"),
    ("conv1: {scale: 0.05,", "conv1: {scale: -1.5,", "-1.5", "greater than 0"),
    ("zero_point: 3,", "zero_point: 256,", "zero_point: 256",
     "quantization.activations.conv1: zero_point 256 is outside uint8's range 0..255"),
    ("zero_point: 0}", "zero_point: -1}", "zero_point: -1", "zero_point -1 is outside uint8's range 0..255"),
    ("zero_point: -2,", "zero_point: 128,", "zero_point: 128", "zero_point 128 is outside int8's range -128..127"),
    ("    ip1: {scale: 0.1,", "    ip2: {scale: 0.1,", "ip2: {scale",
     "quantization.activations: the infer phase has no top or input 'ip2'"),
    ("    - prob\n", "    - prop\n", "prop",
     "quantization.float: the infer phase has no layer 'prop'; did you mean 'prob'?"),
    ("{layer: ip1,", "{layer: ip9,", "ip9", "the infer phase has no layer 'ip9'"),
    ("method: entropy", "method: kl", "kl", "bad 'method': input should be 'minmax', 'percentile', 'entropy' or 'mse'"),
    ("examples: 256", "examples: 0", "0, data", "greater than 0"),
    ("data: heldout.npz}", "data: heldout.npz, bins: 2048}", "bins", "bins"),
])
def test_each_mistake_is_one_problem_at_its_key(old, new, at, words):
    assert old in NET
    text = NET.replace(old, new, 1)
    found = problems(text)
    assert len(found) == 1, found
    line, col, message = found[0]
    assert words in message, message
    assert (line, col) == where(text, at), found[0]


def test_a_top_of_another_phase_only_is_not_a_top_of_the_infer_phase():
    text = NET.replace("  - {name: prob,", "  - {name: lossy, type: Sigmoid, bottom: ip1, top: lossy, phase: train}\n"
                                          "  - {name: prob,").replace("    ip1: {scale", "    lossy: {scale")
    (line, col, message), = problems(text)
    assert message == "quantization.activations: the infer phase has no top or input 'lossy'"
    assert (line, col) == where(text, "lossy: {scale")


@pytest.mark.parametrize("entry, at, words", [
    ("  equalized: {conv9: [ip1]}\n", "conv9", "quantization.equalized: the infer phase has no layer 'conv9'"),
    ("  equalized: {conv1: [ip7]}\n", "ip7", "quantization.equalized: the infer phase has no layer 'ip7'"),
])
def test_an_equalized_layer_the_infer_phase_lacks_is_one_problem_at_it(entry, at, words):
    text = NET.replace("  calibration:", entry + "  calibration:", 1)
    (line, col, message), = problems(text)
    assert message.startswith(words), message
    assert (line, col) == where(text, at)
