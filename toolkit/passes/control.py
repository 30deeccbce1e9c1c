"""``eliminate_dead_branches`` (canonical): an ``if`` whose condition is a constant becomes the
nodes of the branch it would take, spliced in where it stood (the other branch is gone); a loop's
per-step outputs that nothing reads are no longer stacked, and body inputs that the body no
longer reads stop being passed. (The whole pipeline on every body is pipeline.py's
``optimize_bodies``.)
"""
from __future__ import annotations

from ..ir.graph import Graph, Node
from ..ops.control import Body, bodies_of, inline
from .context import PassContext
from .rewrite import Emitter, Substitution, constant_value


def _branch_taken(node: Node) -> str | None:
    cond = constant_value(node.inputs[0])
    if cond is None:
        return None
    return "then_body" if bool(cond) else "else_body"


def _prune_loop(node: Node, readers: set[int]) -> bool:
    """Drop a loop's unread per-step outputs; returns whether it changed."""
    k = node.attrs["carried"]
    flag = 1 if node.attrs.get("condition") else 0
    body: Body = node.attrs["body"]
    names = list(body.graph.outputs)
    keep = [i for i, o in enumerate(node.outputs) if i < k or o.id in readers]
    if len(keep) == len(node.outputs):
        return False
    chosen = list(range(flag)) + [flag + i for i in keep]
    body.graph.outputs = {names[j]: body.graph.outputs[names[j]] for j in chosen}
    node.outputs = [node.outputs[i] for i in keep]
    node.attrs.pop("saved", None)
    return True


def _drop_unread_inputs(node: Node) -> bool:
    """Loop invariants (and if's captured values) that no body reads any more stop being passed."""
    # body input j is node input j + offset; carries and sequences stay, and so does if's condition
    if node.op == "loop":
        first, offset = node.attrs["carried"] + node.attrs["scanned"], 0
    else:
        first, offset = 0, 1
    bodies = bodies_of(node)
    inner = [b.inputs for b in bodies]
    read = set()
    for body in bodies:
        read |= {v.id for n in body.graph.nodes for v in n.inputs} | {v.id for v in body.outputs}
    unread = {j for j in range(first, len(inner[0])) if all(ins[j].id not in read for ins in inner)}
    if not unread:
        return False
    for body in bodies:
        names = list(body.graph.inputs)
        body.graph.inputs = {n: v for j, (n, v) in enumerate(zip(names, body.inputs)) if j not in unread}
    node.inputs = [v for j, v in enumerate(node.inputs) if j - offset not in unread]
    return True


def eliminate_dead_branches(graph: Graph, ctx: PassContext) -> bool:
    """An ``if`` whose condition is a constant becomes the nodes of the branch it takes, spliced in
    where it stood; a loop stops stacking the per-step outputs nothing reads, and stops passing
    the body inputs its bodies no longer read."""
    readers = {v.id for n in graph.nodes for v in n.inputs}
    readers |= {v.id for v in graph.outputs.values()} | {v.id for v in graph.updates.values()}
    subst = Substitution()
    kept: list[Node] = []
    changed = False
    for node in graph.nodes:
        subst.apply_to_node(node)
        if node.op == "if" and (taken := _branch_taken(node)) is not None:
            emitter = Emitter(node.scope)
            outs = inline(emitter, node.attrs[taken], node.inputs[1:])
            for old, new in zip(node.outputs, outs):
                subst.replace(old, new)
            kept.extend(emitter.take())
            changed = True
            ctx.note(f"eliminate_dead_branches: '{node.scope}': the condition is always "
                        f"{taken == 'then_body'}; only its {taken.split('_')[0]} branch is kept")
            continue
        if node.op == "loop" and _prune_loop(node, readers):
            changed = True
            ctx.note(f"eliminate_dead_branches: '{node.scope}': per-step outputs nobody reads are not stacked")
        if node.op in ("loop", "if") and _drop_unread_inputs(node):
            changed = True
            ctx.note(f"eliminate_dead_branches: '{node.scope}': values its body no longer reads are not passed")
        kept.append(node)
    graph.nodes = kept
    subst.apply(graph)
    return changed
