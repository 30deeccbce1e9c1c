"""LMDB records and image lists that lie: records of two shapes, a label past Caffe's int32, a
PNG record claiming 14,000 x 14,000 pixels (PIL's DecompressionBombError), a record that is no
image (PIL named its BytesIO object, not the database), an image-list label of 10^23 or of 5,000
digits. Each is one `error:` line naming the database and the record (or the list's line), exit
2, within seconds under an address-space limit."""
from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest

from tests.bounded import ROOT, run_toolkit
from tests.train.caffe_records import datum, varint
from toolkit.training.sources import parse_datum

LENET = (ROOT / "zoo" / "lenet" / "net.yaml").read_text()
MEMORY_MB = 1000
DIGIT = np.zeros((1, 8, 8), np.uint8)          # LeNet's input here: [N, 1, 8, 8]


def train_on(tmp_path, source: str):
    (tmp_path / "net.yaml").write_text(LENET.replace('source: "builtin:digits"', f"source: {source}"))
    return run_toolkit("train", "net.yaml", "--out", "run", "--set", "train.max_iter=2",
                       "--set", "train.test_interval=2", memory_mb=MEMORY_MB, timeout=30, cwd=tmp_path)


def refused(r, said: str) -> None:
    assert r.status == 2 and r.lines == [f"error: {said}"], r.err
    assert r.seconds < 30


def lmdb_of(tmp_path, records: list[bytes]) -> str:
    lmdb = pytest.importorskip("lmdb", reason="the caffe extra (lmdb) reads LMDB sources")
    env = lmdb.open(str(tmp_path / "db"), map_size=1 << 24)
    with env.begin(write=True) as txn:
        for i, record in enumerate(records):
            txn.put(b"%03d" % i, record)
    env.close()
    return "db"


def png(width: int, height: int, rows: int) -> bytes:
    """A grey PNG whose header says width x height, holding the pixels of its first ``rows`` rows."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    pixels = zlib.compress(b"".join(b"\0" + bytes(width) for _ in range(rows)))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", pixels) + chunk(b"IEND", b""))


def encoded(image: bytes, label: int = 1) -> bytes:
    """A Datum of 1 x 8 x 8 whose data is an encoded image (field 7, encoded, true)."""
    return (b"\x08\x01\x10\x08\x18\x08\x22" + varint(len(image)) + image + b"\x28" + varint(label) + b"\x38\x01")


def test_records_of_two_shapes_are_refused_naming_both(tmp_path):
    db = lmdb_of(tmp_path, [datum(DIGIT, 1)] * 20 + [datum(np.zeros((1, 9, 9), np.uint8), 1)] * 20)
    refused(train_on(tmp_path, db), "db: record b'020' is 1 x 9 x 9 but the first record (b'000') is 1 x 8 x 8; "
                                    "a database's records share one shape")


def test_a_leveldb_is_held_to_the_same_rules(tmp_path):
    plyvel = pytest.importorskip("plyvel", reason="the caffe extra (plyvel) reads LevelDB sources")
    db = plyvel.DB(str(tmp_path / "db"), create_if_missing=True)
    for i, record in enumerate([datum(DIGIT, 1)] * 20 + [encoded(b"no image at all")] * 20):
        db.put(b"%03d" % i, record)
    db.close()
    refused(train_on(tmp_path, "db"), "db: record b'020': not an image in a format Pillow reads (PNG, JPEG, ...)")


def test_a_label_past_int32_is_refused(tmp_path):
    db = lmdb_of(tmp_path, [datum(DIGIT, 1)] * 20 + [datum(DIGIT, 1 << 40)] * 20)
    refused(train_on(tmp_path, db), "db: record b'020' is not a Caffe Datum (a label of 1099511627776, past "
                                    "Datum.label's int32)")


def test_negative_labels_still_read_as_caffe_writes_them():
    # Caffe writes an int32 -1 as a varint of 2^64 - 1 (sign-extended): it is -1, not past int32
    assert parse_datum(datum(DIGIT, -1))["label"] == -1
    assert parse_datum(datum(DIGIT, -(1 << 31)))["label"] == -(1 << 31)
    with pytest.raises(ValueError, match="past Datum.label's int32"):
        parse_datum(datum(DIGIT, -(1 << 31) - 1))


def test_a_png_record_claiming_196_million_pixels_is_refused_before_decoding(tmp_path):
    bomb = png(14_000, 14_000, rows=1)              # PIL's own check raised DecompressionBombError
    assert len(bomb) < 200
    db = lmdb_of(tmp_path, [encoded(png(8, 8, 8))] * 20 + [encoded(bomb)] * 20)
    refused(train_on(tmp_path, db), "db: record b'020': an image of 14000 x 14000 pixels (196,000,000), over the "
                                    "limit of 89,478,485 (set TOOLKIT_MAX_IMAGE_PIXELS to raise it)")


def test_encoded_records_that_are_images_train(tmp_path):
    db = lmdb_of(tmp_path, [encoded(png(8, 8, 8), label=i % 10) for i in range(40)])
    r = train_on(tmp_path, db)
    assert r.status == 0, r.err


def test_a_record_that_is_no_image_names_the_database_and_the_record(tmp_path):
    db = lmdb_of(tmp_path, [encoded(b"no image at all")] * 20)
    refused(train_on(tmp_path, db), "db: record b'000': not an image in a format Pillow reads (PNG, JPEG, ...)")


@pytest.mark.parametrize("label, said", [
    ("100000000000000000000000", "100000000000000000000000"),
    ("3000000000", "3000000000"),
    ("9" * 5000, "999999999999...(5000 digits)"),
])
def test_an_image_list_label_past_int32_is_refused_at_its_line(tmp_path, label, said):
    (tmp_path / "a.png").write_bytes(png(8, 8, 8))
    (tmp_path / "list.txt").write_text("a.png 1\n" * 10 + f"a.png {label}\n")
    refused(train_on(tmp_path, "list.txt"), f"list.txt:11: the label {said} is not a 32-bit integer (Caffe's "
                                            "labels are int32)")
