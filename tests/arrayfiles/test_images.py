"""toolkit.arrayfiles' image reader against PNGs written by PIL: grey and RGB, resized, as float32
[C, H, W]; folders in the order of their names; and the refusals, one UserError each."""
from __future__ import annotations

import numpy as np
import pytest

from toolkit.arrayfiles import ImageRows, image_files, image_layout, read_image
from toolkit.errors import UserError

Image = pytest.importorskip("PIL.Image", reason="images need pillow")


def png(path, pixels) -> str:
    Image.fromarray(np.asarray(pixels, np.uint8)).save(path)
    return str(path)


def test_grey_and_rgb_as_channels_first_float32(tmp_path):
    grey = np.arange(12).reshape(3, 4) * 20
    got = read_image(png(tmp_path / "g.png", grey), (1, 3, 4))
    assert got.dtype == np.float32 and got.shape == (1, 3, 4)
    np.testing.assert_array_equal(got[0], grey)
    rgb = np.arange(2 * 3 * 3).reshape(2, 3, 3) * 9
    got = read_image(png(tmp_path / "c.png", rgb), (3, 2, 3))
    np.testing.assert_array_equal(got, rgb.transpose(2, 0, 1))


def test_converted_and_resized_to_the_layout(tmp_path):
    path = png(tmp_path / "big.png", np.full((6, 8, 3), 77))
    np.testing.assert_array_equal(read_image(path, (3, 2, 3)), np.full((3, 2, 3), 77))
    assert read_image(path, (1, 5, 7)).shape == (1, 5, 7)                         # RGB to grey, resized


def test_a_folder_in_the_order_of_names_skipping_what_is_not_an_image(tmp_path):
    for i in (2, 0, 1):
        png(tmp_path / f"{i}.png", np.full((2, 2), i))
    (tmp_path / "notes.txt").write_text("not an image")
    png(tmp_path / ".hidden.png", np.zeros((2, 2)))
    (tmp_path / "sub.png").mkdir()
    paths = image_files(str(tmp_path))
    assert [p.rsplit("/", 1)[-1] for p in paths] == ["0.png", "1.png", "2.png"]
    rows = ImageRows(paths, (1, 2, 2))
    assert rows.rows == 3 and rows.row_shape == (1, 2, 2) and rows.dtype == np.float32
    np.testing.assert_array_equal(rows.read(1, 3)[:, 0, 0, 0], [1, 2])
    assert rows.read(2, 2).shape == (0, 1, 2, 2)


@pytest.mark.parametrize("data", [b"not an image", b"\x89PNG\r\n\x1a\n truncated"])
def test_a_file_that_is_not_a_readable_image(tmp_path, data):
    path = tmp_path / "bad.png"
    path.write_bytes(data)
    with pytest.raises(UserError) as e:
        read_image(str(path), (1, 2, 2))
    assert str(e.value).startswith(f"error: {path}: not a readable image (") and "\n" not in str(e.value)


@pytest.mark.parametrize("shape", [("N", 2, 4, 4), ("N", 16), ("N", 1, "H", 4)])
def test_inputs_images_cannot_feed(shape):
    with pytest.raises(UserError) as e:
        image_layout("imgs", "data", shape)
    dims = ", ".join(str(d) for d in shape)
    assert str(e.value) == (f"error: imgs: images feed an input shaped [N, 1 or 3, H, W] with fixed sizes; "
                            f"input 'data' is [{dims}]")
    assert image_layout("imgs", "data", ("N", 3, 5, 6)) == (3, 5, 6)


def test_a_folder_that_is_not_there(tmp_path):
    with pytest.raises(UserError, match=r"no-such: cannot read the folder \(No such file or directory\)$"):
        image_files(str(tmp_path / "no-such"))
