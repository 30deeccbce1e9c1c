"""Control flow in the graph: ``loop`` and ``if``, whose bodies are subgraphs.

``loop``  inputs: k initial carried values, s scanned sequences, then invariants (the values the
          body reads from outside, weights included). The body maps (carries, one step of each
          sequence, invariants) to ([a bool "go on" flag,] new carries, per-step outputs). The
          loop's outputs are the final carries and the per-step outputs stacked on a new axis 0.
          It runs once per element of the sequences' axis 0 (``reverse``: last first), or
          ``trips`` times when nothing is scanned; with ``condition`` it also stops after a step
          whose flag is false (such a loop has no per-step outputs and no gradient).
``if``    inputs: a bool scalar condition, then the values both branches read; ``then_body`` or
          ``else_body`` runs, and both give outputs of the same types.

Bodies are built by ordinary lowering code with a Builder on a body graph that may read any outer
value; ``build_body`` then turns every outer value read into a body input (closure conversion),
so a body is a closed graph and the node's inputs say everything it depends on. A body's
symbolic dimensions (the batch N) travel in the ``dims`` attribute, which binding turns into
numbers like any other attribute.

Gradients are graph ops too. A loop's gradient is a loop running the other way over the carries
each step started from (its residuals: before the gradient rule runs, autodiff puts in the
forward loop's place a copy that also stacks them as extra per-step outputs), whose body
recomputes the step and back-propagates through it (``autodiff.backprop``); invariants' gradients
are summed in extra carries. An ``if``'s gradient is an ``if`` over the branches' gradients.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from ..errors import UserError
from ..ir.dims import Sym
from ..ir.graph import FLOAT_DTYPES, Graph, Node, TensorType, Value
from .autodiff import AutodiffError, backprop
from .base import Builder, OpDef, ShapeError, get_op, register
from .flops import graph_flops
from .interpreter import run_body

# a carried value whose type still changes after this many rebuilds of the body never settles
FIXPOINT_ROUNDS = 4


class Body:
    """A subgraph held in a node's attributes; compared and hashed by identity."""

    __slots__ = ("graph",)

    def __init__(self, graph: Graph):
        self.graph = graph

    @property
    def inputs(self) -> list[Value]:
        return list(self.graph.inputs.values())

    @property
    def outputs(self) -> list[Value]:
        return list(self.graph.outputs.values())

    def __repr__(self) -> str:
        return f"body({len(self.graph.nodes)} nodes)"


def bodies_of(node) -> list[Body]:
    return [v for v in node.attrs.values() if isinstance(v, Body)]


# -- building, inlining and re-typing bodies ---------------------------------------------------

def _symbols(graph: Graph) -> tuple:
    names: set[str] = set()
    values = list(graph.inputs.values()) + [o for n in graph.nodes for o in n.outputs]
    for v in values:
        for d in v.shape:
            if isinstance(d, Sym):
                names |= d.symbols
    for node in graph.nodes:
        for body in bodies_of(node):
            names |= {name for name, _ in _symbols(body.graph)}
    return tuple((name, Sym.named(name)) for name in sorted(names))


def free_values(graph: Graph) -> list[Value]:
    """Values the graph reads that neither its inputs nor its nodes define, in order of first use."""
    defined = {v.id for v in graph.inputs.values()}
    free: dict[int, Value] = {}
    for node in graph.nodes:
        for v in node.inputs:
            if v.id not in defined:
                free.setdefault(v.id, v)
        defined.update(o.id for o in node.outputs)
    for v in graph.outputs.values():
        if v.id not in defined:
            free.setdefault(v.id, v)
    return list(free.values())


def _close(graph: Graph) -> list[Value]:
    """Closure conversion: every outer value the body reads becomes a new body input ('capN');
    returns those outer values, in the order of the new inputs."""
    captured = free_values(graph)
    inner: dict[int, Value] = {}
    for j, v in enumerate(captured):
        inner[v.id] = Value(v.type, name=f"cap{j}")
        graph.inputs[f"cap{j}"] = inner[v.id]
    for node in graph.nodes:
        node.inputs = [inner.get(v.id, v) for v in node.inputs]
    graph.outputs = {k: inner.get(v.id, v) for k, v in graph.outputs.items()}
    return captured


def build_body(in_types: Sequence[TensorType], build: Callable[[Builder, list[Value]], list[Value]],
               scope: str) -> tuple[Body, list[Value]]:
    """A closed body whose first inputs have ``in_types`` and whose outputs ``build`` returns,
    and the outer values it captured (its remaining inputs)."""
    graph = Graph("body")
    args = []
    for i, t in enumerate(in_types):
        args.append(Value(t, name=f"in{i}"))
        graph.inputs[f"in{i}"] = args[-1]
    outs = build(Builder(graph, scope), args)
    graph.outputs = {f"out{i}": v for i, v in enumerate(outs)}
    return Body(graph), _close(graph)


def inline(b: Builder, body: Body, args: Sequence[Value]) -> list[Value]:
    """Append a copy of ``body``'s nodes to ``b``'s graph, reading ``args`` for its inputs;
    returns the copies of its outputs. Nodes keep their layer scope."""
    env = {v.id: a for v, a in zip(body.inputs, args)}
    for node in body.graph.nodes:
        outs = b.op_multi(node.op, *[env.get(v.id, v) for v in node.inputs], **node.attrs)
        b.graph.nodes[-1].scope = node.scope
        for o, n in zip(node.outputs, outs):
            env[o.id] = n
    return [env.get(v.id, v) for v in body.outputs]


def _zeros(b: Builder, t: TensorType) -> Value:
    return b.op("broadcast_to", b.scalar(0.0, t.dtype), shape=tuple(t.shape))


def _broadcasts(src: tuple, dst: tuple) -> bool:
    if len(src) > len(dst):
        return False
    return all(s == 1 or s == d for s, d in zip(src[::-1], dst[::-1]))


# -- loop --------------------------------------------------------------------------------------

def _trips(scan_types: list[TensorType], attrs: dict):
    if not scan_types:
        trips = attrs.get("trips")
        if trips is None:
            raise ShapeError("a loop that scans nothing needs a trip count")
        return trips
    lengths = [t.shape[0] if t.rank else None for t in scan_types]
    if None in lengths:
        raise ShapeError("a scanned sequence needs an axis to step along")
    if any(n != lengths[0] for n in lengths):
        raise ShapeError("the scanned sequences differ in length: " + ", ".join(map(str, scan_types)))
    return lengths[0]


def _loop_infer(types, attrs):
    body: Body = attrs["body"]
    k, s = attrs["carried"], attrs["scanned"]
    inner = body.inputs
    if len(types) != len(inner):
        raise ShapeError(f"the loop has {len(types)} inputs, its body {len(inner)}")
    trips = _trips(types[k:k + s], attrs)
    for i, (t, v) in enumerate(zip(types[:k], inner[:k])):
        if t.dtype != v.dtype or not _broadcasts(tuple(t.shape), tuple(v.shape)):
            raise ShapeError(f"carried value {i} enters as {t}, but the body carries {v.type}")
    for t, v in zip(types[k:k + s], inner[k:k + s]):
        if TensorType(tuple(t.shape[1:]), t.dtype) != v.type:
            raise ShapeError(f"a step of the sequence {t} is not the body's {v.type}")
    for t, v in zip(types[k + s:], inner[k + s:]):
        if t != v.type:
            raise ShapeError(f"the body reads {v.type} where the loop passes {t}")
    outs = body.outputs
    flag = 1 if attrs.get("condition") else 0
    if flag and (outs[0].shape != () or outs[0].dtype != "bool"):
        raise ShapeError(f"a loop's condition must be a bool scalar, the body gives {outs[0].type}")
    if len(outs) < flag + k:
        raise ShapeError("the body gives fewer outputs than the loop carries")
    for i, (o, v) in enumerate(zip(outs[flag:flag + k], inner[:k])):
        if o.type != v.type:
            raise ShapeError(f"carried value {i} enters the body as {v.type} but leaves it as {o.type}")
    per_step = outs[flag + k:]
    if flag and per_step:
        raise ShapeError("a loop with a condition cannot stack per-step outputs")
    return [v.type for v in inner[:k]] + [TensorType((trips,) + tuple(o.shape), o.dtype) for o in per_step]


def _loop_reference(*arrays, body, carried, scanned, reverse=False, trips=None, condition=False,
                    dims=(), saved=0, rng=None, unfinished=None):
    bindings = dict(dims)
    k, s = carried, scanned
    carries = [np.broadcast_to(a, v.type.concrete(bindings)).copy() for a, v in zip(arrays[:k], body.inputs[:k])]
    scans, invariants = arrays[k:k + s], list(arrays[k + s:])
    count = scans[0].shape[0] if s else int(trips)
    flag = 1 if condition else 0
    steps: list[list] = []
    for t in (range(count - 1, -1, -1) if reverse else range(count)):
        outs = run_body(body.graph, carries + [x[t] for x in scans] + invariants, bindings, rng)
        carries = [np.array(c) for c in outs[flag:flag + k]]
        steps.append(outs[flag + k:])
        if flag and not bool(outs[0]):
            break
    else:
        if unfinished and count:
            raise UserError(unfinished)
    if reverse:
        steps.reverse()
    stacked = [np.stack([step[j] for step in steps]) for j in range(len(body.outputs) - flag - k)]
    return tuple(carries + stacked)


def loop(b: Builder, init: Sequence[Value], sequences: Sequence[Value],
         step: Callable[[Builder, list[Value], list[Value]], tuple], reverse: bool = False,
         trips=None, condition: bool = False, unfinished: str | None = None) -> list[Value]:
    """Append a loop node; returns its outputs (final carries, then stacked per-step outputs).

    ``step(builder, carries, xs)`` builds one step and returns (new carries, per-step outputs),
    or (flag, new carries) with ``condition``; it may read any outer value. ``unfinished``: with
    a condition, ``trips`` is a bound rather than a count, and a run that reaches it with the
    condition still true fails with this message. The carried types
    are inferred to a fixpoint: a carry whose step result has another type (an initial [1, H]
    that the step broadcasts to [N, H]) is carried with the step's type, and the body rebuilt,
    until the types settle."""
    init, sequences = list(init), list(sequences)
    k = len(init)
    slice_types = [TensorType(tuple(x.shape[1:]), x.dtype) for x in sequences]
    carry_types = [v.type for v in init]

    def build(bb: Builder, args: list[Value]) -> list[Value]:
        result = step(bb, args[:k], args[k:])
        if condition:
            flag, carries = result
            return [flag] + list(carries)
        carries, per_step = result
        return list(carries) + list(per_step)

    for _ in range(FIXPOINT_ROUNDS):
        body, captured = build_body(carry_types + slice_types, build, b.scope)
        flag = 1 if condition else 0
        out_types = [v.type for v in body.outputs[flag:flag + k]]
        if out_types == carry_types:
            break
        widened = []
        for i, (start, now) in enumerate(zip(carry_types, out_types)):
            if start != now and (start.dtype != now.dtype or not _broadcasts(tuple(start.shape), tuple(now.shape))):
                raise ShapeError(f"carried value {i} enters the loop as {start} but one step makes it {now}")
            widened.append(now)
        carry_types = widened
    else:
        raise ShapeError("the loop's carried types do not settle: " + ", ".join(map(str, carry_types)))
    attrs = dict(body=body, carried=k, scanned=len(sequences), reverse=bool(reverse), condition=bool(condition),
                 dims=_symbols(body.graph))
    if trips is not None:
        attrs["trips"] = trips
    if unfinished:             # trips is a bound, not a count: reaching it is this error
        attrs["unfinished"] = unfinished
    return b.op_multi("loop", *init, *sequences, *captured, **attrs)


def _has_random(graph: Graph) -> bool:
    for node in graph.nodes:
        if not get_op(node.op).pure and node.op not in ("loop", "if"):
            return True
        if any(_has_random(body.graph) for body in bodies_of(node)):
            return True
    return False


def _loop_residuals(node: Node) -> Node | None:
    """The forward loop also stacking the carries each step started from (``saved``: that many
    extra per-step outputs), which its gradient's backward loop steps over; None where it does
    already (a node differentiated before). Only train graphs get them, from autodiff, which
    runs this first: a loop without a gradient is refused here, before anything is built."""
    if node.attrs.get("condition"):
        raise AutodiffError(f"layer '{node.scope}': a loop with a condition has no gradient "
                            "(its trip count is only known when it runs)")
    body: Body = node.attrs["body"]
    if _has_random(body.graph):
        raise AutodiffError(f"layer '{node.scope}': a loop body with random ops (dropout) cannot be "
                            "differentiated: its gradient recomputes each step")
    if node.attrs.get("saved"):
        return None
    k = node.attrs["carried"]
    # a copy of the body, sharing no node with it: passes rewrite nodes in place, and the body
    # stays in use where the node is an inner loop (the forward body of an outer loop holds it)
    graph = Graph("body", inputs={name: Value(v.type, name=v.name) for name, v in body.graph.inputs.items()})
    outs = inline(Builder(graph), body, list(graph.inputs.values()))
    graph.outputs = dict(zip(body.graph.outputs, outs))
    for i, v in enumerate(list(graph.inputs.values())[:k]):
        graph.outputs[f"saved{i}"] = v
    new = Node(node.op, list(node.inputs), dict(node.attrs, body=Body(graph), saved=k), node.scope)
    trips = _trips([v.type for v in node.inputs[k:k + node.attrs["scanned"]]], node.attrs)
    new.outputs = list(node.outputs) + [Value(TensorType((trips,) + tuple(v.shape), v.dtype), new)
                                        for v in body.inputs[:k]]
    return new


def _loop_grad(b: Builder, node, gouts):
    """The gradient of a loop that has its residuals (``_loop_residuals``: autodiff adds them)."""
    forward: Body = node.attrs["body"]
    k, s, n_saved = node.attrs["carried"], node.attrs["scanned"], node.attrs["saved"]
    inits, seqs, invariants = node.inputs[:k], node.inputs[k:k + s], node.inputs[k + s:]
    per_step = len(forward.outputs) - k - n_saved
    g_final, g_steps = gouts[:k], gouts[k:k + per_step]
    saved = node.outputs[-n_saved:]
    inner = forward.inputs
    float_carries = [i for i in range(k) if inner[i].dtype in FLOAT_DTYPES]
    float_invariants = [j for j, v in enumerate(invariants) if v.dtype in FLOAT_DTYPES]
    float_seqs = [i for i, v in enumerate(seqs) if v.dtype in FLOAT_DTYPES]
    seeded_steps = [j for j in range(per_step) if g_steps[j] is not None]
    start = [g_final[i] if g_final[i] is not None else _zeros(b, inner[i].type) for i in float_carries]
    start += [_zeros(b, invariants[j].type) for j in float_invariants]
    nc = len(float_carries)

    def backward_step(bb: Builder, carries: list[Value], xs: list[Value]):
        g_carry, sums = carries[:nc], carries[nc:]
        c_in, x_t, g_y = xs[:k], xs[k:k + s], xs[k + s:]
        outs = inline(bb, forward, list(c_in) + list(x_t) + list(invariants))
        seeds = [(outs[i], g) for i, g in zip(float_carries, g_carry)]
        seeds += [(outs[k + j], g) for j, g in zip(seeded_steps, g_y)]
        grads = backprop(bb.graph, seeds, list(c_in) + list(x_t) + list(invariants))
        new_carry = [grads[c_in[i].id] or _zeros(bb, inner[i].type) for i in float_carries]
        new_sums = []
        for acc, j in zip(sums, float_invariants):
            g = grads[invariants[j].id]
            new_sums.append(acc if g is None else bb.add(acc, g))
        g_x = [grads[x_t[i].id] or _zeros(bb, x_t[i].type) for i in float_seqs]
        return new_carry + new_sums, g_x

    outs = loop(b, start, list(saved) + list(seqs) + [g_steps[j] for j in seeded_steps], backward_step,
                reverse=not node.attrs.get("reverse", False))
    grads: list[Value | None] = [None] * len(node.inputs)
    for pos, i in enumerate(float_carries):
        grads[i] = b.sum_to(outs[pos], inits[i].shape)
    for pos, j in enumerate(float_invariants):
        grads[k + s + j] = outs[nc + pos]
    for pos, i in enumerate(float_seqs):
        grads[k + i] = outs[nc + len(float_invariants) + pos]
    return grads


def _loop_flops(ins, outs, attrs):
    trips = _trips(ins[attrs["carried"]:attrs["carried"] + attrs["scanned"]], attrs)
    return trips * graph_flops(attrs["body"].graph)


def _if_flops(ins, outs, attrs):
    then_flops, else_flops = graph_flops(attrs["then_body"].graph), graph_flops(attrs["else_body"].graph)
    if isinstance(then_flops, int) and isinstance(else_flops, int):
        return max(then_flops, else_flops)
    return then_flops                 # symbolic counts need not compare: the then branch's


register(OpDef("loop", _loop_infer, _loop_reference, _loop_grad, _loop_flops, pure=False,
               residuals=_loop_residuals, doc="a body subgraph over carried values and scanned sequences"))


# -- if ----------------------------------------------------------------------------------------

def _if_infer(types, attrs):
    cond = types[0]
    if cond.shape != () or cond.dtype != "bool":
        raise ShapeError(f"an if's condition must be a bool scalar, got {cond}")
    then_body, else_body = attrs["then_body"], attrs["else_body"]
    for body in (then_body, else_body):
        if [v.type for v in body.inputs] != list(types[1:]):
            raise ShapeError("the branch's inputs do not match the values the if passes")
    then_types = [v.type for v in then_body.outputs]
    else_types = [v.type for v in else_body.outputs]
    if len(then_types) != len(else_types):
        raise ShapeError(f"the then branch gives {len(then_types)} outputs, the else branch {len(else_types)}")
    for i, (t, e) in enumerate(zip(then_types, else_types)):
        if t != e:
            raise ShapeError(f"output {i} is {t} in the then branch but {e} in the else branch")
    return then_types


def _if_reference(cond, *args, then_body, else_body, dims=(), rng=None):
    body = then_body if bool(cond) else else_body
    return tuple(run_body(body.graph, list(args), dict(dims), rng))


def if_(b: Builder, cond: Value, then_build: Callable[[Builder], list[Value]],
        else_build: Callable[[Builder], list[Value]]) -> list[Value]:
    """Append an if node whose branches ``then_build(builder)`` and ``else_build(builder)`` build
    (each may read any outer value); returns its outputs."""
    then_body, then_caps = build_body([], lambda bb, _: then_build(bb), b.scope)
    else_body, else_caps = build_body([], lambda bb, _: else_build(bb), b.scope)
    shared = list({v.id: v for v in then_caps + else_caps}.values())
    for body, caps in ((then_body, then_caps), (else_body, else_caps)):
        mine = {v.id: inner for v, inner in zip(caps, body.inputs)}
        body.graph.inputs = {f"cap{j}": mine.get(v.id) or Value(v.type, name=f"cap{j}") for j, v in enumerate(shared)}
    symbols = dict(_symbols(then_body.graph) + _symbols(else_body.graph))
    return b.op_multi("if", cond, *shared, then_body=then_body, else_body=else_body,
                      dims=tuple(sorted(symbols.items())))


def _if_grad(b: Builder, node, gouts):
    for body in (node.attrs["then_body"], node.attrs["else_body"]):
        if _has_random(body.graph):
            raise AutodiffError(f"layer '{node.scope}': a branch with random ops (dropout) cannot be "
                                "differentiated: its gradient recomputes the branch")
    args = node.inputs[1:]
    wanted = [j for j, v in enumerate(args) if v.dtype in FLOAT_DTYPES]
    seeded = [i for i, g in enumerate(gouts) if g is not None]
    if not wanted or not seeded:
        return [None] * len(node.inputs)

    def branch(body: Body):
        def build(bb: Builder) -> list[Value]:
            outs = inline(bb, body, args)
            grads = backprop(bb.graph, [(outs[i], gouts[i]) for i in seeded], list(args))
            return [grads[args[j].id] or _zeros(bb, args[j].type) for j in wanted]
        return build

    outs = if_(b, node.inputs[0], branch(node.attrs["then_body"]), branch(node.attrs["else_body"]))
    grads: list[Value | None] = [None] * len(node.inputs)
    for j, g in zip(wanted, outs):
        grads[1 + j] = g
    return grads


register(OpDef("if", _if_infer, _if_reference, _if_grad, _if_flops, pure=False,
               doc="one of two branch subgraphs, chosen by a bool scalar at run time"))
