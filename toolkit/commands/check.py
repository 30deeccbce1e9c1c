"""``toolkit check``, ``toolkit render`` and ``toolkit schema``."""
from __future__ import annotations

import json
import math

from ..ir.dims import format_count, format_dim
from ..ops.flops import graph_flops
from ..zoo.resolve import load_net

PHASE_ORDER = ("infer", "test", "train")
# The keys of an If or Loop block (layers/control.py) that hold its own layers, as written.
_BLOCK_KEYS = ("body", "then", "else")


def owned_layers(layer) -> set[str]:
    """The layer's own name and, for an If or Loop, the names of every layer inside it (nested
    blocks included): a block's weights are declared under its body layers' names."""
    names = {layer.name}
    raw = [layer.model_dump(by_alias=True).get(key) or [] for key in _BLOCK_KEYS]
    pending = [item for layers in raw for item in layers]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            names.add(item.get("name"))
            pending.extend(x for key in _BLOCK_KEYS for x in (item.get(key) or []))
    return names


def run_check(args) -> int:
    from ..frontend.spec import parse_overrides
    net = load_net(args.net, parse_overrides(args.overrides))
    lowered = {p: net.lower(p) for p in PHASE_ORDER}
    rows = []
    total_params = 0
    for layer in net.spec.layers:
        phases = [args.phase] if args.phase else [p for p in PHASE_ORDER if p in layer.phases]
        if not phases or phases[0] not in layer.phases:
            continue
        graph, blobs = lowered[phases[0]].graph, lowered[phases[0]].blobs
        tops = [blobs[t] for t in layer.tops if t in blobs]
        shapes = " ".join("[" + ", ".join(format_dim(d) for d in v.shape) + "]" for v in tops)
        # Python ints: numpy's product wraps past 2**63 (a layer of 10**24 weights)
        owners = owned_layers(layer)
        params = sum(math.prod(shape) for key, (shape, owner) in net.declared.items()
                     if owner in owners and not key.endswith(("running_mean", "running_var")))
        total_params += params
        rows.append((layer.name, layer.type, shapes, f"{params:,}", format_count(graph_flops(graph, layer.name)),
                     ",".join(p for p in PHASE_ORDER if p in layer.phases)))
    header = ("layer", "type", "output shape", "params", "FLOPs", "phases")
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    print(f"{net.file}: net '{net.name}' is valid")
    print("  ".join(h.ljust(w) for h, w in zip(header, widths)))
    for r in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)))
    infer_flops = graph_flops(net.graph("infer"))
    print(f"total: {total_params:,} parameters; infer pass {format_count(infer_flops)} FLOPs")
    return 0


def run_render(args) -> int:
    from ..frontend.render import render_net
    from ..frontend.spec import parse_overrides
    net = load_net(args.net, parse_overrides(args.overrides))
    print(render_net(net), end="")
    return 0


def run_schema(args) -> int:
    from layers import NetSpec
    from schemas import json_schema
    print(json.dumps(json_schema(NetSpec), indent=args.indent))
    return 0
