"""Caffe's data augmentation in train.data (its transform_param): ``crop_size`` (a random crop
per example in training, the centre in test and deployment), ``mirror`` (a random left-right
flip per example), a per-channel ``mean_value`` or a ``mean_file`` image, all seeded by the
iteration so that a resumed run is bit-exact."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from schemas.train import DataSpec
from tests.train.train_helpers import cli, sets
from toolkit.training.data import augment, center_crop, transform

ROOT = Path(__file__).resolve().parents[2]
# LeNet on 6x6 crops of the 8x8 digits
CROPPED = ((ROOT / "zoo" / "lenet" / "net.yaml").read_text()
           .replace("data:  {shape: [N, 1, 8, 8]", "data:  {shape: [N, 1, 6, 6]")
           .replace("scale: 0.0625}", "scale: 0.0625, crop_size: 6, mirror: true}"))


class _Input:
    def __init__(self, dtype, shape):
        self.dtype, self.shape = dtype, shape


INPUTS = {"data": _Input("float32", ("N", 3, 4, 4)), "label": _Input("int64", ("N",))}


def test_random_crops_and_flips_are_pieces_of_each_example_and_repeat_per_seed():
    x = np.random.default_rng(0).standard_normal((64, 3, 7, 9)).astype(np.float32)
    batch = {"data": x, "label": np.arange(64)}
    spec = DataSpec(crop_size=4, mirror=True)
    a = augment(batch, INPUTS, spec, np.random.default_rng([5, 1]))
    b = augment(batch, INPUTS, spec, np.random.default_rng([5, 1]))
    assert np.array_equal(a["data"], b["data"]) and a["data"].shape == (64, 3, 4, 4)
    assert a["label"] is batch["label"]
    offsets, flipped = set(), 0
    for k in range(64):
        found = [(t, left, f) for t in range(4) for left in range(6) for f in (False, True)
                 if np.array_equal(a["data"][k], (x[k, :, t:t + 4, left:left + 4][:, :, ::-1] if f
                                                   else x[k, :, t:t + 4, left:left + 4]))]
        assert len(found) == 1, k
        offsets.add(found[0][:2])
        flipped += found[0][2]
    assert len(offsets) > 10 and 16 <= flipped <= 48          # offsets spread; about half flipped
    assert not np.array_equal(augment(batch, INPUTS, spec, np.random.default_rng([5, 2]))["data"], a["data"])


def test_the_centre_crop_is_caffes():
    x = np.arange(2 * 1 * 7 * 8, dtype=np.float32).reshape(2, 1, 7, 8)
    np.testing.assert_array_equal(center_crop(x, 4), x[:, :, 1:5, 2:6])       # (7-4)//2, (8-4)//2


def test_mean_value_per_channel_and_a_mean_image(tmp_path):
    x = np.random.default_rng(1).integers(0, 255, (4, 3, 4, 4)).astype(np.float32)
    arrays = {"data": x, "label": np.arange(4)}
    out = transform(arrays, INPUTS, DataSpec(mean_value=[10, 20, 30], scale=0.5), "float32")["data"]
    np.testing.assert_array_equal(out, (x - np.array([10, 20, 30], np.float32)[None, :, None, None]) * 0.5)
    image = np.random.default_rng(2).random((3, 4, 4)).astype(np.float32)
    np.save(tmp_path / "mean.npy", image)
    out = transform(arrays, INPUTS, DataSpec(mean_file="mean.npy"), "float32", tmp_path)["data"]
    np.testing.assert_array_equal(out, x - image[None])
    with pytest.raises(ValueError, match="give one of mean, mean_value and mean_file, not mean and mean_value"):
        DataSpec(mean=1, mean_value=[1, 2, 3])


def test_training_on_crops_and_flips_resumes_bit_exactly(tmp_path):
    net = tmp_path / "crop.yaml"
    net.write_text(CROPPED)
    short = sets(train__test_interval=5, train__snapshot=1000)
    full, split = tmp_path / "full", tmp_path / "split"
    r = cli("train", net, "--out", full, *sets(train__max_iter=12), *short)
    assert r.status == 0, r.err
    assert cli("train", net, "--out", split, *sets(train__max_iter=6), *short).status == 0
    assert cli("train", "--resume", split, *sets(train__max_iter=12)).status == 0
    a, b = load_file(str(full / "model.safetensors")), load_file(str(split / "model.safetensors"))
    assert sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a)
    # the augmentation changes what is learnt: without it the same run ends elsewhere
    plain = tmp_path / "plain"
    assert cli("train", net, "--out", plain, *sets(train__max_iter=12, train__data__mirror="false"), *short).status == 0
    assert not np.array_equal(load_file(str(plain / "model.safetensors"))["conv1.weight"], a["conv1.weight"])


def test_deployment_takes_the_centre_crop_of_larger_inputs(tmp_path):
    net = tmp_path / "crop.yaml"
    net.write_text(CROPPED)
    run = tmp_path / "run"
    assert cli("train", net, "--out", run, *sets(train__max_iter=5, train__test_interval=1000)).status == 0
    x = np.random.default_rng(3).random((5, 1, 8, 8)).astype(np.float32) * 16
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "x6.npy", center_crop(x, 6) * np.float32(0.0625))
    weights = run / "model.safetensors"
    r = cli("infer", run / "net.yaml", "--weights", weights, "--input", tmp_path / "x.npy",
            "--output", tmp_path / "a.npy")
    assert r.status == 0, r.err
    assert "centre crop 6" in r.err
    assert cli("infer", run / "net.yaml", "--weights", weights, "--input", tmp_path / "x6.npy", "--no-transform",
               "--output", tmp_path / "b.npy").status == 0
    np.testing.assert_allclose(np.load(tmp_path / "a.npy"), np.load(tmp_path / "b.npy"), rtol=1e-6, atol=1e-7)


def test_a_crop_size_that_is_not_the_inputs_size_is_refused(tmp_path):
    net = tmp_path / "crop.yaml"
    net.write_text(CROPPED.replace("crop_size: 6", "crop_size: 5"))
    line = next(n for n, text in enumerate(net.read_text().splitlines(), 1) if "crop_size: 5" in text)
    col = net.read_text().splitlines()[line - 1].index("crop_size: 5") + len("crop_size: ") + 1
    for command in (["train", net, "--out", tmp_path / "run", *sets(train__max_iter=2)], ["check", net]):
        r = cli(*command)      # refused when the file is read: `toolkit check` as `toolkit train`
        assert r.status == 2 and r.errors == [f"{net}:{line}:{col}: error: train.data.crop_size 5: the net's input "
                                              "'data' is ['N', 1, 6, 6]; its height and width must be the crop size"]
    assert not (tmp_path / "run").exists()
