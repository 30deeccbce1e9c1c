"""``toolkit bench --per-layer``: a row per layer in net order (forward, and backward with
``--train``), labelled rows for the work of no single layer, rows that add up to the profiled
total, and the same rows under ``--json``."""
from __future__ import annotations

import json
import re

import pytest
from cli_helpers import REPO, expect_error, run_cli

from toolkit.commands import bench as bench_module
from toolkit.frontend import Net

NET = REPO / "zoo" / "lenet" / "net.yaml"
FAST = ["--batch", "8", "--iters", "3", "--warmup", "1"]
PROFILED = re.compile(r"(\d+\.\d+) ms in all .* vs (\d+\.\d+) ms unprofiled median")


def layer_names(phase: str) -> list[str]:
    return [layer.name for layer in Net.load(str(NET)).spec.layers if phase in layer.phases]


def bench(*flags) -> str:
    result = run_cli("bench", NET, *FAST, "--per-layer", *flags)
    assert result.status == 0, result.err
    assert result.err == ""
    return result.out


def parse_table(out: str) -> tuple[float, list[str], dict[str, list[str]], list[str]]:
    """(profiled total, header cells, {row label: cells}, the total row's figures) of the table."""
    lines = out.splitlines()
    assert "items/s" in lines[0]                       # the usual one-line summary comes first
    m = PROFILED.search(lines[1])
    assert m, lines[1]
    header = re.split(r"\s{2,}", lines[2].strip())
    rows = {}
    for line in lines[3:-1]:
        cells = re.split(r"\s{2,}", line.strip())
        rows[cells[0]] = cells
    total = re.split(r"\s{2,}", lines[-1].strip())
    assert total[0] == "total"
    total = total[1:]                                  # its type and ops cells are empty
    return float(m.group(1)), header, rows, total


def ms(cell: str) -> float:
    return 0.0 if cell == "-" else float(cell)


@pytest.mark.parametrize("train", [False, True], ids=["infer", "train"])
def test_table_has_every_layer_and_adds_up(train):
    out = bench(*(["--train"] if train else []))
    profiled, header, rows, total = parse_table(out)
    assert header[:3] == ["layer", "type", "forward ms"]
    assert ("backward ms" in header) == train
    assert header[2 + (2 if train else 1)] == "share" and header[-1] == "ops"
    names = layer_names("train" if train else "infer")
    own = [label for label in rows if label in names]
    assert own == names                                # every layer, in net order
    assert rows["conv1"][1] == "Convolution" and rows["ip2"][1] == "InnerProduct"
    columns = 2 if train else 1
    sums = [sum(ms(cells[2 + c]) for cells in rows.values()) for c in range(columns)]
    slack = 0.0005 * (len(rows) + 1)                   # each printed figure rounded to 3 decimals
    for c in range(columns):
        assert sums[c] == pytest.approx(float(total[c]), abs=slack)
    assert sum(sums) == pytest.approx(profiled, abs=slack * 2)
    shares = [float(cells[2 + columns][:-1]) for cells in rows.values() if cells[2 + columns] != "-"]
    assert sum(shares) == pytest.approx(100, abs=0.05 * len(shares) + 0.01)
    if train:
        assert rows["(solver update)"][2] == "-" and rows["(solver update)"][3] != "-"
        assert rows["loss"][2] != "-" and rows["loss"][3] != "-"      # the loss and its gradient
    else:
        assert not any(label.startswith("(") for label in rows)   # infer: no gradient, no update


# conv1 + pool1 fuse in NCHW; with the generated kernels the layout pass would block conv1 (its
# one input channel read as NCHW) and pool1 would follow it instead
NCHW = ("--disable", "choose_layout")


def test_fused_groups_are_named_after_their_layers():
    _, _, rows, _ = parse_table(bench(*NCHW))
    assert "conv1+pool1" in rows and "fused_epilogue" in rows["conv1+pool1"][-1]
    assert rows["conv1"][2] == "-" and "in conv1+pool1" in rows["conv1"][-1]


def test_without_the_optimiser_each_layer_has_its_own_kernels():
    _, _, rows, _ = parse_table(bench("--train", "--no-optimize"))
    for name in layer_names("train"):
        assert rows[name][2] != "-", name                 # a time of its own (0.000 for a tiny one)
    assert rows["conv1"][3] != "-" and "conv2d_grad_weight" in rows["conv1"][-1]


@pytest.mark.parametrize("train", [False, True], ids=["infer", "train"])
def test_json_rows(train):
    report = json.loads(bench("--json", *(["--train"] if train else [])))
    rows = report["per_layer"]
    keys = {"layer", "type", "forward_ms", "backward_ms", "share", "ops"}
    assert all(keys <= set(row) <= keys | {"kernel"} for row in rows)     # 'kernel' where the plan says
    labels = [row["layer"] for row in rows]
    names = layer_names("train" if train else "infer")
    assert [label for label in labels if label in names] == names
    total = sum((row["forward_ms"] or 0) + (row["backward_ms"] or 0) for row in rows)
    assert total == pytest.approx(report["profiled_ms"], abs=1e-4 * (len(rows) + 1))
    assert sum(row["share"] for row in rows) == pytest.approx(1, abs=1e-4 * len(rows))
    assert all(isinstance(row["ops"], dict) for row in rows)
    assert sum(n for row in rows for n in row["ops"].values()) == report["kernel_calls"]
    assert any(row["backward_ms"] is not None for row in rows) == train
    assert report["median_ms"] > 0


def test_json_without_the_flag_has_no_rows():
    result = run_cli("bench", NET, *FAST, "--json")
    assert result.status == 0, result.err
    assert "per_layer" not in json.loads(result.out)


def test_kernel_column_when_the_plan_labels_its_steps(monkeypatch):
    real = bench_module.bench_plan

    def labelled(*args, **kwargs):
        plan, inputs = real(*args, **kwargs)
        plan.impls = ["native" if node.op.startswith("fused") else "numpy" for node in plan.steps]
        return plan, inputs
    monkeypatch.setattr(bench_module, "bench_plan", labelled)
    _, header, rows, _ = parse_table(bench("--train"))
    assert "kernel" in header
    at = header.index("kernel")
    assert rows["(solver update)"][at] == "native" and rows["conv1"][at] == "numpy"
    report = json.loads(bench("--json", *NCHW))
    assert {row["layer"]: row["kernel"] for row in report["per_layer"]}["conv1+pool1"] == ["native"]


@pytest.mark.parametrize("flags", [["--dtype", "float64"], ["--disable", "fuse_epilogue"], ["--warmup", "0"]],
                         ids=lambda f: " ".join(f))
def test_other_flags_still_work(flags):
    report = json.loads(bench("--json", "--train", *flags))
    assert [r["layer"] for r in report["per_layer"] if r["layer"] in layer_names("train")] == layer_names("train")


def test_flag_takes_no_value():
    result = run_cli("bench", NET, *FAST, "--per-layer=yes")
    expect_error(result, "--per-layer")
    assert len(result.err_lines) == 1 and result.out == ""
