"""Every example of the README and of the documentation site, run as written (the convention is
in tests/docs/examples.py): each page's shell and Python blocks run top to bottom in a folder of
the page's own, with the files its titled blocks write, and each must end with exit status 0, or
the status its ``<!-- example: exit N -->`` comment gives. The folder has the reader's ``.venv``
(a link to the toolkit's environment), and that environment's ``bin`` leads PATH, as after
``. .venv/bin/activate``. A server a page starts in the
background is stopped when the page ends."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.docs.examples import FILE, ROOT, SHELL, ConventionError, all_blocks, blocks_of, ports_by_page

BLOCK_TIMEOUT_S = 300
BIN = Path(sys.executable).parent           # the toolkit's environment: its `toolkit` and `python`
BLOCKS = all_blocks([])
RUNNABLE = sorted(page for page, found in BLOCKS.items() if any(b.runs or b.kind == FILE for b in found))
DRY = [block for found in BLOCKS.values() for block in found if block.dry_run]


def test_every_page_follows_the_convention():
    errors: list[str] = []
    all_blocks(errors)
    assert not errors, "\n".join(errors)


def test_a_block_spelled_to_escape_the_run_is_refused(tmp_path, monkeypatch):
    from tests.docs import examples
    monkeypatch.setattr(examples, "ROOT", tmp_path)
    page = tmp_path / "page.md"
    page.write_text("text\n\n```console\n$ toolkit train x.yaml\n```\n")
    with pytest.raises(ConventionError, match=r"page\.md:3: ```console: write shell examples as ```sh"):
        blocks_of(page)
    page.write_text("<!-- example: skip: -->\n```sh\ntoolkit --version\n```\n")
    with pytest.raises(ConventionError, match=r"page\.md:2: .*write 'skip: REASON', 'dry-run: REASON' or 'exit N'"):
        blocks_of(page)
    page.write_text('<!-- example: exit 2 -->\n```sh\ntoolkit check bad.yaml\n```\n\n```yaml title="bad.yaml"\n'
                    'name: x\n```\n\n```text\nshown\n```\n')
    shell, written, shown = blocks_of(page)
    assert (shell.kind, shell.exit_status, shell.line) == (SHELL, 2, 2)
    assert (written.kind, written.title, written.code) == (FILE, "bad.yaml", "name: x\n")
    assert not shown.runs


def test_no_two_pages_serve_on_the_same_port():
    seen: dict[int, str] = {}
    for page, ports in ports_by_page(BLOCKS).items():
        for port in ports:
            assert port not in seen, f"{page} and {seen[port]} both use port {port}: examples run side by side"
            seen[port] = page


def _stop(groups: list[int]) -> None:
    """Ends every process a page's blocks started, servers in the background included."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for group in groups:
            try:
                os.killpg(group, sig)
            except ProcessLookupError:
                pass
        if sig == signal.SIGTERM:
            time.sleep(0.5)


def _run(block, folder: Path, env: dict, groups: list[int]) -> None:
    command = ["bash", "-e", "-o", "pipefail", "-c", block.code] if block.kind == SHELL \
        else [str(BIN / "python"), "-c", block.code]
    log = folder.parent / f"{folder.name}-{block.line}.log"
    with open(log, "wb") as out:
        # output to a file, not a pipe: a server left running in the background keeps a pipe open
        proc = subprocess.Popen(command, cwd=folder, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        groups.append(proc.pid)
        try:
            status = proc.wait(timeout=BLOCK_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            _stop([proc.pid])
            status = f"no end after {BLOCK_TIMEOUT_S} s"
    if status != block.exit_status:
        tail = log.read_text(errors="replace")[-3000:]
        pytest.fail(f"{block.where}: exit status {status}, expected {block.exit_status}\n"
                    f"--- the block ---\n{block.code}--- its output (end) ---\n{tail}", pytrace=False)


@pytest.mark.parametrize("page", RUNNABLE)
def test_the_examples_of(page, tmp_path):
    folder = tmp_path / "page"
    folder.mkdir()
    # the reader works in the checkout, where `make` made .venv: `.venv/bin/toolkit` is theirs
    (folder / ".venv").symlink_to(sys.prefix, target_is_directory=True)
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
               MPLBACKEND="Agg", PYTHONUNBUFFERED="1")
    groups: list[int] = []
    try:
        for block in BLOCKS[page]:
            if block.skip is not None:
                continue
            if block.kind == FILE:
                target = folder / block.title
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(block.code)
            elif block.runs:
                _run(block, folder, env, groups)
    finally:
        _stop(groups)


def _dry_run(code: str, tmp_path: Path) -> list[str]:
    """Runs a shell block from the repository's root with every Python command line parsed and
    nothing done (tests/docs/parse_only.py as sitecustomize); the parse log's lines."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text((Path(__file__).parent / "parse_only.py").read_text())
    log = tmp_path / "parsed.log"
    python_path = os.pathsep.join(filter(None, [str(hook), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", PYTHONPATH=python_path,
               TOOLKIT_EXAMPLE_PARSE_LOG=str(log))
    proc = subprocess.Popen(["bash", "-c", code], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        proc.wait(timeout=BLOCK_TIMEOUT_S)
    finally:
        _stop([proc.pid])
    return log.read_text().splitlines() if log.exists() else []


def test_a_dry_run_checks_flags_without_doing_the_work(tmp_path):
    lines = _dry_run("toolkit bench zoo:lenet --batch 64 --iters 100000\n"
                     "toolkit bench zoo:lenet --batch 64 --no-such-flag\n", tmp_path)
    assert lines[0].startswith("ok ") and lines[0].endswith("bench zoo:lenet --batch 64 --iters 100000"), lines
    assert lines[1].startswith("error ") and "unrecognized arguments: --no-such-flag" in lines[1], lines


@pytest.mark.parametrize("block", DRY, ids=lambda b: b.where)
def test_the_command_lines_of(block, tmp_path):
    lines = _dry_run(block.code, tmp_path)
    errors = [line for line in lines if line.startswith("error ")]
    assert lines and not errors, f"{block.where}: " + ("\n".join(errors) or "no command line was parsed")
