"""The local cache of fetched zoo models: ``CACHE/zoo/<source-slug>/<NAME>/`` (CACHE is
``$TOOLKIT_CACHE``, else the user's cache folder). Files arrive through pooch, which writes a
temporary file beside the target, checks its sha256 against the card and only then renames it:
a file under its real name has always matched its card, and an interrupted or refused download
(more bytes than the card says stop it at once) leaves nothing behind."""
from __future__ import annotations

import hashlib
import re
import time
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from schemas.card import CardFile, ModelCard

from ..cachedir import cache_root
from ..errors import UserError, notice
from .card import (
    CARD,
    DATA_FILES,
    check_files,
    decimal_size,
    parse_card,
    read_card,
    read_card_text,
    sha256_file,
    write_text,
)
from .transfer import Broken, HttpError, MissingFile, Unreachable, os_reason

SOURCE_FILE = ".source"          # in each source's cache folder: the source as the user gave it
STALE_S = 600                    # a temporary file this old belongs to a download that was killed


def wanted(card: ModelCard, need: str) -> list[CardFile]:
    """The files a use needs: always the config and the input description; then ``need``:
    "none" nothing more, "default" the default (first) weights, "data" the bundled training data
    (what a train, a test or ``toolkit data`` reads), "all" every file (``zoo get``). A card's
    other data files (a mean image) come with the weights and with the data: both read it."""
    other = [f for f in card.data_files if f.file not in DATA_FILES.values()]
    extra = [card.input] if card.input else []
    chosen = {"none": [], "default": [*card.weights[:1], *other], "data": card.data_files,
              "all": [*card.weights, *card.data_files]}[need]
    return [card.config, *extra, *chosen]


@dataclass
class Fetched:
    dir: Path
    card: ModelCard
    actions: list[tuple[CardFile, str]]      # each file and what was done: cached, fetched, ...


def fetch_model(source, name: str, need: str = "default", announce: bool = False) -> Fetched | None:
    """NAME from ``source`` into its cache folder: the card fresh (the cached one, with a notice,
    when the source cannot be reached), then each file ``need`` wants (see ``wanted``) unless the
    cached copy matches. ``announce``: one line on stderr, before the transfer, naming each file
    not yet in the cache and its size (a use of ``zoo:NAME``; ``zoo get`` prints its own table).
    None when the source has no model NAME."""
    dest = source.cache_dir / name
    card_path = dest / CARD
    try:
        text = source.card_text(name)
    except Unreachable as e:
        if not card_path.is_file():
            raise
        notice(f"{e.problems[0].message}; using the card of {name} fetched earlier")
        text, origin = read_card_text(card_path), str(card_path)
    else:
        if text is None:
            return None
        origin = source.card_origin(name)
    card, _body = parse_card(text, origin, expect_name=name)
    remember_source(source)
    if origin != str(card_path):
        write_cached(card_path, text)
    entries = wanted(card, need)
    new = [e for e in entries if not (dest / e.file).is_file()]
    if announce and new:
        notice(f"zoo:{name}: fetching {', '.join(f'{e.file} ({decimal_size(e.bytes)})' for e in new)} "
               f"from {source}")
    actions = [(entry, retrieve(source, name, entry, dest)) for entry in entries]
    return Fetched(dest, card, actions)


def remember_source(source) -> None:
    marker = source.cache_dir / SOURCE_FILE
    if not marker.is_file() or marker.read_text(encoding="utf-8") != source.text:
        write_cached(marker, source.text)


def write_cached(path: Path, text: str) -> None:
    """A text file of the cache, written atomically (its folder made first); a full disk is one
    error naming the file, which keeps what it held before."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text(path, text)
    except OSError as e:
        raise UserError(f"{path}: {os_reason(e)}") from None


def retrieve(source, name: str, entry: CardFile, folder: Path) -> str:
    """One file of a card into ``folder``, verified by sha256 (pooch.retrieve) and size: refused
    as soon as more bytes arrive than the card says; one retry for a transfer that broke off or
    fell short. Returns what was done."""
    import pooch

    pooch.get_logger().setLevel("WARNING")
    sweep_temporaries(folder)
    target = folder / entry.file
    damaged = ""
    if target.is_file():
        digest = sha256_file(target)
        if digest == entry.sha256:
            return "cached"
        damaged = f"the cached {target} has sha256 {digest}, the card says {entry.sha256}"
        target.unlink()          # never leave a file that fails its card under the real name
    url = source.file_origin(name, entry.file)
    got: dict = {}

    def download(_url: str, output_file: str, _pooch) -> None:
        got.clear()
        size, digest = 0, hashlib.sha256()
        with closing(source.read_file(name, entry.file, entry.bytes)) as pieces, open(output_file, "wb") as out:
            for piece in pieces:
                size += len(piece)
                if size > entry.bytes:
                    raise UserError(f"{url}: more than the {entry.bytes} bytes its card says; the file was "
                                    "refused and not kept")
                digest.update(piece)
                out.write(piece)
        if size < entry.bytes:
            raise Broken(f"the transfer stopped after {size} of {entry.bytes} bytes")
        got.update(bytes=size, sha256=digest.hexdigest())

    failure = ""
    for _attempt in range(2):
        try:
            pooch.retrieve(url, known_hash=f"sha256:{entry.sha256}", fname=entry.file, path=folder,
                           downloader=download, progressbar=False)
            return "fetched (the cached copy did not match the card)" if damaged else "fetched"
        except MissingFile:
            raise UserError(f"zoo source {source}: {name}/{entry.file} is missing (its card lists it)") from None
        except ValueError:                       # pooch: the sha256 does not match the card
            raise UserError(f"{url}: sha256 is {got['sha256']}, the card says {entry.sha256} "
                            f"({got['bytes']} bytes, the card says {entry.bytes}); the file was refused "
                            "and not kept") from None
        except HttpError as e:
            if e.status == 404:
                raise UserError(f"{url}: not found (the card of {name} lists {entry.file})") from None
            failure = str(e)
        except Broken as e:
            failure = e.reason
        except OSError as e:                     # writing the cache: the download's own errors are above
            raise UserError(f"{target}: {os_reason(e)}; nothing was kept") from None
    what = f"{damaged}; fetching it again" if damaged else f"fetching {entry.file}"
    raise UserError(f"zoo:{name}: {what} failed twice: {url}: {failure}; nothing was kept")


# tempfile's names: pooch's for the files, fileio.atomic_write's for the card
_TEMPORARY = re.compile(r"tmp[a-z0-9_]{8}|\.README\.md\.[a-z0-9_]{8}\.md")


def sweep_temporaries(folder: Path) -> None:
    """Remove what fetches killed mid-way left behind (a live fetch's file is younger)."""
    if not folder.is_dir():
        return
    now = time.time()
    for path in folder.iterdir():
        if _TEMPORARY.fullmatch(path.name) and path.is_file() and now - path.stat().st_mtime > STALE_S:
            path.unlink(missing_ok=True)


def cached_copy(folder: Path, name: str, need: str) -> tuple[ModelCard | None, list[str]]:
    """(card, problems) of a cached model folder, with no network: (None, []) when nothing is
    cached there; problems name each file ``need`` wants that is missing or fails its sha256."""
    card_path = folder / CARD
    if not card_path.is_file():
        return None, []
    try:
        card, _body = read_card(card_path, expect_name=name)
    except UserError as e:
        return None, [str(e.problems[0])]
    return card, check_files(folder, card, wanted(card, need))


def cached_elsewhere(name: str, skip: set[Path]) -> list[tuple[Path, str]]:
    """Cached copies of NAME from any source but those in ``skip``, the most recent first, as
    (model folder, source text)."""
    root = cache_root() / "zoo"
    if not root.is_dir():
        return []
    found = [p.parent for p in root.glob(f"*/{name}/{CARD}") if p.parent.parent not in skip]
    found.sort(key=lambda p: (p / CARD).stat().st_mtime, reverse=True)
    return [(folder, source_text(folder.parent)) for folder in found]


def cached_models() -> dict[str, list[tuple[Path, str]]]:
    """Every cached model: name -> [(model folder, source text)], the most recent first."""
    root = cache_root() / "zoo"
    out: dict[str, list[tuple[Path, str]]] = {}
    if root.is_dir():
        for card_path in sorted(root.glob(f"*/*/{CARD}"), key=lambda p: p.stat().st_mtime, reverse=True):
            out.setdefault(card_path.parent.name, []).append((card_path.parent, source_text(card_path.parent.parent)))
    return out


def source_text(source_folder: Path) -> str:
    marker = source_folder / SOURCE_FILE
    return marker.read_text(encoding="utf-8").strip() if marker.is_file() else source_folder.name
