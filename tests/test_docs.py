"""The repository's own documents: every link in the README and docs/ resolves to a file of the
repository (a user who clones it has nothing else), and the contract's sections that code and
tests cite by number exist."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_resolves_inside_the_repository(document):
    for target in LINK.findall(document.read_text()):
        assert "://" not in target, f"{document.name}: links out of the repository: {target}"
        path = (document.parent / target.split("#")[0]).resolve()
        assert path.is_relative_to(ROOT) and path.exists(), f"{document.name}: broken link {target}"


def test_cited_sections_of_the_contract_exist():
    spec = (ROOT / "docs" / "spec.md").read_text()
    sections = {int(n) for n in re.findall(r"^## (\d+)\. ", spec, re.M)}
    cited = set()
    for path in [ROOT / "README.md", *ROOT.glob("toolkit/**/*.py"), *ROOT.glob("schemas/*.py"),
                 *ROOT.glob("tests/**/*.py")]:
        for match in re.finditer(r"docs/spec\.md\)? sections? ([\d, and]+)", path.read_text()):
            cited |= {int(n) for n in re.findall(r"\d+", match.group(1))}
    assert cited and cited <= sections, sorted(cited - sections)
