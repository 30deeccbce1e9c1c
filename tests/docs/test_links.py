"""The repository's own documents: every link in the README and docs/ resolves to a file of the
repository or a page of the site (a user who clones it has the repository; the site's pages that
are generated when it builds are those its nav lists), every link out is https, and the contract's
sections that code and tests cite by number exist. ``make docs`` checks the site's links again,
anchors included, in strict mode."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
DOCUMENTS = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md") if "hooks" not in p.parts)]


def _nav_pages(entries) -> set[str]:
    """The pages mkdocs.yml's nav lists, as paths below docs/."""
    found = set()
    for entry in entries:
        for value in (entry.values() if isinstance(entry, dict) else [entry]):
            found |= _nav_pages(value) if isinstance(value, list) else {value}
    return found


def _pictures() -> set[str]:
    """The pictures the site's build draws (docs/hooks/pictures.py's PICTURES), read as text."""
    text = (ROOT / "docs" / "hooks" / "pictures.py").read_text()
    return set(re.findall(r'"(images/[\w.-]+)"', re.search(r"^PICTURES = \((.*?)\)$", text, re.M).group(1)))


SITE_PAGES = {(ROOT / "docs" / page).resolve()
              for page in _nav_pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]) | _pictures()}
FENCED = re.compile(r"^(`{3,}|~{3,}).*?^\1", re.S | re.M)


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_resolves_inside_the_repository(document):
    for target in LINK.findall(FENCED.sub("", document.read_text())):     # code is not a link
        if "://" in target:
            assert target.startswith("https://"), f"{document.name}: a link out that is not https: {target}"
            continue
        if target.startswith("#"):
            continue
        path = (document.parent / target.split("#")[0]).resolve()
        assert path.is_relative_to(ROOT) and (path.exists() or path in SITE_PAGES), \
            f"{document.name}: broken link {target}"


def test_cited_sections_of_the_contract_exist():
    spec = (ROOT / "docs" / "spec.md").read_text()
    sections = {int(n) for n in re.findall(r"^## (\d+)\. ", spec, re.M)}
    cited = set()
    for path in [ROOT / "README.md", *ROOT.glob("toolkit/**/*.py"), *ROOT.glob("schemas/*.py"),
                 *ROOT.glob("tests/**/*.py")]:
        for match in re.finditer(r"docs/spec\.md\)? sections? ([\d, and]+)", path.read_text()):
            cited |= {int(n) for n in re.findall(r"\d+", match.group(1))}
    assert cited and cited <= sections, sorted(cited - sections)
