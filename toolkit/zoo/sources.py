"""Where zoo models come from: the zoo that ships with the toolkit, and the sources named by
``--source`` or ``TOOLKIT_ZOO`` (a folder or file:// URL, an http(s):// URL of a published
folder, or ``git+URL[@REF]``). A source only says where a file is; cache.py fetches and checks it.

A published folder holds ``NAME/README.md`` (the card), ``NAME/net.yaml``, the weights, and
``index.json`` (``{"format": 1, "models": {NAME: {...}}}``) at its root, which http sources need
for listing; folders and git checkouts are listed by reading their cards.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Iterator
from urllib.parse import urlsplit
from urllib.request import url2pathname

from ..cachedir import cache_root
from ..errors import UserError, notice
from ..settings import current
from . import transfer
from .cache import write_cached
from .card import CARD
from .transfer import Broken, HttpError, MissingFile, Unreachable, file_budget_s, folder_pieces, http_pieces, read_text

SHIPPED = "shipped"
INDEX = "index.json"
INDEX_FORMAT = 1
GIT_TIMEOUT_S = 600


def shipped_zoo_dir() -> Path:
    """The zoo that ships with the toolkit: the repository's top-level ``zoo/`` in a checkout (or
    an editable install), else the copy a wheel installs under ``PREFIX/share/toolkit/zoo``."""
    import sysconfig
    # this file is toolkit/zoo/sources.py: the checkout's root is three folders up
    checkout = Path(__file__).resolve().parents[2] / "zoo"
    if checkout.is_dir():
        return checkout
    return Path(sysconfig.get_path("data")) / "share" / "toolkit" / "zoo"


def configured_sources(flags: list[str] | None = None) -> list["Source"]:
    """The ``--source`` flags (None when none were given: then the ``zoo`` setting, ``TOOLKIT_ZOO``
    comma-separated)."""
    if flags is not None:
        return [parse_source(t) for t in flags]
    given = current().zoo
    try:
        return [parse_source(t) for t in given]
    except UserError as e:
        raise UserError(f"TOOLKIT_ZOO: {e.problems[0].message}") from None


def parse_source(text: str) -> "Source":
    t = text.strip()
    if not t:
        raise UserError("an empty zoo source (give a folder, an http(s):// URL or git+URL)")
    if t.startswith("git+"):
        url, ref = _split_git_ref(t[4:])
        if not url:
            raise UserError(f"zoo source '{t}': git+ needs a repository URL or path after it")
        if "://" not in url and not _scp_like(url):
            url = str(Path(url).expanduser().resolve())
        return GitSource(url, ref)
    scheme = urlsplit(t).scheme.lower()
    if scheme in ("http", "https"):
        if not urlsplit(t).netloc:
            raise UserError(f"zoo source '{t}': the URL has no host")
        return HttpSource(t if t.endswith("/") else t + "/")
    if scheme == "file":
        return FolderSource(Path(url2pathname(urlsplit(t).path)).resolve())
    if "://" in t:
        raise UserError(f"zoo source '{t}': unsupported URL scheme '{scheme}' (use a folder, file://, "
                        "http://, https:// or git+URL)")
    return FolderSource(Path(t).expanduser().resolve())


def _scp_like(url: str) -> bool:
    """git's ``user@host:path`` form."""
    return re.match(r"^[\w.-]+@[\w.-]+:", url) is not None


def _split_git_ref(url: str) -> tuple[str, str | None]:
    """``URL@REF`` -> (URL, REF); an ``@`` in the URL's user part is not a ref."""
    if "://" in url:
        head, _, rest = url.partition("://")
        netloc, slash, path = rest.partition("/")
        if "@" in path:
            path, _, ref = path.rpartition("@")
            return f"{head}://{netloc}{slash}{path}", ref or None
        return url, None
    start = url.index(":") + 1 if _scp_like(url) else 0
    if "@" in url[start:]:
        base, _, ref = url.rpartition("@")
        return base, ref or None
    return url, None


def index_entry(card) -> dict:
    """What ``index.json`` and ``toolkit zoo list`` say about one model."""
    return {"description": card.description, "task": card.task, "licence": card.licence,
            "metric": {"name": card.metric.name, "value": card.metric.value, "split": card.metric.split},
            "weights_bytes": sum(w.bytes for w in card.weights), "toolkit_version": card.toolkit_version}


def scan_cards(root: Path) -> dict[str, dict]:
    """``NAME/README.md`` cards under a folder, as index entries; a card that cannot be read (a
    symbolic link, or in one) or does not parse is skipped with a notice."""
    from .card import parse_card
    if not root.is_dir():
        return {}
    with os.scandir(root) as entries:
        names = sorted(e.name for e in entries if e.is_dir() and not e.name.startswith((".", "_")))
    found = {}
    for name in names:
        readme = root / name / CARD
        try:
            text = folder_text(root, name, CARD)
        except MissingFile:
            continue
        except UserError as e:
            notice(f"skipping {e.problems[0].message}")
            continue
        try:
            card, _body = parse_card(text, str(readme), expect_name=name)
        except UserError as e:
            notice(f"skipping {readme}: {e.problems[0].message}")
            continue
        found[name] = index_entry(card)
    return found


def folder_text(root: Path, name: str, file: str) -> str:
    """A card of a folder: at most MAX_TEXT_BYTES, and never through a symbolic link."""
    return read_text(folder_pieces(root, name, file), str(root / name / file))


class Source:
    """One configured source. ``text`` is its canonical spelling (the cache is keyed by it)."""

    def __init__(self, text: str):
        self.text = text

    def __str__(self) -> str:
        return self.text

    @property
    def slug(self) -> str:
        """A folder name for this source: readable, plus a short hash that makes it unique."""
        readable = re.sub(r"[^A-Za-z0-9._]+", "-", self.text.split("://", 1)[-1]).strip("-.")[-40:].strip("-.")
        return f"{readable or 'source'}-{hashlib.sha256(self.text.encode()).hexdigest()[:10]}"

    @property
    def cache_dir(self) -> Path:
        return cache_root() / "zoo" / self.slug

    def models(self) -> dict[str, dict]:
        """Every model of the source: name -> index entry. Raises Unreachable."""
        raise NotImplementedError

    def card_text(self, name: str) -> str | None:
        """NAME's card as text; None when the source has no model NAME. Raises Unreachable."""
        raise NotImplementedError

    def card_origin(self, name: str) -> str:
        """Where NAME's card comes from, for messages (a path or a URL)."""
        raise NotImplementedError

    def file_origin(self, name: str, file: str) -> str:
        """The URL or path of NAME/FILE, for messages."""
        raise NotImplementedError

    def read_file(self, name: str, file: str, size: int) -> Iterator[bytes]:
        """NAME/FILE in pieces (``size``, the card's, sets an http transfer's deadline; the
        caller stops past it). Raises MissingFile, HttpError, Broken, UserError."""
        raise NotImplementedError


class FolderSource(Source):
    def __init__(self, root: Path):
        super().__init__(str(root))
        self.root = root

    def _root(self) -> Path:
        if not self.root.is_dir():
            raise Unreachable(f"zoo source {self.root}: no such folder")
        return self.root

    def models(self) -> dict[str, dict]:
        return scan_cards(self._root())

    def card_text(self, name: str) -> str | None:
        try:
            return folder_text(self._root(), name, CARD)
        except MissingFile:
            return None

    def card_origin(self, name: str) -> str:
        return str(self.root / name / CARD)

    def file_origin(self, name: str, file: str) -> str:
        return str(self.root / name / file)

    def read_file(self, name: str, file: str, size: int) -> Iterator[bytes]:
        return folder_pieces(self._root(), name, file)


class GitSource(Source):
    """A git repository holding a published folder at its root. It is fetched (depth 1) into
    the cache once per use; offline, the checkout fetched earlier serves, with a notice."""

    def __init__(self, url: str, ref: str | None):
        super().__init__(f"git+{url}" + (f"@{ref}" if ref else ""))
        self.url, self.ref = url, ref
        self._checkout: FolderSource | None = None

    @property
    def checkout_dir(self) -> Path:
        return cache_root() / "git" / self.slug

    def _folder(self) -> FolderSource:
        if self._checkout is None:
            self._checkout = FolderSource(self._update())
        return self._checkout

    def _update(self) -> Path:
        git_program()
        dest = self.checkout_dir
        had_checkout = _git_ok(dest, "rev-parse", "--verify", "-q", "HEAD")
        if not (dest / ".git").is_dir():
            dest.mkdir(parents=True, exist_ok=True)
            _git(dest, "init", "-q")
        fetched = _git(dest, "fetch", "--quiet", "--depth", "1", "--", self.url, self.ref or "HEAD", check=False)
        if fetched.returncode == 0:
            _git(dest, "reset", "--quiet", "--hard", "FETCH_HEAD")
            return dest
        reason = _git_reason(fetched.stderr) or f"git fetch exited with {fetched.returncode}"
        if had_checkout:
            notice(f"{self.text}: cannot fetch ({reason}); using the copy fetched earlier")
            return dest
        shutil.rmtree(dest, ignore_errors=True)
        raise Unreachable(f"zoo source {self.text}: git cannot fetch it ({reason})")

    def models(self) -> dict[str, dict]:
        return self._folder().models()

    def card_text(self, name: str) -> str | None:
        return self._folder().card_text(name)

    def card_origin(self, name: str) -> str:
        return self._folder().card_origin(name)

    def file_origin(self, name: str, file: str) -> str:
        return self._folder().file_origin(name, file)

    def read_file(self, name: str, file: str, size: int) -> Iterator[bytes]:
        return self._folder().read_file(name, file, size)


def git_program() -> str:
    exe = shutil.which("git")
    if exe is None:
        raise UserError("git+ zoo sources need the git program, which is not on PATH "
                        "(install git, or use a folder or http(s) source)")
    return exe


def _git(cwd: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0"}      # never wait for a password prompt
    command = [git_program(), "-C", str(cwd), *args]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=GIT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc = subprocess.CompletedProcess(command, 124, "", f"fatal: no answer in {GIT_TIMEOUT_S} s")
    if check and proc.returncode != 0:
        raise UserError(f"git {args[0]} in {cwd} failed: {_git_reason(proc.stderr)}")
    return proc


def _git_ok(cwd: Path, *args: str) -> bool:
    return (cwd / ".git").is_dir() and _git(cwd, *args, check=False).returncode == 0


def _git_reason(stderr: str) -> str:
    """git's first ``fatal:`` line (what went wrong; the lines after it are advice)."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    fatal = [line.removeprefix("fatal:").strip() for line in lines if line.startswith("fatal:")]
    return fatal[0] if fatal else (lines[-1] if lines else "")


class HttpSource(Source):
    """A published folder served over http(s). The index and cards carry no hash: they are
    fetched fresh, and the cached copies serve (with a notice) when the server cannot be reached."""

    def __init__(self, base: str):
        super().__init__(base)
        self.base = base

    def models(self) -> dict[str, dict]:
        url = self.base + INDEX
        cached = self.cache_dir / f".{INDEX}"
        try:
            text = http_text(url)
        except Unreachable as e:
            if not cached.is_file():
                raise
            notice(f"{e.problems[0].message}; using the index fetched earlier")
            text = cached.read_text(encoding="utf-8")
        else:
            if text is None:
                raise UserError(f"{url}: not found (a published zoo folder has {INDEX} at its root; "
                                "`toolkit zoo publish` writes it)")
            write_cached(cached, text)
        return parse_index(text, url)

    def card_text(self, name: str) -> str | None:
        return http_text(self.card_origin(name))

    def card_origin(self, name: str) -> str:
        return self.base + f"{name}/{CARD}"

    def file_origin(self, name: str, file: str) -> str:
        return self.base + f"{name}/{file}"

    def read_file(self, name: str, file: str, size: int) -> Iterator[bytes]:
        return http_pieces(self.file_origin(name, file), file_budget_s(size))


def parse_index(text: str, url: str) -> dict[str, dict]:
    try:
        data = json.loads(text)
    except ValueError as e:
        raise UserError(f"{url}: not a JSON zoo index ({e})") from None
    if not isinstance(data, dict) or data.get("format") != INDEX_FORMAT or not isinstance(data.get("models"), dict):
        raise UserError(f"{url}: not a zoo index (expected {{\"format\": {INDEX_FORMAT}, \"models\": {{...}}}})")
    return {str(k): _entry_of(v) for k, v in data["models"].items()}


def _entry_of(raw) -> dict:
    """An index entry as listing uses it, whatever the index holds (it is not trusted)."""
    raw = raw if isinstance(raw, dict) else {}
    metric = raw.get("metric") if isinstance(raw.get("metric"), dict) else {}
    size = raw.get("weights_bytes")
    return {"description": str(raw.get("description", "")), "task": str(raw.get("task", "")),
            "licence": str(raw.get("licence", "")),
            "metric": {k: metric[k] for k in ("name", "value", "split")
                       if isinstance(metric.get(k), (str, int, float))},
            "weights_bytes": size if isinstance(size, int) and size >= 0 else 0,
            "toolkit_version": str(raw.get("toolkit_version", ""))}


def http_text(url: str) -> str | None:
    """The text at ``url``; None for 404. Unreachable when the server cannot be reached or is too
    slow (a card or an index has TIMEOUT_S in all), a UserError naming the URL for any other failure."""
    try:
        return read_text(http_pieces(url, transfer.TIMEOUT_S), url)
    except HttpError as e:
        if e.status == 404:
            return None
        raise UserError(f"{url}: HTTP {e.status} {e.reason}") from None
    except Broken as e:
        raise Unreachable(f"{url}: {e.reason}") from None
