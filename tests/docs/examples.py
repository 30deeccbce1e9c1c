"""The examples of the README and of the documentation site, read out of the Markdown.

Every fenced block of README.md and docs/**/*.md is one of:

- ```sh : commands as a reader types them, run by ``bash -e -o pipefail``;
- ```python : run by the toolkit's Python;
- a fence with a title (```yaml title="mlp.yaml"): a file the reader writes, written to that name;
- anything else (```text, or yaml without a title): shown, not run.

A page's blocks run top to bottom in one folder of the page's own. A comment on the line right
before a fence changes that: ``<!-- example: skip: REASON -->`` (not run, and the reason is
said), ``<!-- example: dry-run: REASON -->`` (run from the repository's root with every command
line parsed and nothing done: for benchmarks that take minutes and commands that need a GPU,
whose flags are so still checked against the code) or ``<!-- example: exit N -->`` (the block
must end with that exit status, for the examples of errors). ```bash, ```console and ```shell
are refused, so that no shell example can escape being run by being spelled another way.

``python -m tests.docs.examples`` prints the count of examples per page and every skip reason.
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHELL, PYTHON, FILE, SHOWN = "sh", "python", "file", "shown"
REFUSED_LANGUAGES = {"bash", "console", "shell", "shell-session", "zsh", "pycon", "ipython"}

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<lang>[\w+-]*)[ \t]*(?P<attrs>.*)$")
_TITLE = re.compile(r'title="([^"]+)"')
_DIRECTIVE = re.compile(r"^\s*<!--\s*example:\s*(?P<body>.*?)\s*-->\s*$")
_PORT = re.compile(r"(?:--port[ =]|localhost:|127\.0\.0\.1:)(\d{2,5})\b")


class ConventionError(ValueError):
    """A block that breaks the convention above, at its PAGE:LINE."""


@dataclass(frozen=True)
class Block:
    page: str              # relative to the repository
    line: int              # of the opening fence, 1-based
    kind: str              # SHELL, PYTHON, FILE or SHOWN
    code: str
    title: str | None = None
    skip: str | None = None            # the reason it is not run
    exit_status: int = 0
    dry_run: str | None = None         # the reason its command lines are only parsed

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def runs(self) -> bool:
        return self.kind in (SHELL, PYTHON) and self.skip is None and self.dry_run is None


def pages() -> list[Path]:
    """README.md and every page of the site's sources (the build hooks' folder is code)."""
    docs = ROOT / "docs"
    found = [p for p in sorted(docs.rglob("*.md")) if "hooks" not in p.relative_to(docs).parts]
    return [ROOT / "README.md", *found]


def _directive(lines: list[str], fence_index: int, where: str) -> dict:
    """What the comment just above a fence says: a skip or dry-run reason, an exit status."""
    match = _DIRECTIVE.match(lines[fence_index - 1]) if fence_index else None
    if not match:
        return {}
    body = match.group("body")
    for word, key in (("skip:", "skip"), ("dry-run:", "dry_run")):
        if body.startswith(word) and body[len(word):].strip():
            return {key: body[len(word):].strip()}
    if re.fullmatch(r"exit \d+", body):
        return {"exit_status": int(body.split()[1])}
    raise ConventionError(f"{where}: '<!-- example: {body} -->': write 'skip: REASON', 'dry-run: REASON' "
                          "or 'exit N'")


def blocks_of(path: Path) -> list[Block]:
    """The fenced blocks of one Markdown file, in order."""
    page = str(path.relative_to(ROOT))
    lines = path.read_text(encoding="utf-8").splitlines()
    found, i = [], 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, fence = opening.group("indent"), opening.group("fence")
        lang, attrs = opening.group("lang").lower(), opening.group("attrs")
        where = f"{page}:{i + 1}"
        body, j = [], i + 1
        while j < len(lines) and not re.match(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$", lines[j]):
            line = lines[j]
            body.append(line[len(indent):] if line.startswith(indent) else line.lstrip())
            j += 1
        if j == len(lines):
            raise ConventionError(f"{where}: a fence that is never closed")
        if lang in REFUSED_LANGUAGES:
            raise ConventionError(f"{where}: ```{lang}: write shell examples as ```sh (they are run)")
        directive = _directive(lines, i, where)
        title = _TITLE.search(attrs)
        kind = FILE if title else SHELL if lang == "sh" else PYTHON if lang == "python" else SHOWN
        if kind == SHOWN and directive:
            raise ConventionError(f"{where}: a directive on a block that is not run")
        if "dry_run" in directive and kind != SHELL:
            raise ConventionError(f"{where}: dry-run is for ```sh blocks")
        found.append(Block(page, i + 1, kind, "\n".join(body) + "\n", title.group(1) if title else None,
                           **directive))
        i = j + 1
    return found


def all_blocks(errors: list[str] | None = None) -> dict[str, list[Block]]:
    """Every page's blocks, by page. With ``errors``, a page that breaks the convention is
    left out and its error appended there; without, the error is raised."""
    found = {}
    for path in pages():
        try:
            found[str(path.relative_to(ROOT))] = blocks_of(path)
        except ConventionError as error:
            if errors is None:
                raise
            errors.append(str(error))
    return found


def ports_by_page(blocks: dict[str, list[Block]]) -> dict[str, set[int]]:
    """The TCP ports each page's examples serve on or ask."""
    return {page: {int(p) for b in found if b.kind in (SHELL, PYTHON) for p in _PORT.findall(b.code)}
            for page, found in blocks.items()}


def main() -> int:
    totals = {SHELL: 0, PYTHON: 0, FILE: 0, "skipped": 0, "dry": 0}
    skipped, dry, errors = [], [], []
    for page, found in all_blocks(errors).items():
        counts = {kind: sum(b.kind == kind and (b.runs or kind == FILE) for b in found)
                  for kind in (SHELL, PYTHON, FILE)}
        skips, dries = [b for b in found if b.skip], [b for b in found if b.dry_run]
        if not any(counts.values()) and not skips and not dries:
            continue
        for kind in counts:
            totals[kind] += counts[kind]
        totals["skipped"] += len(skips)
        totals["dry"] += len(dries)
        skipped += [f"  {b.where}: {b.skip}" for b in skips]
        dry += [f"  {b.where}: {b.dry_run}" for b in dries]
        print(f"{page}: {counts[SHELL]} sh, {counts[PYTHON]} python run; {len(dries)} sh parsed only; "
              f"{counts[FILE]} files; {len(skips)} not run")
    print(f"total: {totals[SHELL]} sh and {totals[PYTHON]} python examples run, {totals['dry']} sh examples "
          f"parsed only, {totals[FILE]} files written, {totals['skipped']} examples not run.")
    print("parsed only:\n" + "\n".join(dry))
    print("not run:\n" + "\n".join(skipped))
    if errors:
        print("pages that break the convention:\n  " + "\n  ".join(errors))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
