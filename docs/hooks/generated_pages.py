"""Two pages of the documentation site made when it builds, each from its one source: the settings
page (settings.md) from ``toolkit.settings.KNOBS``, and the changelog (changelog.md) from the
repository's CHANGELOG.md.

Registered under ``hooks:`` in mkdocs.yml; the pages are written into the build, never into docs/
(a file of docs/ at either page's path stops the build: the page has one source).
A setting without a description (its ``help``) stops the build with a message naming its
variable (reference.py's ``DriftError``): the page cannot drift from the table. The changelog's
links to files of docs/ (``docs/spec.md``) become links between the site's pages (``spec.md``).

The page functions need no MkDocs: tests/docs/test_site.py calls them directly.
"""
from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SETTINGS_PAGE = "settings.md"
CHANGELOG_PAGE = "changelog.md"
CHANGELOG = ROOT / "CHANGELOG.md"


def _reference():
    """reference.py, loaded by path (MkDocs loads each hook as a module of its own)."""
    module = sys.modules.get("docs_reference_hook")
    if module is None:
        spec = importlib.util.spec_from_file_location("docs_reference_hook", Path(__file__).with_name("reference.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    return module


DriftError = _reference().DriftError


def settings_page(knobs=None) -> str:
    """The settings page in Markdown (``toolkit.settings.markdown``); raises DriftError naming every
    knob without a description."""
    from toolkit import settings
    knobs = settings.KNOBS if knobs is None else tuple(knobs)
    missing = [f"setting {knob.variable} ({knob.name}): no description (give its Knob a help=...)"
               for knob in knobs if not (knob.help or "").strip()]
    if missing:
        raise DriftError("the settings page would drift from the code:\n  " + "\n  ".join(missing))
    return settings.markdown(knobs)


_DOCS_LINK = re.compile(r"\]\(docs/([^)\s]+)\)")


def changelog_page(path: Path = CHANGELOG) -> str:
    """CHANGELOG.md as the site's page: the same text, its links into docs/ made the site's own."""
    text = path.read_text()
    return _DOCS_LINK.sub(r"](\1)", text)


def on_files(files, config):
    """Adds the generated pages to the build (they exist in site/ only)."""
    from mkdocs.exceptions import PluginError
    from mkdocs.structure.files import File
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    try:
        pages = ((SETTINGS_PAGE, settings_page()), (CHANGELOG_PAGE, changelog_page()))
    except DriftError as error:
        raise PluginError(str(error)) from None   # one clear message, not a traceback
    for uri, content in pages:
        if files.get_file_from_path(uri) is not None:
            raise PluginError(f"docs/{uri} is generated when the site builds ({Path(__file__).name}); "
                              "remove the file (edit its source instead)")
        files.append(File.generated(config, uri, content=content))
    return files
