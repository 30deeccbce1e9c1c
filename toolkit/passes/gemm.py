"""GEMM batching: several matrix products become one larger one, forward and backward alike.

1. Shared operand. matmuls that read the same matrix in the same role, with the same flags,
   become one GEMM over the other operands concatenated, and slices of its result:
       x @ W1^T, x @ W2^T              ->  x @ [W1; W2]^T, then split the columns
       g1^T @ x, g2^T @ x  (dW)        ->  [g1, g2]^T @ x, then split the rows (contiguous)
   Several InnerProducts on one bottom (Q/K/V, RNN gates) in the forward pass; the weight
   gradients of those layers, which all read the bottom, in the backward pass.
2. Sum of products. g1 @ W1 + g2 @ W2 (the input gradient of those layers) -> [g1, g2] @ [W1; W2]:
   one GEMM over the concatenated inner dimension; the concatenations are the same ones as in
   1, so the common-subexpression pass shares them.
3. Independent products of one shape, small enough that the per-call cost dominates, become one
   batched matmul over stacked operands.

A batched group runs where its first reader would: every operand must exist by then, which is
also what keeps a product that depends on another's result out of its group.
"""
from __future__ import annotations

import numpy as np

from ..backend.placement import Placement
from ..ir.dims import is_static
from ..ir.graph import FLOAT_DTYPES, Graph, Node, Value
from .context import PassContext
from .rewrite import CONSTANT_OPS, Emitter, Substitution, kept_ids

# Rule 3 only batches products this small (M*N*K multiply-adds each): above it, the copies that
# stack the operands cost more than the matmul calls they save (measured on 2-core EPYC: two
# 32x32x32 products took 3.1 us each as separate calls).
SMALL_PRODUCT = 32 * 32 * 32


def _is_plain(node: Node) -> bool:
    return (node.op == "matmul" and len(node.outputs) == 1 and node.inputs[0].rank == 2 and node.inputs[1].rank == 2
            and node.outputs[0].dtype in FLOAT_DTYPES)


class _Places:
    """Positions of nodes, where values are defined and first read, and where nodes run."""

    def __init__(self, graph: Graph, placement: Placement):
        self.device_of = placement.node
        self.pos = {id(n): i for i, n in enumerate(graph.nodes)}
        self.defined: dict[int, int] = {v.id: -1 for v in graph.graph_values()}
        self.first_read: dict[int, int] = {}
        self.readers = graph.consumers()
        for i, n in enumerate(graph.nodes):
            for o in n.outputs:
                self.defined[o.id] = i
            for v in n.inputs:
                self.first_read.setdefault(v.id, i)
        end = len(graph.nodes)
        for vid in kept_ids(graph):
            self.first_read.setdefault(vid, end)

    def window(self, nodes: list[Node]) -> tuple[int, int]:
        """(the last position an operand is defined at, the first position a result is read at)."""
        last_def = max(self.defined[v.id] for n in nodes for v in n.inputs)
        first_use = min(self.first_read.get(n.outputs[0].id, 1 << 30) for n in nodes)
        return last_def, first_use


def _largest_fitting(nodes: list[Node], places: _Places) -> list[Node]:
    """The largest set of ``nodes``, earliest first, whose operands all exist before any of
    their results is read."""
    chosen: list[Node] = []
    for n in sorted(nodes, key=lambda n: places.pos[id(n)]):
        trial = chosen + [n]
        last_def, first_use = places.window(trial)
        if last_def < first_use:
            chosen = trial
    return chosen


def _shared_operand_groups(graph: Graph, places: _Places) -> dict[tuple, list[Node]]:
    groups: dict[tuple, list[Node]] = {}
    for node in graph.nodes:
        if not _is_plain(node):
            continue
        ta, tb = node.attrs["trans_a"], node.attrs["trans_b"]
        a, b = node.inputs
        where = places.device_of(node)             # one GEMM never spans two devices
        groups.setdefault((a.id, "a", ta, tb, where), []).append(node)
        groups.setdefault((b.id, "b", ta, tb, where), []).append(node)
    return groups


def _layer_order(graph: Graph) -> dict[str, int]:
    """Position of each layer's first node: groups are joined in layer order, so that the forward
    pass and the backward pass concatenate the same weights and gradients the same way and the
    common-subexpression pass can share them."""
    order: dict[str, int] = {}
    for i, node in enumerate(graph.nodes):
        order.setdefault(_layer_of(node), i)
    return order


def _layer_of(node: Node) -> str:
    scope = node.scope
    return scope[:-len(".grad")] if scope.endswith(".grad") else scope


def _bias_of(node: Node, places: _Places, kept: set[int]) -> Node | None:
    """The add that is the only reader of a [rows, O] product and adds a [O] vector to it."""
    out = node.outputs[0]
    uses = places.readers.get(out.id, [])
    if out.id in kept or len(uses) != 1 or uses[0].op != "add":
        return None
    add = uses[0]
    other = add.inputs[1] if add.inputs[0] is out else add.inputs[0]
    if other is out or tuple(other.shape) != (out.shape[1],) or add.outputs[0].type != out.type:
        return None
    return add


def _batch_shared(graph: Graph, subst: Substitution, inserts, places: _Places, done: set[int]) -> list[str]:
    notes = []
    order = _layer_order(graph)
    kept = kept_ids(graph)
    for (shared_id, role, ta, tb, _where), nodes in _shared_operand_groups(graph, places).items():
        # the other operands are concatenated along the axis that becomes the result's columns
        # (shared a: b's N axis) or rows (shared b: a's M axis); it must have a fixed size
        axis = (0 if tb else 1) if role == "a" else (1 if ta else 0)

        def other(n: Node) -> Value:
            return n.inputs[1] if role == "a" else n.inputs[0]
        nodes = [n for n in nodes if id(n) not in done and other(n).id != shared_id and is_static(other(n).shape[axis])]
        nodes = _largest_fitting(nodes, places) if len(nodes) > 1 else []
        if len(nodes) < 2:
            continue
        nodes.sort(key=lambda n: (order[_layer_of(n)], places.pos[id(n)]))
        shared = nodes[0].inputs[0] if role == "a" else nodes[0].inputs[1]
        b = Emitter("+".join(dict.fromkeys(n.scope for n in nodes)))
        joined = b.op("concat", *[other(n) for n in nodes], axis=axis)
        if role == "a":
            product, out_axis = b.op("matmul", shared, joined, trans_a=ta, trans_b=tb), 1
        else:
            product, out_axis = b.op("matmul", joined, shared, trans_a=ta, trans_b=tb), 0
        # InnerProducts' bias adds join too (zeros for a layer without one): one add on the joined
        # result, which the epilogue fusion then puts in the GEMM's kernel
        adds = [_bias_of(n, places, kept) if out_axis == 1 else None for n in nodes]
        if any(adds):
            vectors = [(a.inputs[1] if a.inputs[0] is n.outputs[0] else a.inputs[0]) if a is not None else
                       b.op("constant", value=np.zeros(n.outputs[0].shape[1], n.outputs[0].dtype))
                       for n, a in zip(nodes, adds)]
            product = b.add(product, b.op("concat", *vectors, axis=0))
        start = 0
        for n, add in zip(nodes, adds):
            size = n.outputs[0].shape[out_axis]
            part = b.op("slice", product, axis=out_axis, start=start, stop=start + size)
            subst.replace(add.outputs[0] if add is not None else n.outputs[0], part)
            start += size
            done.add(id(n))
        _last_def, first_use = places.window(nodes)
        inserts.setdefault(first_use, []).extend(b.take())
        notes.append(f"batch_gemms: {len(nodes)} matmuls sharing an operand ({b.scope}) -> one GEMM, "
                     f"split by {'columns' if out_axis == 1 else 'rows'}")
    return notes


def _product_terms(v: Value, places: _Places, kept: set[int]) -> list[Node] | None:
    """The matmuls an add tree sums, when each is read by that tree alone."""
    node = v.producer
    if node is None:
        return None
    if _is_plain(node) and v.id not in kept and len(places.readers.get(v.id, [])) == 1:
        return [node]
    if node.op == "add" and v.id not in kept and len(places.readers.get(v.id, [])) == 1:
        left = _product_terms(node.inputs[0], places, kept)
        right = _product_terms(node.inputs[1], places, kept)
        if left is not None and right is not None:
            return left + right
    return None


def _batch_sums(graph: Graph, subst: Substitution, inserts, places: _Places, done: set[int]) -> list[str]:
    notes = []
    kept = kept_ids(graph)
    order = _layer_order(graph)
    for node in reversed(graph.nodes):        # the root of an add tree first: it takes every term
        if node.op != "add" or id(node) in done:
            continue
        out = node.outputs[0]
        terms = []
        for v in node.inputs:
            t = _product_terms(v, places, kept) if v.id not in kept else None
            if t is None:
                terms = None
                break
            terms += t
        if not terms or len(terms) < 2:
            continue
        terms.sort(key=lambda t: (order[_layer_of(t)], places.pos[id(t)]))
        ta, tb = terms[0].attrs["trans_a"], terms[0].attrs["trans_b"]
        a_axis, b_axis = (0 if ta else 1), (1 if tb else 0)
        where = places.device_of(node)
        if any(t.attrs["trans_a"] != ta or t.attrs["trans_b"] != tb or t.outputs[0].type != out.type
               or not is_static(t.inputs[0].shape[a_axis]) or id(t) in done
               or places.device_of(t) != where for t in terms):
            continue
        b = Emitter(node.scope)
        joined_a = b.op("concat", *[t.inputs[0] for t in terms], axis=a_axis)
        joined_b = b.op("concat", *[t.inputs[1] for t in terms], axis=b_axis)
        product = b.op("matmul", joined_a, joined_b, trans_a=ta, trans_b=tb)
        subst.replace(out, product)
        for t in terms:
            done.add(id(t))
        done.add(id(node))
        inserts.setdefault(places.pos[id(node)], []).extend(b.take())
        notes.append(f"batch_gemms: a sum of {len(terms)} matmuls ({node.scope}) -> one GEMM over the joined "
                     "inner dimension")
    return notes


def _batch_independent(graph: Graph, subst: Substitution, inserts, places: _Places, done: set[int]) -> list[str]:
    notes = []
    groups: dict[tuple, list[Node]] = {}
    for node in graph.nodes:
        if not _is_plain(node) or id(node) in done:
            continue
        a, b = node.inputs
        if not all(is_static(d) for d in a.shape + b.shape):
            continue
        rows, inner = (a.shape[1], a.shape[0]) if node.attrs["trans_a"] else a.shape
        cols = b.shape[0] if node.attrs["trans_b"] else b.shape[1]
        if rows * cols * inner > SMALL_PRODUCT:
            continue
        groups.setdefault((a.type, b.type, node.attrs["trans_a"], node.attrs["trans_b"], places.device_of(node)),
                          []).append(node)
    for (_ta, _tb, trans_a, trans_b, _where), nodes in groups.items():
        nodes = _largest_fitting(nodes, places) if len(nodes) > 1 else []
        if len(nodes) < 2:
            continue
        b = Emitter("+".join(dict.fromkeys(n.scope for n in nodes)))
        stacked_a = b.op("concat", *[b.reshape(n.inputs[0], (1,) + tuple(n.inputs[0].shape)) for n in nodes], axis=0)
        stacked_b = b.op("concat", *[b.reshape(n.inputs[1], (1,) + tuple(n.inputs[1].shape)) for n in nodes], axis=0)
        product = b.op("matmul", stacked_a, stacked_b, trans_a=trans_a, trans_b=trans_b)
        for i, n in enumerate(nodes):
            part = b.op("slice", product, axis=0, start=i, stop=i + 1)
            subst.replace(n.outputs[0], b.reshape(part, n.outputs[0].shape))
            done.add(id(n))
        _last_def, first_use = places.window(nodes)
        inserts.setdefault(first_use, []).extend(b.take())
        notes.append(f"batch_gemms: {len(nodes)} independent small matmuls of one shape ({b.scope}) "
                     "-> one batched matmul")
    return notes


def _batch_bias_gradients(graph: Graph, subst: Substitution, inserts, places: _Places, done: set[int]) -> list[str]:
    """The bias gradients of batched InnerProducts, sum(g_i over rows), read from the joined
    gradient [g_1, g_2, ...] the batched GEMMs already made: one column sum and slices of it."""
    notes = []
    for node in graph.nodes:
        if node.op != "concat" or node.outputs[0].rank != 2 or node.attrs["axis"] % 2 != 1:
            continue
        joined = node.outputs[0]
        sums = []                    # per input: (the sum's value, or the [O] reshape of it) or None
        for g in node.inputs:
            found = [r for r in places.readers.get(g.id, []) if r.op == "reduce_sum" and r.attrs["keepdims"]
                     and tuple(a % 2 for a in r.attrs["axes"]) == (0,) and id(r) not in done]
            target = found[0].outputs[0] if found else None
            if target is not None:   # sum_to's reshape to [O] reads it at once: replace that instead
                uses = places.readers.get(target.id, [])
                if len(uses) == 1 and uses[0].op == "reshape" and tuple(uses[0].outputs[0].shape) == (g.shape[1],):
                    target = uses[0].outputs[0]
            sums.append(target)
        if sum(t is not None for t in sums) < 2:
            continue
        if any(t is not None and places.device_of(t.producer) != places.device_of(node) for t in sums):
            continue
        position = places.pos[id(node)] + 1
        if any(t is not None and places.first_read.get(t.id, 1 << 30) < position for t in sums):
            continue                 # a bias update that runs before the joined gradient exists
        b = Emitter(f"{node.scope}.bias")
        total = b.op("reduce_sum", joined, axes=(0,), keepdims=True)
        flat = b.reshape(total, (joined.shape[1],))
        start = 0
        for g, t in zip(node.inputs, sums):
            stop = start + g.shape[1]
            if t is not None:
                source = flat if t.rank == 1 else total
                subst.replace(t, b.op("slice", source, axis=source.rank - 1, start=start, stop=stop))
                done.add(id(t.producer))
            start = stop
        inserts.setdefault(position, []).extend(b.take())
        notes.append(f"batch_gemms: {sum(t is not None for t in sums)} bias gradients ({node.scope}) -> one "
                     "column sum of the joined gradient")
    return notes


def batch_gemms(graph: Graph, ctx: PassContext) -> bool:
    """matmuls sharing an operand -> one wider GEMM and slices; sums of matmuls -> one GEMM over
    the joined inner dimension; small independent matmuls of one shape -> one batched matmul;
    the batched layers' bias gradients -> one column sum."""
    notes = []
    # constants read nothing: first in the order, they never keep a group from fitting
    graph.nodes = ([n for n in graph.nodes if n.op in CONSTANT_OPS] +
                   [n for n in graph.nodes if n.op not in CONSTANT_OPS])
    for rule in (_batch_shared, _batch_sums, _batch_independent, _batch_bias_gradients):
        places = _Places(graph, ctx.placement(graph))
        subst = Substitution()
        inserts: dict[int, list[Node]] = {}
        done: set[int] = set()
        found = rule(graph, subst, inserts, places, done)
        if not found:
            continue
        nodes: list[Node] = []
        for i, node in enumerate(graph.nodes):
            nodes.extend(inserts.get(i, ()))
            nodes.append(node)
        nodes.extend(inserts.get(len(graph.nodes), ()))
        graph.nodes = nodes
        subst.apply(graph)
        notes += found
    for text in notes:
        ctx.note(text)
    return bool(notes)
