"""Fetching zoo models: from an HTTP server on loopback, a folder and a local git repository;
a tampered file is refused and not kept, a broken transfer is retried or fails cleanly, and the
cache serves offline (every test has its own TOOLKIT_CACHE)."""
from __future__ import annotations

import os
import re
import shutil
import time

import pytest
from zoo_helpers import LENET, NAME, WEIGHTS, cache_folder, git, leftovers, needs_git, row, run

from toolkit import settings
from toolkit.errors import UserError
from toolkit.zoo.card import sha256_file
from toolkit.zoo.resolve import resolve


# -- HTTP ----------------------------------------------------------------------------------------
def test_list_show_get_over_http_then_resolve_uses_the_cache(server, isolated_cache):
    r = run("zoo", "list", "--source", server.url)
    assert r.status == 0, r.err
    assert row(r.out, NAME)[:5] == [NAME, server.url, "accuracy 0.986072", "55.4 kB", "-"]
    assert "lenet" in r.out and "shipped" in r.out              # the shipped zoo is listed too

    r = run("zoo", "show", NAME, "--source", server.url)
    assert r.status == 0, r.err
    assert f"zoo:{NAME}  from {server.url}" in r.out and "not cached yet" in r.out
    assert "accuracy 0.986072 on the test split" in r.out and "BSD-2-Clause" in r.out
    assert "  task:        image classification (10 digits, 8×8 pixels)\n" in r.out     # UTF-8 whatever the server says

    r = run("zoo", "get", f"zoo:{NAME}", "--source", server.url)
    assert r.status == 0, r.err
    folder = cache_folder(isolated_cache, server.url)
    assert f"zoo:{NAME} from {server.url}: {folder}" in r.out
    assert re.search(rf"{WEIGHTS}\s+55.4 kB\s+sha256 3ebca9152455…\s+fetched", r.out), r.out
    assert sha256_file(folder / WEIGHTS) == sha256_file(LENET / WEIGHTS)
    assert leftovers(folder) == []

    hits = len(server.hits)
    model = resolve(f"zoo:{NAME}", [server.url])              # from the cache: no request at all
    assert len(server.hits) == hits
    assert (model.name, model.source, model.dir) == (NAME, server.url, folder)
    assert model.net == folder / "net.yaml" and model.weights == folder / WEIGHTS
    assert model.card.metric.value == 0.986072

    # no source configured: the copy fetched before still serves (its source is remembered)
    assert resolve(f"zoo:{NAME}", []).source == server.url and resolve(f"zoo:{NAME}").dir == folder
    assert len(server.hits) == hits

    r = run("zoo", "get", NAME, "--source", server.url)      # the card again, the weights not
    assert r.status == 0 and re.search(rf"{WEIGHTS}.*cached", r.out), r.out
    assert server.hits[hits:] == [f"/{NAME}/README.md"]
    r = run("zoo", "list", "--source", server.url)
    assert row(r.out, NAME)[4] == "cached"


def test_get_over_http_then_test_and_infer_reproduce_the_card(server, tmp_path):
    """The issue's acceptance in small: `zoo get` from loopback, then `toolkit test zoo:NAME`
    gives the card's metric and `toolkit infer zoo:NAME` the same accuracy, from the cache alone."""
    import json

    import numpy as np

    from toolkit.zoo.card import read_card
    assert run("zoo", "get", NAME, "--source", server.url).status == 0
    server.stop()                                           # everything below runs from the cache
    card, _ = read_card(resolve(f"zoo:{NAME}", []).dir / "README.md")
    r = run("test", f"zoo:{NAME}")
    assert r.status == 0, r.err
    assert json.loads(r.out)[card.metric.name] == pytest.approx(card.metric.value, abs=card.metric.tolerance)
    assert run("data", f"zoo:{NAME}", "--out", tmp_path / "heldout.npz").status == 0
    r = run("infer", f"zoo:{NAME}", "--input", tmp_path / "heldout.npz", "--output", tmp_path / "prob.npz")
    assert r.status == 0, r.err
    prob, label = np.load(tmp_path / "prob.npz")["prob"], np.load(tmp_path / "heldout.npz")["label"]
    assert (prob.argmax(1) == label).mean() == pytest.approx(card.metric.value, abs=1e-6)


def test_get_to_copies_the_files_and_refuses_to_overwrite(server, tmp_path):
    out = tmp_path / "mine"
    r = run("zoo", "get", NAME, "--source", server.url, "--to", out)
    assert r.status == 0, r.err
    assert sorted(p.name for p in out.iterdir()) == ["README.md", WEIGHTS, "net.yaml"]
    (out / "net.yaml").write_text("# mine\n")
    r = run("zoo", "get", NAME, "--source", server.url, "--to", out)
    assert r.status == 2 and "net.yaml already there and different; pass --force" in r.err
    assert (out / "net.yaml").read_text() == "# mine\n"
    r = run("zoo", "get", NAME, "--source", server.url, "--to", out, "--force")
    assert r.status == 0 and (out / "net.yaml").read_bytes() == (LENET / "net.yaml").read_bytes()


def test_a_tampered_file_is_refused_and_not_kept(server, published, isolated_cache):
    weights = published / NAME / WEIGHTS
    data = bytearray(weights.read_bytes())
    data[-100] ^= 0x01
    weights.write_bytes(bytes(data))
    r = run("zoo", "get", NAME, "--source", server.url)
    assert r.status == 2 and "Traceback" not in r.err
    url = f"{server.url}{NAME}/{WEIGHTS}"
    assert (f"error: {url}: sha256 is {sha256_file(weights)}, the card says {sha256_file(LENET / WEIGHTS)}"
            in r.err), r.err
    assert "refused and not kept" in r.err
    folder = cache_folder(isolated_cache, server.url)
    assert not (folder / WEIGHTS).exists() and leftovers(folder) == []
    with pytest.raises(UserError, match="refused"):
        resolve(f"zoo:{NAME}", [server.url])
    assert not (folder / WEIGHTS).exists()


def test_an_interrupted_download_is_retried(server, isolated_cache):
    path = f"/{NAME}/{WEIGHTS}"
    server.faults[path] = "truncate_once"
    model = resolve(f"zoo:{NAME}", [server.url])
    assert server.hits.count(path) == 2                      # cut off once, then whole
    assert sha256_file(model.weights) == sha256_file(LENET / WEIGHTS)
    assert leftovers(model.dir) == []


def test_a_download_that_keeps_breaking_fails_cleanly_then_recovers(server, isolated_cache):
    path = f"/{NAME}/{WEIGHTS}"
    server.faults[path] = "truncate"
    r = run("zoo", "get", NAME, "--source", server.url)
    assert r.status == 2 and "Traceback" not in r.err
    assert (f"error: zoo:{NAME}: fetching {WEIGHTS} failed twice: {server.url}{NAME}/{WEIGHTS}: the transfer "
            "broke off (") in r.err and "nothing was kept" in r.err
    folder = cache_folder(isolated_cache, server.url)
    assert not (folder / WEIGHTS).exists() and leftovers(folder) == []
    # a fetch killed outright leaves pooch's temporary file (or the card's); the next fetch sweeps
    # them once stale
    for stale in (folder / "tmpabcd1234", folder / ".README.md.abcd_123.md"):
        stale.write_bytes(b"half a file")
        os.utime(stale, (time.time() - 3600, time.time() - 3600))
    del server.faults[path]
    r = run("zoo", "get", NAME, "--source", server.url)
    assert r.status == 0, r.err
    assert sha256_file(folder / WEIGHTS) == sha256_file(LENET / WEIGHTS)
    assert leftovers(folder) == []


def test_offline_the_cache_serves(server, isolated_cache):
    assert run("zoo", "get", NAME, "--source", server.url).status == 0
    r = run("zoo", "list", "--source", server.url)
    server.stop()
    folder = cache_folder(isolated_cache, server.url)
    model = resolve(f"zoo:{NAME}", [server.url])
    assert model.weights == folder / WEIGHTS
    r = run("zoo", "get", NAME, "--source", server.url)
    assert r.status == 0, r.err
    assert re.fullmatch(rf"note: {re.escape(server.url)}{NAME}/README.md: cannot reach the server \(.*\); "
                        rf"using the card of {NAME} fetched earlier\n", r.err), r.err
    r = run("zoo", "list", "--source", server.url)
    assert r.status == 0 and "using the index fetched earlier" in r.err
    assert row(r.out, NAME)[:2] == [NAME, server.url]
    # a damaged cached file cannot be fetched again while offline: an error that says both
    data = bytearray((folder / WEIGHTS).read_bytes())
    data[-1] ^= 0xFF
    (folder / WEIGHTS).write_bytes(bytes(data))
    with pytest.raises(UserError) as e:
        resolve(f"zoo:{NAME}", [server.url])
    message = str(e.value)
    assert f"zoo:{NAME}: the cached {folder / WEIGHTS} has sha256 " in message
    assert f"fetching it again failed twice: {server.url}{NAME}/{WEIGHTS}: cannot reach the server" in message
    assert not (folder / WEIGHTS).exists()                   # nothing that fails its card stays


def test_a_damaged_cache_file_is_fetched_again(server, isolated_cache):
    assert run("zoo", "get", NAME, "--source", server.url).status == 0
    folder = cache_folder(isolated_cache, server.url)
    (folder / WEIGHTS).write_bytes(b"not the weights")
    model = resolve(f"zoo:{NAME}", [server.url])
    assert sha256_file(model.weights) == sha256_file(LENET / WEIGHTS)
    (folder / WEIGHTS).write_bytes(b"not the weights")
    r = run("zoo", "verify", f"zoo:{NAME}", "--no-test", "--source", server.url)
    assert r.status == 0 and f"note: zoo:{NAME}: " in r.err and f"fetched it again from {server.url}" in r.err


def test_a_damaged_cache_with_no_source_to_refetch_from_says_how_to_get_it(server, isolated_cache):
    assert run("zoo", "get", NAME, "--source", server.url).status == 0
    (cache_folder(isolated_cache, server.url) / WEIGHTS).unlink()
    r = run("test", f"zoo:{NAME}")                         # TOOLKIT_ZOO is not set
    assert r.status == 2 and "Traceback" not in r.err
    assert r.err.strip() == (f"error: zoo:{NAME}: the cached copy from {server.url} is incomplete or damaged and "
                             "cannot be fetched again from the sources now configured; run `toolkit zoo get "
                             f"{NAME} --source {server.url}` when it can be reached")


def test_unknown_models_and_unreachable_sources(server, tmp_path):
    r = run("zoo", "get", "digitnett", "--source", server.url)
    assert r.status == 2
    assert r.err.strip().endswith(f"error: zoo:digitnett: no model named 'digitnett' in the shipped zoo "
                                  "(branchnet, gru_digits, lenet, mlp, resnet, transformer_digits) "
                                  f"or in the sources ({server.url})")
    # TOOLKIT_ZOO: comma-separated; a missing folder is noted and the next source still serves
    with settings.use(zoo=f"{tmp_path / 'nowhere'},{server.url}"):
        model = resolve(f"zoo:{NAME}")
    assert model.source == server.url
    server.stop()
    with settings.use(zoo=server.url):
        r = run("zoo", "get", "other", )
    assert r.status == 2 and "could not reach" in r.err and "cannot reach the server" in r.err
    for bad, words in (("ftp://host/zoo", "unsupported URL scheme 'ftp'"), ("http://", "the URL has no host")):
        r = run("zoo", "list", "--source", bad)
        assert r.status == 2 and f"error: zoo source '{bad}': {words}" in r.err and "Traceback" not in r.err
    with settings.use(zoo="ftp://host/zoo"):
        r = run("zoo", "list")
    assert r.status == 2 and r.err.startswith("error: TOOLKIT_ZOO: zoo source 'ftp://host/zoo': unsupported")


# -- folders and git ----------------------------------------------------------------------------
def test_folder_source_copies_into_the_cache_by_sha256(published, isolated_cache):
    model = resolve(f"zoo:{NAME}", [f"file://{published}"])
    assert model.source == str(published) and model.dir.is_relative_to(isolated_cache)
    assert sha256_file(model.weights) == sha256_file(LENET / WEIGHTS)
    # a changed file in the folder no longer matches its card: refused, by its sha256 when it
    # kept its size, as soon as it passes the card's size when it grew
    net = published / NAME / "net.yaml"
    original = net.read_text()
    net.write_text(original.replace("name:", "Name:", 1))
    shutil.rmtree(model.dir)
    r = run("zoo", "get", NAME, "--source", published)
    assert r.status == 2 and f"{net}: sha256 is" in r.err, r.err
    assert not (model.dir / "net.yaml").exists()
    net.write_text(original + "# changed\n")
    r = run("zoo", "get", NAME, "--source", published)
    assert r.status == 2 and r.err == (f"error: {net}: more than the {len(original)} bytes its card says; "
                                       "the file was refused and not kept\n"), r.err
    assert not (model.dir / "net.yaml").exists() and leftovers(model.dir) == []


@pytest.fixture
def repo(tmp_path, published_template):
    repo = tmp_path / "repo"
    shutil.copytree(published_template, repo)
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "publish")
    git(repo, "tag", "v1")
    return repo


@needs_git
def test_git_source(repo, tmp_path):
    source = f"git+{repo}"
    r = run("zoo", "get", NAME, "--source", source)
    assert r.status == 0, r.err
    assert f"zoo:{NAME} from {source}:" in r.out and re.search(rf"{WEIGHTS}.*fetched", r.out)
    # a new commit is seen on the next get; a tag pins the old one
    card = repo / NAME / "README.md"
    card.write_text(card.read_text().replace("description: ", "description: Updated. ", 1))
    git(repo, "commit", "-q", "-am", "describe")
    r = run("zoo", "show", NAME, "--source", source)
    assert r.status == 0 and "description: Updated." in r.out, r.out
    r = run("zoo", "show", NAME, "--source", f"git+file://{repo}@v1")
    assert r.status == 0 and "Updated." not in r.out
    # offline (the repository is gone): the checkout fetched before serves, with a notice
    shutil.move(repo, tmp_path / "elsewhere")
    r = run("zoo", "get", NAME, "--source", source)
    assert r.status == 0, r.err
    assert r.err.startswith(f"note: {source}: cannot fetch (") and "using the copy fetched earlier" in r.err
    never = tmp_path / "never"
    r = run("zoo", "get", "other", "--source", f"git+{never}")
    assert r.status == 2 and "Traceback" not in r.err
    assert (f"note: zoo source git+{never}: git cannot fetch it ('{never}' does not appear to be a git "
            "repository)") in r.err
    assert "error: zoo:other: no model named 'other'" in r.err and f"could not reach git+{never}" in r.err


@needs_git
def test_git_missing_is_a_clear_error(repo, monkeypatch):
    monkeypatch.setenv("PATH", "")
    r = run("zoo", "get", NAME, "--source", f"git+{repo}")
    assert r.status == 2
    assert r.err.strip().splitlines()[-1].startswith("error: git+ zoo sources need the git program")
