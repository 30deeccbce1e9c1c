"""Class names out of `toolkit infer`: a labels file (one name per line, as Caffe's
synset_words.txt) given with --labels or recorded at import, --top K printed and written to CSV,
CSV output of [N, C, 1, 1] scores (a net that ends in global pooling), and the labels file's
checks (size, control characters, a count that fits no output). The rankings are checked against
numpy's argsort of the scores `toolkit.load` gives."""
from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import run_cli, write_net

REAL = Path(__file__).resolve().parents[2] / ".." / "shared" / "real-models"
NAMES = [f"digit {i}, the numeral {i}" for i in range(10)]

# a net that ends in global pooling: scores [N, 5, 1, 1], as SqueezeNet's deploy net gives them
POOLED = """
name: pooled
inputs:
  data: {shape: [N, 3, 6, 6], dtype: float32}
layers:
  - {name: conv, type: Convolution, bottom: data, top: conv, num_output: 5, kernel_size: 3, pad: 1}
  - {name: pool, type: Pooling, bottom: conv, top: pool, pool: ave, global_pooling: true}
outputs: [pool]
"""


def _pooled_net(tmp_path, text=POOLED):
    """The net file and a weights file of its fillers' values (seeded)."""
    import toolkit
    from toolkit.weights import save_weights
    net = write_net(tmp_path, text)
    save_weights(str(tmp_path / "w.safetensors"), toolkit.Net(str(net)).init_weights(seed=1))
    return net, tmp_path / "w.safetensors"


def _lenet_scores(x):
    import toolkit
    return toolkit.load("zoo:lenet").infer(data=x)["prob"]


def _reference_top(scores, k):
    rows = scores.reshape(len(scores), -1)
    order = np.argsort(-rows, axis=1, kind="stable")[:, :k]
    return order, np.take_along_axis(rows, order, axis=1)


@pytest.fixture()
def digits(tmp_path):
    x = np.random.default_rng(3).random((4, 1, 8, 8)).astype(np.float32) * 16
    np.save(tmp_path / "x.npy", x)
    (tmp_path / "labels.txt").write_text("\n".join(NAMES) + "\n")
    return tmp_path, x


def test_top_k_printed_and_written_with_names(digits):
    tmp, x = digits
    want_index, want_score = _reference_top(_lenet_scores(x), 3)
    r = run_cli("infer", "zoo:lenet", "--input", tmp / "x.npy", "--top", "3", "--labels", tmp / "labels.txt",
                "--output", tmp / "out.csv")
    assert r.status == 0, r.err
    with open(tmp / "out.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4
    for i, row in enumerate(rows):
        for rank in range(3):
            prefix = f"prob_top{rank + 1}"
            assert int(row[f"{prefix}_class"]) == want_index[i, rank]
            assert row[f"{prefix}_name"] == NAMES[want_index[i, rank]]
            assert float(row[f"{prefix}_score"]) == pytest.approx(want_score[i, rank], rel=1e-6)
    # printed: a heading per example, then rank, score, index and name
    for i in range(4):
        block = r.out.split(f"row {i}: prob top 3\n")[1].splitlines()[:3]
        for rank, line in enumerate(block):
            m = re.fullmatch(r"\s+(\d)\. (\S+)  class (\d+)  (.*)", line)
            assert m, line
            assert int(m[1]) == rank + 1 and int(m[3]) == want_index[i, rank]
            assert float(m[2]) == pytest.approx(want_score[i, rank], abs=1e-6)
            assert m[4] == NAMES[want_index[i, rank]]


def test_top_k_without_names_and_printed_only(digits):
    tmp, x = digits
    want_index, _ = _reference_top(_lenet_scores(x), 2)
    r = run_cli("infer", "zoo:lenet", "--input", tmp / "x.npy", "--top", "2")
    assert r.status == 0, r.err
    assert "prob [4, 10]" not in r.out                  # the ranked output is not also dumped whole
    firsts = [int(m) for m in re.findall(r"  1\. \S+  class (\d+)$", r.out, re.M)]
    assert firsts == want_index[:, 0].tolist()


def test_csv_takes_scores_of_global_pooling(tmp_path):
    import toolkit
    net, weights = _pooled_net(tmp_path)
    x = np.random.default_rng(0).standard_normal((3, 3, 6, 6)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    r = run_cli("infer", net, "--weights", weights, "--input", tmp_path / "x.npy", "--output", tmp_path / "out.csv")
    assert r.status == 0, r.err
    scores = toolkit.load(str(net), weights=str(weights)).infer(data=x)["pool"]
    assert scores.shape == (3, 5, 1, 1)
    with open(tmp_path / "out.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    flat = scores.reshape(3, 5)
    assert [int(r["pool_class"]) for r in rows] == flat.argmax(axis=1).tolist()
    np.testing.assert_allclose([float(r["pool_score"]) for r in rows], flat.max(axis=1), rtol=1e-6)
    (tmp_path / "five.txt").write_text("a\nb\nc\nd\ne\n")
    r = run_cli("infer", net, "--weights", weights, "--input", tmp_path / "x.npy", "--labels", tmp_path / "five.txt",
                "--top", "2",
                "--output", tmp_path / "top.csv")
    assert r.status == 0, r.err
    with open(tmp_path / "top.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    order = np.argsort(-flat, axis=1, kind="stable")
    assert [r["pool_top2_name"] for r in rows] == ["abcde"[i] for i in order[:, 1]]


@pytest.mark.parametrize("content, message", [
    ("\n".join(NAMES[:9]) + "\n", "9 class names, but the net's class scores have 'prob' 10 per example"),
    ("\n".join(NAMES[:4] + ["bad\x1bname"] + NAMES[5:]) + "\n", "line 5 holds the control character U+001B"),
    ("\n".join(NAMES[:3] + [""] + NAMES[4:]) + "\n", "line 4 is empty"),
    (b"\xff\xfe" + b"x" * 10, "a labels file is UTF-8 text"),
])
def test_bad_labels_files_are_one_line(digits, content, message):
    tmp, _ = digits
    path = tmp / "bad.txt"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    r = run_cli("infer", "zoo:lenet", "--input", tmp / "x.npy", "--labels", path)
    assert r.status == 2 and len(r.err_lines) == 1 and message in r.err, r.err


def test_labels_file_too_large_is_refused_before_reading_it_all(digits):
    from toolkit.arrayfiles.labels import MAX_LABELS_BYTES
    tmp, _ = digits
    path = tmp / "huge.txt"
    with open(path, "wb") as f:
        f.truncate(MAX_LABELS_BYTES + 1)          # sparse: a size that lies about its content
    r = run_cli("infer", "zoo:lenet", "--input", tmp / "x.npy", "--labels", path)
    assert r.status == 2 and "at most" in r.err and "labels file" in r.err, r.err


def test_top_on_a_net_without_class_scores_is_refused(tmp_path):
    net, weights = _pooled_net(tmp_path, POOLED.replace("global_pooling: true", "kernel_size: 2, stride: 2"))
    np.save(tmp_path / "x.npy", np.zeros((1, 3, 6, 6), np.float32))
    r = run_cli("infer", net, "--weights", weights, "--input", tmp_path / "x.npy", "--top", "1")
    assert r.status == 2 and "--top 1: the net has no output of class scores" in r.err, r.err


@pytest.mark.skipif(not (REAL / "synset_words.txt").is_file(), reason="the real models folder is absent")
def test_import_records_the_labels_and_infer_names_the_classes(tmp_path):
    """`toolkit import caffe --transform caffe-imagenet --labels synset_words.txt` records the
    names; `toolkit infer cat.jpg --top 5` of the real SqueezeNet prints them, ranked and scored as
    Caffe's preprocessing written here with PIL and numpy (warp to 256 x 256, centre crop 227,
    BGR, minus the ILSVRC mean) and the net run without a transform rank and score them."""
    from PIL import Image

    import toolkit
    out = tmp_path / "sq"
    r = run_cli("import", "caffe", REAL / "squeezenet_v1.0_deploy.prototxt", "--weights",
                REAL / "squeezenet_v1.0_deep_compression.caffemodel", "--out", out,
                "--transform", "caffe-imagenet", "--labels", REAL / "synset_words.txt")
    assert r.status == 0, r.err
    synsets = (REAL / "synset_words.txt").read_text().splitlines()
    assert json.loads((out / "input.json").read_text())["classes"] == synsets
    r = run_cli("infer", out / "net.yaml", "--weights", out / "model.safetensors", "--input", REAL / "cat.jpg",
                "--top", "5")
    assert r.status == 0, r.err
    model = toolkit.load(str(out / "net.yaml"), weights=str(out / "model.safetensors"), buckets=[1], transform=False)
    img = Image.open(REAL / "cat.jpg").convert("RGB").resize((256, 256), Image.BILINEAR)
    bgr = np.asarray(img, np.float32).transpose(2, 0, 1)[::-1, 14:241, 14:241]
    x = bgr - np.array([104.007, 116.6688, 122.6789], np.float32)[:, None, None]
    scores = next(iter(model.infer(data=np.ascontiguousarray(x[None])).values()))
    order, best = _reference_top(scores, 5)
    printed = re.findall(r"\d\. (\S+)  class (\d+)  (.*)$", r.out, re.M)
    assert [(i, name) for _, i, name in printed] == [(str(i), synsets[i]) for i in order[0]]
    assert synsets[order[0, 0]] == "n02119789 kit fox, Vulpes macrotis"
    np.testing.assert_allclose([float(v) for v, _, _ in printed], best[0], atol=1e-4)
    # names that fit no output: refused, and the import leaves nothing behind (its rerun needs no --force)
    (tmp_path / "ten.txt").write_text("\n".join(NAMES) + "\n")
    r = run_cli("import", "caffe", REAL / "squeezenet_v1.0_deploy.prototxt", "--out", tmp_path / "sq2",
                "--labels", tmp_path / "ten.txt")
    assert r.status == 2 and "10 class names, but the net's class scores have" in r.err, r.err
    assert not (tmp_path / "sq2").exists()


def test_import_onnx_records_the_labels(digits):
    """`toolkit import onnx --labels` records the names beside the imported net, and `toolkit
    infer --top` of it names the classes LeNet's own scores rank first."""
    pytest.importorskip("onnx")
    tmp, x = digits
    assert run_cli("export", "onnx", "zoo:lenet", "-o", tmp / "lenet.onnx").status == 0
    r = run_cli("import", "onnx", tmp / "lenet.onnx", "--out", tmp / "imported", "--labels", tmp / "labels.txt")
    assert r.status == 0, r.err
    assert json.loads((tmp / "imported" / "input.json").read_text()) == {"classes": NAMES}
    r = run_cli("infer", tmp / "imported" / "net.yaml", "--weights", tmp / "imported" / "model.safetensors",
                "--input", tmp / "x.npy", "--top", "1")
    assert r.status == 0, r.err
    best = _lenet_scores(x).argmax(axis=1)
    assert re.findall(r"class (\d+)  (.*)$", r.out, re.M) == [(str(i), NAMES[i]) for i in best]


def test_import_onnx_that_fails_leaves_nothing_behind(digits):
    """An ONNX import refused at its last step (names that fit no output) writes nothing into
    --out, so the rerun with the right names needs no --force."""
    pytest.importorskip("onnx")
    tmp, _x = digits
    assert run_cli("export", "onnx", "zoo:lenet", "-o", tmp / "lenet.onnx").status == 0
    (tmp / "three.txt").write_text("a\nb\nc\n")
    r = run_cli("import", "onnx", tmp / "lenet.onnx", "--out", tmp / "imported", "--labels", tmp / "three.txt")
    assert r.status == 2 and "3 class names" in r.err and "nothing was imported" in r.err, r.err
    assert not (tmp / "imported").exists()
    r = run_cli("import", "onnx", tmp / "lenet.onnx", "--out", tmp / "imported", "--labels", tmp / "labels.txt")
    assert r.status == 0, r.err
    assert sorted(p.name for p in (tmp / "imported").iterdir()) == ["input.json", "model.safetensors", "net.yaml"]
