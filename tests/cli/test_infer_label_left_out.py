"""`toolkit infer` on training data for a deploy net (one input, ``data``, as a Caffe deploy
prototxt has): the CSV's ``label`` column and the .npz's ``label`` array, which no input of the
net is named after, are left out with a note when the rest fits the inputs exactly; a column or
array that is no label, or that does not stand in the way, is as before."""
from __future__ import annotations

import numpy as np
import pytest
from cli_helpers import expect_error, run_cli, write_net

DEPLOY = """
name: deploy
inputs:
  data: {shape: [N, 64]}
layers:
  - {name: ip, type: InnerProduct, bottom: data, top: prob, num_output: 10}
outputs: [prob]
"""


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    """The test digits as `toolkit data` writes them (data_0..data_63,label), a deploy net and
    random weights for it."""
    root = tmp_path_factory.mktemp("label")
    r = run_cli("data", "zoo:lenet", "--split", "test", "--out", root / "d.csv")
    assert r.status == 0, r.err
    table = np.loadtxt(root / "d.csv", delimiter=",", skiprows=1, dtype=np.float32)
    header = (root / "d.csv").read_text().splitlines()[0].split(",")
    assert header[-1] == "label" and header[0] == "data_0" and len(header) == 65
    rng = np.random.default_rng(0)
    w, b = rng.standard_normal((10, 64)).astype(np.float32), rng.standard_normal(10).astype(np.float32)
    np.savez(root / "w.npz", **{"ip.weight": w, "ip.bias": b})
    write_net(root, DEPLOY)
    return root, table, header, table[:, :64] @ w.T + b


def _infer(root, *inputs):
    out = root / "out.npz"
    out.unlink(missing_ok=True)
    r = run_cli("infer", root / "net.yaml", "--weights", root / "w.npz", "--output", out,
                *[part for i in inputs for part in ("--input", i)])
    return r, (np.load(out)["prob"] if r.status == 0 else None)


def test_the_label_column_of_a_csv_is_left_out_with_a_note(digits):
    root, _table, _header, expected = digits
    r, prob = _infer(root, root / "d.csv")
    assert r.status == 0, r.err
    assert f"note: {root / 'd.csv'}: left out column 'label': no input of the net is named so" in r.err.splitlines()
    np.testing.assert_allclose(prob, expected, rtol=1e-5, atol=1e-4)


def test_the_label_array_of_an_npz_is_left_out_with_a_note(digits):
    root, table, _header, expected = digits
    np.savez(root / "d.npz", data=table[:, :64], label=table[:, 64].astype(np.int64))
    r, prob = _infer(root, root / "d.npz")
    assert r.status == 0, r.err
    assert f"note: {root / 'd.npz'}: left out array 'label': no input of the net is named so" in r.err.splitlines()
    np.testing.assert_allclose(prob, expected, rtol=1e-5, atol=1e-4)


def test_a_misspelt_array_is_still_the_mistake(digits):
    root, table, _header, _expected = digits
    np.savez(root / "bad.npz", dta=table[:, :64], label=table[:, 64])
    r, _ = _infer(root, root / "bad.npz")
    expect_error(r, "array 'dta' matches no input of the net (inputs: data)")


def _csv(root, name, header, rows):
    lines = ([",".join(header)] if header else []) + [",".join(f"{v:g}" for v in row) for row in rows]
    (root / name).write_text("\n".join(lines) + "\n")
    return root / name


def test_a_column_that_is_no_label_or_no_header_is_still_an_error(digits):
    root, table, header, _expected = digits
    for path in (_csv(root, "extra.csv", header[:64] + ["extra"], table[:20]),   # not a label's name
                 _csv(root, "plain.csv", None, table[:20]),                     # no header at all
                 _csv(root, "two.csv", header + ["more"], np.c_[table[:20], table[:20, :1]])):  # still 65
        r, _ = _infer(root, path)
        expect_error(r, f"{path}: examples of shape [", "do not fit the input's [64]")
        assert "left out" not in r.err


def test_a_label_column_that_stands_in_no_way_is_read(digits):
    root, table, header, _expected = digits
    path = _csv(root, "fits.csv", header[:63] + ["label"], table[:20, :64])
    r, prob = _infer(root, path)
    assert r.status == 0, r.err
    assert "left out" not in r.err and prob.shape == (20, 10)
