"""Constants: weights frozen into constants, constant folding, and constant dedup.

Folding evaluates a pure node once, at compile time, when everything it reads is a constant and
its shape is known; a result may not grow memory by more than FOLD_FREE_BYTES over what it reads.
Random ops never fold (their result must differ from run to run).
"""
from __future__ import annotations

import hashlib
import weakref
from collections import Counter
from typing import Mapping

import numpy as np

from ..ir.graph import Graph, Node
from ..ops.base import get_op
from ..ops.reduce import bessel_factor
from .context import PassContext
from .rewrite import CONSTANT_OPS, Emitter, Substitution, constant_node, constant_value, is_concrete

# A folded constant may be this much larger than the constants it is computed from: enough for
# broadcast scalars and small tables, never a copy of an activation-sized array per plan.
FOLD_FREE_BYTES = 1 << 16


def freeze_weights(graph: Graph, weights: Mapping[str, np.ndarray], consume: bool = False) -> Graph:
    """Weights that no update writes become constants holding ``weights``' arrays (infer and test
    graphs: the model is fixed), so the passes can fold what is computed from them. ``consume``:
    each frozen array is taken out of ``weights`` (a dict the caller hands over), so that once a
    pass has folded it into another constant (a pre-transposed GEMM weight) nothing holds the old
    one: a net's weights are in memory once, not twice, while it compiles."""
    frozen: list[Node] = []
    for name, w in list(graph.weights.items()):
        if name in graph.updates or name not in weights:
            continue
        arr = np.asarray(weights.pop(name) if consume else weights[name])
        expected = w.value.type.concrete({})
        if arr.shape != expected:
            raise ValueError(f"weight '{name}' has shape {arr.shape}, the graph needs {expected}")
        if str(arr.dtype) != w.value.dtype:
            arr = arr.astype(w.value.dtype)
        node = constant_node(arr, w.layer or name)
        node.outputs = [w.value]                 # the weight's value keeps its id: no use changes
        w.value.producer = node
        frozen.append(node)
        del graph.weights[name]
    graph.nodes = frozen + graph.nodes
    return graph


def _fold_limit(inputs: list[np.ndarray]) -> int:
    return FOLD_FREE_BYTES + sum(a.nbytes for a in inputs)


def _evaluate(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray] | None:
    """The node's outputs by its reference implementation, or None where it cannot (or must not)
    be folded: a result too large, or a reference that raises (a run-time error stays at run time)."""
    opdef = get_op(node.op)
    try:
        result = opdef.reference(*arrays, **node.attrs)
    except Exception:
        return None
    results = result if isinstance(result, tuple) else (result,)
    out = []
    for value, r in zip(node.outputs, results):
        r = np.asarray(r, dtype=value.dtype)
        if r.shape != value.type.concrete({}):
            return None
        out.append(r)
    if sum(r.nbytes for r in out) > _fold_limit(arrays):
        return None
    return out


def _shape_derived(node: Node, emitter: Emitter) -> Node | None:
    """Ops whose arithmetic depends on a shape: once the shape is a number, the factor is a
    constant. bessel_correct(var, count=n) -> var * (n / (n - 1))."""
    if node.op == "bessel_correct" and isinstance(node.attrs["count"], int):
        factor = emitter.scalar(bessel_factor(node.attrs["count"]), node.outputs[0].dtype)
        mul = Node("mul", [node.inputs[0], factor], {}, node.scope)
        mul.outputs = node.outputs
        for o in mul.outputs:
            o.producer = mul
        return mul
    return None


def fold_constants(graph: Graph, ctx: PassContext) -> bool:
    """Pure nodes that read only constants (with concrete shapes and attributes) become constants,
    and shape-derived factors become constants; one sweep in topological order reaches the
    fixpoint of constant propagation."""
    known: dict[int, np.ndarray] = {}
    out_nodes: list[Node] = []
    folded = rewrites = 0
    # a constant whose last reader folds is dropped at once, not when the sweep ends: folding a
    # net's GEMM weights into their transposes then holds one weight twice at a time, not all
    readers = Counter(v.id for n in graph.nodes for v in n.inputs)
    keep = {v.id for v in graph.outputs.values()} | {v.id for v in graph.updates.values()}
    dropped: set[int] = set()
    nodes, graph.nodes = graph.nodes, []
    for at in range(len(nodes)):
        node, nodes[at] = nodes[at], None         # the sweep holds no node it has passed
        if node.op in CONSTANT_OPS:
            known[node.outputs[0].id] = constant_value(node.outputs[0])
            out_nodes.append(node)
            continue
        emitter = Emitter(node.scope)
        rewritten = _shape_derived(node, emitter)
        if rewritten is not None:
            for factor in emitter.take():
                known[factor.outputs[0].id] = constant_value(factor.outputs[0])
                out_nodes.append(factor)
            node = rewritten
            rewrites += 1
            ctx.note(f"fold_constants: {node.scope}: bessel_correct's n/(n-1) is a constant")
        opdef = get_op(node.op)
        foldable = (opdef.pure and node.inputs and all(v.id in known for v in node.inputs)
                    and all(is_concrete(o.shape) for o in node.outputs) and is_concrete(node.attrs))
        results = _evaluate(node, [known[v.id] for v in node.inputs]) if foldable else None
        if results is None:
            out_nodes.append(node)
            continue
        folded += 1
        for v in node.inputs:
            readers[v.id] -= 1
            if readers[v.id] == 0 and v.id not in keep and v.producer is not None and v.producer.op in CONSTANT_OPS:
                dropped.add(id(v.producer))
                known.pop(v.id, None)
                # a node and its value refer to each other: only the cycle collector would free
                # the array, at some later collection; unlinked, it goes with its last reference
                v.producer.attrs = {}
                v.producer.outputs = []
                v.producer = None
        for value, arr in zip(node.outputs, results):
            const = constant_node(arr, node.scope)
            const.outputs = [value]
            value.producer = const
            known[value.id] = const.attrs["value"]
            out_nodes.append(const)
        if dropped:
            out_nodes = [n for n in out_nodes if id(n) not in dropped]
            dropped.clear()
    graph.nodes = out_nodes
    if folded:
        ctx.note(f"fold_constants: {folded} node(s) evaluated at compile time")
    return bool(folded or rewrites)


def _bytes(arr: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(arr).reshape(-1).view(np.uint8)


# digests by array, kept while the array lives: the canonical passes run dedup_constants after
# every pass that changed the graph, and hashing a ResNet-50's weights each time took 1.2 s of
# its 2 s compile. (A digest only finds candidates; equal bytes are checked before a merge.)
_DIGESTS: dict[int, tuple] = {}


def _digest(arr: np.ndarray) -> tuple:
    kept = _DIGESTS.get(id(arr))
    if kept is not None and kept[0]() is arr:
        return kept[1]
    digest = (arr.dtype.str, arr.shape, hashlib.blake2b(_bytes(arr)).digest())
    try:
        ref = weakref.ref(arr, lambda _ref, key=id(arr): _DIGESTS.pop(key, None))
    except TypeError:
        return digest
    _DIGESTS[id(arr)] = (ref, digest)
    return digest


def dedup_constants(graph: Graph, ctx: PassContext) -> bool:
    """Constants equal in dtype, shape and bytes become one (the first); its readers share it."""
    seen: dict[tuple, list] = {}
    subst = Substitution()
    kept: list[Node] = []
    merged = 0
    for node in graph.nodes:
        subst.apply_to_node(node)
        if node.op in CONSTANT_OPS:
            value = node.outputs[0]
            arr = constant_value(value)
            key = _digest(arr)
            same = next((v for v in seen.get(key, ())
                         if v.type == value.type and np.array_equal(_bytes(constant_value(v)), _bytes(arr))), None)
            if same is not None:
                subst.replace(value, same)
                merged += 1
                continue
            seen.setdefault(key, []).append(value)
        kept.append(node)
    graph.nodes = kept
    subst.apply(graph)
    if merged:
        ctx.note(f"dedup_constants: {merged} duplicate constant(s) merged")
    return bool(merged)

