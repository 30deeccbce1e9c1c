"""`toolkit serve` with class names and images, through Triton's own HTTP client: the
classification parameter answered as Triton answers it ("VALUE:INDEX:LABEL", BYTES, [N, K]; JSON
and binary), encoded PNG and JPEG files sent as a BYTES input (the binary tensor extension)
decoded and transformed on the server to the scores `toolkit infer` gives for the same files, and
bad images, lying lengths, wrong shapes and oversized bodies answered with one line, never 500.
The references: numpy's ranking of `toolkit.load`'s scores, and `toolkit infer` on the files."""
from __future__ import annotations

import io
import json
import re
import struct
import subprocess
import sys
import zlib

import numpy as np
import pytest
from serve_helpers import ROOT, Server

from toolkit import settings

http = pytest.importorskip("tritonclient.http", reason="the test extra's tritonclient[http] is not installed")
Image = pytest.importorskip("PIL.Image")

REAL = ROOT / ".." / "shared" / "real-models"
NAMES = [f"digit {i}, the numeral {i}" for i in range(10)]
ENTRY = re.compile(r"^(-?\d+\.\d{9}):(\d+)(?::(.*))?$")


@pytest.fixture(scope="module")
def labels(tmp_path_factory):
    path = tmp_path_factory.mktemp("labels") / "digits.txt"
    path.write_text("\n".join(NAMES) + "\n")
    return path


@pytest.fixture(scope="module")
def server(labels):
    s = Server("--labels", str(labels), "--max-body-mb", "1")
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def model():
    import toolkit
    return toolkit.load("zoo:lenet")


def _floats(x, binary=True):
    inp = http.InferInput("data", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=binary)
    return inp


def _images(encoded: list[bytes], binary=True, shape=None):
    inp = http.InferInput("data", shape or [len(encoded)], "BYTES")
    inp.set_data_from_numpy(np.array(encoded, dtype=object).reshape(shape or [len(encoded)]), binary_data=binary)
    return inp


def _parse(entries: np.ndarray) -> list[list[tuple[float, int, str | None]]]:
    out = []
    for row in entries:
        parsed = []
        for item in row:
            text = item.decode() if isinstance(item, bytes) else item
            m = ENTRY.match(text)
            assert m, text
            parsed.append((float(m[1]), int(m[2]), m[3]))
        out.append(parsed)
    return out


def test_classification_as_triton_answers_it(server):
    import toolkit
    client = http.InferenceServerClient(url=server.url)
    assert "classification" in client.get_server_metadata()["extensions"]
    x = np.random.default_rng(5).random((5, 1, 8, 8)).astype(np.float32) * 16
    # a model of this test's own, on the numpy kernels as the server (tests/tiers.py NUMPY_KERNELS):
    # the generated kernels' blocking moves the scores by more than this test's 1e-6
    with settings.use(native=False):
        scores = toolkit.load("zoo:lenet").infer(data=x)["prob"]
    order = np.argsort(-scores, axis=1, kind="stable")
    for binary in (True, False):
        for k in (1, 3, 12):                        # 12: more than the 10 classes, cut to 10
            out = http.InferRequestedOutput("prob", binary_data=binary, class_count=k)
            result = client.infer("lenet", [_floats(x)], outputs=[out])
            entries = result.as_numpy("prob")
            assert result.get_output("prob")["datatype"] == "BYTES"
            assert entries.shape == (5, min(k, 10)), (binary, k)
            for i, row in enumerate(_parse(entries)):
                assert [index for _, index, _ in row] == order[i, :k].tolist()
                assert [label for _, _, label in row] == [NAMES[j] for j in order[i, :k]]
                np.testing.assert_allclose([v for v, _, _ in row], scores[i, order[i, :k]], rtol=1e-6, atol=1e-9)
    # asked with other outputs as they are: the raw one stays raw
    result = client.infer("lenet", [_floats(x)], outputs=[http.InferRequestedOutput("prob")])
    np.testing.assert_allclose(result.as_numpy("prob"), scores, rtol=1e-6, atol=1e-7)


def _png(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "PNG")
    return buf.getvalue()


def _jpeg(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def test_images_sent_encoded_equal_infer_on_the_files(server, model, tmp_path):
    """PNG and JPEG files of several sizes, grey and colour, sent as BYTES: the scores equal
    `toolkit infer` on the same files; PNGs of the input's size equal its pixels given as FP32."""
    rng = np.random.default_rng(1)
    from toolkit.training.data import load_digits
    digits, _ = load_digits()
    files = []
    for i in range(4):
        grey = np.kron(digits[i, 0] * 15, np.ones((3, 3))).astype(np.uint8)        # 24 x 24
        files.append(tmp_path / f"{i}.png")
        files[-1].write_bytes(_png(grey))
    colour = (rng.random((30, 20, 3)) * 255).astype(np.uint8)
    files.append(tmp_path / "4.jpg")
    files[-1].write_bytes(_jpeg(colour))
    encoded = [f.read_bytes() for f in files]

    client = http.InferenceServerClient(url=server.url)
    got = client.infer("lenet", [_images(encoded)]).as_numpy("prob")

    proc = subprocess.run([sys.executable, "-m", "toolkit.cli", "infer", "zoo:lenet", "--input", *map(str, files),
                           "--output", str(tmp_path / "out.npz")], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    want = np.load(tmp_path / "out.npz")["prob"]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    # an independent reading: 8 x 8 grey PNGs hold the input's pixels exactly (no resize to differ on)
    exact = [(digits[i, 0] * 15).astype(np.uint8) for i in range(10, 13)]
    got = client.infer("lenet", [_images([_png(a) for a in exact])]).as_numpy("prob")
    reference = model.infer(data=np.stack(exact).astype(np.float32)[:, None])["prob"]
    np.testing.assert_allclose(got, reference, rtol=1e-6, atol=1e-7)
    # the images and the classification in one request, as Triton's image client asks
    out = http.InferRequestedOutput("prob", binary_data=True, class_count=2)
    entries = _parse(client.infer("lenet", [_images(encoded)], outputs=[out]).as_numpy("prob"))
    assert [row[0][1] for row in entries] == want.argmax(axis=1).tolist()


def _png_claiming(width: int, height: int) -> bytes:
    """A PNG whose header claims width x height pixels (its data is a few bytes)."""
    data = _png(np.zeros((2, 2), np.uint8))
    ihdr = struct.pack(">II", width, height) + data[24:29]
    chunk = b"IHDR" + ihdr
    return data[:12] + chunk + struct.pack(">I", zlib.crc32(chunk)) + data[33:]


def _post(server, inputs: list[dict], binary: bytes) -> tuple[int, dict]:
    head = json.dumps({"inputs": inputs}).encode()
    return server.post("/v2/models/lenet/infer", head + binary,
                       {"Inference-Header-Content-Length": str(len(head)), "Content-Type": "application/octet-stream"})


def _framed(*elements: bytes) -> bytes:
    return b"".join(len(e).to_bytes(4, "little") + e for e in elements)


def test_bad_images_and_bytes_are_one_line_400s(server):
    client = http.InferenceServerClient(url=server.url)
    good = _png(np.zeros((8, 8), np.uint8))
    cases = [([b"not an image at all"], None, "input 'data' image 0: not a readable image"),
             ([good, good[:40]], None, "input 'data' image 1: not a readable image"),
             ([_png_claiming(100_000, 100_000)], None, "over the limit"),
             ([good, good], [1, 2], "encoded images come as BYTES of shape [N]"),
             ([b""], None, "input 'data' image 0: empty"),
             ([good] * 65, None, "65 images, at most 64 (the largest bucket) are decoded per request")]
    for encoded, shape, message in cases:
        with pytest.raises(http.InferenceServerException) as e:
            client.infer("lenet", [_images(encoded, shape=shape)])
        assert e.value.status() == "400" and message in e.value.message(), (message, e.value.message())
        assert "\n" not in e.value.message()
    # lengths that lie, by raw HTTP: past the data, and bytes left over
    framed = _framed(good)
    for binary, message in [(framed[:-5], "element 0 says"), (framed + b"xyz", "3 bytes of binary data after"),
                            (b"\x01\x00", "cannot hold the 1 BYTES elements")]:
        status, body = _post(server, [{"name": "data", "shape": [1], "datatype": "BYTES",
                                       "parameters": {"binary_data_size": len(binary)}}], binary)
        assert status == 400 and message in body["error"], (message, body)
    # JSON strings are not image files; an unknown datatype; a classification that is no count
    status, body = server.post("/v2/models/lenet/infer", json.dumps(
        {"inputs": [{"name": "data", "shape": [1], "datatype": "BYTES", "data": ["abc"]}]}).encode())
    assert status == 400 and "not a readable image" in body["error"], body
    status, body = server.post("/v2/models/lenet/infer", json.dumps(
        {"inputs": [{"name": "data", "shape": [1], "datatype": "BYTES", "data": [1]}]}).encode())
    assert status == 400 and "a flat list of strings" in body["error"], body
    x = np.zeros((1, 1, 8, 8), np.float32)
    status, body = server.post("/v2/models/lenet/infer", json.dumps(
        {"inputs": [{"name": "data", "shape": [1, 1, 8, 8], "datatype": "FP32", "data": x.ravel().tolist()}],
         "outputs": [{"name": "prob", "parameters": {"classification": "five"}}]}).encode())
    assert status == 400 and '"classification" must be a non-negative integer' in body["error"], body
    # a body over the server's limit (1 MiB here) is refused like any other: 413
    with pytest.raises(http.InferenceServerException) as e:
        client.infer("lenet", [_images([b"\x89PNG" + bytes(1_100_000)])])
    assert e.value.status() == "413" and "over the limit" in e.value.message(), e.value
    assert server.proc.poll() is None
    assert "Traceback" not in server.log


def test_labels_that_fit_no_output_are_refused_at_start(tmp_path):
    (tmp_path / "nine.txt").write_text("\n".join(NAMES[:9]) + "\n")
    proc = subprocess.run([sys.executable, "-m", "toolkit.cli", "serve", "zoo:lenet", "--port", "0", "--labels",
                           str(tmp_path / "nine.txt")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "9 class names, but the net's class scores have 'prob' 10" in proc.stderr, \
        proc.stderr


@pytest.mark.skipif(not (REAL / "synset_words.txt").is_file(), reason="the real models folder is absent")
def test_real_photo_sent_to_the_server_named_as_infer_names_it(tmp_path):
    """The real SqueezeNet imported with Caffe's preprocessing and class names; Caffe's cat.jpg
    sent encoded with Triton's client asking for the top 5: the same classes, names and scores as
    `toolkit infer cat.jpg --top 5` (kit fox first, as Caffe's own pipeline answers)."""
    out = tmp_path / "sq"
    proc = subprocess.run([sys.executable, "-m", "toolkit.cli", "import", "caffe",
                           str(REAL / "squeezenet_v1.0_deploy.prototxt"), "--weights",
                           str(REAL / "squeezenet_v1.0_deep_compression.caffemodel"), "--out", str(out),
                           "--transform", "caffe-imagenet", "--labels", str(REAL / "synset_words.txt")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    proc = subprocess.run([sys.executable, "-m", "toolkit.cli", "infer", str(out / "net.yaml"), "--weights",
                           str(out / "model.safetensors"), "--input", str(REAL / "cat.jpg"), "--top", "5"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    printed = re.findall(r"^\s+\d\. (\S+)  class (\d+)  (.*)$", proc.stdout, re.M)
    assert len(printed) == 5
    s = Server("--weights", str(out / "model.safetensors"), "--buckets", "1", net=str(out / "net.yaml"))
    try:
        client = http.InferenceServerClient(url=s.url)
        name = client.get_model_metadata("FireNet")["outputs"][0]["name"]
        image = http.InferInput("data", [1], "BYTES")
        image.set_data_from_numpy(np.array([(REAL / "cat.jpg").read_bytes()], dtype=object), binary_data=True)
        result = client.infer("FireNet", [image], outputs=[http.InferRequestedOutput(name, class_count=5)])
        entries = _parse(result.as_numpy(name))[0]
    finally:
        assert s.stop() == 0
    assert [(str(i), label) for _, i, label in entries] == [(i, label) for _, i, label in printed]
    assert entries[0][2] == "n02119789 kit fox, Vulpes macrotis"
    np.testing.assert_allclose([v for v, _, _ in entries], [float(v) for v, _, _ in printed], rtol=1e-5)
