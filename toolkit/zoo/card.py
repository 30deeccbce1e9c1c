"""Model cards: ``README.md`` files that open with YAML front matter (schemas/card.py's
ModelCard) followed by markdown. Reading reports every problem at its README line; writing
keeps the markdown body as it was and is atomic."""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING

import yaml
from pydantic import ValidationError

from schemas.card import CardFile, CardMetric, ModelCard

from ..errors import Location, Problem, SpecError, UserError, did_you_mean
from ..fileio import atomic_write
from ..frontend.spec import split_loc

if TYPE_CHECKING:
    from ..frontend.yaml_loader import Positions

CARD = "README.md"
FENCE = "---"
# the training data ``publish --bundle-data`` carries, by the train.data key that reads it; a
# card's other data files (a mean image) are read with the weights, at inference too
DATA_FILES = {"source": "data.npz", "test_source": "test.npz"}


def decimal_size(n: int) -> str:
    """A file size in decimal units up to EB, in exact arithmetic: a card may state any integer."""
    from decimal import Decimal
    if n >= 1000 ** 7:
        return f"{Decimal(n):.1e} B"
    for power, unit in ((6, "EB"), (5, "PB"), (4, "TB"), (3, "GB"), (2, "MB"), (1, "kB")):
        if n >= 1000 ** power:
            return f"{Decimal(n) / 1000 ** power:.1f} {unit}"
    return f"{n} B"


def sha256_file(path: Path | str) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def split_front_matter(text: str, file: str) -> tuple[str | None, str]:
    """(front matter, body). The front matter comes back with its opening fence replaced by a
    blank line, so that YAML line numbers are the README's; None when the text has none."""
    lines = text.splitlines(keepends=True)
    if not lines or lines[0].rstrip() != FENCE:
        return None, text
    for i in range(1, len(lines)):
        if lines[i].rstrip() in (FENCE, "..."):
            return "\n" + "".join(lines[1:i]), "".join(lines[i + 1:])
    raise SpecError(Problem("the front matter that opens here is not closed by a '---' line", Location(file, 1, 1)))


def read_front_matter(text: str, file: str) -> tuple[dict | None, Positions | None, str]:
    """The front matter as a mapping with its positions (None when there is none), and the body."""
    from ..frontend.yaml_loader import Positions, load_yaml  # not at import: frontend may import the zoo
    front, body = split_front_matter(text, file)
    if front is None:
        return None, None, body
    if all(not line.strip() or line.lstrip().startswith("#") for line in front.splitlines()):
        return {}, Positions(file), body          # nothing but comments: an empty mapping
    data, positions = load_yaml(front, file)
    if not isinstance(data, dict):
        raise SpecError(Problem("the front matter must be a mapping of keys (name, task, ...)",
                                positions.locate(())))
    return data, positions, body


def parse_card(text: str, file: str, expect_name: str | None = None) -> tuple[ModelCard, str]:
    """(ModelCard, markdown body); SpecError with every problem at its README line."""
    data, positions, body = read_front_matter(text, file)
    if data is None:
        raise SpecError(Problem("a model card starts with a '---' line, then YAML front matter (name, "
                                "description, task, data, metric, licence, config, weights, reproduce, "
                                "toolkit_version) and a closing '---'", Location(file, 1, 1)))
    try:
        card = ModelCard.model_validate(data)
    except ValidationError as e:
        raise SpecError(*schema_problems(e, data, positions)) from None
    if expect_name is not None and card.name != expect_name:
        raise SpecError(Problem(f"the card's name '{card.name}' differs from its folder's name '{expect_name}'",
                                positions.locate(("name",), prefer_key=False)))
    return card, body


def read_card(path: Path | str, expect_name: str | None = None) -> tuple[ModelCard, str]:
    return parse_card(read_card_text(path), str(path), expect_name)


def read_card_text(path: Path | str) -> str:
    p = Path(path)
    if not p.is_file():
        raise UserError(f"{path}: no such file (a zoo model's card is its README.md)")
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{path}: not a UTF-8 text file") from None


_OWNERS = {"metric": CardMetric, "config": CardFile, "weights": CardFile}


def schema_problems(error: ValidationError, data: dict, positions: Positions) -> list[Problem]:
    """Pydantic's errors as one Problem per offending place, with near-miss hints for keys."""
    found: dict[tuple, Problem] = {}
    misspelt: set[tuple] = set()         # keys that an unknown key's hint names: not also "missing"
    missing: dict[tuple, list[str]] = {}
    errors = error.errors(include_url=False)
    for err in sorted(errors, key=lambda e: e["type"] != "extra_forbidden"):
        path, rest = split_loc(err["loc"], data)
        kind = err["type"]
        if kind == "extra_forbidden":
            owner = _OWNERS.get(path[0], ModelCard) if len(path) > 1 else ModelCard
            hint = did_you_mean(path[-1], owner.model_fields)
            if hint:
                misspelt.add(path[:-1] + (hint.split("'")[1],))
            found[path] = Problem(f"card: unknown key '{path[-1]}'{hint}", positions.locate(path))
        elif kind == "missing":
            key = rest[-1] if rest else "?"
            if path + (key,) not in misspelt:
                missing.setdefault(path, []).append(str(key))
        else:
            key = next((str(k) for k in reversed(path) if isinstance(k, str)), "")
            message = err["msg"].removeprefix("Value error, ")
            what = f"bad '{key}': " if key else ""
            found.setdefault(path, Problem(f"card: {what}{message[0].lower()}{message[1:]}",
                                           positions.locate(path, prefer_key=False)))
    for path, keys in missing.items():           # one line per mapping that lacks keys
        listed = ", ".join(f"'{k}'" for k in keys)
        where = f"'{'.'.join(map(str, path))}' is " if path else ""
        found[path + ("<missing>",)] = Problem(f"card: {where}missing required key{'s' if len(keys) > 1 else ''} "
                                               f"{listed}", positions.locate(path, prefer_key=False))
    return sorted(found.values(), key=lambda p: (p.location.line, p.location.col))


class _Dumper(yaml.SafeDumper):
    """Indents list items under their key (``weights:`` then ``  - {...}``)."""

    def increase_indent(self, flow: bool = False, indentless: bool = False):
        return super().increase_indent(flow, False)


def render_front_matter(fields: dict) -> str:
    """One top-level key per line, small mappings on one line (``metric: {name: ..., ...}``)."""
    text = yaml.dump(fields, Dumper=_Dumper, sort_keys=False, default_flow_style=None, allow_unicode=True,
                     width=10**6)
    return f"{FENCE}\n{text}{FENCE}\n"


def render_card(card: ModelCard, body: str) -> str:
    fields = card.model_dump(mode="json")
    for key, empty in (("input", None), ("classes", None), ("data_files", []),
                       ("calibration", None)):   # optional keys: left out when unused
        if fields.get(key) == empty:
            del fields[key]
    if fields.get("calibration"):            # the record as written, less its unset keys
        fields["calibration"] = {k: v for k, v in fields["calibration"].items() if v not in (None, [])}
    return render_front_matter(fields) + body


def calibration_line(record) -> str:
    """A card's calibration record in one line (``toolkit zoo show``)."""
    files = ", ".join(f"{f.file} ({f.rows} rows)" for f in record.files) or record.data
    how = record.method + (f" {record.percentile:g}" if record.percentile is not None else "")
    dtype = f"{record.dtype} activations, " if record.dtype else ""
    version = f"; toolkit {record.toolkit_version}" if record.toolkit_version else ""
    return f"int8: {dtype}scales by {how} over {record.examples} examples of {files}{version}"


def write_card(path: Path, card: ModelCard, body: str) -> None:
    write_text(path, render_card(card, body))


def write_text(path: Path, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def write_bytes(path: Path, data: bytes) -> None:
    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:
            f.write(data)
    atomic_write(Path(path), write)


def check_files(folder: Path, card: ModelCard, entries: list[CardFile] | None = None) -> list[str]:
    """Each file of the card (or just ``entries``) present in ``folder`` with its size and
    sha256; one message per file that is not."""
    problems = []
    for entry in card.files if entries is None else entries:
        path = folder / entry.file
        if not path.is_file():
            problems.append(f"{path}: missing (the card lists it)")
            continue
        size = path.stat().st_size
        digest = sha256_file(path)
        if digest != entry.sha256:
            problems.append(f"{path}: sha256 is {digest}, the card says {entry.sha256} "
                            f"({size} bytes, the card says {entry.bytes})")
        elif size != entry.bytes:
            problems.append(f"{path}: {size} bytes, the card says {entry.bytes}")
    return problems
