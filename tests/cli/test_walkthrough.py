"""The README's walk-through, run as written: its net file is read out of the README, and each
command of it runs here in order (train on a CSV, infer to CSV, fine-tune a new head, publish
with the data, verify, serve and ask Triton's config endpoint, and the Python API)."""
from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np

from tests.train.train_helpers import cli
from toolkit.training.data import load_digits

ROOT = Path(__file__).resolve().parents[2]


def _walkthrough() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("## A walk-through: from a CSV to a served model")
    return text[start:text.index("\n## ", start + 10)]


def test_the_readme_walkthrough(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    section = _walkthrough()
    net_text = re.search(r"cat > mlp.yaml <<'YAML'\n(.*?)\nYAML\n", section, re.S).group(1)
    Path("mlp.yaml").write_text(net_text + "\n")
    x, y = load_digits()
    # the walk-through's first command writes digits.csv; parity.csv is the reader's own table
    first = section.split("```sh\n", 1)[1].splitlines()[0]
    assert first == "toolkit data zoo:lenet --split train --set train.data.test_fraction=0 --out digits.csv"
    r = cli(*first.split()[1:])
    assert r.status == 0, r.err
    with open("digits.csv", newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == [f"data_{i}" for i in range(64)] + ["label"] and len(rows) == len(y) + 1
    with open("parity.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(rows[0])
        writer.writerows([*map(int, row), int(label)] for row, label in zip(x.reshape(len(x), 64), y % 2))

    assert "toolkit train mlp.yaml " in section
    r = cli("train", "mlp.yaml")
    assert r.status == 0, r.err
    assert "test at iteration 200:" in r.err and Path("runs/digits/best.safetensors").is_file()
    r = cli("infer", "runs/digits/net.yaml", "--weights", "runs/digits/best.safetensors", "--input", "digits.csv",
            "--output", "preds.csv")
    assert r.status == 0, r.err
    rows = list(csv.DictReader(open("preds.csv")))
    assert list(rows[0]) == ["row", "prob_class", "prob_score"] and len(rows) == len(y)
    assert np.mean([int(row["prob_class"]) == label for row, label in zip(rows, y)]) > 0.95

    # parity.yaml as the comment describes it
    Path("parity.yaml").write_text(net_text.replace("name: digits", "name: parity")
                                   .replace("{name: ip2, type: InnerProduct, bottom: ip1, top: ip2, num_output: 10}",
                                            "{name: parity, type: InnerProduct, bottom: ip1, top: ip2, num_output: 2}")
                                   .replace("digits.csv", "parity.csv") + "\n")
    r = cli("train", "parity.yaml", "--weights", "runs/digits/model.safetensors", "--allow-missing")
    assert r.status == 0, r.err
    assert "copied 2 of the net's 4 arrays; 2 in the file ignored" in r.err
    r = cli("zoo", "publish", "runs/parity", "--to", "myzoo", "--licence", "CC-BY-4.0", "--task", "even or odd digit",
            "--bundle-data")
    assert r.status == 0, r.err
    r = cli("zoo", "verify", "myzoo/parity")
    assert r.status == 0 and "verified myzoo/parity" in r.out, r.err

    env = {"TOOLKIT_ZOO": str(tmp_path / "myzoo"), "PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin",
           "HOME": str(tmp_path)}
    server = subprocess.Popen([sys.executable, "-m", "toolkit.cli", "serve", "zoo:parity", "--port", "0"],
                              cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)
    try:
        port = None
        deadline = time.monotonic() + 60
        while port is None and time.monotonic() < deadline:
            line = server.stderr.readline()
            assert line, "the server exited"
            found = re.search(r"http://127\.0\.0\.1:(\d+)", line)
            port = int(found.group(1)) if found else None
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/parity/config", timeout=10) as answer:
            config = json.loads(answer.read())
        assert config["output"] == [{"name": "prob", "data_type": "TYPE_FP32", "dims": [2]}]
    finally:
        server.terminate()
        server.wait(30)

    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    exec(compile(code, "README walk-through", "exec"), {})
    assert Path("runs/from-python/model.safetensors").is_file()
