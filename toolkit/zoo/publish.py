"""``toolkit zoo publish`` and ``toolkit zoo verify``: a net, its weights and a card made into a
model folder of a zoo (with the metric measured, not copied), and a model folder checked end to
end (card, hashes, net, weights, metric)."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from schemas.card import CardFile, ModelCard

from ..errors import Problem, SpecError, UserError, did_you_mean
from ..fileio import refuse_own_inputs, same_file, staged_folder
from .card import (
    CARD,
    DATA_FILES,
    check_files,
    read_card,
    read_card_text,
    read_front_matter,
    render_card,
    schema_problems,
    write_bytes,
    write_text,
)
from .sources import INDEX, INDEX_FORMAT, scan_cards

NET_FILE = "net.yaml"
WEIGHTS_FILE = "model.safetensors"
REQUIRED_FROM_USER = ("licence", "task")


@dataclass
class Measured:
    name: str
    value: float
    examples: int
    outputs: list[str]


def measure(net, weights_path: Path, metric: str | None = None) -> Measured | None:
    """The test phase's metric with these weights, as ``toolkit test`` computes it; None when
    the net has no test data (no train section, no test split, or no scalar test output)."""
    if net.spec.train is None:
        return None
    from ..training.evaluate import NoTestData, evaluate
    try:
        result = evaluate(net, str(weights_path))
    except NoTestData:
        return None
    values = result.metrics
    name = metric or ("accuracy" if "accuracy" in values else next(iter(values)))
    if name not in values:
        raise UserError(f"the test phase of {net.file} has no output '{name}' (it gives: {', '.join(values)})")
    return Measured(name, round(values[name], 6), result.examples, list(values))


def net_text_for_publishing(net, path: Path, folder: Path) -> str:
    """The net file as it is published into ``folder``: as written (comments and all) when it
    stands alone, else rendered with its bases merged, so the published folder needs nothing else."""
    if len(net.files) == 1:
        return Path(path).read_text(encoding="utf-8")
    from ..frontend.render import render_net
    return render_net(net, folder=folder)


def find_inputs(folder: Path) -> tuple[Path, Path, Path | None]:
    """(net file, weights file, draft card or None) of a folder to publish."""
    if not folder.is_dir():
        raise UserError(f"{folder}: no such folder (publish takes a folder with a net file and its weights)")
    nets = ([folder / NET_FILE] if (folder / NET_FILE).is_file()
            else sorted(folder.glob("*.yaml")) + sorted(folder.glob("*.yml")))
    weights = ([folder / WEIGHTS_FILE] if (folder / WEIGHTS_FILE).is_file()
               else sorted(folder.glob("*.safetensors")) + sorted(folder.glob("*.npz")))
    problems = []
    if len(nets) != 1:
        problems.append(f"{folder}: {'no net file' if not nets else 'several net files'} "
                        f"(publish takes {NET_FILE}, or the only *.yaml)")
    if len(weights) != 1:
        problems.append(f"{folder}: {'no weights file' if not weights else 'several weights files'} "
                        f"(publish takes {WEIGHTS_FILE}, or the only *.safetensors or *.npz)")
    if problems:
        raise UserError(*problems)
    draft = folder / CARD
    return nets[0], weights[0], draft if draft.is_file() else None


def read_draft(path: Path | None) -> tuple[dict, object, str]:
    """A draft card: (front matter fields, positions, body). Keys must be card keys; values are
    checked when the card is complete."""
    if path is None:
        return {}, None, ""
    fields, positions, body = read_front_matter(read_card_text(path), str(path))
    if fields is None:
        return {}, None, body
    unknown = [Problem(f"card: unknown key '{k}'{did_you_mean(k, ModelCard.model_fields)}", positions.locate((k,)))
               for k in fields if k not in ModelCard.model_fields]
    if "metric" in fields and not isinstance(fields["metric"], dict):
        unknown.append(Problem("card: 'metric' is a mapping {name, value, split, tolerance}",
                               positions.locate(("metric",), prefer_key=False)))
    if unknown:
        raise SpecError(*unknown)
    return fields, positions, body


@dataclass
class Published:
    folder: Path
    card: ModelCard
    measured: Measured | None
    changed: bool
    models: int                 # how many models the zoo folder's index lists


def external_data(net) -> dict[str, str]:
    """The net's train.data sources that are files or folders ({key: the source as written}):
    none of them travels with a published model unless it is bundled."""
    data = net.spec.train.data if net.spec.train else None
    if data is None:
        return {}
    sources = {"source": data.source, "test_source": data.test_source}
    return {k: v for k, v in sources.items() if v and not v.startswith("builtin:")}


def bundle_data(net) -> dict[str, bytes]:
    """The net's data sources as .npz files ({key: bytes}), every array as the net's inputs take
    it before the transform, in the source's order (so the seeded split is the same)."""
    import io

    import numpy as np

    from ..ir.binding import lengths_input
    from ..training.data import data_folder, fit_to_inputs, load_source
    from ..training.sequences import attach_lengths, sequence_symbol, unpack_ragged, uses_lengths
    out = {}
    data_spec, inputs = net.spec.train.data if net.spec.train else None, net.spec.inputs
    for key, source in external_data(net).items():
        raw = load_source(source, inputs, data_folder(net, key))
        if uses_lengths(data_spec):
            raw = unpack_ragged(raw, data_spec, inputs, source)        # padded, one row per example
        arrays = fit_to_inputs(raw, inputs, source).arrays
        if data_spec.lengths is not None:          # the lengths travel too, under the name the net gives them
            found = attach_lengths(arrays, raw, data_spec, inputs, source)
            arrays = {**arrays, data_spec.lengths: found[lengths_input(sequence_symbol(inputs))]}
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)
        out[key] = buffer.getvalue()
    return out


def publish(dir: Path | str, to_folder: Path | str, name: str | None = None, licence: str | None = None,
            task: str | None = None, force: bool = False, bundle: bool = False) -> Published:
    """Adds the model in ``dir`` to the zoo folder ``to_folder``: net.yaml, model.safetensors
    and README.md (the card, its metric measured) in ``to_folder/NAME``, with input.json where
    the folder has one, and index.json. A net trained on data from files is refused unless
    ``bundle``, which adds the data as data.npz (and test.npz) and points the net at them."""
    from ..version import __version__
    from ..weights import load_weights
    from .resolve import load_net, model_name
    src, to = Path(dir), Path(to_folder)
    net_path, weights_path, draft_path = find_inputs(src)
    fields, positions, body = read_draft(draft_path)
    net = load_net(str(net_path))
    net.load_weights(str(weights_path))                      # every key present with its shape
    name = model_name(str(name or fields.get("name") or net.name))
    given = {"licence": licence or fields.get("licence"), "task": task or fields.get("task")}
    missing = [k for k in REQUIRED_FROM_USER if not given[k]]
    if missing:
        raise UserError(f"publish {src}: the card needs {' and '.join(f'a {k}' for k in missing)}: pass "
                        f"{' and '.join('--' + k for k in missing)}, or write {' and '.join(missing)} in the "
                        f"front matter of {src / CARD}")
    draft_metric = dict(fields.get("metric") or {})
    outside = external_data(net)
    if outside and not bundle:
        said = ", ".join(f"train.data.{k} {v}" for k, v in outside.items())
        raise UserError(f"publish {src}: the net trains on {said}, which would not travel with the model, so "
                        "others could not reproduce or verify it: pass --bundle-data to publish the data with it "
                        "(as .npz), or train on builtin: data")
    measured = measure(net, weights_path, draft_metric.get("name"))
    metric = _metric(draft_metric, measured, draft_path or src / CARD)

    data = bundle_data(net) if outside else {}
    mean = _mean_to_carry(net)
    pointed = net
    repoint = [(("train", "data", k), DATA_FILES[k]) for k in data] + \
        ([(mean[0], mean[1])] if mean is not None and mean[1] != mean[3] else [])
    if repoint:
        from ..frontend.render import render_net
        pointed = load_net(str(net_path), repoint)
        net_bytes = render_net(pointed, folder=to / name).encode("utf-8")
    else:
        net_bytes = net_text_for_publishing(net, net_path, to / name).encode("utf-8")
    carried = {DATA_FILES[k]: b for k, b in data.items()}
    if mean is not None:
        carried[mean[1]] = mean[2]
    from ..training.data import INPUT_FILE, data_files, mean_file_of, recorded_input
    input_bytes = (src / INPUT_FILE).read_bytes() if (src / INPUT_FILE).is_file() else None
    classes = recorded_input(str(net_path)).get("classes") if input_bytes is not None else None
    if weights_path.suffix == ".safetensors":
        weights_bytes = weights_path.read_bytes()             # as given, metadata and all
    else:
        from safetensors.numpy import save
        weights_bytes = save({k: v for k, v in load_weights(str(weights_path)).items()})
    card_fields = {**fields, **given, "name": name, "metric": metric,
                   "description": fields.get("description") or _description(net, net_path, name, given["task"]),
                   "data": fields.get("data") or _data_of(pointed, measured),
                   "config": _entry(NET_FILE, net_bytes), "weights": [_entry(WEIGHTS_FILE, weights_bytes)],
                   "reproduce": fields.get("reproduce") or f"toolkit train zoo:{name}",
                   "toolkit_version": __version__,
                   "input": _entry(INPUT_FILE, input_bytes) if input_bytes is not None else None,
                   "classes": len(classes) if classes else None,
                   "data_files": [_entry(f, b) for f, b in carried.items()],
                   "calibration": _calibration_of(net)}
    try:
        card = ModelCard.model_validate(card_fields)
    except ValidationError as e:
        from ..frontend.yaml_loader import Positions
        raise SpecError(*schema_problems(e, card_fields, positions or Positions(str(src / CARD)))) from None
    text = render_card(card, body if body.strip() else _default_body(card, measured))
    files = {NET_FILE: net_bytes, WEIGHTS_FILE: weights_bytes,
             **({INPUT_FILE: input_bytes} if input_bytes is not None else {}),
             **carried, CARD: text.encode("utf-8")}
    unlisted = _not_carried(pointed, set(files))
    if unlisted:
        raise UserError(f"publish {src}: the net names {', '.join(unlisted)}, which the published model would not "
                        "carry, so it could not be used or verified elsewhere")

    target = to / name
    differing = [f for f, data in files.items() if not (target / f).is_file() or (target / f).read_bytes() != data]
    in_place = same_file(target, src)                        # refreshing a model's own card
    # the files publish writes never replace one it reads (a data source or the net in the target
    # folder), but for the draft card a model's own card refreshes in place
    inputs = [("the net file", f) for f in net.files] + [("the weights file", weights_path),
                                                         ("the input description", src / INPUT_FILE)]
    inputs += ([("the mean file", mean_file_of(net))] if mean is not None else []) + data_files(net)
    refuse_own_inputs("--to", to, [to / INDEX] + [target / f for f in differing if not (f == CARD and in_place)],
                      inputs + ([] if in_place else [("the draft card", draft_path)]))
    if target.exists() and differing and not (force or in_place):
        raise UserError(f"{target} already holds a model whose {', '.join(differing)} "
                        f"{'differs' if len(differing) == 1 else 'differ'} from what publish would write; "
                        "pass --force to replace it")
    # the files are written into a staged folder moved into place once all are written (a full
    # disk leaves the model as it was), the card last: it vouches for the others
    with staged_folder(target) as stage:
        for f in differing:
            if f != CARD:
                write_bytes(stage / f, files[f])
    if CARD in differing:
        write_bytes(target / CARD, files[CARD])
    models = write_index(to)
    return Published(target, card, measured, bool(differing), len(models))


def _calibration_of(net) -> dict | None:
    """A quantized net's calibration record, for its card (None for a float net)."""
    section = getattr(net.spec, "quantization", None)
    if section is None or section.calibration is None:
        return None
    return section.calibration.model_dump(mode="json")


def _mean_to_carry(net) -> tuple[tuple, str, bytes, str] | None:
    """(the key naming the net's mean image, the file name it is published under, its bytes, the
    name as the net writes it), or None: a published model carries its mean as a file of its own."""
    from ..fileio import read_regular
    from ..training.data import carried_name, mean_declared, mean_file_of
    declared = mean_declared(net)
    if declared is None:
        return None
    key, named = declared
    path = mean_file_of(net)
    name = carried_name(named)
    if name in (NET_FILE, WEIGHTS_FILE, CARD, INDEX, *DATA_FILES.values()):
        name = "mean.npy"
    return key, name, read_regular(str(path), MAX_MEAN_BYTES, "mean image"), named


MAX_MEAN_BYTES = 1 << 30


def named_files(net) -> list[tuple[str, str]]:
    """The files a net names, which a model folder must hold for the net to load, test and run:
    (where the net names it, the name as written): its data sources, its mean image, the model
    file of each ONNX layer."""
    from ..training.data import mean_declared
    found = [(f"train.data.{k}", v) for k, v in external_data(net).items()]
    declared = mean_declared(net)
    if declared is not None:
        found.append((".".join(declared[0]), declared[1]))
    for layer in net.spec.layers:
        if getattr(layer, "type", None) == "ONNX" and getattr(layer, "file", None):
            found.append((f"layer '{layer.name}' file", layer.file))
    return found


def _not_carried(net, names: set[str]) -> list[str]:
    """The files the net names that are not among ``names`` (the model folder's), in words."""
    import os
    return [f"{value} ({where})" for where, value in named_files(net) if os.path.normpath(value) not in names]


def _entry(file: str, data: bytes) -> dict:
    return {"file": file, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}


def _metric(draft: dict, measured: Measured | None, draft_path: Path) -> dict:
    if measured is None:
        if "name" not in draft or "value" not in draft:
            raise UserError(f"the net has no test data to measure a metric: give metric {{name, value}} in "
                            f"the front matter of {draft_path}")
        return draft
    if "value" in draft:
        tolerance = draft.get("tolerance", 0.001)
        if not isinstance(draft["value"], (int, float)) or abs(draft["value"] - measured.value) > tolerance:
            raise UserError(f"{draft_path}: the draft card says {measured.name} {draft['value']}, the test "
                            f"phase measures {measured.value} on {measured.examples} examples "
                            f"(tolerance {tolerance})")
    return {**draft, "name": measured.name, "value": measured.value, "split": draft.get("split", "test")}


def _description(net, net_path: Path, name: str, task: str) -> str:
    """A card's description where the draft gives none: the net file's own opening comment line;
    else, for a net built on a zoo model, that model's description; else NAME: TASK. Never the
    banner of a rendered net (a run's net.yaml opens with it), which says how the file was
    made, not what the model is; it names the bases, though, once they are merged."""
    from ..frontend.render import rendered_bases
    from .resolve import resolve
    bases = list(net.bases)
    for line in Path(net_path).read_text(encoding="utf-8").splitlines():
        if not line.strip().startswith("#"):
            if line.strip():
                break
            continue
        named = rendered_bases(line)
        if named is None:
            own = line.strip().lstrip("#").strip()
            if own:
                return own
        elif not bases:
            bases = named
    for ref in bases:
        if ref.startswith("zoo:"):
            try:
                return f"{name}, built on {ref}: {resolve(ref, need_weights=False).card.description}"
            except UserError:             # a base that cannot be read now: the plain default
                break
    return f"{name}: {task}"


def _data_of(net, measured: Measured | None) -> str:
    if net.spec.train is None:
        return "not stated"
    data = net.spec.train.data
    if data.test_source:
        return f"{data.source}; test: {data.test_source}"
    held = f", {measured.examples} examples" if measured else ""
    return f"{data.source} (seeded {data.test_fraction:.0%} held-out split{held})"


def _default_body(card: ModelCard, measured: Measured | None) -> str:
    m = card.metric
    on = f" on {measured.examples} {m.split} examples" if measured else f" ({m.split})"
    return (f"\n# {card.name}\n\n{card.description}\n\n- **Task**: {card.task}\n- **Data**: {card.data}\n"
            f"- **Metric**: {m.name} {m.value}{on}\n- **Reproduce**: `{card.reproduce}`\n"
            f"- **Licence**: {card.licence}\n")


def write_index(folder: Path) -> dict[str, dict]:
    """``index.json`` of a zoo folder, rebuilt from its cards (so it never disagrees with them)."""
    models = scan_cards(folder)
    write_text(folder / INDEX, json.dumps({"format": INDEX_FORMAT, "models": models}, indent=2) + "\n")
    return models


@dataclass
class Check:
    status: str        # ok, skip or FAIL
    what: str


def verify(dir: Path | str, no_test: bool = False) -> list[Check]:
    """Every check of a model folder, in order; raises UserError listing every problem after
    the checks that could run (``report`` in the error's ``checks`` attribute)."""
    from .resolve import load_net
    folder = Path(dir)
    if not folder.is_dir():
        raise UserError(f"{folder}: no such folder (verify takes a model folder with {CARD})")
    card, _body = read_card(folder / CARD)
    checks = [Check("ok", f"card {folder / CARD} ({card.name}, toolkit {card.toolkit_version})")]
    problems: list[Problem | str] = []
    for entry in card.files:
        found = check_files(folder, card, [entry])
        checks.append(Check("FAIL" if found else "ok",
                            f"{entry.file}: sha256 {entry.sha256[:12]}…, {entry.bytes} bytes"))
        problems += found
    net = None
    try:
        net = load_net(str(folder / card.config.file))
        checks.append(Check("ok", f"{card.config.file} loads (net '{net.name}')"))
    except UserError as e:
        checks.append(Check("FAIL", f"{card.config.file} loads"))
        problems += e.problems
    if net is not None and named_files(net):      # what the net reads beside it (data, a mean, a model) travels with it
        unlisted = _not_carried(net, {f.file for f in card.files})
        checks.append(Check("FAIL" if unlisted else "ok", f"the card lists every file {card.config.file} names"))
        problems += [f"{folder / card.config.file}: names {u}, which the card does not list (the model folder "
                     "does not carry it)" for u in unlisted]
    loaded = []
    for entry in card.weights:
        if net is None or not (folder / entry.file).is_file():
            checks.append(Check("skip", f"{entry.file} matches the net (no net or no file)"))
            continue
        try:
            net.load_weights(str(folder / entry.file))
            checks.append(Check("ok", f"{entry.file} matches the net ({len(net.declared)} arrays)"))
            loaded.append(entry)
        except UserError as e:
            checks.append(Check("FAIL", f"{entry.file} matches the net"))
            problems += e.problems
    if card.classes is not None:
        checks.append(_check_classes(folder, card, net, problems))
    checks.append(_check_metric(folder, card, net, loaded, no_test, problems))
    if problems:
        error = UserError(*problems)
        error.checks = checks
        raise error
    return checks


def _check_classes(folder: Path, card: ModelCard, net, problems: list) -> Check:
    """The card's count of class names is input.json's, and a class score output of the net has
    that many scores per example ([N, C] or [N, C, 1, 1])."""
    from ..training.data import recorded_input
    what = f"{card.input.file} names {card.classes} classes, one per class score"
    try:
        names = recorded_input(str(folder / card.config.file)).get("classes") or []
    except UserError as e:
        problems += e.problems
        return Check("FAIL", what)
    found = []
    if len(names) != card.classes:
        found.append(f"{folder / card.input.file}: {len(names)} class names, the card says {card.classes}")
    elif net is not None:
        shapes = [tuple(v.shape) for v in net.graph("infer", "float32").outputs.values()]
        if not any(len(s) >= 2 and s[1] == card.classes and all(d == 1 for d in s[2:]) for s in shapes):
            found.append(f"{folder / card.input.file}: {card.classes} class names, but no output of the net has "
                         f"{card.classes} class scores per example")
    problems += found
    return Check("FAIL" if found else "ok", what)


def _check_metric(folder: Path, card: ModelCard, net, loaded: list[CardFile], no_test: bool,
                  problems: list) -> Check:
    m = card.metric
    if no_test:
        return Check("skip", f"{m.name} not measured (--no-test)")
    if net is None or not loaded or loaded[0] is not card.weights[0]:
        return Check("skip", f"{m.name} not measured (the net or its default weights did not load)")
    try:
        measured = measure(net, folder / card.weights[0].file, m.name)
    except UserError as e:
        problems += e.problems
        return Check("FAIL", f"{m.name} measured")
    if measured is None:
        return Check("skip", f"{m.name} not measured: the net has no test data")
    line = (f"{m.name} {measured.value} on {measured.examples} {m.split} examples "
            f"(the card says {m.value}, tolerance {m.tolerance})")
    if abs(measured.value - m.value) > m.tolerance + 1e-12:
        problems.append(f"{folder / card.weights[0].file}: {m.name} is {measured.value} on "
                        f"{measured.examples} examples, the card says {m.value} (tolerance {m.tolerance})")
        return Check("FAIL", line)
    return Check("ok", line)
