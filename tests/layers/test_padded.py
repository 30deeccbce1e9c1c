"""Buckets over a sequence length T: inputs padded along T up to a bucket, each example's real length
in the graph's lengths input, and the layers that read T keep the padding out, so every real
position's result equals the unpadded run's (float64, to rounding). Layers that cannot are
refused with the reason; the session pads, fills the lengths and cuts the outputs back."""
from __future__ import annotations

import contextlib
import io
import re

import numpy as np
import pytest

from toolkit.cli import main
from toolkit.errors import SpecError, UserError
from toolkit.frontend import Net
from toolkit.ir.binding import lengths_input
from toolkit.runtime.plan import Plan
from toolkit.runtime.session import InferSession

NET = """
name: padded
inputs:
  x: {shape: [N, T, 6]}
layers:
  - {name: embed, type: InnerProduct, bottom: x, top: e, num_output: 8, axis: 2}
  - {name: attn, type: MultiHeadAttention, bottom: e, top: a, num_heads: 2, causal: CAUSAL}
  - {name: res, type: Eltwise, bottom: [e, a], top: r}
  - {name: ln, type: LayerNorm, bottom: r, top: r}
  - {name: act, type: GELU, bottom: r, top: r}
  - {name: gru, type: GRU, bottom: r, top: seq, num_output: 5, bidirectional: true, num_layers: 2}
  - {name: lstm, type: LSTM, bottom: seq, top: last, num_output: 4, bidirectional: true, return_sequence: false}
  - {name: rnn, type: RNN, bottom: seq, top: rlast, num_output: 3, bidirectional: true, return_sequence: false}
  - {name: tags, type: InnerProduct, bottom: seq, top: tags, num_output: 3, axis: 2}
  - {name: sm, type: Softmax, bottom: tags, top: tagp, axis: 2}
  - {name: mean, type: Reduction, bottom: seq, top: mean, operation: mean, axis: 1}
  - {name: sumsq, type: Reduction, bottom: seq, top: sumsq, operation: sumsq, axis: 1}
outputs: [last, rlast, tagp, mean, sumsq, seq]
"""


def net_of(tmp_path, text=NET, causal=True) -> Net:
    path = tmp_path / "net.yaml"
    path.write_text(text.replace("CAUSAL", str(causal).lower()))
    return Net.load(str(path))


@pytest.mark.parametrize("causal", [True, False])
def test_padded_examples_equal_their_unpadded_runs(tmp_path, causal):
    net = net_of(tmp_path, causal=causal)
    weights = net.init_weights(seed=1, dtype="float64")
    plain = net.graph("infer", "float64")
    bucketed = net.graph("infer", "float64", bucketed=frozenset({"T"}))
    assert lengths_input("T") in bucketed.inputs and lengths_input("T") not in plain.inputs
    rng = np.random.default_rng(0)
    lengths, bucket = [3, 7, 1, 5], 7
    xs = [rng.normal(size=(1, t, 6)) for t in lengths]
    padded = np.zeros((4, bucket, 6))
    for i, x in enumerate(xs):
        padded[i, :lengths[i]] = x[0]
    padded[0, 3:] = 1e3                       # what lies in the padding must not matter
    got = Plan(bucketed, {"N": 4, "T": bucket}, weights).run({"x": padded, lengths_input("T"): np.array(lengths)})
    for i, x in enumerate(xs):
        want = Plan(plain, {"N": 1, "T": lengths[i]}, weights).run({"x": x})
        for name, value in want.items():
            mine = np.asarray(got[name])[i:i + 1]
            if name in ("tagp", "seq"):
                mine, rest = mine[:, :lengths[i]], mine[:, lengths[i]:]
                if name == "seq":          # the padded steps' outputs are zeros, as pad_packed_sequence's
                    assert not rest.any()
            np.testing.assert_allclose(mine, np.asarray(value), rtol=1e-10, atol=1e-12, err_msg=f"{name} {i}")


@pytest.mark.parametrize("layer, why", [
    ("{name: bad, type: Softmax, bottom: x, top: y, axis: 1}", "works along the bucketed dimension T (axis 1)"),
    ("{name: bad, type: Concat, bottom: [x, x], top: y, axis: 1}", "works along the bucketed dimension T"),
    ("{name: bad, type: Flatten, bottom: x, top: y}", "its result at a real position would depend on the padding"),
    ("{name: bad, type: ArgMax, bottom: x, top: y, axis: 1}", "works along the bucketed dimension T"),
])
def test_a_layer_that_would_read_the_padding_is_refused(tmp_path, layer, why):
    text = f"name: bad\ninputs:\n  x: {{shape: [N, T, 6]}}\nlayers:\n  - {layer}\n"
    net = net_of(tmp_path, text)
    net.graph("infer")                              # fine without buckets over T
    with pytest.raises(SpecError, match=re.escape(why)) as e:
        net.graph("infer", bucketed=frozenset({"T"}))
    assert "net.yaml:5:5: error: layer 'bad'" in str(e.value)


def test_a_convolution_along_t_and_batch_statistics_in_training_are_refused(tmp_path):
    text = """name: conv
inputs:
  x: {shape: [N, 2, T, 6]}
  label: {shape: [N], dtype: int64}
layers:
  - {name: bn, type: BatchNorm, bottom: x, top: b}
  - {name: conv, type: Convolution, bottom: b, top: c, num_output: 3, kernel_size: 3, pad: 1}
  - {name: pool, type: Reduction, bottom: c, top: p, operation: mean, axis: 2}
  - {name: ip, type: InnerProduct, bottom: p, top: s, num_output: 2}
  - {name: loss, type: SoftmaxWithLoss, bottom: [s, label], top: loss, phase: train}
"""
    net = net_of(tmp_path, text)
    with pytest.raises(SpecError) as e:
        net.graph("train", bucketed=frozenset({"T"}))
    assert ("layer 'bn' (BatchNorm): buckets over T pad it, and its batch statistics would count the padding"
            in str(e.value))
    with pytest.raises(SpecError, match="layer 'conv' .*depend on the padding along T"):
        net.graph("infer", bucketed=frozenset({"T"}))


def test_the_session_pads_fills_the_lengths_and_cuts_back(tmp_path):
    net = net_of(tmp_path)
    weights = net.init_weights(seed=2, dtype="float64")
    plain = net.graph("infer", "float64")
    session = InferSession(net.graph("infer", "float64", bucketed=frozenset({"T"})), weights, buckets=(1, 4),
                           dim_buckets={"T": (4, 8)})
    assert session.warm() == 4 and session.plans_built == 4
    rng = np.random.default_rng(3)
    for t in (1, 3, 4, 6, 8):
        x = rng.normal(size=(3, t, 6))
        got = session.run({"x": x})
        want = Plan(plain, {"N": 3, "T": t}, weights).run({"x": x})
        for name in want:
            assert got[name].shape == np.asarray(want[name]).shape, name
            np.testing.assert_allclose(got[name], np.asarray(want[name]), rtol=1e-10, atol=1e-12, err_msg=name)
    assert session.plans_built == 4                 # every length ran on a warm bucket
    # a batch already padded, each row's length given
    x = rng.normal(size=(2, 6, 6))
    got = session.run({"x": x, lengths_input("T"): np.array([6, 2])})
    short = Plan(plain, {"N": 1, "T": 2}, weights).run({"x": x[1:, :2]})
    np.testing.assert_allclose(got["last"][1:], np.asarray(short["last"]), rtol=1e-10, atol=1e-12)
    with pytest.raises(UserError, match="T=9 is longer than the largest bucket 8"):
        session.run({"x": rng.normal(size=(1, 9, 6))})
    with pytest.raises(UserError, match="length from 1 to 6"):
        session.run({"x": x, lengths_input("T"): np.array([7, 2])})


def cli(*args):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main([str(a) for a in args])
    return status, out.getvalue(), err.getvalue()


def test_infer_takes_buckets_per_dimension_from_the_flag_or_the_net_file(tmp_path):
    net = net_of(tmp_path)
    from toolkit.weights import save_weights
    save_weights(str(tmp_path / "w.safetensors"), net.init_weights(seed=4))
    x = np.random.default_rng(5).normal(size=(3, 5, 6)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    runs = {}
    for name, flags in (("exact", []), ("flag", ["--buckets", "N=1,4 T=4,8"])):
        status, out, err = cli("infer", tmp_path / "net.yaml", "--weights", tmp_path / "w.safetensors",
                               "--input", f"x={tmp_path / 'x.npy'}", "--output", tmp_path / f"{name}.npz", *flags)
        assert status == 0, err
        runs[name] = np.load(tmp_path / f"{name}.npz")
    (tmp_path / "net.yaml").write_text((tmp_path / "net.yaml").read_text() + "buckets: {N: [4], T: [8]}\n")
    status, out, err = cli("infer", tmp_path / "net.yaml", "--weights", tmp_path / "w.safetensors", "--input",
                           f"x={tmp_path / 'x.npy'}", "--output", tmp_path / "file.npz", "--verbose")
    assert status == 0, err
    runs["file"] = np.load(tmp_path / "file.npz")
    for name in ("flag", "file"):
        for k in runs["exact"]:
            np.testing.assert_allclose(runs[name][k], runs["exact"][k], rtol=1e-5, atol=1e-6, err_msg=f"{name} {k}")
    for flags, message in ((["--buckets", "N=1 X=4"], "buckets over X: the net has no such symbolic dimension "
                                                       "(it has: N, T)"),
                           (["--buckets", "T=4,x"], "'T=4,x' is not a comma-separated list of sizes"),
                           (["--buckets", "T=2,4"], "T=5 is longer than the largest bucket 4")):
        status, out, err = cli("infer", tmp_path / "net.yaml", "--weights", tmp_path / "w.safetensors",
                               "--input", f"x={tmp_path / 'x.npy'}", *flags)
        assert status == 2 and message in err and "Traceback" not in err, err
        assert len([line for line in err.splitlines() if "error" in line]) == 1, err


SOFTMAX_ALONG_T = ("name: g\ninputs:\n  x: {shape: [N, T, 6]}\nlayers:\n"
                   "  - {name: sm, type: Softmax, bottom: x, top: p, axis: 1}\noutputs: [p]\n")


@pytest.mark.parametrize("key", ["buckets", "gears"])       # gears: the old name, still read
def test_the_net_files_buckets_are_checked_when_it_loads(tmp_path, key):
    text = SOFTMAX_ALONG_T
    with pytest.raises(SpecError) as e:
        net_of(tmp_path, text + f"{key}: {{N: [1, 8], T: [4, 8], S: [2]}}\n")
    column = 26 + len(key)                  # the S after "KEY: {N: [1, 8], T: [4, 8], "
    assert (f"net.yaml:7:{column}: error: {key}: the inputs have no symbolic dimension 'S' (they have: N, T)"
            in str(e.value))
    with pytest.raises(SpecError, match=re.escape("net.yaml:5:5: error: layer 'sm' (Softmax): it works along the "
                                                  "bucketed dimension T (axis 1)")):
        net_of(tmp_path, text + f"{key}: {{T: [4, 8]}}\n")
    assert net_of(tmp_path, text + f"{key}: {{N: [1, 8]}}\n").spec.buckets == {"N": [1, 8]}   # the batch's


def test_a_net_file_that_says_gears_is_the_same_net_as_one_that_says_buckets(tmp_path):
    import toolkit
    from toolkit.weights import save_weights
    models = {}
    for key in ("gears", "buckets"):
        (tmp_path / key).mkdir()
        net = net_of(tmp_path / key, NET + f"{key}: {{N: [1, 4], T: [4, 8]}}\n")
        assert net.spec.buckets == {"N": [1, 4], "T": [4, 8]} and net.spec.gears is None
        save_weights(str(tmp_path / key / "w.safetensors"), net.init_weights(seed=8))
        models[key] = toolkit.load(str(tmp_path / key / "net.yaml"), weights=str(tmp_path / key / "w.safetensors"))
    assert net_of(tmp_path / "gears", NET + "gears: {N: [1, 4], T: [4, 8]}\n").spec == net.spec
    x = np.random.default_rng(9).normal(size=(3, 5, 6)).astype(np.float32)
    got = {key: model.infer(x=x) for key, model in models.items()}
    for key, model in models.items():             # padded to T=8 and batched as 4 + ... either way
        assert model.session.dim_buckets == {"T": (4, 8)} and model.buckets == (1, 4), key
        assert model.session.plans_built == 1, key
    for name, value in got["buckets"].items():
        np.testing.assert_array_equal(got["gears"][name], value, err_msg=name)


def test_a_net_file_with_both_buckets_and_gears_is_refused_at_gears(tmp_path):
    with pytest.raises(SpecError) as e:
        net_of(tmp_path, SOFTMAX_ALONG_T.replace("axis: 1", "axis: 2")
               + "buckets: {N: [1, 8]}\ngears: {T: [4, 8]}\n")
    assert str(e.value).splitlines() == [
        f"{tmp_path / 'net.yaml'}:8:1: error: gears is the old name of buckets, and buckets is given too: keep buckets"]
    # and on the command line: that one line, exit status 2
    from tests.train.train_helpers import cli
    r = cli("check", tmp_path / "net.yaml")
    assert r.status == 2 and r.err.splitlines() == [
        f"{tmp_path / 'net.yaml'}:8:1: error: gears is the old name of buckets, and buckets is given too: keep buckets"]


def test_the_python_api_takes_buckets_per_dimension(tmp_path):
    import toolkit
    from toolkit.weights import save_weights
    net = net_of(tmp_path)
    save_weights(str(tmp_path / "w.safetensors"), net.init_weights(seed=6))
    exact = toolkit.load(str(tmp_path / "net.yaml"), weights=str(tmp_path / "w.safetensors"))
    bucketed = toolkit.load(str(tmp_path / "net.yaml"), weights=str(tmp_path / "w.safetensors"),
                          buckets={"N": [1, 4], "T": [4, 8]})
    assert bucketed.warm() == 4
    x = np.random.default_rng(7).normal(size=(2, 6, 6)).astype(np.float32)
    for name, value in exact.infer(x=x).items():
        np.testing.assert_allclose(bucketed.infer(x=x)[name], value, rtol=1e-5, atol=1e-6, err_msg=name)
    # a batch padded to one length, each row's own length given: row 1 is its first 3 steps
    short = exact.infer(x=x[1:, :3])
    got = bucketed.infer(x=x, **{lengths_input("T"): np.array([6, 3])})
    np.testing.assert_allclose(got["last"][1:], short["last"], rtol=1e-5, atol=1e-6)
    with pytest.raises(UserError, match="buckets T must be positive integers"):
        toolkit.load(str(tmp_path / "net.yaml"), weights=str(tmp_path / "w.safetensors"), buckets={"T": [0]})
