"""Sources that try to harm: answers without end, gzip bombs and slow drips over HTTP, symbolic
links, devices and FIFOs in folders and git checkouts, a full disk. Each ends within seconds in
one `error:` line, exit 2 (a note where a source counts as unreachable), with the cache small."""
from __future__ import annotations

import errno
import json
import os
import resource
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from zoo_helpers import LENET, NAME, ROOT, WEIGHTS, Result, cache_folder, git, leftovers, needs_git, row, run

from schemas.card import ModelCard
from toolkit.zoo import cache as zoo_cache
from toolkit.zoo import card as zoo_card
from toolkit.zoo import transfer
from toolkit.zoo.card import read_card, sha256_file, write_card
from toolkit.zoo.resolve import resolve
from toolkit.zoo.sources import FolderSource, parse_source

SIZE = (LENET / WEIGHTS).stat().st_size
LINK = "a symbolic link; a zoo source must hold its model folders and files itself, so links are refused"


def within(seconds: float, *args) -> tuple[Result, float]:
    """``run(*args)`` and the seconds it took; the test fails when that is more than ``seconds``."""
    done: dict = {}

    def target():
        try:
            done["result"] = run(*args)
        except BaseException as e:
            done["error"] = e
    start = time.monotonic()
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        pytest.fail(f"toolkit {' '.join(map(str, args))} still runs after {seconds} s")
    if "error" in done:
        raise done["error"]
    return done["result"], time.monotonic() - start


def cli(*args, timeout: float = 30) -> tuple[Result, float]:
    """``python -m toolkit.cli ARGS`` in a process of its own, killed past ``timeout`` and unable
    to write a file over 16 MiB: a copy that never ends fails its test instead of filling the disk."""
    def bounded():
        resource.setrlimit(resource.RLIMIT_FSIZE, (16 << 20, 16 << 20))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "toolkit.cli", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, preexec_fn=bounded, env=env, cwd=ROOT)
    return Result(proc.returncode, proc.stdout, proc.stderr), time.monotonic() - start


def disk_use(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def forge(card_path: Path, file: str, like: Path, size: int | None = None) -> None:
    """The card's entry for ``file`` rewritten to carry the sha256 and size of ``like`` (what an
    attacker publishing a link writes), or just ``size``."""
    card, body = read_card(card_path)
    data = card.model_dump(mode="json")
    for entry in [data["config"], *data["weights"]]:
        if entry["file"] == file:
            entry.update(sha256=sha256_file(like), bytes=like.stat().st_size if size is None else size)
    write_card(card_path, ModelCard.model_validate(data), body)


# -- HTTP: size and time -------------------------------------------------------------------------
def test_an_endless_file_is_refused_once_it_passes_the_cards_size(server, isolated_cache):
    server.faults[f"/{NAME}/{WEIGHTS}"] = "endless"
    r, took = within(20, "zoo", "get", NAME, "--source", server.url)
    assert r.status == 2 and r.err == (f"error: {server.url}{NAME}/{WEIGHTS}: more than the {SIZE} bytes its "
                                       "card says; the file was refused and not kept\n"), r.err
    assert took < 5 and disk_use(isolated_cache) < 20_000
    assert leftovers(cache_folder(isolated_cache, server.url)) == []


def test_a_gzip_encoded_file_counts_its_decoded_bytes(server, isolated_cache):
    path, folder = f"/{NAME}/{WEIGHTS}", cache_folder(isolated_cache, server.url)
    server.faults[path] = "gzip"                        # what a server may do despite Accept-Encoding: identity
    r = run("zoo", "get", NAME, "--source", server.url)
    assert r.status == 0, r.err
    assert sha256_file(folder / WEIGHTS) == sha256_file(LENET / WEIGHTS)
    (folder / WEIGHTS).unlink()
    server.faults[path] = "gzip_endless"                # a few kB that inflate without end
    r, took = within(20, "zoo", "get", NAME, "--source", server.url)
    assert r.status == 2 and r.err == (f"error: {server.url}{path[1:]}: more than the {SIZE} bytes its card "
                                       "says; the file was refused and not kept\n"), r.err
    assert took < 5 and disk_use(isolated_cache) < 20_000 and leftovers(folder) == []


def test_an_endless_index_or_card_is_refused_past_1_MiB(server, isolated_cache):
    server.faults["/index.json"] = "endless"
    r, took = within(20, "zoo", "list", "--source", server.url)
    assert r.status == 2 and r.err == f"error: {server.url}index.json: more than 1 MiB, not a zoo card or index\n"
    server.faults[f"/{NAME}/README.md"] = "gzip_endless"
    r, took2 = within(20, "zoo", "get", NAME, "--source", server.url)
    assert r.status == 2 and r.err == (f"error: {server.url}{NAME}/README.md: more than 1 MiB, not a zoo card "
                                       "or index\n"), r.err
    assert took + took2 < 5 and disk_use(isolated_cache) < 1000


@pytest.fixture
def short_timeout(monkeypatch):
    """Transfers get 1 s, plus a second per 100 kB for a file (55 kB of weights: 1.55 s)."""
    monkeypatch.setattr(transfer, "TIMEOUT_S", 1)


def test_a_slow_drip_ends_at_the_deadline(server, isolated_cache, short_timeout):
    server.faults["/index.json"] = "drip"               # a byte every 0.1 s: no read ever times out
    r, took = within(10, "zoo", "list", "--source", server.url)
    assert took < 3 and r.status == 0              # an unreachable source is a note, the rest still lists
    assert r.err == f"note: {server.url}index.json: the transfer did not finish within 1.0 s\n", r.err
    assert row(r.out, "lenet")[1] == "shipped"

    card, weights = f"/{NAME}/README.md", f"/{NAME}/{WEIGHTS}"
    for fault in ("drip", "drip_headers"):              # the body or the headers dripping
        server.faults[card] = fault
        r, took = within(10, "zoo", "get", NAME, "--source", server.url)
        assert took < 3 and r.status == 2, r.err
        assert r.err.startswith(f"note: {server.url}{card[1:]}: the transfer did not finish within 1.0 s\n"
                                f"error: zoo:{NAME}: no model named '{NAME}'"), r.err
        assert r.err.endswith(f"could not reach {server.url}\n")
    del server.faults[card]

    server.faults[weights] = "drip"
    r, took = within(10, "zoo", "get", NAME, "--source", server.url)
    assert took < 6 and r.status == 2
    assert r.err == (f"error: zoo:{NAME}: fetching {WEIGHTS} failed twice: {server.url}{weights[1:]}: the "
                     "transfer did not finish within 1.6 s; nothing was kept\n"), r.err
    assert disk_use(isolated_cache) < 20_000 and leftovers(cache_folder(isolated_cache, server.url)) == []


# -- folders and git: symbolic links and special files -------------------------------------------
def test_a_folder_source_refuses_symbolic_links(published, isolated_cache, tmp_path):
    weights, folder = published / NAME / WEIGHTS, cache_folder(isolated_cache, str(published))
    weights.unlink()
    weights.symlink_to("/etc/passwd")
    forge(published / NAME / "README.md", WEIGHTS, Path("/etc/passwd"))    # the hash matches the link's file
    r = run("zoo", "get", NAME, "--source", published)
    assert r.status == 2 and r.err == f"error: {weights}: {LINK}\n", r.err
    assert not (folder / WEIGHTS).exists() and leftovers(folder) == []

    # a card that links elsewhere, and a model folder that does
    outside = tmp_path / "outside"
    shutil.move(published / NAME, outside)
    (published / NAME).mkdir()
    (published / NAME / "README.md").symlink_to(outside / "README.md")
    r = run("zoo", "get", NAME, "--source", published)
    assert r.status == 2 and r.err == f"error: {published / NAME / 'README.md'}: {LINK}\n", r.err
    shutil.rmtree(published / NAME)
    (published / NAME).symlink_to(outside)
    r = run("zoo", "get", NAME, "--source", published)
    assert r.status == 2 and r.err == f"error: {published / NAME}: {LINK}\n", r.err
    shutil.rmtree(isolated_cache)                        # (or the card fetched above would be listed)
    r = run("zoo", "list", "--source", published)        # listing skips it with a note
    assert r.status == 0 and r.err == f"note: skipping {published / NAME}: {LINK}\n", r.err
    assert f"{NAME} " not in r.out


def test_a_folder_source_never_streams_a_device_or_waits_on_a_fifo(published, isolated_cache):
    weights, folder = published / NAME / WEIGHTS, cache_folder(isolated_cache, str(published))
    weights.unlink()
    weights.symlink_to("/dev/zero")
    r, took = cli("zoo", "get", NAME, "--source", published)
    assert r.status == 2 and r.err == f"error: {weights}: {LINK}\n", r.err
    assert took < 10 and disk_use(isolated_cache) < 20_000 and leftovers(folder) == []

    weights.unlink()
    os.mkfifo(weights)                                   # no writer: opening it to read would block
    r, took = cli("zoo", "get", NAME, "--source", published)
    assert r.status == 2 and r.err == (f"error: {weights}: not a regular file (a FIFO); a zoo source's files "
                                       "must be plain files\n"), r.err
    assert took < 10 and leftovers(folder) == []
    card = published / NAME / "README.md"
    card.unlink()
    os.mkfifo(card)
    r, took = cli("zoo", "list", "--source", published)
    assert r.status == 0 and took < 10
    assert r.err == f"note: skipping {card}: not a regular file (a FIFO); a zoo source's files must be plain files\n"


@needs_git
def test_a_git_source_refuses_symbolic_links(published_template, isolated_cache, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(published_template, repo)
    weights = repo / NAME / WEIGHTS
    weights.unlink()
    weights.symlink_to("/etc/passwd")
    forge(repo / NAME / "README.md", WEIGHTS, Path("/etc/passwd"))
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "a link to /etc/passwd")
    source = f"git+{repo}"
    checkout = parse_source(source).checkout_dir
    folder = cache_folder(isolated_cache, source)
    r = run("zoo", "get", NAME, "--source", source)
    assert r.status == 2 and r.err == f"error: {checkout / NAME / WEIGHTS}: {LINK}\n", r.err
    assert not (folder / WEIGHTS).exists() and leftovers(folder) == []

    weights.unlink()
    weights.symlink_to("/dev/zero")
    git(repo, "commit", "-q", "-am", "a link to /dev/zero")
    r, took = cli("zoo", "get", NAME, "--source", source)
    assert r.status == 2 and r.err == f"error: {checkout / NAME / WEIGHTS}: {LINK}\n", r.err
    assert took < 10 and disk_use(folder) < 20_000 and leftovers(folder) == []

    # the model folder a link out of the repository
    outside = tmp_path / "outside"
    shutil.copytree(published_template / NAME, outside)
    git(repo, "rm", "-rq", NAME)
    (repo / NAME).symlink_to(outside)
    git(repo, "add", NAME)
    git(repo, "commit", "-q", "-m", "the model folder links outside")
    r = run("zoo", "get", NAME, "--source", source)
    assert r.status == 2 and r.err == f"error: {checkout / NAME}: {LINK}\n", r.err


# -- the cache: a full disk, an interrupt --------------------------------------------------------
class _Filling:
    """A file that takes ``room`` more bytes, then fails as a full disk does."""

    def __init__(self, f, room: int):
        self.f, self.room = f, room

    def write(self, data) -> int:
        if len(data) > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(data)
        return self.f.write(data)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.f.close()

    def __getattr__(self, name):
        return getattr(self.f, name)


def fill_disk(monkeypatch, module, room: int) -> None:
    """Files that ``module`` opens to write get ``room`` bytes each."""
    def filling_open(path, mode="r", *args, **kwargs):
        f = open(path, mode, *args, **kwargs)
        return _Filling(f, room) if "w" in mode else f
    monkeypatch.setattr(module, "open", filling_open, raising=False)


def test_a_full_disk_is_one_line_naming_the_file_and_keeps_the_previous_one(published, isolated_cache, monkeypatch):
    folder = cache_folder(isolated_cache, str(published))
    assert run("zoo", "get", NAME, "--source", published).status == 0
    before = (folder / "README.md").read_bytes()
    card = published / NAME / "README.md"
    card.write_text(card.read_text().replace("description: ", "description: Updated. ", 1))
    with monkeypatch.context() as m:
        fill_disk(m, zoo_card, 0)                          # the card cannot be written
        r = run("zoo", "get", NAME, "--source", published)
    assert r.status == 2 and r.err == f"error: {folder / 'README.md'}: No space left on device\n", r.err
    assert (folder / "README.md").read_bytes() == before and leftovers(folder) == []

    (folder / WEIGHTS).unlink()
    fill_disk(monkeypatch, zoo_cache, 10_000)              # the weights stop after 10 kB
    r = run("zoo", "get", NAME, "--source", published)
    assert r.status == 2 and r.err == f"error: {folder / WEIGHTS}: No space left on device; nothing was kept\n"
    assert not (folder / WEIGHTS).exists() and leftovers(folder) == []
    assert "Updated." in (folder / "README.md").read_text()


def _can_mount_tmpfs() -> bool:
    if shutil.which("unshare") is None or sys.platform != "linux":
        return False
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=16k tmpfs /mnt"],
                           capture_output=True)
    return probe.returncode == 0


# Runs inside a private mount namespace whose cache is a tmpfs of 40 kB: the card, the net and the
# source's marker fit, the 55 kB of weights do not.
_ON_A_SMALL_DISK = """
import contextlib, io, json, os, sys
from toolkit.cli import main
err = io.StringIO()
with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
    status = main(sys.argv[1:])
cache = os.environ["TOOLKIT_CACHE"]
files = sorted(os.path.relpath(os.path.join(d, f), cache) for d, _, fs in os.walk(cache) for f in fs)
print(json.dumps({"status": status, "err": err.getvalue(), "files": files}))
"""


@pytest.mark.skipif(not _can_mount_tmpfs(), reason="needs unshare and a tmpfs mount in a user namespace")
def test_a_really_full_disk(published, isolated_cache):
    isolated_cache.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(["unshare", "-rm", "sh", "-c", 'mount -t tmpfs -o size=40k tmpfs "$TOOLKIT_CACHE" && '
                           'exec "$0" -c "$1" zoo get "$2" --source "$3"', sys.executable, _ON_A_SMALL_DISK,
                           NAME, published], capture_output=True, text=True, timeout=60, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    weights = cache_folder(isolated_cache, str(published)) / WEIGHTS
    assert got["status"] == 2 and got["err"] == f"error: {weights}: No space left on device; nothing was kept\n"
    slug = parse_source(str(published)).slug
    assert got["files"] == [f"zoo/{slug}/.source", f"zoo/{slug}/{NAME}/README.md", f"zoo/{slug}/{NAME}/net.yaml"]


def test_an_interrupted_copy_leaves_nothing(published, isolated_cache, monkeypatch):
    def interrupted(self, name, file, size):
        yield b"x" * 1000
        raise KeyboardInterrupt
    monkeypatch.setattr(FolderSource, "read_file", interrupted)
    r = run("zoo", "get", NAME, "--source", published)
    assert r.status == 130 and r.err == "interrupted\n"
    folder = cache_folder(isolated_cache, str(published))
    assert sorted(p.name for p in folder.iterdir()) == ["README.md"]
    with pytest.raises(KeyboardInterrupt):
        resolve(f"zoo:{NAME}", [str(published)])
    assert sorted(p.name for p in folder.iterdir()) == ["README.md"]


# -- sizes -----------------------------------------------------------------------------------------
def test_sizes_read_in_units_up_to_exabytes(published, server):
    forge(published / NAME / "README.md", WEIGHTS, LENET / WEIGHTS, size=10**18)
    r = run("zoo", "list", "--source", published)
    assert r.status == 0 and row(r.out, NAME)[3] == "1.0 EB", r.out
    r = run("zoo", "show", NAME, "--source", published)
    assert r.status == 0 and f"weights:     {WEIGHTS}  1.0 EB  sha256 " in r.out, r.out
    index = json.loads((published / "index.json").read_text())
    index["models"][NAME]["weights_bytes"] = 10**400       # JSON integers have no bound
    (published / "index.json").write_text(json.dumps(index))
    r = run("zoo", "list", "--source", server.url)
    assert r.status == 0 and row(r.out, NAME)[3] == "1.0e+400 B", r.err
    forge(published / NAME / "README.md", WEIGHTS, LENET / WEIGHTS, size=10**400)
    r = run("zoo", "get", NAME, "--source", server.url)     # a card's size past 64 bits: refused at its place
    assert r.status == 2 and r.err.count("\n") == 1 and "README.md:10:" in r.err and \
        "an integer of 401 digits is more than any field holds (64 bits)" in r.err, r.err
