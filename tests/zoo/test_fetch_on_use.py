"""A model from a source is fetched file by file as a command needs it: its net when it is
loaded, its weights for a test or an inference, the data it bundles (``publish --bundle-data``)
for a train, a test or ``toolkit data``, each checked by sha256 like any fetch, and each fetch
said in one line with the sizes. And a net built on a zoo model is published with a description
of its own, never the banner of its rendered net file."""
from __future__ import annotations

import json
from decimal import Decimal

import numpy as np
import pytest
from zoo_helpers import run

from toolkit import settings
from toolkit.training.data import load_digits
from toolkit.zoo.card import read_card
from toolkit.zoo.sources import parse_source

NAME = "lenet-npz"
BASED = """\
base: zoo:lenet                  # the shipped LeNet, on data of its own
name: {name}
train:
  data: {{source: train.npz, test_source: test.npz}}
  max_iter: 20
"""
PUBLISH = ("--licence", "MIT", "--task", "digits")


@pytest.fixture(scope="module")
def bundled(tmp_path_factory):
    """A zoo folder holding NAME: a net built on zoo:lenet, trained on .npz files and published
    with --bundle-data and no draft card; and the training folder."""
    work = tmp_path_factory.mktemp("work")
    x, y = load_digits()
    np.savez(work / "train.npz", data=x[:400], label=y[:400])
    np.savez(work / "test.npz", data=x[400:500], label=y[400:500])
    (work / "net.yaml").write_text(BASED.format(name=NAME))
    with settings.use(cache=work / "cache", zoo=()):
        assert run("train", work / "net.yaml", "--out", work / "run").status == 0
        r = run("zoo", "publish", work / "run", "--to", work / "zoo", *PUBLISH, "--bundle-data")
    assert r.status == 0, r.err
    return work / "zoo", work


def cached(cache, zoo) -> set[str]:
    folder = cache / "zoo" / parse_source(str(zoo)).slug / NAME
    return {p.name for p in folder.iterdir()} if folder.is_dir() else set()


def fetching(zoo, *files) -> str:
    """The note of a fetch of ``files`` (each over 1 kB), with the sizes their card gives."""
    card, _ = read_card(zoo / NAME / "README.md")
    size = {f.file: f"{Decimal(f.bytes) / 1000:.1f} kB" for f in card.files}
    return f"note: zoo:{NAME}: fetching {', '.join(f'{f} ({size[f]})' for f in files)} from {zoo}\n"


def test_a_test_fetches_the_bundled_data_and_the_weights_on_first_use(bundled, isolated_cache):
    zoo, _work = bundled
    with settings.use(zoo=(str(zoo),)):
        r = run("test", f"zoo:{NAME}")
        assert r.status == 0, r.err
        assert json.loads(r.out)["examples"] == 100
        # one line per fetch, with the sizes; nothing said "missing" of a file never fetched
        assert r.err == (fetching(zoo, "net.yaml") + fetching(zoo, "data.npz", "test.npz")
                         + fetching(zoo, "model.safetensors")), r.err
        again = run("test", f"zoo:{NAME}")
    assert again.status == 0 and again.out == r.out and again.err == "", again.err


def test_the_weights_fetched_after_the_net_are_not_called_missing(published, isolated_cache):
    """The shipped LeNet published as NAME (no bundled data): a test fetches the net, then the
    weights; each fetch is one note with the size, and nothing is "missing" or "fetched again"."""
    from zoo_helpers import NAME as LENET_NAME
    card, _ = read_card(published / LENET_NAME / "README.md")
    size = {f.file: f"{Decimal(f.bytes) / 1000:.1f} kB" for f in card.files}
    with settings.use(zoo=(str(published),)):
        r = run("test", f"zoo:{LENET_NAME}")
    assert r.status == 0, r.err
    assert r.err == (f"note: zoo:{LENET_NAME}: fetching net.yaml ({size['net.yaml']}) from {published}\n"
                     f"note: zoo:{LENET_NAME}: fetching model.safetensors ({size['model.safetensors']}) "
                     f"from {published}\n"), r.err


def test_a_train_fetches_the_data_not_the_weights(bundled, isolated_cache, tmp_path):
    zoo, _work = bundled
    with settings.use(zoo=(str(zoo),)):
        r = run("train", f"zoo:{NAME}", "--set", "train.max_iter=2", "--out", tmp_path / "run")
    assert r.status == 0, r.err
    assert "missing" not in r.err
    assert cached(isolated_cache, zoo) == {"README.md", "net.yaml", "data.npz", "test.npz"}


def test_data_and_infer_fetch_only_what_they_read(bundled, isolated_cache, tmp_path):
    zoo, _work = bundled
    with settings.use(zoo=(str(zoo),)):
        r = run("infer", f"zoo:{NAME}", "--input", bundled[1] / "test.npz", "--output", tmp_path / "scores.npz")
        assert r.status == 0, r.err
        assert cached(isolated_cache, zoo) == {"README.md", "net.yaml", "model.safetensors"}
        r = run("data", f"zoo:{NAME}", "--split", "test", "--out", tmp_path / "test.npz")
    assert r.status == 0 and r.out == f"wrote {tmp_path / 'test.npz'}: 100 examples of data, label\n", r.err
    assert "data.npz" in cached(isolated_cache, zoo)


def test_a_net_built_on_the_model_reads_its_bundled_data(bundled, isolated_cache, tmp_path):
    zoo, _work = bundled
    (tmp_path / "child.yaml").write_text(f"base: zoo:{NAME}\nname: child\ntrain: {{max_iter: 2}}\n")
    with settings.use(zoo=(str(zoo),)):
        r = run("train", tmp_path / "child.yaml", "--out", tmp_path / "run")
    assert r.status == 0, r.err
    assert {"data.npz", "test.npz"} <= cached(isolated_cache, zoo)


def test_bundled_data_that_fails_its_card_is_refused(bundled, isolated_cache, tmp_path):
    import shutil
    zoo = tmp_path / "zoo"
    shutil.copytree(bundled[0], zoo)
    data = bytearray((zoo / NAME / "test.npz").read_bytes())
    data[-1] ^= 0xFF
    (zoo / NAME / "test.npz").write_bytes(bytes(data))
    with settings.use(zoo=(str(zoo),)):
        r = run("test", f"zoo:{NAME}")
    assert r.status == 2 and "Traceback" not in r.err
    assert f"error: {zoo / NAME / 'test.npz'}: sha256 is " in r.err and "the file was refused and not kept" in r.err
    assert "test.npz" not in cached(isolated_cache, zoo)


def test_a_based_net_is_published_with_its_own_description(bundled, tmp_path):
    """No draft card: the description is the net's own first comment, else the base's card's,
    never the banner that says the run's net.yaml was rendered."""
    zoo, work = bundled
    card, _ = read_card(zoo / NAME / "README.md")
    assert card.description == f"{NAME}, built on zoo:lenet: A LeNet-style CNN for the 8x8 handwritten digits"
    assert "rendered" in (work / "run" / "net.yaml").read_text()
    (tmp_path / "net.yaml").write_text("# LeNet on my own digits\n" + BASED.format(name="mine"))
    for f in ("train.npz", "test.npz"):
        (tmp_path / f).write_bytes((work / f).read_bytes())
    assert run("train", tmp_path / "net.yaml", "--out", tmp_path / "run", "--set", "train.max_iter=2").status == 0
    r = run("zoo", "publish", tmp_path / "run", "--to", tmp_path / "zoo", *PUBLISH, "--bundle-data")
    assert r.status == 0, r.err
    assert read_card(tmp_path / "zoo" / "mine" / "README.md")[0].description == "LeNet on my own digits"


def test_a_file_not_fetched_yet_from_a_source_gone_says_so(bundled, isolated_cache, tmp_path):
    import shutil
    zoo = tmp_path / "zoo"
    shutil.copytree(bundled[0], zoo)
    with settings.use(zoo=(str(zoo),)):
        assert run("data", f"zoo:{NAME}", "--split", "test", "--out", tmp_path / "test.npz").status == 0
        shutil.rmtree(zoo)
        r = run("infer", f"zoo:{NAME}", "--input", tmp_path / "test.npz", "--output", tmp_path / "scores.npz")
    assert r.status == 2 and "Traceback" not in r.err
    assert r.err.splitlines()[-1] == f"error: zoo:{NAME}: model.safetensors not fetched yet, and zoo source {zoo}: " \
        "no such folder", r.err
    assert "missing" not in r.err
