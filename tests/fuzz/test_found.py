"""What the fuzzer found, through the real command line: a few of the corpus's ``found-`` inputs
given to ``toolkit import`` or ``toolkit check`` in a child process under tests/bounded.py's bounds,
each refused with exit status 2 and one ``error:`` line that says what is wrong (the replay in
test_fuzz.py holds every one of them; these show what the user reads)."""
from __future__ import annotations

import shutil

import pytest

from tests.bounded import run_toolkit
from tests.fuzz.run import CORPUS

COMMANDS = {"onnx": ("model.onnx", ["import", "onnx", "model.onnx", "--out", "out"]),
            "caffemodel": ("net.caffemodel", ["import", "caffe", "net.prototxt", "--weights", "net.caffemodel",
                                              "--out", "out"]),
            "prototxt": ("net.prototxt", ["import", "caffe", "net.prototxt", "--out", "out"]),
            "netfile": ("net.yaml", ["check", "net.yaml"])}

CASES = [
    ("onnx", "found-graph-name-not-utf8", "model.onnx: not a readable ONNX model (graph.name is not UTF-8 text)"),
    ("caffemodel", "found-layer-name-not-utf8",
     "net.caffemodel: not a readable caffemodel (layer[0].name is not UTF-8 text)"),
    ("onnx", "found-output-name-with-line-breaks", r"has no value '\x08\x07\x12\x08\n\x02\x08\x01\n\x02\x08\x02'"),
    ("onnx", "found-attribute-of-another-type", "attribute 'then_branch' is TYPE_PROTOS, where If takes GRAPH"),
    ("onnx", "found-required-attribute-missing", "attribute 'kernel_shape', which AveragePool requires, is missing"),
    ("onnx", "found-branch-output-given-by-no-node", "is given by no node, input or initializer"),
]


@pytest.mark.parametrize("target, entry, said", CASES, ids=[c[1] for c in CASES])
def test_a_found_input_is_one_line_from_the_command(tmp_path, target, entry, said):
    pytest.importorskip("onnx" if target == "onnx" else "google.protobuf")
    name, argv = COMMANDS[target]
    shutil.copyfile(CORPUS / target / entry, tmp_path / name)
    if target == "caffemodel":
        from tests.fuzz.targets import CAFFE_NET
        (tmp_path / "net.prototxt").write_text(CAFFE_NET)
    r = run_toolkit(*argv, memory_mb=1024, timeout=60, cwd=tmp_path)
    assert r.status == 2 and len(r.lines) == 1 and "error: " in r.lines[0], r.err
    assert said in r.lines[0], r.err
    assert not (tmp_path / "out").exists()
