"""Rules of the house that keep the code cheap to change, checked on every file:

- a module has at most ``LINE_BUDGET`` lines (toolkit/, layers/, schemas/, peers/, benchmarks/
  and tests/): past that it is doing more than one job, and is split by job;
- no file imports a test module (``test_*.py``): what tests share lives in a helper module
  (tests/<folder>/<what>.py) or a conftest fixture, so that a test module can move or be deleted
  with the code it tests, and pytest never collects one test module's tests twice;
- ``pytest tests`` (the script) finds the repository's packages as ``python -m pytest`` does.

The first two read the files' text (no import), so they are in the fast tier; the third runs
pytest in a child process.
"""
from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINE_BUDGET = 600
BUDGETED = ("toolkit", "layers", "schemas", "peers", "benchmarks", "tests")
# folders of inputs, not code: the fuzzers' corpus and the Caffe fixtures
NOT_CODE = ("tests/fuzz/corpus", "tests/data")


def python_files(root: Path, *tops: str) -> list[Path]:
    skip = {root / part for part in NOT_CODE}
    files = []
    for top in tops:
        for folder, dirs, names in os.walk(root / top):
            here = Path(folder)
            dirs[:] = sorted(d for d in dirs if d != "__pycache__" and here / d not in skip)
            files += [here / n for n in sorted(names) if n.endswith(".py")]
    return files


def over_budget(root: Path, files: list[Path]) -> list[tuple[str, int]]:
    counts = [(str(f.relative_to(root)), len(f.read_text(encoding="utf-8").splitlines())) for f in files]
    return sorted((name, n) for name, n in counts if n > LINE_BUDGET)


def _imports(tree: ast.AST, package: tuple[str, ...]) -> set[str]:
    """Every dotted name an import in ``tree`` may bring in as a module (``from a import b`` may
    import a.b), relative ones made absolute from ``package``, and those of every script held in
    a string constant, parsed the same way (the GPU stand-in's scripts import helpers in a child
    process)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else ()
            module = ".".join(base + tuple((node.module or "").split(".")) if node.module else base)
            names |= {module} | {f"{module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "import" in node.value:
            try:
                names |= _imports(ast.parse(textwrap.dedent(node.value)), ())
            except SyntaxError:              # prose, or a script in another language
                pass
    return names


def imported_test_modules(root: Path, path: Path) -> list[str]:
    """The test modules (test_*.py files under ``root``) that ``path`` imports."""
    package = path.relative_to(root).parent.parts
    names = _imports(ast.parse(path.read_text(encoding="utf-8"), str(path)), package)
    return sorted(n for n in names if n.rsplit(".", 1)[-1].startswith("test_")
                  and (root / (n.replace(".", "/") + ".py")).is_file())


def test_every_module_is_within_the_line_budget():
    offenders = over_budget(ROOT, python_files(ROOT, *BUDGETED))
    assert not offenders, (f"{len(offenders)} modules over {LINE_BUDGET} lines (split each by job):\n"
                           + "\n".join(f"  {name}: {n} lines" for name, n in offenders))


def test_the_line_budget_counts_lines_and_names_each_offender(tmp_path):
    (tmp_path / "pkg" / "__pycache__").mkdir(parents=True)
    (tmp_path / "pkg" / "small.py").write_text("x = 1\n" * LINE_BUDGET)
    (tmp_path / "pkg" / "big.py").write_text("x = 1\n" * (LINE_BUDGET + 1))
    (tmp_path / "pkg" / "__pycache__" / "big.py").write_text("x = 1\n" * 2000)
    assert over_budget(tmp_path, python_files(tmp_path, "pkg")) == [("pkg/big.py", LINE_BUDGET + 1)]


def test_no_file_imports_a_test_module():
    # this file quotes such imports in its own test below
    found = {str(f.relative_to(ROOT)): names for f in python_files(ROOT, *BUDGETED)
             if f != Path(__file__) and (names := imported_test_modules(ROOT, f))}
    assert not found, ("test modules imported (move what they share to a helper module or a fixture):\n"
                       + "\n".join(f"  {path}: {', '.join(names)}" for path, names in sorted(found.items())))


def test_an_import_of_a_test_module_is_found_in_code_in_a_script_and_by_name(tmp_path):
    for module in ("tests/ops/op_cases.py", "tests/train/test_loop.py", "tests/runtime/test_gpu_backend.py",
                   "tests/importers/test_onnx_models.py", "tests/importers/helpers.py", "toolkit/evaluate.py"):
        (tmp_path / module).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / module).write_text("")
    sample = tmp_path / "toolkit" / "sample.py"
    sample.write_text(textwrap.dedent('''\
        import os
        from tests.ops.op_cases import CASES
        from tests.train.test_loop import cli
        from .evaluate import test_graph
        SCRIPT = """
            import tests.runtime.test_gpu_backend as gpu
        """
        NOTE = "a sentence that says import, not code"


        def f():
            from tests.importers import (helpers,
                                         test_onnx_models)
        '''))
    assert imported_test_modules(tmp_path, sample) == [
        "tests.importers.test_onnx_models", "tests.runtime.test_gpu_backend", "tests.train.test_loop"]


def test_pytest_the_script_collects_what_imports_the_repository_packages():
    """``pytest`` (unlike ``python -m pytest``) does not put the working folder on sys.path: a test
    folder such as tests/layers then stood for the ``layers`` package, and ``tests.*`` helper
    modules could not be imported. Collecting modules that import both is the check."""
    modules = ["tests/layers/test_infer_mixed_nets.py", "tests/train/test_hostile_databases.py"]
    # -P: no working folder on sys.path, as the pytest script runs
    result = subprocess.run([sys.executable, "-P", "-c", "import pytest; raise SystemExit(pytest.console_main())",
                             "--collect-only", "-q", "-p", "no:cacheprovider", *modules],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert re.search(r"^\d+ tests collected", result.stdout, re.MULTILINE), result.stdout[-2000:]


def test_every_entry_of_the_tiers_names_a_test_that_exists():
    """An entry of tests/tiers.py that names nothing (a file moved or a test renamed) would drop
    tests from the fast tier or from the native kernels without a word."""
    from tests.tiers import FAST, NATIVE_FOLDERS, NOT_FAST, NUMPY_KERNELS
    missing = []
    for entry in FAST + NOT_FAST + NUMPY_KERNELS:
        path, _, name = entry.partition("::")
        if not (ROOT / path).exists() or (name and f"def {name}(" not in (ROOT / path).read_text(encoding="utf-8")):
            missing.append(entry)
    missing += [f"tests/{folder}/" for folder in NATIVE_FOLDERS if not (ROOT / "tests" / folder).is_dir()]
    assert not missing, missing


def test_a_tier_entry_takes_a_folder_a_file_a_test_and_its_parameters():
    from tests.tiers import listed
    entries = ("tests/ir/", "tests/ops/test_op_table.py", "tests/runtime/test_team.py::test_step")
    assert listed("tests/ir/test_dims.py::test_x", entries)
    assert listed("tests/ops/test_op_table.py::test_forward[add-float32]", entries)
    assert listed("tests/runtime/test_team.py::test_step[True]", entries)
    assert listed("tests/runtime/test_team.py::test_step", entries)
    assert not listed("tests/runtime/test_team.py::test_steps", entries)
    assert not listed("tests/irx/test_dims.py::test_x", entries)
    assert not listed("tests/ops/test_op_table_more.py::test_y", entries)


def test_test_files_have_unique_names():
    """pytest imports test files by their base name (the default prepend import mode): two files
    of one name in different folders make the second an import error, in whichever run collects
    both (a CI run failed on tests/distributed/test_pipeline.py beside tests/passes/')."""
    seen: dict[str, Path] = {}
    clashes = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        if path.name in seen:
            clashes.append(f"{seen[path.name].relative_to(ROOT)} and {path.relative_to(ROOT)}")
        seen.setdefault(path.name, path)
    assert not clashes, clashes
