"""toolkit.arrayfiles' numeric CSV reader against real files: the header row, blank lines, row
ranges in and out of order, and each refusal as one UserError naming the file and the line."""
from __future__ import annotations

import os

import numpy as np
import pytest

from toolkit.arrayfiles import CsvRows
from toolkit.errors import UserError


def write(tmp_path, text: str | bytes):
    path = tmp_path / "t.csv"
    path.write_bytes(text) if isinstance(text, bytes) else path.write_text(text)
    return path


def refusal(path) -> str:
    with pytest.raises(UserError) as e:
        CsvRows(str(path)).read_all()
    message = str(e.value)
    assert "\n" not in message and message.startswith(f"error: {path}: "), message
    return message


def test_a_first_row_of_names_is_the_header(tmp_path):
    table = CsvRows(str(write(tmp_path, "a,b,label\n1,2,0\n\n3.5,-4e1,1\n")))
    assert table.header == ["a", "b", "label"] and table.rows == 2 and table.columns == 3
    assert table.row_shape == (3,) and table.dtype == np.float32
    np.testing.assert_array_equal(table.read_all(), np.array([[1, 2, 0], [3.5, -40, 1]], np.float32))
    table.close()


def test_without_a_header_every_row_is_data(tmp_path):
    table = CsvRows(str(write(tmp_path, "1,2\n3,4\n5,6\n7,8\n")), np.float64)
    assert table.header is None and table.rows == 4 and table.dtype == np.float64
    np.testing.assert_array_equal(table.read(2, 4), [[5, 6], [7, 8]])
    np.testing.assert_array_equal(table.read(0, 1), [[1, 2]])          # back: the file starts again
    np.testing.assert_array_equal(table.read(1, 3), [[3, 4], [5, 6]])
    assert table.read(3, 3).shape == (0, 2)
    table.close()


@pytest.mark.parametrize("text, message", [
    ("", "the CSV file is empty"),
    ("\n\n", "the CSV file is empty"),
    ("x,y\n", "the CSV file has a header but no data rows"),
    ("1,2,3\n4,5,6\n7,8\n", "the CSV rows have different numbers of columns (line 3 has 2, the first row has 3)"),
    ("a,b,c\n\n1,2,3,4\n", "the CSV rows have different numbers of columns (line 3 has 4, the header has 3)"),
    ("1,2\n3,x\n", "non-numeric value in the CSV (line 2: could not convert string to float: 'x')"),
    (b"1,2\n\xff\xfe,3\n", "not a readable CSV file ('utf-8' codec can't decode byte 0xff"),
])
def test_refusals(tmp_path, text, message):
    path = write(tmp_path, text)
    assert f"{path}: {message}" in refusal(path)


def test_a_file_that_changes_while_its_rows_are_read(tmp_path):
    path = write(tmp_path, "1,2\n3,4\n5,6\n")
    table = CsvRows(str(path))
    path.write_text("1,2\n")
    with pytest.raises(UserError, match=r"t.csv: not a readable CSV file \(it changed while being read\)$"):
        table.read(0, 3)
    table.close()


def test_no_such_file_and_not_a_regular_file(tmp_path):
    assert refusal(tmp_path / "no.csv").endswith("no.csv: no such file")
    os.mkfifo(tmp_path / "pipe.csv")                    # opening it to scan would wait forever
    assert refusal(tmp_path / "pipe.csv").endswith("pipe.csv: is not a regular file (it is a FIFO)")
