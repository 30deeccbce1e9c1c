"""``toolkit zoo list | show NAME | get NAME [--to DIR] | verify DIR | publish DIR --to FOLDER``:
the model zoo (toolkit/zoo/) from the command line."""
from __future__ import annotations

import shutil
from pathlib import Path

from ..errors import UserError, notice
from ..fileio import atomic_write
from ..zoo.cache import cached_copy, cached_elsewhere, cached_models
from ..zoo.card import CARD, calibration_line, decimal_size, parse_card, read_card, read_card_text, sha256_file
from ..zoo.resolve import find, model_name, not_found
from ..zoo.sources import SHIPPED, Unreachable, configured_sources, index_entry, scan_cards, shipped_zoo_dir


def run_zoo(args) -> int:
    return {"list": _list, "show": _show, "get": _get, "verify": _verify, "publish": _publish}[args.zoo_command](args)


_size = decimal_size


def _metric(entry: dict) -> str:
    m = entry.get("metric") or {}
    return f"{m.get('name', '?')} {m.get('value', '?')}" if m else "-"


def _state(folder: Path) -> str:
    """How much of a model the cache holds (sizes only: listing hashes nothing)."""
    if not (folder / CARD).is_file():
        return "-"
    try:
        card, _ = read_card(folder / CARD)
    except UserError:
        return "damaged"
    have = [(folder / e.file).is_file() and (folder / e.file).stat().st_size == e.bytes for e in card.files]
    return "cached" if all(have) else "partly cached" if have[0] else "card cached"


def _list(args) -> int:
    rows = [(name, SHIPPED, entry, "shipped") for name, entry in scan_cards(shipped_zoo_dir()).items()]
    listed = set()
    for source in configured_sources(args.source):
        try:
            models = source.models()
        except Unreachable as e:
            notice(e.problems[0].message + ("; listing what was fetched from it before"
                                            if source.cache_dir.is_dir() else ""))
            models = scan_cards(source.cache_dir) if source.cache_dir.is_dir() else {}
        for name, entry in models.items():
            rows.append((name, str(source), entry, _state(source.cache_dir / name)))
            listed.add(source.cache_dir / name)
    for name, copies in sorted(cached_models().items()):
        for folder, source_text in copies:
            if folder not in listed:
                card, _problems = cached_copy(folder, name, "none")
                if card is not None:
                    rows.append((name, source_text, index_entry(card), _state(folder)))
    if not rows:
        print("no models (the shipped zoo is empty and no source is configured)")
        return 0
    shipped = {name for name, source, _, _ in rows if source == SHIPPED}
    rows = [(name, source, entry, "shadowed by shipped" if source != SHIPPED and name in shipped else state)
            for name, source, entry, state in rows]
    table = [("NAME", "SOURCE", "METRIC", "WEIGHTS", "STATE", "DESCRIPTION")]
    for name, source, entry, state in rows:
        description = str(entry.get("description", ""))
        table.append((name, source, _metric(entry), _size(int(entry.get("weights_bytes", 0))), state,
                      description if len(description) <= 70 else description[:69] + "…"))
    widths = [max(len(r[i]) for r in table) for i in range(5)]
    for r in table:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[5])
    return 0


def _show(args) -> int:
    name = model_name(args.name)
    sources = configured_sources(args.source)
    folder, where = shipped_zoo_dir() / name, "shipped with the toolkit, used in place"
    text, origin, source = None, None, SHIPPED
    if (folder / CARD).is_file():
        text, origin = read_card_text(folder / CARD), str(folder / CARD)
    for candidate in sources if text is None else []:
        folder = candidate.cache_dir / name
        try:
            text, origin = candidate.card_text(name), candidate.card_origin(name)
        except Unreachable as e:
            if not (folder / CARD).is_file():
                notice(e.problems[0].message)
                continue
            notice(f"{e.problems[0].message}; showing the card fetched earlier")
            text, origin = read_card_text(folder / CARD), str(folder / CARD)
        if text is not None:
            source = str(candidate)
            break
    if text is None:
        for folder, source in cached_elsewhere(name, {s.cache_dir for s in sources}):
            text, origin = read_card_text(folder / CARD), str(folder / CARD)
            break
    if text is None:
        raise not_found(name, sources, [])
    card, body = parse_card(text, origin, expect_name=name)
    if source != SHIPPED:
        state = _state(folder)
        where = (f"{state} in {folder}" if state != "-" else
                 f"not cached yet (`toolkit zoo get {name}` fetches it into {folder})")
    m = card.metric
    print(f"zoo:{card.name}  from {source}")
    fields = [("description", card.description), ("task", card.task), ("data", card.data),
              ("metric", f"{m.name} {m.value} on the {m.split} split (tolerance {m.tolerance})"),
              ("licence", card.licence), ("config", _file_line(card.config)),
              *[("weights", _file_line(w) + ("  (default)" if i == 0 and len(card.weights) > 1 else ""))
                for i, w in enumerate(card.weights)],
              *([("classes", f"{card.classes} names, in {card.input.file}")] if card.classes else []),
              *([("calibration", calibration_line(card.calibration))] if card.calibration else []),
              ("reproduce", card.reproduce), ("toolkit", card.toolkit_version), ("files", where)]
    for key, value in fields:
        print(f"  {key + ':':<13}{value}")
    if body.strip():
        print()
        print(body.strip("\n"))
    return 0


def _file_line(entry) -> str:
    return f"{entry.file}  {_size(entry.bytes)}  sha256 {entry.sha256[:12]}…"


def _get(args) -> int:
    name = model_name(args.name)
    model = find(name, configured_sources(args.source), "all", refresh=True)
    print(f"zoo:{name} from {model.source}: {model.dir}")
    for entry in model.card.files:
        print(f"  {entry.file:<20} {_size(entry.bytes):>9}  sha256 {entry.sha256[:12]}…  "
              f"{model.actions.get(entry.file, '')}")
    if args.to:
        copied = copy_model(model.dir, [CARD] + [e.file for e in model.card.files], Path(args.to), args.force)
        print(f"copied {', '.join(copied) or 'nothing (already there)'} to {args.to}")
    return 0


def copy_model(folder: Path, files: list[str], dest: Path, force: bool) -> list[str]:
    """Copies ``files`` into ``dest``; a differing file there is replaced only with ``force``."""
    if dest.exists() and not dest.is_dir():
        raise UserError(f"--to {dest}: not a folder")
    same = {f for f in files if (dest / f).is_file() and sha256_file(dest / f) == sha256_file(folder / f)}
    differing = [f for f in files if (dest / f).exists() and f not in same]
    if differing and not force:
        raise UserError(f"--to {dest}: {', '.join(differing)} already there and different; pass --force to replace")
    dest.mkdir(parents=True, exist_ok=True)
    copied = []
    for f in files:
        if f not in same:
            atomic_write(dest / f, lambda tmp, src=folder / f: shutil.copyfile(src, tmp))
            copied.append(f)
    return copied


def _verify(args) -> int:
    from ..zoo.publish import verify
    folder = Path(args.dir)
    if args.dir.startswith("zoo:"):
        folder = find(model_name(args.dir), configured_sources(args.source), "all", refresh=False).dir
    try:
        checks = verify(folder, no_test=args.no_test)
    except UserError as e:
        for check in getattr(e, "checks", []):
            print(f"{check.status:<5} {check.what}")
        raise
    for check in checks:
        print(f"{check.status:<5} {check.what}")
    print(f"verified {folder}")
    return 0


def _publish(args) -> int:
    from ..zoo.publish import publish
    done = publish(args.dir, args.to, name=args.name, licence=args.licence, task=args.task, force=args.force,
                   bundle=args.bundle_data)
    card = done.card
    what = "published" if done.changed else "unchanged:"
    print(f"{what} zoo:{card.name} in {done.folder}")
    for entry in card.files:
        print(f"  {_file_line(entry)}")
    if done.measured:
        print(f"  {done.measured.name} {done.measured.value} on {done.measured.examples} test examples (measured)")
    else:
        print(f"  {card.metric.name} {card.metric.value} (as the card states: the net has no test data)")
    print(f"{Path(args.to) / 'index.json'} lists {done.models} model{'s' if done.models != 1 else ''}; "
          f"others fetch it with --source {args.to} (or its URL, or git+URL once pushed)")
    return 0
