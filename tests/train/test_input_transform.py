"""The input transform prepares images as Caffe's and torchvision's pipelines do (docs/spec.md
section 3): channel order, resize (shorter side or warp), centre crop, mean, std, raw scale,
declared once as presets or keys. Each reference below is written here with PIL and numpy, step by
step as the peer's own code does it, and compared with what `toolkit infer` feeds the net (a
net that flattens its input, so its output is the transformed input) or what it answers."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from tests.train.train_helpers import cli

REAL = Path(__file__).resolve().parents[2] / ".." / "shared" / "real-models"
IMAGENET_BGR_MEAN = [104.0069879317889, 116.66876761696767, 122.6789143406786]
TORCH_MEAN, TORCH_STD = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])


def _flatten_net(folder: Path, shape: list, **top) -> Path:
    """A net whose output is its input, flattened: what the transform made of it."""
    net = {"name": "passthrough", "inputs": {"data": {"shape": ["N"] + shape, "dtype": "float32"}},
           "layers": [{"name": "flat", "type": "Flatten", "bottom": "data", "top": "flat"}], **top}
    path = folder / "net.yaml"
    path.write_text(yaml.safe_dump(net, sort_keys=False))
    return path


def _image(folder: Path, width: int, height: int, name: str = "a.png") -> Path:
    rng = np.random.default_rng(width * 100 + height)
    path = folder / name
    Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(path)
    return path


def _fed(folder: Path, net: Path, *inputs, extra=()) -> np.ndarray:
    r = cli("infer", net, *[a for i in inputs for a in ("--input", i)], "--output", folder / "out.npy", *extra)
    assert r.status == 0, r.err
    return np.load(folder / "out.npy")


def test_torchvision_preset_resizes_the_shorter_side_crops_and_normalises_as_torchvision(tmp_path):
    # Resize(7) of a 9 x 11 image: width 7, height int(7 * 11 / 9) = 8; CenterCrop([5, 4]) starts at
    # round(1.5) = 2 on both axes (torchvision's round, half to even), where Caffe's floor says 1
    net = _flatten_net(tmp_path, [3, 5, 4], transform={"preset": "torchvision-imagenet", "resize": 7,
                                                      "crop_size": [5, 4]})
    image = _image(tmp_path, 9, 11)
    pil = Image.open(image).convert("RGB").resize((7, 8), Image.BILINEAR)
    x = np.asarray(pil, dtype=np.float32).transpose(2, 0, 1) / np.float32(255)       # ToTensor
    x = x[:, 2:7, 2:6]
    want = (x - TORCH_MEAN[:, None, None]) / TORCH_STD[:, None, None]
    got = _fed(tmp_path, net, image)
    np.testing.assert_allclose(got.reshape(3, 5, 4), want, rtol=0, atol=1e-5)


def test_caffe_preset_on_an_array_reverses_the_channels_crops_to_the_input_and_subtracts_the_mean(tmp_path):
    net = _flatten_net(tmp_path, [3, 7, 7], transform={"preset": "caffe-imagenet"})
    rgb = np.random.default_rng(1).integers(0, 256, (2, 3, 10, 10)).astype(np.float32)
    np.save(tmp_path / "x.npy", rgb)
    want = rgb[:, ::-1, 1:8, 1:8] - np.array(IMAGENET_BGR_MEAN)[None, :, None, None]   # floor((10 - 7) / 2)
    got = _fed(tmp_path, net, tmp_path / "x.npy")
    np.testing.assert_allclose(got.reshape(2, 3, 7, 7), want, rtol=0, atol=1e-4)
    np.save(tmp_path / "x7.npy", rgb[:, :, :7, :7])
    plain = _fed(tmp_path, net, tmp_path / "x7.npy", extra=["--no-transform"])        # fed as given
    np.testing.assert_array_equal(plain.reshape(2, 3, 7, 7), rgb[:, :, :7, :7])


def test_caffe_preset_warps_an_image_file_then_crops_the_centre(tmp_path):
    net = _flatten_net(tmp_path, [3, 5, 5], transform={"preset": "caffe-imagenet", "resize": [8, 9]})
    image = _image(tmp_path, 13, 6)
    pil = Image.open(image).convert("RGB").resize((9, 8), Image.BILINEAR)
    x = np.asarray(pil, dtype=np.float32)[1:6, 2:7, ::-1].transpose(2, 0, 1)          # HWC crop, RGB -> BGR
    want = x - np.array(IMAGENET_BGR_MEAN, np.float32)[:, None, None]
    np.testing.assert_allclose(_fed(tmp_path, net, image).reshape(3, 5, 5), want, rtol=0, atol=1e-4)


def test_a_mean_image_is_cropped_with_the_input(tmp_path):
    """Caffe's mean_file: the mean image of the uncropped size, subtracted at the crop's place."""
    import toolkit
    mean = np.random.default_rng(5).random((3, 10, 10)) * 100
    np.save(tmp_path / "mean.npy", mean)
    net = _flatten_net(tmp_path, [3, 7, 7], transform={"mean_file": "mean.npy", "crop_size": 7,
                                                      "channel_order": "bgr", "scale": 0.5})
    x = np.random.default_rng(6).integers(0, 256, (2, 3, 10, 10)).astype(np.float32)
    want = (x[:, ::-1, 1:8, 1:8] - mean[None, :, 1:8, 1:8]) * 0.5
    np.save(tmp_path / "x.npy", x)
    np.testing.assert_allclose(_fed(tmp_path, net, tmp_path / "x.npy").reshape(2, 3, 7, 7), want, atol=1e-4)
    got = toolkit.load(str(net)).infer(data=x)["flat"]                   # the Python API, the same transform
    np.testing.assert_allclose(got.reshape(2, 3, 7, 7), want, rtol=0, atol=1e-4)


def test_train_data_crop_size_takes_effect_on_an_image_file(tmp_path):
    # Caffe's transform_param on an image read at its own size: the centre crop_size square
    net = _flatten_net(tmp_path, [3, 4, 4], train={"data": {"crop_size": 4, "scale": 0.5}})
    image = _image(tmp_path, 9, 11)
    x = np.asarray(Image.open(image).convert("RGB"), dtype=np.float32).transpose(2, 0, 1)
    want = x[:, 3:7, 2:6] * 0.5                                                           # (11-4)//2, (9-4)//2
    np.testing.assert_allclose(_fed(tmp_path, net, image).reshape(3, 4, 4), want, rtol=0, atol=1e-6)


def test_images_of_different_shapes_stack_after_the_shorter_side_resize_and_crop(tmp_path):
    net = _flatten_net(tmp_path, [3, 4, 4], transform={"resize": 6, "crop_size": 4, "std": 2})
    images = [_image(tmp_path, 9, 11, "a.png"), _image(tmp_path, 12, 7, "b.png")]
    wants = []
    for image, size in zip(images, [(6, 7), (10, 6)]):        # (W, H): int(6 * 11 / 9) = 7, int(6 * 12 / 7) = 10
        x = np.asarray(Image.open(image).convert("RGB").resize(size, Image.BILINEAR), np.float32).transpose(2, 0, 1)
        top, left = (size[1] - 4) // 2, (size[0] - 4) // 2
        wants.append(x[:, top:top + 4, left:left + 4] / 2)
    got = _fed(tmp_path, net, tmp_path)
    np.testing.assert_allclose(got.reshape(2, 3, 4, 4), np.stack(wants), rtol=0, atol=1e-6)


@pytest.mark.parametrize("top, message", [
    ({"transform": {"scale": 2}, "train": {"data": {"scale": 3}}}, "the input transform is declared twice"),
    ({"transform": {"preset": "caffe-imagenette"}}, "bad 'preset'"),
    ({"transform": {"mean": 1, "mean_file": "m.npy"}}, "give one of mean and mean_file"),
    ({"transform": {"std": 0}}, "bad 'std'"),
])
def test_a_bad_transform_is_an_error_at_its_place(tmp_path, top, message):
    net = _flatten_net(tmp_path, [3, 4, 4], **top)
    r = cli("check", net)
    assert r.status == 2 and message in r.err, r.err
    assert str(net) in r.err and "Traceback" not in r.err


def test_transform_inputs_names_a_float_input(tmp_path):
    net = _flatten_net(tmp_path, [3, 4, 4], transform={"inputs": ["label"], "scale": 2})
    np.save(tmp_path / "x.npy", np.zeros((1, 3, 4, 4), np.float32))
    r = cli("infer", net, "--input", tmp_path / "x.npy")
    assert r.status == 2 and "transform.inputs names 'label'" in r.err, r.err


# -- a real Caffe model and Caffe's own example photos ------------------------------------------
def _caffe_classify_reference(path: Path) -> np.ndarray:
    """Caffe's classify.py, written out: the image in RGB, warped to 256 x 256 (bilinear), the
    centre 227 x 227 (offset (256 - 227) // 2 = 14), RGB -> BGR, minus the mean per channel."""
    rgb = np.asarray(Image.open(path).convert("RGB").resize((256, 256), Image.BILINEAR), dtype=np.float32)
    crop = rgb[14:14 + 227, 14:14 + 227]
    bgr = crop[:, :, ::-1].transpose(2, 0, 1)
    return (bgr - np.array(IMAGENET_BGR_MEAN, np.float32)[:, None, None])[None]


@pytest.mark.skipif(not (REAL / "squeezenet_v1.0_deploy.prototxt").is_file(),
                    reason="the real models folder (shared/real-models beside the repository) is absent")
def test_squeezenet_on_caffe_photos_answers_as_caffes_pipeline(tmp_path):
    pytest.importorskip("google.protobuf", reason="the caffe extra (protobuf) reads caffemodels")
    out = tmp_path / "squeezenet"
    r = cli("import", "caffe", REAL / "squeezenet_v1.0_deploy.prototxt", "--weights",
            REAL / "squeezenet_v1.0_deep_compression.caffemodel", "--transform", "caffe-imagenet", "--out", out)
    assert r.status == 0, r.err
    photos = [REAL / "cat.jpg", REAL / "fish-bike.jpg"]
    weights = ["--weights", out / "model.safetensors"]
    got = _fed(tmp_path, out / "net.yaml", *[f"data={p}" for p in photos], extra=weights)
    np.save(tmp_path / "ref.npy", np.concatenate([_caffe_classify_reference(p) for p in photos]))
    want = _fed(tmp_path, out / "net.yaml", f"data={tmp_path / 'ref.npy'}", extra=["--no-transform"] + weights)
    assert got.shape == (2, 1000, 1, 1)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    names = (REAL / "synset_words.txt").read_text().splitlines()
    assert "kit fox" in names[int(got[0].argmax())]


def test_training_and_its_test_passes_apply_a_top_level_transform(tmp_path):
    """A net's ``transform`` (mean 8, std 16) trains and tests as train.data's mean 8, scale 1/16
    does: the same losses and test metrics, iteration by iteration (x / 16 == x * 0.0625 exactly)."""
    from tests.train.train_helpers import records, train
    base = {"name": "mlp", "inputs": {"data": {"shape": ["N", 64]}, "label": {"shape": ["N"], "dtype": "int64"}},
            "layers": [{"name": "ip1", "type": "InnerProduct", "bottom": "data", "top": "ip1", "num_output": 10},
                       {"name": "loss", "type": "SoftmaxWithLoss", "bottom": ["ip1", "label"], "top": "loss"},
                       {"name": "accuracy", "type": "Accuracy", "bottom": ["ip1", "label"], "top": "accuracy",
                        "phase": "test"}]}
    train_section = {"solver": {"base_lr": 0.1}, "max_iter": 20, "test_interval": 10, "display": 5}
    runs = []
    for name, extra, data in (("declared", {"transform": {"mean": 8, "std": 16}}, {}),
                              ("caffe", {}, {"mean": 8, "scale": 0.0625})):
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump({**base, **extra, "train": {**train_section, "data": data}}))
        train(path, tmp_path / name)
        runs.append(records(tmp_path / name))
    assert runs[0] == runs[1] and any("accuracy" in r for r in runs[0])


def test_import_caffe_transform_is_refused_where_the_prototxt_gives_one(tmp_path):
    pytest.importorskip("google.protobuf", reason="the caffe extra (protobuf) reads caffemodels")
    prototxt = Path(__file__).resolve().parents[1] / "data" / "caffe" / "examples_mnist_lenet_train_test.prototxt"
    r = cli("import", "caffe", prototxt, "--input-shape", "data=1,28,28", "--transform", "caffe-imagenet",
            "--out", tmp_path / "out")
    assert r.status == 2 and "the prototxt's transform_param gives the input transform already (scale" in r.err, r.err
    assert not (tmp_path / "out" / "net.yaml").exists()
