"""`toolkit infer` inputs beyond .npy/.npz: CSV rows and image files, stacked along the batch."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from toolkit.cli import main
from toolkit.training.data import load_digits

ROOT = Path(__file__).resolve().parents[2]
LENET = str(ROOT / "zoo" / "lenet" / "net.yaml")
WEIGHTS = str(ROOT / "zoo" / "lenet" / "model.safetensors")


def infer(tmp_path, *inputs) -> tuple[int, np.ndarray | None, str]:
    out = tmp_path / "out.npz"
    import contextlib
    import io
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        flags = [part for item in inputs for part in ("--input", item)]
        status = main(["infer", LENET, "--weights", WEIGHTS, "--output", str(out), *flags])
    prob = np.load(out)["prob"] if status == 0 else None
    return status, prob, err.getvalue()


def reference(tmp_path, x: np.ndarray) -> np.ndarray:
    np.save(tmp_path / "x.npy", x.astype(np.float32))
    status, prob, err = infer(tmp_path, str(tmp_path / "x.npy"))
    assert status == 0, err
    return prob


def test_csv_rows_take_the_input_shape(tmp_path):
    x, _ = load_digits()
    x = x[:7] / 16
    np.savetxt(tmp_path / "rows.csv", x.reshape(7, 64), delimiter=",", header=",".join(f"p{i}" for i in range(64)),
               comments="")
    status, prob, err = infer(tmp_path, str(tmp_path / "rows.csv"))
    assert status == 0, err
    np.testing.assert_allclose(prob, reference(tmp_path, x), rtol=1e-5, atol=1e-6)


def test_images_stack_along_the_batch(tmp_path):
    from PIL import Image
    x, _ = load_digits()
    paths = []
    for i in range(3):
        path = tmp_path / f"digit{i}.png"
        Image.fromarray(x[i, 0].astype(np.uint8)).save(path)   # 8x8, the input's own size
        paths.append(f"data={path}")
    status, prob, err = infer(tmp_path, *paths)
    assert status == 0, err
    assert prob.shape == (3, 10)
    np.testing.assert_allclose(prob, reference(tmp_path, x[:3]), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("make,words", [
    (lambda d: (d / "a.csv").write_text("1,2,3\n"), ("do not fit", "[3]", "[1, 8, 8]")),
    (lambda d: (d / "a.csv").write_text("x,y\n"), ("has a header but no data rows",)),
    (lambda d: (d / "a.csv").write_text(""), ("the CSV file is empty",)),
    (lambda d: (d / "a.csv").write_text("1,2\n3\n"), ("different numbers of columns", "line 2 has 1")),
    (lambda d: (d / "a.png").write_bytes(b"not an image"), ("not a readable image",)),
])
def test_bad_csv_or_image_is_a_one_line_error(tmp_path, make, words):
    make(tmp_path)
    name = next(p for p in tmp_path.iterdir() if p.suffix in (".csv", ".png"))
    status, _, err = infer(tmp_path, str(name))
    assert status == 2 and "Traceback" not in err
    line = err.strip().splitlines()[-1]
    assert line.startswith("error:") and all(w in line for w in words), line


def test_the_same_input_twice_is_an_error(tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((1, 1, 8, 8), np.float32))
    status, _, err = infer(tmp_path, f"data={tmp_path / 'x.npy'}", f"data={tmp_path / 'x.npy'}")
    assert status == 2 and "given twice" in err
