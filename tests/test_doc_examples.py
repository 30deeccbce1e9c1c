"""The Python examples of the README and of docs/spec.md, as written: each ```python block is
checked against the API (every ``toolkit.NAME`` it uses exists, every keyword it passes to
``toolkit.Net``, ``toolkit.load``, ``toolkit.train`` or ``Model.infer`` is one they take), and
each block that runs on its own is run, in a folder of its own.

A block that runs on its own may use the walk-through's files (the README's ``mlp.yaml`` and
its ``digits.csv``), which are made here as the walk-through makes them. The contract's blocks
are sketches of the calls, with placeholders (``x``, ``source``, a ``net.yaml`` of the reader's);
they are listed in SKETCHES with what they lack, and only checked, not run."""
from __future__ import annotations

import ast
import csv
import inspect
import re
from pathlib import Path

import pytest

import toolkit
import toolkit.api

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", ROOT / "docs" / "spec.md"]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)

# the first line of a block that cannot run by itself -> what it lacks
SKETCHES = {
    'model = toolkit.load("net.yaml", weights="model.safetensors", device="cpu")   # or "zoo:lenet"':
        "a net.yaml and model.safetensors of the reader's, and an input x",
    'net = toolkit.Net(source, set={"train.max_iter": 100})   # a path, zoo:NAME, a YAML string or a dict':
        "a source of the reader's",
}


def python_blocks() -> list[tuple[str, str]]:
    """(DOCUMENT:LINE, code) of every ```python block."""
    found = []
    for document in DOCUMENTS:
        text = document.read_text()
        for match in BLOCK.finditer(text):
            line = text.count("\n", 0, match.start()) + 2
            found.append((f"{document.relative_to(ROOT)}:{line}", match.group(1)))
    return found


BLOCKS = python_blocks()


def first_line(code: str) -> str:
    return next(line for line in code.splitlines() if line.strip() and not line.startswith(("import ", "from ")))


def _api_calls(code: str):
    """(what, keyword names) of each call of toolkit.Net/load/train and of ``.infer`` in the code."""
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            if isinstance(owner, ast.Name) and owner.id == "toolkit":
                yield node.func.attr, [k.arg for k in node.keywords if k.arg]
            elif node.func.attr == "infer":
                yield "Model.infer", [k.arg for k in node.keywords if k.arg]


def _accepts(function, keyword: str) -> bool:
    parameters = inspect.signature(function).parameters
    return keyword in parameters and parameters[keyword].kind != inspect.Parameter.POSITIONAL_ONLY \
        or any(p.kind == inspect.Parameter.VAR_KEYWORD for p in parameters.values())


def test_there_are_examples_and_every_sketch_is_still_in_the_documents():
    assert len(BLOCKS) >= 4
    firsts = {first_line(code) for _, code in BLOCKS}
    assert set(SKETCHES) <= firsts, set(SKETCHES) - firsts


@pytest.mark.parametrize("where, code", BLOCKS, ids=[where for where, _ in BLOCKS])
def test_each_example_uses_the_api_as_it_is(where, code):
    for name in re.findall(r"\btoolkit\.(\w+)", code):
        assert name in dir(toolkit) and hasattr(toolkit, name), f"{where}: toolkit.{name} does not exist"
    for what, keywords in _api_calls(code):
        # the API's own function or class, whose signature help() shows (toolkit.NAME hands it out)
        function = toolkit.Model.infer if what == "Model.infer" else getattr(toolkit.api, what)
        assert inspect.isfunction(function) or inspect.isclass(function), f"{where}: toolkit.{what} is a {function!r}"
        for keyword in keywords:
            if what == "Model.infer":
                continue                   # its keywords are the net's input names
            assert _accepts(function, keyword), f"{where}: toolkit.{what} takes no argument {keyword!r}"


@pytest.fixture
def walkthrough_files(tmp_path, monkeypatch):
    """The README walk-through's mlp.yaml and digits.csv, made as it makes them."""
    from toolkit.training.data import load_digits
    monkeypatch.chdir(tmp_path)
    readme = (ROOT / "README.md").read_text()
    net = re.search(r"cat > mlp.yaml <<'YAML'\n(.*?)\nYAML\n", readme, re.S)
    if net:
        Path("mlp.yaml").write_text(net.group(1) + "\n")
    x, y = load_digits()
    with open("digits.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([f"p{i}" for i in range(64)] + ["label"])
        writer.writerows([*map(int, row), int(label)] for row, label in zip(x.reshape(len(x), 64), y))
    return tmp_path


RUNNABLE = [(where, code) for where, code in BLOCKS if first_line(code) not in SKETCHES]


@pytest.mark.parametrize("where, code", RUNNABLE, ids=[where for where, _ in RUNNABLE])
def test_each_example_that_stands_alone_runs(where, code, walkthrough_files):
    namespace: dict = {"__name__": "__example__"}
    exec(compile(code, where, "exec"), namespace)
