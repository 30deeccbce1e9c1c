"""The floors of docs/architecture.md, held against the code's own imports: each package of the
toolkit imports only the floors the page allows it (module level or inside a function alike),
nothing imports a device's kernels by name but the registry's table, and no package is named
``dist`` or ``build`` (tools skip such folders)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# unit -> the units it may import (its own files aside). A unit is a package of toolkit/, a
# top-level module of toolkit/, or layers/ and schemas/. Keep in step with docs/architecture.md.
GROUND = {"toolkit/errors", "toolkit/fileio", "toolkit/cachedir", "toolkit/hostmem", "toolkit/hostcpu",
          "toolkit/settings", "toolkit/onnxtypes", "toolkit/version"}
ALLOWED: dict[str, set[str]] = {
    "toolkit/errors": set(),
    "toolkit/fileio": {"toolkit/errors"},
    "toolkit/cachedir": {"toolkit/settings"},
    "toolkit/hostmem": set(),
    "toolkit/hostcpu": set(),
    # ONNX's element-type numbers, read by the importer and written by the exporter
    "toolkit/onnxtypes": set(),
    # the version the server, the model cards and --version name
    "toolkit/version": set(),
    # every knob, read from the environment once (docs/settings.md)
    "toolkit/settings": {"toolkit/errors"},
    "schemas": set(),
    "toolkit/distributed": GROUND,
    "toolkit/ir": GROUND,
    "toolkit/codegen": GROUND,
    "toolkit/arrayfiles": GROUND,
    "toolkit/importers": GROUND,
    # an ONNX layer's parameters start from the model file's initializers
    "toolkit/weights": GROUND | {"toolkit/arrayfiles", "toolkit/importers"},
    "toolkit/ops": GROUND | {"toolkit/ir", "toolkit/distributed", "toolkit/codegen"},
    "toolkit/backend": GROUND | {"toolkit/ir"},
    "layers": GROUND | {"schemas", "toolkit/ir", "toolkit/ops", "toolkit/importers"},
    "toolkit/optim": GROUND | {"toolkit/ir", "toolkit/ops"},
    "toolkit/passes": GROUND | {"toolkit/ir", "toolkit/ops", "toolkit/backend"},
    "toolkit/runtime": GROUND | {"toolkit/ir", "toolkit/ops", "toolkit/backend", "toolkit/codegen",
                                "toolkit/distributed"},
    "toolkit/kernels": GROUND | {"toolkit/ir", "toolkit/ops", "toolkit/backend", "toolkit/codegen",
                                 "toolkit/distributed", "toolkit/runtime"},
    "toolkit/frontend": GROUND | {"schemas", "layers", "toolkit/ir", "toolkit/ops", "toolkit/passes",
                                  "toolkit/weights", "toolkit/importers"},
    "toolkit/exporters": GROUND | {"toolkit/ir"},
    "toolkit/compile": GROUND | {"toolkit/ir", "toolkit/ops", "toolkit/backend", "toolkit/optim",
                                 "toolkit/passes", "toolkit/frontend"},
    "toolkit/training": GROUND | {"schemas", "toolkit/arrayfiles", "toolkit/ir", "toolkit/ops", "toolkit/backend",
                                  "toolkit/optim", "toolkit/passes", "toolkit/runtime", "toolkit/frontend",
                                  "toolkit/weights", "toolkit/compile", "toolkit/distributed", "toolkit/placement"},
    # what a placement costs and the placers choosing by it: above the compiler, below training
    "toolkit/placement": GROUND | {"toolkit/ir", "toolkit/ops", "toolkit/backend", "toolkit/optim", "toolkit/passes",
                                   "toolkit/runtime", "toolkit/frontend", "toolkit/weights", "toolkit/compile"},
    # the plan `toolkit bench`, the tests and the benchmarks time (beside training: above compile)
    "toolkit/benchmarking": GROUND | {"toolkit/ir", "toolkit/backend", "toolkit/optim", "toolkit/passes",
                                      "toolkit/runtime", "toolkit/frontend", "toolkit/compile", "toolkit/placement"},
    "toolkit/zoo": GROUND | {"schemas", "toolkit/ir", "toolkit/backend", "toolkit/passes",
                             "toolkit/runtime", "toolkit/frontend", "toolkit/weights", "toolkit/compile",
                             "toolkit/training"},
    "toolkit/inference": GROUND | {"toolkit/ir", "toolkit/backend", "toolkit/passes", "toolkit/runtime",
                                   "toolkit/frontend", "toolkit/compile", "toolkit/zoo"},
    # serving knows no training, no compiler: the model it serves is handed to it
    "toolkit/serve": GROUND,
    # calibration runs the fp32 infer phase (inference.py) over data transformed as infer does
    "toolkit/quantization": GROUND | {"toolkit/ir", "toolkit/ops", "toolkit/backend", "toolkit/passes",
                                      "toolkit/runtime", "toolkit/frontend", "toolkit/compile", "toolkit/training",
                                      "toolkit/zoo", "toolkit/inference", "toolkit/weights"},
    "toolkit/api": GROUND | {"toolkit/ir", "toolkit/backend", "toolkit/runtime", "toolkit/frontend", "toolkit/compile",
                             "toolkit/training", "toolkit/zoo", "toolkit/inference", "toolkit/quantization"},
    # the faces: anything below them
    "toolkit/commands": None,
    "toolkit/cli": None,
    # the package's face: `toolkit.load` and `toolkit.UserError`, imported when first asked for
    # (the one import that runs back up a floor; docs/architecture.md says why)
    "toolkit/__init__": GROUND | {"toolkit/api"},
}


def _unit(parts: tuple[str, ...]) -> str:
    if parts[0] in ("layers", "schemas"):
        return parts[0]
    if len(parts) == 1 or parts[1] == "__init__":
        return "toolkit/__init__"
    return f"toolkit/{parts[1]}"


def _is_module(parts: tuple[str, ...]) -> bool:
    path = ROOT.joinpath(*parts)
    return path.with_suffix(".py").is_file() or path.is_dir()


def _imports():
    """(importing file, its unit, the unit imported, line) for every import of the toolkit's own
    packages in toolkit/, layers/ and schemas/."""
    for path in sorted(p for top in ("toolkit", "layers", "schemas") for p in (ROOT / top).rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        module = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        package = module if rel.name == "__init__" else module[:-1]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = package[:len(package) - node.level + 1] if node.level else ()
                target = tuple(base) + tuple((node.module or "").split(".") if node.module else ())
                # `from . import name`: a submodule, or a name the package itself defines
                targets = [target + (a.name,) if not node.module and _is_module(target + (a.name,)) else target
                           for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [tuple(a.name.split(".")) for a in node.names]
            else:
                continue
            for t in targets:
                if t and t[0] in ("toolkit", "layers", "schemas"):
                    yield path.relative_to(ROOT), _unit(module), _unit(t), node.lineno


def test_every_unit_is_on_the_page():
    units = {unit for _path, unit, _target, _line in _imports()}
    assert units <= set(ALLOWED), sorted(units - set(ALLOWED))


def test_each_unit_imports_only_the_floors_below_it():
    wrong = [f"{path}:{line}: {unit} imports {target}" for path, unit, target, line in _imports()
             if target != unit and ALLOWED.get(unit) is not None and target not in ALLOWED[unit]]
    assert not wrong, "\n".join(wrong)


def test_the_allowed_imports_have_no_circle():
    """The page's floors are floors: following 'may import' never comes back."""
    def reach(unit, seen):
        if unit == "toolkit/__init__":            # its lazy face import: the page's one exception
            return
        for nxt in ALLOWED.get(unit) or ():
            if nxt == start:
                pytest.fail(f"{start} can reach itself through {unit}")
            if nxt not in seen:
                seen.add(nxt)
                reach(nxt, seen)
    for start in ALLOWED:
        if start != "toolkit/__init__" and ALLOWED[start] is not None:
            reach(start, {start})


def test_only_the_registry_loads_kernels_and_nothing_imports_them_from_below():
    importers = {(unit, str(path)) for path, unit, target, _line in _imports() if target == "toolkit/kernels"}
    assert all(unit in ("toolkit/kernels",) for unit, _path in importers), sorted(importers)
    registry = (ROOT / "toolkit" / "backend" / "registry.py").read_text()
    assert "importlib.import_module" in registry


def _top_level_imports(top: str) -> set[tuple[str, str]]:
    """(file, top-level package it imports) for every import in the files under ``top``."""
    found = set()
    for path in (ROOT / top).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else []
            found |= {(str(path.relative_to(ROOT)), name.split(".")[0]) for name in names}
    return found


def test_the_product_imports_no_oracle_and_the_benchmarks_no_test():
    """peers/ (the PyTorch and ONNX translations the tests and benchmarks compare with) is not
    installed, so nothing installed may import it; benchmarks share what they need with the tests
    through peers/, never by importing tests/."""
    wrong = [f"{path} imports {name}" for top in ("toolkit", "layers", "schemas")
             for path, name in _top_level_imports(top) if name in ("peers", "tests", "benchmarks")]
    wrong += [f"{path} imports {name}" for top in ("benchmarks", "peers")
              for path, name in _top_level_imports(top) if name == "tests"]
    assert not wrong, "\n".join(sorted(wrong))


def test_no_folder_is_named_dist_or_build():
    for top in ("toolkit", "layers", "schemas", "tests", "benchmarks", "zoo", "docs"):
        for path in (ROOT / top).rglob("*"):
            if path.is_dir() and "__pycache__" not in path.parts:
                assert path.name not in ("dist", "build"), path


def test_every_source_folder_is_a_package():
    """A folder of modules without __init__.py imports as a namespace package in a checkout but
    is left out of the wheel (setuptools' find_packages)."""
    for top in ("toolkit", "layers", "schemas"):
        for folder in [ROOT / top, *(p for p in (ROOT / top).rglob("*") if p.is_dir())]:
            if "__pycache__" not in folder.parts and any(folder.glob("*.py")):
                assert (folder / "__init__.py").is_file(), f"{folder.relative_to(ROOT)} has no __init__.py"
