"""The Caffe layers' own mistakes: each a FILE:LINE:COL error naming the layer and the key, exit 2."""
from __future__ import annotations

import pytest

from tests.train.train_helpers import cli

HEAD = """name: x
inputs:
  data: {shape: [N, 3, 6, 6], dtype: float32}
  seq:  {shape: [N, 5, 4], dtype: float32}
  cont: {shape: [N, 5], dtype: float32}
  label: {shape: [N], dtype: int64}
layers:
"""


@pytest.mark.parametrize("line, words", [
    ("  - {name: c, type: Clip, bottom: data, top: c, min: 2, max: 1}", ("layer 'c' (Clip)", "min 2", "above max 1")),
    ("  - {name: s, type: SPP, bottom: data, top: s, pyramid_height: 5}", ("layer 's' (SPP)", "level 3 needs 8 bins")),
    ("  - {name: l, type: CaffeLSTM, bottom: [seq, cont], top: l, num_output: 3}",
     ("layer 'l' (CaffeLSTM)", "number of time steps (T, unrolled) must be a fixed number")),
    ("  - {name: l, type: CaffeLSTM, bottom: [seq, cont], top: [a, b], num_output: 3}",
     ("layer 'l' (CaffeLSTM)", "has one top (without expose_hidden), got 2")),
    ("  - {name: m, type: MVN, bottom: label, top: m}", ("layer 'm' (MVN)", "needs a float input")),
    ("  - {name: h, type: HingeLoss, bottom: [data, label], top: h}", ("layer 'h' (HingeLoss)", "must be [N, C]")),
    ("  - {name: r, type: Reshape, bottom: data, top: r, shape: [2, 2], axis: 2, num_axes: 1}",
     ("layer 'r' (Reshape)", "the element counts differ")),
    ("  - {name: w, type: LRN, bottom: data, top: w, norm_region: within_channel, local_size: 4}",
     ("layer 'w' (LRN)", "an odd local_size")),
])
def test_a_caffe_layer_mistake_is_one_located_line(tmp_path, line, words):
    net = tmp_path / "net.yaml"
    net.write_text(HEAD + line + "\n")
    r = cli("check", net)
    assert r.status == 2 and "Traceback" not in r.err
    assert len(r.errors) == 1 and r.errors[0].startswith(f"{net}:8:"), r.err
    assert all(w in r.errors[0] for w in words), r.errors[0]


def test_sharing_one_parameter_and_a_misnamed_one(tmp_path):
    """share: {weight: a} shares the weight alone (the bias stays the layer's own); a parameter
    name the layer does not have is an error at share."""
    net = tmp_path / "net.yaml"
    net.write_text(HEAD + "  - {name: a, type: InnerProduct, bottom: data, top: a, num_output: 4}\n"
                   "  - {name: b, type: InnerProduct, bottom: data, top: b, num_output: 4, share: {weight: a}}\n")
    from toolkit.frontend import Net
    declared = Net.load(str(net)).declared
    assert sorted(declared) == ["a.bias", "a.weight", "b.bias"]
    net.write_text(HEAD + "  - {name: a, type: InnerProduct, bottom: data, top: a, num_output: 4}\n"
                   "  - {name: b, type: InnerProduct, bottom: data, top: b, num_output: 4, share: {wieght: a}}\n")
    r = cli("check", net)
    assert r.status == 2 and len(r.errors) == 1 and r.errors[0].startswith(f"{net}:9:")
    assert "share names no parameter 'wieght' of this layer (its parameters: weight, bias)" in r.errors[0]
