"""The parsers against the fuzzing corpus (tests/fuzz/corpus: seeds from the tests' own files, and
every input the fuzzer once found to break the property), replayed in a child process under a
memory and time bound: each input ends in a result or a one-line refusal. Under ``-m slow``, atheris
fuzzes each parser for TOOLKIT_FUZZ_SECONDS (60 by default) and must find nothing."""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys

import pytest

from tests.bounded import ROOT
from tests.fuzz import targets
from tests.fuzz.run import corpus_files

TARGETS = list(targets.TARGETS)
NEEDS = {"prototxt": "google.protobuf", "caffemodel": "google.protobuf", "onnx": "onnx"}
MEMORY_MB = 1024


def _child(*args, timeout: float) -> subprocess.CompletedProcess:
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_MB << 20, MEMORY_MB << 20))
    return subprocess.run([sys.executable, "-m", "tests.fuzz.run", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, preexec_fn=limit, env=dict(os.environ, PYTHONPATH=str(ROOT)))


@pytest.mark.parametrize("target", TARGETS)
def test_every_corpus_input_ends_in_a_result_or_one_line(target):
    if target in NEEDS:
        pytest.importorskip(NEEDS[target], reason=f"the test extra's {NEEDS[target]} reads these files")
    files = corpus_files(target)
    assert files and all(f.stat().st_size <= 64 << 10 for f in files)
    r = _child(target, "--replay", timeout=60 + 2 * targets.SECONDS)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert r.stdout.count(": holds (") == len(files), r.stdout


def test_the_corpus_stays_small():
    total = sum(f.stat().st_size for t in TARGETS for f in corpus_files(t))
    assert total < 300 << 10, f"the corpus holds {total:,} bytes"


def test_the_check_tells_a_refusal_from_a_bug(monkeypatch):
    """What the fuzzer counts as a finding: any exception but a UserError whose problems print as
    lines that say something, and time."""
    from toolkit.errors import UserError

    def refuse(data):
        raise UserError("net.yaml: one line", "net.yaml: another line")

    def two_lines(data):                    # printed as one line, the break escaped
        raise UserError("net.yaml: one line\nand a second")

    def empty(data):
        raise UserError("")

    def bug(data):
        return {}[data]

    def slow(data):
        while True:
            pass
    for name, fn in [("refuse", refuse), ("two_lines", two_lines), ("empty", empty), ("bug", bug), ("slow", slow)]:
        monkeypatch.setitem(targets.TARGETS, name, fn)
    assert targets.check("refuse", b"") is None
    assert targets.check("two_lines", b"") is None
    assert targets.check("empty", b"").kind == "not one line"
    found = targets.check("bug", b"x")
    assert found.kind == "KeyError" and "test_fuzz.py" in found.where
    assert targets.check("slow", b"", seconds=0.2).kind == "took too long"


@pytest.mark.slow
@pytest.mark.parametrize("target", TARGETS)
def test_fuzzing_finds_nothing(target, tmp_path, request):
    # the suite's configuration would otherwise run every marked test: only when asked for
    if "slow" not in (request.config.option.markexpr or ""):
        pytest.skip("fuzzing takes minutes: run with -m slow")
    pytest.importorskip("atheris", reason="the test extra's atheris is the fuzzer")
    if target in NEEDS:
        pytest.importorskip(NEEDS[target], reason=f"the test extra's {NEEDS[target]} reads these files")
    seconds = float(os.environ.get("TOOLKIT_FUZZ_SECONDS", 60))
    r = subprocess.run([sys.executable, "-m", "tests.fuzz.run", target, "--seconds", str(seconds),
                        "--findings", str(tmp_path / "findings")], cwd=ROOT, capture_output=True, text=True,
                       timeout=seconds + 300, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    lines = r.stdout.strip().splitlines()
    assert lines, r.stderr[-3000:]
    totals = json.loads(lines[-1])
    print(f"{target}: {totals['execs']:,} executions in {totals['seconds']} s, coverage {totals['cov']} edges "
          f"({totals['ft']} features), corpus {totals['corpus']}")
    findings = {p.stem: p.read_text() for p in (tmp_path / "findings").glob("*.txt")}
    assert r.returncode == 0 and not findings, "\n\n".join(findings.values())[-6000:]
    assert totals["execs"] > 0
