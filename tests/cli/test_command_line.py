"""The parser built from toolkit/cli.py's table: ``--set`` on every command that reads a net (and
changing the net it reads), each command's module imported only when that command runs, and
the table's every entry naming a function that exists."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from cli_helpers import LENET, REPO, expect_error, run_cli

from toolkit.cli import COMMANDS, build_parser, runner

# every command that reads a net: (the command, what else it requires)
READS_A_NET = [(["check"], []), (["render"], []), (["infer"], ["--input", "x.npy"]), (["serve"], []),
               (["bench"], ["--batch", "1"]), (["train"], []), (["test"], []), (["data"], ["--out", "d.npz"]),
               (["compile"], []), (["graph"], ["-o", "g.dot"]), (["export", "onnx"], ["-o", "m.onnx"])]


@pytest.mark.parametrize(("command", "required"), READS_A_NET, ids=[" ".join(c) for c, _ in READS_A_NET])
def test_every_command_that_reads_a_net_takes_set(command, required):
    args = build_parser().parse_args([*command, "net.yaml", *required, "--set", "a.b=1", "--set", "c=2"])
    assert args.net == "net.yaml" and args.overrides == ["a.b=1", "c=2"]
    assert build_parser().parse_args([*command, "net.yaml", *required]).overrides == []


def _compile(*extra) -> dict:
    result = run_cli("compile", LENET, "--json", *extra)
    assert result.status == 0, result.err
    return json.loads(result.out)


def test_set_changes_the_net_that_compile_reads():
    # conv1 has 20 outputs in lenet.yaml: 7 cut its FLOPs and conv2's (which reads 7 channels, not 20)
    plain, narrow = _compile(), _compile("--set", "layers.conv1.num_output=7")
    assert plain["lowered"]["flops"] == 4601780
    assert narrow["lowered"]["flops"] == 2139892


def test_set_changes_the_net_that_bench_times():
    def peak(*extra) -> int:
        result = run_cli("bench", LENET, "--batch", "2", "--iters", "1", "--warmup", "0", "--json", *extra)
        assert result.status == 0, result.err
        return json.loads(result.out)["peak_bytes"]
    assert peak() == 29440
    assert peak("--set", "layers.conv1.num_output=7") == 14464


def test_set_changes_the_net_that_graph_draws(tmp_path):
    out = tmp_path / "g.dot"
    result = run_cli("graph", LENET, "-o", out, "--set", "layers.conv1.num_output=7")
    assert result.status == 0, result.err
    text = out.read_text()
    assert "conv1.weight\\nf32[7, 1, 5, 5]" in text and "[20, 1, 5, 5]" not in text


def test_set_changes_the_net_that_serve_loads(monkeypatch):
    import toolkit.serve.server as server
    served = {}

    def serve(model, *rest):            # the model as it would be served, without the server
        served["model"] = model
        return 0
    monkeypatch.setattr(server, "serve", serve)
    # the shipped model's classifier cut to 4 classes: the published weights but ip2's fit, which start
    # from their fillers
    result = run_cli("serve", "zoo:lenet", "--port", "0", "--set", "layers.ip2.num_output=4", "--allow-missing")
    assert result.status == 0, result.err
    assert [tuple(t.shape) for t in served["model"].outputs] == [(None, 4)]     # (None: the batch)
    assert "ip2" in result.err


def test_a_bad_set_is_one_line_on_the_new_commands():
    for words in (["bench", "--batch", "1"], ["compile"], ["graph", "-o", "g.dot"]):
        expect_error(run_cli(*words, LENET, "--set", "layers.conv1.num_output"), "KEY=VALUE")


def test_every_command_of_the_table_runs_a_function_of_its_module():
    for command in COMMANDS:
        run = runner(command.name)
        assert callable(run) and run.__module__ == f"toolkit.commands.{command.run.split(':')[0]}"


def _modules_after(code: str) -> dict:
    """(toolkit.commands modules, numpy loaded?, the net file's models built?) in a fresh interpreter
    after ``code``."""
    script = ("import json, sys\n" + code + "\nprint(json.dumps({'commands': sorted(m for m in sys.modules "
              "if m.startswith('toolkit.commands.')), 'numpy': 'numpy' in sys.modules, "
              "'net_models': 'schemas.net' in sys.modules}))")
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def test_zoo_list_imports_no_other_command_module_nor_numpy_nor_the_net_models():
    after = _modules_after("from toolkit.cli import main\nassert main(['zoo', 'list']) == 0")
    assert after == {"commands": ["toolkit.commands.options", "toolkit.commands.zoo_cmd"], "numpy": False,
                     "net_models": False}


@pytest.mark.parametrize("words", [["--help"], ["infer", "--help"], ["zoo", "get", "--help"]])
def test_help_imports_no_command_module_and_no_numpy(words):
    code = f"from toolkit.cli import main\ntry:\n    main({words!r})\nexcept SystemExit:\n    pass"
    assert _modules_after(code) == {"commands": ["toolkit.commands.options"], "numpy": False, "net_models": False}
