"""Fuzzing the parsers with atheris (coverage-guided, libFuzzer's engine), and replaying a corpus.

    python -m tests.fuzz.run TARGET --seconds 600 [--findings DIR] [--memory-mb 3072]
    python -m tests.fuzz.run TARGET --replay [FILE ...]

A fuzzing run starts from the target's corpus (tests/fuzz/corpus/TARGET, read only; what the
fuzzer adds goes to a scratch folder) and the words of its format (tests/fuzz/dicts/TARGET.dict,
libFuzzer's dictionary) with the toolkit's modules instrumented for coverage. Every
input is checked by targets.check; an input that breaks the property is written to the findings
folder (one file per distinct finding: its kind and the toolkit's frame it came from, with the
traceback beside it) and the run goes on. Should the engine itself stop (an input past its memory
or time bound, which it kills), that input is a finding too and a new engine takes the time left.
The last line says what it did: executions, coverage (libFuzzer's edges and features), corpus
and findings.

A replay runs each corpus file (or the FILEs) once through the same check and prints each finding;
its exit status is 1 if there was any.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CORPUS = HERE / "corpus"
INSTRUMENTED = ["toolkit", "layers", "schemas"]
MAX_LEN = 64 << 10                 # no seed is larger; longer inputs only slow the engine down


def corpus_files(target: str) -> list[Path]:
    return sorted(p for p in (CORPUS / target).iterdir() if p.is_file())


def _limit_memory(memory_mb: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))


# -- the engine's process ---------------------------------------------------------------------------

def _engine(target: str, findings: Path, engine_args: list[str]) -> None:
    """Runs inside the child: instruments the toolkit, then hands the target to atheris."""
    import atheris

    from tests.fuzz import targets
    with atheris.instrument_imports(include=INSTRUMENTED):
        targets.warm_up()
        for seed in corpus_files(target)[:8]:          # what the targets import lazily, imported here
            targets.check(target, seed.read_bytes())
    seen: set[str] = {p.stem for p in findings.glob("*.txt")}

    def one_input(data: bytes) -> None:
        finding = targets.check(target, data)
        if finding is None:
            return
        name = hashlib.sha1(finding.key.encode()).hexdigest()[:12]
        if name in seen:
            return
        seen.add(name)
        (findings / f"{name}.input").write_bytes(data)
        (findings / f"{name}.txt").write_text(f"{finding.key}\n\n{finding.text}\n")
        print(f"FINDING {name}: {finding.key}", file=sys.stderr, flush=True)

    atheris.Setup([sys.argv[0], *engine_args], one_input)
    atheris.Fuzz()


# -- the driver --------------------------------------------------------------------------------------

def _stats(log: str) -> dict:
    """What libFuzzer's output says: executions, the last cov/ft/corpus figures."""
    out = {"execs": 0, "cov": 0, "ft": 0, "corpus": 0}
    runs = re.findall(r"stat::number_of_executed_units: (\d+)", log)
    if runs:
        out["execs"] = int(runs[-1])
    else:
        counts = re.findall(r"^#(\d+)\s", log, re.M)
        out["execs"] = int(counts[-1]) if counts else 0
    for key in ("cov", "ft"):
        found = re.findall(rf"\b{key}: (\d+)", log)
        if found:
            out[key] = int(found[-1])
    corp = re.findall(r"corp: (\d+)/", log)
    if corp:
        out["corpus"] = int(corp[-1])
    return out


def fuzz(target: str, seconds: float, findings: Path, memory_mb: int, log_to=None, keep: Path | None = None) -> dict:
    """Fuzzes ``target`` for ``seconds`` in engine processes; the totals and the findings. The
    inputs the engines add to the corpus go to ``keep`` (else a scratch folder removed at the end)."""
    findings.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f"toolkit-fuzz-{target}-"))
    try:
        return _fuzz(target, seconds, findings, memory_mb, log_to, scratch, keep or scratch / "corpus")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _fuzz(target: str, seconds: float, findings: Path, memory_mb: int, log_to, scratch: Path, grown: Path) -> dict:
    grown.mkdir(parents=True, exist_ok=True)
    totals = {"target": target, "seconds": 0.0, "execs": 0, "cov": 0, "ft": 0, "corpus": 0, "engines": 0}
    start = time.monotonic()
    while (left := seconds - (time.monotonic() - start)) > 5:
        artifacts = scratch / f"artifact-{totals['engines']}-"
        engine_args = [str(grown), str(CORPUS / target), f"-max_total_time={int(left)}",
                       f"-timeout={int(3 * _targets().SECONDS)}", f"-rss_limit_mb={memory_mb - 512}",
                       f"-max_len={MAX_LEN}", "-print_final_stats=1", f"-artifact_prefix={artifacts}"]
        words = HERE / "dicts" / f"{target}.dict"      # the format's words: mutations that reach its values
        if words.exists():
            engine_args.append(f"-dict={words}")
        cmd = [sys.executable, "-m", "tests.fuzz.run", target, "--engine", "--findings", str(findings), "--",
               *engine_args]
        proc = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT), TOOLKIT_NATIVE="0",
                                                       TOOLKIT_FUZZ_SCRATCH=str(scratch)),
                              capture_output=True, text=True, preexec_fn=lambda: _limit_memory(memory_mb))
        log = proc.stdout + proc.stderr
        if log_to is not None:
            log_to.write(log)
            log_to.flush()
        stats = _stats(log)
        totals["engines"] += 1
        totals["execs"] += stats["execs"]
        totals["cov"] = max(totals["cov"], stats["cov"])
        totals["ft"] = max(totals["ft"], stats["ft"])
        totals["corpus"] = max(totals["corpus"], stats["corpus"])
        # the engine's own verdict on an input it killed (past -timeout or -rss_limit_mb, or a crash
        # outside the check): kept as a finding with the engine's words
        for artifact in sorted(scratch.glob(f"artifact-{totals['engines'] - 1}-*")):
            kind = artifact.name.split("-")[2]
            name = hashlib.sha1(artifact.read_bytes()).hexdigest()[:12]
            (findings / f"{name}.input").write_bytes(artifact.read_bytes())
            tail = "\n".join(log.splitlines()[-40:])
            (findings / f"{name}.txt").write_text(f"engine: {kind}\n\n{tail}\n")
        if proc.returncode == 0:
            break
        if stats["execs"] == 0:          # an engine that cannot start: say why rather than loop
            raise SystemExit(f"the fuzzing engine did not start:\n{log[-3000:]}")
    totals["seconds"] = round(time.monotonic() - start, 1)
    totals["findings"] = [p.read_text().splitlines()[0] + f" ({p.with_suffix('.input').name})"
                          for p in sorted(findings.glob("*.txt"))]
    return totals


def _targets():
    from tests.fuzz import targets
    return targets


def replay(target: str, files: list[Path]) -> int:
    targets = _targets()
    targets.warm_up()
    failed = 0
    for path in files:
        start = time.perf_counter()
        finding = targets.check(target, path.read_bytes())
        took = time.perf_counter() - start
        if finding is not None:
            failed += 1
            print(f"{path.name}: {finding.key}\n{finding.text}", flush=True)
        else:
            print(f"{path.name}: holds ({took:.2f} s)", flush=True)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("target", choices=["prototxt", "caffemodel", "onnx", "netfile", "kserve"])
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--findings", type=Path, help="where findings are written (default: a new temporary folder)")
    parser.add_argument("--memory-mb", type=int, default=3072, help="the engine's address-space limit")
    parser.add_argument("--log", type=Path, help="append the engines' output to this file")
    parser.add_argument("--keep-corpus", type=Path, help="keep the inputs the fuzzer adds to the corpus here")
    parser.add_argument("--replay", nargs="*", type=Path, help="replay these files (none: the target's corpus)")
    parser.add_argument("--engine", action="store_true", help=argparse.SUPPRESS)
    argv = sys.argv[1:] if argv is None else list(argv)
    engine_args = argv[argv.index("--") + 1:] if "--" in argv else []    # libFuzzer's own flags
    args = parser.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    if args.engine:
        _engine(args.target, args.findings, engine_args)
        return 0
    if args.replay is not None:
        return replay(args.target, args.replay or corpus_files(args.target))
    findings = args.findings or Path(tempfile.mkdtemp(prefix=f"toolkit-fuzz-findings-{args.target}-"))
    log = open(args.log, "a") if args.log else None
    try:
        totals = fuzz(args.target, args.seconds, findings, args.memory_mb, log, args.keep_corpus)
    finally:
        if log:
            log.close()
    for line in totals["findings"]:
        print(f"finding: {line}")
    print(json.dumps({**totals, "findings": len(totals["findings"]), "folder": str(findings)}))
    return 1 if totals["findings"] else 0


if __name__ == "__main__":
    sys.exit(main())
