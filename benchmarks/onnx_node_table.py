"""The ONNX conformance count: the onnx package's own test cases run through ``toolkit``'s ONNX
importer (the converters ``toolkit infer model.onnx`` lowers a model with) and the reference
interpreter, against each case's expected outputs.

Four suites, each passed/total:
  node               the node test cases whose ops all have counterparts here and whose tensors are
                     of the graph's types (peers/onnx_conformance.py: COUNTERPARTS, in_scope),
                     by op and overall
  pytorch-converted  the model tests converted from PyTorch modules
  pytorch-operator   the model tests of single PyTorch operators
  light              the light real models (AlexNet ... ZFNet-512), fed as onnx's backend runner feeds them

    python benchmarks/onnx_node_table.py              # the four suites, by op, and the failures' reasons
    python benchmarks/onnx_node_table.py --markdown   # every node case by op (docs/onnx_conformance.md)
    python benchmarks/onnx_node_table.py --record F   # the pass counts the suite holds the importer to
"""
from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from peers.onnx_conformance import case_ops, in_scope, light_cases, model_cases, node_cases, run_case  # noqa: E402

MODEL_SUITES = ("pytorch-converted", "pytorch-operator", "light")


def results() -> dict:
    """suite -> [(case name, op, status, why)] for the four suites; node cases out of scope under
    "node-out-of-scope"."""
    cases = node_cases()
    ops = case_ops(cases)
    out: dict[str, list] = defaultdict(list)
    for case in cases:
        status, why = run_case(case)
        out["node" if in_scope(case) else "node-out-of-scope"].append((case.name, ops[case.name], status, why))
    for kind in MODEL_SUITES:
        for case in (light_cases() if kind == "light" else model_cases(kind)):
            status, why = run_case(case)
            out[kind].append((case.name, kind, status, why))
    return dict(out)


def _by_op(rows) -> dict[str, dict]:
    table: dict[str, dict] = defaultdict(lambda: {"pass": [], "fail": []})
    for name, op, status, why in rows:
        table[op]["pass" if status == "pass" else "fail"].append(name if status == "pass" else (name, why))
    return dict(table)


def _short(why: str) -> str:
    return why.split("): ", 1)[-1][:90].replace("|", "/")


def print_suites(res: dict) -> None:
    node = _by_op(res["node"])
    print("node cases whose ops all have counterparts here, by op (passed/total; the first reasons):")
    for op, r in sorted(node.items()):
        total = len(r["pass"]) + len(r["fail"])
        reasons = sorted({_short(why) for _, why in r["fail"]})
        print(f"  {op}: {len(r['pass'])}/{total}" + (f"  -- {'; '.join(reasons[:2])}" if reasons else ""))
    grand = [0, 0]
    print()
    for suite in ("node",) + MODEL_SUITES:
        rows = res.get(suite, [])
        passed = sum(1 for r in rows if r[2] == "pass")
        grand[0] += passed
        grand[1] += len(rows)
        print(f"{suite}: {passed}/{len(rows)} passed ({100 * passed / max(1, len(rows)):.1f}%)")
        if suite != "node":
            for name, _, status, why in rows:
                if status != "pass":
                    print(f"    {name}: {_short(why)}")
    print(f"all four suites: {grand[0]}/{grand[1]} passed ({100 * grand[0] / grand[1]:.1f}%)")
    out = res.get("node-out-of-scope", [])
    print(f"(node cases out of scope, not counted: {len(out)}, of which {sum(1 for r in out if r[2] == 'pass')} pass)")


def print_markdown(res: dict) -> None:
    every = _by_op(res["node"] + res.get("node-out-of-scope", []))
    scoped = {name for name, *_ in res["node"]}
    print("| op | passed | failed | why (the first reasons) |")
    print("|---|---|---|---|")
    for op, r in sorted(every.items()):
        reasons = sorted({_short(why)[:70] for _, why in r["fail"]})
        print(f"| {op} | {len(r['pass'])} | {len(r['fail'])} | {'; '.join(reasons[:2])} |")
    print()
    for suite in ("node",) + MODEL_SUITES:
        rows = res.get(suite, [])
        passed = sum(1 for r in rows if r[2] == "pass")
        label = "node cases whose ops all have counterparts here" if suite == "node" else f"{suite} model tests"
        print(f"- {label}: {passed} of {len(rows)} pass")
    total = len(res["node"]) + len(res.get("node-out-of-scope", []))
    print(f"- every node case: {sum(len(r['pass']) for r in every.values())} of {total} pass "
          f"({total - len(scoped)} use an op or type with no counterpart here)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--record", metavar="FILE.json", help="write the pass counts per op and per model suite")
    parser.add_argument("--markdown", action="store_true", help="every node case by op, as a markdown table")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    res = results()
    if args.record:
        every = _by_op(res["node"] + res.get("node-out-of-scope", []))
        counts = {op: len(r["pass"]) for op, r in sorted(every.items()) if r["pass"]}
        models = {kind: sorted(name for name, _, status, _ in res[kind] if status == "pass") for kind in MODEL_SUITES}
        Path(args.record).write_text(json.dumps({"node": counts, "models": models}, indent=1) + "\n")
        return 0
    if args.markdown:
        print_markdown(res)
    else:
        print_suites(res)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
