"""``zoo:NAME`` -> a model's files on disk, checked against its card: the shipped zoo first,
then cached copies (no network), then the configured sources. Light to import: nothing here
touches the network or pooch until a model has to be fetched."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from schemas.card import ModelCard

from ..errors import UserError, did_you_mean, notice
from .cache import cached_copy, cached_elsewhere, fetch_model, wanted
from .card import CARD, check_files, read_card
from .sources import SHIPPED, Source, Unreachable, configured_sources, shipped_zoo_dir

if TYPE_CHECKING:
    from ..frontend import Net

PREFIX = "zoo:"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")


@dataclass
class ZooModel:
    name: str
    source: str              # "shipped", or the source as configured
    dir: Path
    net: Path                # the config (net.yaml)
    weights: Path | None     # the default (first) weights file, None when not asked for
    card: ModelCard
    actions: dict[str, str] = field(default_factory=dict)     # file -> what was done to it


def is_zoo_ref(s) -> bool:
    return isinstance(s, str) and s.startswith(PREFIX)


def model_name(ref: str) -> str:
    """``zoo:NAME`` or ``NAME`` -> NAME, checked."""
    name = ref[len(PREFIX):] if is_zoo_ref(ref) else ref
    if not _NAME.fullmatch(name):
        raise UserError(f"{ref}: not a zoo model name (letters, digits, '_', '.', '-'; not starting with '.')")
    return name


def load_net(path: str, overrides=(), text: str | None = None) -> "Net":
    """A net file or ``zoo:NAME`` (and bases that are ``zoo:`` names) as a checked Net: what the
    commands and ``toolkit.load`` read nets with. ``text``: the net's YAML itself, ``path`` then
    only its name in messages."""
    from ..frontend import Net
    return Net.load(path, overrides, resolve=resolve, text=text)


def resolve(ref: str, sources: list[str] | None = None, need_weights: bool = True,
            need_data: bool = False) -> ZooModel:
    """The model ``ref`` names, from the shipped zoo, a cached copy, or the sources (``None``:
    ``TOOLKIT_ZOO``), every file checked by sha256 against the card. Its config always;
    ``need_data``: the training data it bundles (what a train or a test reads) instead of the
    weights, else ``need_weights``: its default weights. Each file is fetched when first needed."""
    name = model_name(ref)
    need = "data" if need_data else "default" if need_weights else "none"
    return find(name, configured_sources(sources), need, refresh=False)


def find(name: str, sources: list[Source], need: str, refresh: bool) -> ZooModel:
    """The files ``need`` wants (cache.py's ``wanted``) from the shipped zoo, then: without
    ``refresh`` the cached copies before any network; with it (``zoo get``) each source first
    (its cached copy serves when it cannot be reached)."""
    model = shipped_model(name, need)
    if model is not None:
        return model
    if not refresh:
        for source in sources:
            model = _from_cache(source, name, need)
            if model is not None:
                return model
        model = _from_other_caches(name, need, sources)
        if model is not None:
            return model
    unreachable = []
    for source in sources:
        try:
            fetched = fetch_model(source, name, need, announce=not refresh)
        except Unreachable as e:
            notice(e.problems[0].message)
            unreachable.append(source)
            continue
        if fetched is not None:
            return _model(name, str(source), fetched.dir, fetched.card, need,
                          {entry.file: action for entry, action in fetched.actions})
    if refresh:
        model = _from_other_caches(name, need, sources)
        if model is not None:
            return model
    raise not_found(name, sources, unreachable)


def shipped_model(name: str, need: str = "default") -> ZooModel | None:
    """NAME from the shipped zoo, its files used in place once they match the card."""
    folder = shipped_zoo_dir() / name
    if not (folder / CARD).is_file():
        return None
    card, _body = read_card(folder / CARD, expect_name=name)
    problems = check_files(folder, card, wanted(card, need))
    if problems:
        raise UserError(*[f"zoo:{name}: {p}; if the change is meant, run `toolkit zoo publish {folder} "
                          f"--to {folder.parent}` or update the sha256 and bytes in {folder / CARD}"
                          for p in problems])
    return _model(name, SHIPPED, folder, card, need, "checked (shipped, used in place)")


def _model(name: str, source: str, folder: Path, card: ModelCard, need: str,
           actions: dict[str, str] | str = "checked in the cache") -> ZooModel:
    if isinstance(actions, str):
        actions = {entry.file: actions for entry in wanted(card, need)}
    default = folder / card.weights[0].file if need in ("default", "all") else None
    return ZooModel(name, source, folder, folder / card.config.file, default, card, actions)


def _from_cache(source: Source, name: str, need: str) -> ZooModel | None:
    """The cached copy from ``source``, or None if there is none. A file the use needs that is
    not cached yet (the weights after the net, the data for a test) is fetched, said in one line
    with its size; a damaged file is fetched again, with a note that it was damaged. When the
    source cannot be reached, either is an error."""
    folder = source.cache_dir / name
    card, problems = cached_copy(folder, name, need)
    if card is not None and not problems:
        return _model(name, str(source), folder, card, need)
    if card is None and not problems:
        return None
    # a file never fetched is no damage: only a file there that fails its card (or the card) is
    damaged = problems if card is None else \
        check_files(folder, card, [e for e in wanted(card, need) if (folder / e.file).is_file()])
    absent = [e.file for e in wanted(card, need) if not (folder / e.file).is_file()] if card is not None else []
    why = damaged[0] if damaged else f"{', '.join(absent)} not fetched yet"
    try:
        fetched = fetch_model(source, name, need, announce=not damaged)
    except Unreachable as e:
        raise UserError(f"zoo:{name}: {why}, and {e.problems[0].message}") from None
    if fetched is None:
        raise UserError(f"zoo:{name}: {why}, and {source} no longer has the model")
    if damaged:
        notice(f"zoo:{name}: {damaged[0]}; fetched it again from {source}")
    return _model(name, str(source), fetched.dir, fetched.card, need,
                  {entry.file: action for entry, action in fetched.actions})


def _from_other_caches(name: str, need: str, sources: list[Source]) -> ZooModel | None:
    """A complete, intact cached copy of NAME fetched earlier from any other source."""
    for folder, source_text in cached_elsewhere(name, {s.cache_dir for s in sources}):
        card, problems = cached_copy(folder, name, need)
        if card is not None and not problems:
            return _model(name, source_text, folder, card, need)
    return None


def shipped_names() -> list[str]:
    root = shipped_zoo_dir()
    return sorted(p.parent.name for p in root.glob(f"*/{CARD}")) if root.is_dir() else []


def not_found(name: str, sources: list[Source], unreachable: list[Source]) -> UserError:
    from .cache import cached_models
    shipped = shipped_names()
    where = f"in the shipped zoo ({', '.join(shipped) or 'empty'})"
    if sources:
        where += f" or in the sources ({', '.join(map(str, sources))})"
    else:
        where += "; no other source is configured (--source or TOOLKIT_ZOO)"
    if unreachable:
        where += f"; could not reach {', '.join(map(str, unreachable))}"
    cached = cached_models()
    if name in cached:
        _folder, source = cached[name][0]
        return UserError(f"zoo:{name}: the cached copy from {source} is incomplete or damaged and cannot be "
                         f"fetched again from the sources now configured; run `toolkit zoo get {name} "
                         f"--source {source}` when it can be reached")
    known = set(shipped) | set(cached)
    return UserError(f"zoo:{name}: no model named '{name}' {where}{did_you_mean(name, known)}")
