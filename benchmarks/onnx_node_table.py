"""The ONNX conformance table of the README: every node test case of the onnx package (and its
pytorch-converted and pytorch-operator model tests) run through ``toolkit``'s ONNX importer and
the reference interpreter, per op: cases passed, failed and why, and the ops with no counterpart.

    python benchmarks/onnx_node_table.py              # the markdown table
    python benchmarks/onnx_node_table.py --record F   # the per-op pass counts the suite holds to
"""
from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.importers.onnx_conformance import model_cases, node_cases, run_case, table  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--record", metavar="FILE.json", help="write the pass counts per op and per model suite")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    rows = table(node_cases())
    models = {kind: sorted(c.name for c in model_cases(kind) if run_case(c)[0] == "pass")
              for kind in ("pytorch-converted", "pytorch-operator")}
    if args.record:
        counts = {op: len(r["pass"]) for op, r in sorted(rows.items()) if r["pass"]}
        Path(args.record).write_text(json.dumps({"node": counts, "models": models}, indent=1) + "\n")
        return 0
    total = {k: sum(len(r[k]) for r in rows.values()) for k in ("pass", "fail", "unsupported")}
    print("| op | passed | failed | why (the first reasons) |")
    print("|---|---|---|---|")
    for op, r in sorted(rows.items()):
        if not r["pass"] and not r["fail"]:
            continue
        reasons = sorted({why.split("): ", 1)[-1][:70] for _, why in r["fail"]})
        print(f"| {op} | {len(r['pass'])} | {len(r['fail'])} | {'; '.join(reasons[:2])} |")
    unsupported = sorted(op for op, r in rows.items() if r["unsupported"] and not r["pass"] and not r["fail"])
    print(f"\nnode cases: {total['pass']} passed, {total['fail']} failed, {total['unsupported']} of ops with no "
          f"counterpart ({', '.join(unsupported)})")
    for kind, passed in models.items():
        print(f"{kind}: {len(passed)} of {len(model_cases(kind))} passed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
