"""The documentation site's generated references, made from the code each time the site builds.

Registered under ``hooks:`` in mkdocs.yml. Two pages are written into the build, never into
docs/: the layer catalog (every layer type of ``layers.LAYERS``, each parameter's type, default
and description, read from the layer's pydantic model) and the command line (every command of
``toolkit.cli.build_parser()``, each option and its help). A parameter or an option without a
description stops the build with a message naming it: the references cannot drift from the code.
The few described nowhere yet are listed in docs/hooks/undocumented.txt; that list may only
shrink (an entry that has since gained a description, or no longer exists, fails the build too).

The page functions need no MkDocs: tests/test_docs_site.py calls them directly.
"""
from __future__ import annotations

import argparse
import re
import types
import typing
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
UNDOCUMENTED = Path(__file__).with_name("undocumented.txt")
LAYER_PAGE = "reference/layers.md"
COMMAND_PAGE = "reference/commands.md"


class DriftError(Exception):
    """Something the code declares has no description for the generated reference."""


def known_undocumented(path: Path = UNDOCUMENTED) -> set[str]:
    """The names (``layer Type.param``, ``flag toolkit cmd --opt``) still awaiting a description."""
    if not path.exists():
        return set()
    lines = (line.split("#")[0].strip() for line in path.read_text().splitlines())
    return {line for line in lines if line}


def _check(missing: list[str], known: set[str], kind: str) -> None:
    """Fail on a description missing from something new, or on a list entry that is out of date."""
    new = [name for name in missing if name not in known]
    stale = sorted(name for name in known if name.startswith(kind + " ") and name not in missing)
    problems = [f"{name}: no description (add one, e.g. Field(description=...) or help=...)" for name in new]
    problems += [f"{name}: listed in {UNDOCUMENTED.name} but now described or gone; remove the line"
                 for name in stale]
    if problems:
        raise DriftError("the generated reference would drift from the code:\n  " + "\n  ".join(problems))


# ---------------------------------------------------------------------------------------------
# the layer catalog

def _docstring_entry(model: type, field: str) -> str | None:
    """``field``'s description in a docstring of the model or the base class declaring it, written
    as ``- ``field``: text`` or a sentence beginning ``field``: (the style docstrings here use)."""
    for cls in model.__mro__:
        if field not in getattr(cls, "__annotations__", {}):
            continue
        doc = " ".join((cls.__doc__ or "").split())
        match = re.search(rf"``{re.escape(field)}``:\s*(.+?)(?=\s*(?:-\s*)?``\w+``:|$)", doc)
        if match:
            return match.group(1).strip().rstrip(";")
    return None


def _type_name(annotation) -> str:
    """A type as a reader writes it: ``int | list[int] | None``, constraints left to the text."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin in (typing.Union, types.UnionType):
        return " | ".join(dict.fromkeys(_type_name(a) for a in args))
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in args)
    if origin is not None:
        return f"{getattr(origin, '__name__', str(origin))}[{', '.join(_type_name(a) for a in args)}]"
    if annotation is type(None):
        return "None"
    return getattr(annotation, "__name__", str(annotation))


def _cell(text: str) -> str:
    """A table cell: argparse's %% as %, a | escaped so that it does not end the cell."""
    return (text or "(not yet described)").replace("%%", "%").replace("|", r"\|")


def _default(field) -> str:
    if field.is_required():
        return "required"
    return f"`{field.get_default(call_default_factory=True)!r}`"


def layer_rows(layers: dict) -> tuple[dict[str, list[tuple[str, str, str, str]]], list[str]]:
    """Each layer type's rows (parameter, type, default, description), and the parameters that
    have no description, as ``layer Type.param``."""
    rows, missing = {}, []
    for name in sorted(layers):
        model = layers[name].params
        rows[name] = []
        for param, field in model.model_fields.items():
            text = field.description or _docstring_entry(model, param)
            if not text:
                missing.append(f"layer {name}.{param}")
            rows[name].append((param, _type_name(field.annotation), _default(field), text or ""))
    return rows, missing


def layer_catalog(layers: dict | None = None, known: set[str] | None = None) -> str:
    """The layer catalog page in Markdown; raises DriftError on an undescribed parameter."""
    if layers is None:
        from layers import LAYERS as layers
    from schemas.base import LayerBase, ParamLayerBase
    rows, missing = layer_rows(layers)
    _check(missing, known_undocumented() if known is None else known, "layer")
    common, weighted = set(LayerBase.model_fields), set(ParamLayerBase.model_fields)

    def table(entries):
        return (["| parameter | type | default | description |", "| --- | --- | --- | --- |"]
                + [f"| `{p}` | {_cell(t)} | {_cell(d)} | {_cell(text)} |" for p, t, d, text in entries] + [""])

    base = rows.get(next((n for n in rows if issubclass(layers[n].params, ParamLayerBase)), ""), [])
    out = ["# Layer catalog", "",
           "<!-- Generated from layers.LAYERS when the site builds (docs/hooks/reference.py). -->", "",
           f"The {len(rows)} layer types a net file may use (see [the net file](../spec.md)), each with the "
           "parameters its own parameter model declares.", "",
           "## Keys every layer has", "",
           "Every layer takes the first keys below; a layer with learnable weights (marked so in its "
           "section) takes the others too.", ""]
    out += table([row for row in base if row[0] in weighted and row[0] != "type"])
    for name, entries in rows.items():
        model = layers[name].params
        doc = " ".join((model.__doc__ or "").split())
        out += [f"## {name}", ""] + ([doc, ""] if doc else [])
        if issubclass(model, ParamLayerBase):
            out += ["Has learnable weights: takes the weight keys above.", ""]
        own = [row for row in entries if row[0] not in (weighted if issubclass(model, ParamLayerBase) else common)]
        out += table(own) if own else ["No parameters of its own.", ""]
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# the command line

def _commands(parser: argparse.ArgumentParser, path: str):
    """(command path, help, its options) for each command that runs something, depth first."""
    subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    options = [a for a in parser._actions
               if not isinstance(a, (argparse._SubParsersAction, argparse._HelpAction, argparse._VersionAction))]
    yield path, parser.description or "", options
    for group in subparsers:
        helps = {choice.dest: choice.help for choice in group._choices_actions}
        for name, sub in group.choices.items():
            sub.description = sub.description or helps.get(name) or ""
            yield from _commands(sub, f"{path} {name}")


def command_rows(parser: argparse.ArgumentParser):
    """Each command's (help, [(option, help)]), and the options without help, as ``flag CMD OPT``."""
    rows, missing = {}, []
    for path, text, options in _commands(parser, parser.prog):
        entries = []
        for action in options:
            label = ", ".join(action.option_strings) or action.metavar or action.dest
            if not action.help:
                missing.append(f"flag {path} {label}")
            entries.append((label, action.help or ""))
        rows[path] = (text, entries)
    return rows, missing


def command_line(parser: argparse.ArgumentParser | None = None, known: set[str] | None = None) -> str:
    """The command line page in Markdown; raises DriftError on an option without help."""
    if parser is None:
        from toolkit.cli import build_parser
        parser = build_parser()
    rows, missing = command_rows(parser)
    _check(missing, known_undocumented() if known is None else known, "flag")
    out = ["# Command line", "",
           "<!-- Generated from toolkit.cli's parser when the site builds (docs/hooks/reference.py). -->", "",
           "Every command and option of `toolkit`, as `toolkit COMMAND --help` prints them. A user "
           "mistake is one `error: ...` line and exit status 2.", ""]
    for path, (text, entries) in rows.items():
        out += [f"## `{path}`", "", text.replace("%%", "%"), ""]
        if entries:
            out += ["| option | what it does |", "| --- | --- |"]
            out += [f"| `{label}` | {_cell(h)} |" for label, h in entries]
            out.append("")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# MkDocs events

def on_files(files, config):
    """Adds the generated pages to the build (they exist in site/ only)."""
    import sys

    from mkdocs.exceptions import PluginError
    from mkdocs.structure.files import File
    sys.path.insert(0, str(ROOT))
    try:
        pages = ((LAYER_PAGE, layer_catalog()), (COMMAND_PAGE, command_line()))
    except DriftError as error:
        raise PluginError(str(error)) from None   # one clear message, not a traceback
    for uri, content in pages:
        files.append(File.generated(config, uri, content=content))
    return files


_OUTSIDE = re.compile(r"\[([^\]]*)\]\(\.\./([^)#\s]+)(#[^)\s]*)?\)")


def on_page_markdown(markdown, page, config, files):
    """A link from docs/ to a file elsewhere in the repository (the README, say) is text naming
    that file: the site holds docs/ only. A target that does not exist stays a link, so the strict
    build fails on it."""
    def outside(match):
        target = ROOT / match.group(2)
        return f"{match.group(1)} (`{match.group(2)}` in the repository)" if target.is_file() else match.group(0)
    return _OUTSIDE.sub(outside, markdown)
