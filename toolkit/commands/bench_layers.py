"""``toolkit bench --per-layer``: where a plan's time goes, layer by layer, as Caffe's ``caffe time``.

What lives here:

- ``attribute(plan, layers)``: which row of the table each plan step belongs to, read from the
  node's ``scope`` by the naming conventions of the frontend (``LAYER``), autodiff
  (``LAYER.grad``, ``autodiff``), the solvers (``LAYER.SOLVER``, ``clip_gradients``) and the
  fusion passes (members' scopes joined with ``+``, possibly ending in ``N more``; ``+folded``
  for a folded BatchNorm; ``.bias`` for joined bias gradients): ``toolkit/commands/dot.py`` reads the
  same conventions to colour its clusters.
- ``per_layer_table(plan, profiles, layers)``: from profiled runs (``Plan.profile``; bench.py
  interleaves them with its timed runs), one row per layer of the phase, in net order, plus
  labelled rows for the work of no single layer, and the profiled total they add up to.
- ``format_table(rows, ...)``: the text table.

Rows: every layer of the phase has one, even one with no kernels of its own (its work fused
into a group, folded away, or pruned); a fused group of several layers gets a row named after
them (``conv1+relu1``; ``ip1+1 more`` where the fusion pass kept only the count); the solver's
updates (and gradient clipping) are one ``(solver update)`` row, whose time is in the backward
column (it runs after the backward pass); ``(autodiff)`` is the gradient seed and the sums of
a value's gradient parts; ``(objective)`` the loss-weighted sum of several losses. A row's time
in a column is the median over the profiled runs of the summed time of its steps in that run;
the total is the sum of the rows, so the shares add up to 100%. Profiling times each call, which
adds a little to each: the caller prints the unprofiled median beside it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from .dot import BACKWARD_SCOPES, SOLVER_SCOPES, SOLVER_TYPES

FORWARD, BACKWARD = "forward", "backward"
SOLVER_ROW = "(solver update)"
AUTODIFF_ROW = "(autodiff)"
OBJECTIVE_ROW = "(objective)"
OBJECTIVE_SCOPE = "objective"            # toolkit/frontend/net.py: the train graph's weighted loss sum
_MORE = re.compile(r"(\d+) more")
MAX_LABEL_CHARS = 40


@dataclass
class Row:
    layer: str
    type: str
    order: tuple                       # sort key: net order, groups after their last member
    members: tuple[str, ...] = ()      # the layers a group row covers (known by name)
    steps: dict = field(default_factory=lambda: {FORWARD: [], BACKWARD: []})   # stage -> step indices
    forward_ms: float | None = None
    backward_ms: float | None = None
    ops: dict = field(default_factory=dict)
    impls: list = field(default_factory=list)

    @property
    def ms(self) -> float:
        return (self.forward_ms or 0.0) + (self.backward_ms or 0.0)


def _parse_part(part: str, names: set[str]) -> tuple[str | None, str, str | None]:
    """(layer name or None, stage 'forward' / 'backward' / 'solver', special row or None) of one
    '+'-separated piece of a scope."""
    stage, name = FORWARD, part
    while name not in names:
        base, dot, suffix = name.rpartition(".")
        if not dot:
            break
        if suffix == "grad":
            stage = BACKWARD if stage == FORWARD else stage
        elif suffix in SOLVER_TYPES:
            stage = "solver"
        elif suffix != "bias":           # passes/gemm.py: joined bias gradients, 'LAYER.grad.bias'
            break
        name = base
    if name in names:
        return name, stage, None
    if name in SOLVER_SCOPES:
        return None, "solver", SOLVER_ROW
    if name in BACKWARD_SCOPES:
        return None, BACKWARD, AUTODIFF_ROW
    if name == OBJECTIVE_SCOPE:
        return None, stage, OBJECTIVE_ROW
    return None, stage, f"(scope '{part}')" if part else "(no scope)"


def _short_label(label: str, names: list[str], more: int) -> str:
    """A group's label as shown: a long one shortened to its first name and a count (the
    members' own rows say 'in LABEL', which ties them to it)."""
    if len(label) > MAX_LABEL_CHARS and len(names) > 1:
        return f"{names[0]}+{len(names) - 1 + more} more"
    return label


def attribute(plan, layers: list[tuple[str, str]], solver: str | None = None) -> list[Row]:
    """Rows for ``layers`` ([(name, YAML type)] in net order) with every step of ``plan`` put in
    one row and one stage (by index into ``plan.steps``), in table order."""
    index = {name: i for i, (name, _) in enumerate(layers)}
    types, names = dict(layers), set(index)
    rows = {name: Row(name, t, (i, 0)) for i, (name, t) in enumerate(layers)}
    end = len(layers)
    impls = getattr(plan, "impls", None)
    for k, node in enumerate(plan.steps):
        parts = [p for p in node.scope.split("+") if p != "folded"] if node.scope else [""]
        known, specials, more, stages = [], [], 0, set()
        for part in parts:
            m = _MORE.fullmatch(part)
            if m:
                more += int(m.group(1))
                continue
            name, stage, special = _parse_part(part, names)
            stages.add(stage)
            if name is not None and name not in known:
                known.append(name)
            if special is not None and special not in specials:
                specials.append(special)
        if "solver" in stages:                                   # any update work: the update row
            key, kind, order, members = SOLVER_ROW, f"{solver} update" if solver else "update", (end, 2), ()
        elif len(known) == 1 and not specials and not more:
            key, kind, order, members = known[0], types[known[0]], None, ()
        elif not known and len(specials) == 1 and not more:
            key, kind, order, members = specials[0], "-", (end, 1), ()
        else:                                                    # a fused group of several layers
            known.sort(key=index.get)
            key = "+".join(known + specials) + (f"+{more} more" if more else "")
            counts: dict[str, int] = {}
            for n in known:
                counts[types[n]] = counts.get(types[n], 0) + 1
            kind = "+".join([t if c == 1 else f"{t} x{c}" for t, c in counts.items()]
                            + ([f"{more} more"] if more else []))
            order = (max(index[n] for n in known), 1) if known else (end, 1)
            members = tuple(known)
        row = rows.get(key)
        if row is None:
            row = rows[key] = Row(_short_label(key, known + specials, more), kind or "-", order, members)
        row.steps[BACKWARD if stages & {BACKWARD, "solver"} else FORWARD].append(k)
        row.ops[node.op] = row.ops.get(node.op, 0) + 1
        if impls is not None and impls[k] not in row.impls:
            row.impls.append(impls[k])
    return sorted(rows.values(), key=lambda r: r.order)


def per_layer_table(plan, profiles: list[list[tuple]], layers: list[tuple[str, str]],
                    solver: str | None = None) -> tuple[list[Row], float]:
    """Each row's median forward / backward ms over ``profiles`` (``Plan.profile`` results, one
    per run). Returns (rows, the profiled total in ms: the sum of the rows)."""
    rows = attribute(plan, layers, solver)
    runs = np.array([[seconds for _, seconds in run] for run in profiles]) * 1e3
    runs = runs.reshape(len(profiles), len(plan.steps))
    for row in rows:
        for stage, attr in ((FORWARD, "forward_ms"), (BACKWARD, "backward_ms")):
            if row.steps[stage]:
                setattr(row, attr, float(np.median(runs[:, row.steps[stage]].sum(axis=1))))
    return rows, sum(row.ms for row in rows)


def _ops_text(row: Row, groups: dict[str, list[str]]) -> str:
    text = ", ".join(op if n == 1 else f"{op} x{n}" for op, n in row.ops.items())
    where = groups.get(row.layer)
    if where:
        text = (f"{text}; also in " if text else "in ") + ", ".join(where)
    return text or "no kernels of its own (fused, folded away, or done in place by the memory plan)"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def format_table(rows: list[Row], total_ms: float, train: bool, with_impls: bool) -> str:
    groups: dict[str, list[str]] = {}
    for row in rows:
        for name in row.members:
            groups.setdefault(name, []).append(row.layer)
    header = ["layer", "type", "forward ms"] + (["backward ms"] if train else []) + ["share"] \
        + (["kernel"] if with_impls else []) + ["ops"]
    body = []
    for row in rows:
        cells = [row.layer, row.type, _ms(row.forward_ms)] + ([_ms(row.backward_ms)] if train else []) \
            + [f"{100 * row.ms / total_ms:.1f}%" if total_ms > 0 and row.ops else "-"] \
            + ([",".join(row.impls) or "-"] if with_impls else []) + [_ops_text(row, groups)]
        body.append(cells)
    fwd = sum(r.forward_ms or 0.0 for r in rows)
    bwd = sum(r.backward_ms or 0.0 for r in rows)
    total = ["total", "", f"{fwd:.3f}"] + ([f"{bwd:.3f}"] if train else []) + ["100.0%"] \
        + ([""] if with_impls else []) + [""]
    numeric = {"forward ms", "backward ms", "share"}
    widths = [max(len(r[i]) for r in body + [header, total]) for i in range(len(header))]

    def line(cells):
        return "  ".join((c.rjust(w) if h in numeric else c.ljust(w))
                         for c, w, h in zip(cells, widths, header)).rstrip()
    return "\n".join([line(header)] + [line(c) for c in body] + [line(total)])


def json_rows(rows: list[Row], total_ms: float, with_impls: bool) -> list[dict]:
    out = []
    for row in rows:
        item = {"layer": row.layer, "type": row.type,
                "forward_ms": None if row.forward_ms is None else round(row.forward_ms, 4),
                "backward_ms": None if row.backward_ms is None else round(row.backward_ms, 4),
                "share": round(row.ms / total_ms, 4) if total_ms > 0 else 0.0,
                "ops": dict(row.ops)}
        if with_impls:
            item["kernel"] = list(row.impls)
        out.append(item)
    return out
