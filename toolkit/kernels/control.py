"""Kernels of the control-flow ops, one for every device: each body becomes a Plan of its own
(built once with the node's shapes, on the node's device, sharing the caller's random state),
and the kernel runs it step by step.

A loop fills its body's invariant inputs once per call; per step it copies in the carries and
one step of each sequence, runs the body's calls, and copies the per-step outputs into their
slot of the stacked results. Nothing is allocated per step.
"""
from __future__ import annotations

import numpy as np

from ..backend.devices import to_host
from ..backend.registry import KERNELS, KernelContext
from ..errors import UserError
from ..runtime.plan import Plan, RuntimeState


def _body_plan(ctx: KernelContext, body):
    """The body's plan, built once per shape binding and device and kept in the runtime state.
    One thread: the body's ops are small, and the outer plan already runs on every core."""
    runtime = ctx.runtime if ctx.runtime is not None else RuntimeState(np.random.default_rng(0))
    key = (id(body), tuple(ctx.attrs["dims"]), ctx.device)
    kept = runtime.body_plans.get(key)
    if kept is None:
        plan = Plan(body.graph, dict(ctx.attrs["dims"]), {}, device=ctx.device,
                    runtime=runtime, threads=1, concurrent=False, keep_inputs=True, reuse_memory=ctx.reuse_memory,
                    capture=False)
        kept = runtime.body_plans[key] = (body, plan)      # the body held: its id stays unique
    return kept[1]


def _to_host_bool(flag) -> bool:
    return bool(to_host(flag))


def loop_kernel(ctx: KernelContext):
    attrs = ctx.attrs
    body = attrs["body"]
    plan = _body_plan(ctx, body)
    xp = ctx.xp
    k, s = attrs["carried"], attrs["scanned"]
    flag = 1 if attrs.get("condition") else 0
    names = list(body.graph.inputs)
    carry_in = [plan.input_views[n] for n in names[:k]]
    scan_in = [plan.input_views[n] for n in names[k:k + s]]
    fixed_in = [plan.input_views[n] for n in names[k + s:]]
    outs = [plan.output_views[n] for n in body.graph.outputs]
    carry_out, step_out = outs[flag:flag + k], outs[flag + k:]
    # a carry handed on unchanged or swapped with another reads an input buffer: copy via temporaries
    inputs = {v.id for v in body.inputs}
    aliased = any(v.id in inputs for v in body.outputs[flag:flag + k])
    trips = ctx.in_shapes[k][0] if s else int(attrs["trips"])
    unfinished = attrs.get("unfinished") if flag else None     # the trips are a bound, not a count
    order = range(trips - 1, -1, -1) if attrs.get("reverse") else range(trips)

    def run(ins, results):
        for buf, a in zip(fixed_in, ins[k + s:]):
            xp.copyto(buf, a)
        for buf, a in zip(carry_in, ins[:k]):
            xp.copyto(buf, xp.broadcast_to(a, buf.shape))
        for t in order:
            for buf, seq in zip(scan_in, ins[k:k + s]):
                xp.copyto(buf, seq[t])
            plan.execute(nested=True)
            for slot, out in zip(results[k:], step_out):
                xp.copyto(slot[t], out)
            done = flag and not _to_host_bool(outs[0])
            news = [c.copy() for c in carry_out] if aliased else carry_out
            for buf, new in zip(carry_in, news):
                xp.copyto(buf, new)
            if done:
                break
        else:
            if unfinished and trips:
                raise UserError(unfinished)
        for slot, buf in zip(results[:k], carry_in):
            xp.copyto(slot, buf)
    if plan.made.before_run:
        run.host_sync = "runs host work before every step of its body (random keys)"
    return run


def if_kernel(ctx: KernelContext):
    attrs = ctx.attrs
    branches = []
    for body in (attrs["then_body"], attrs["else_body"]):
        plan = _body_plan(ctx, body)
        branches.append((plan, [plan.input_views[n] for n in body.graph.inputs],
                         [plan.output_views[n] for n in body.graph.outputs]))
    xp = ctx.xp

    def run(ins, results):
        plan, args, outs = branches[0] if _to_host_bool(ins[0]) else branches[1]
        for buf, a in zip(args, ins[1:]):
            xp.copyto(buf, a)
        plan.execute(nested=True)
        for slot, out in zip(results, outs):
            xp.copyto(slot, out)
    if any(plan.made.before_run for plan, _args, _outs in branches):
        run.host_sync = "runs host work before its branch (random keys)"
    return run


def _loop_host_sync(node) -> str | None:
    return "reads its stopping condition on the host after every step" if node.attrs.get("condition") else None


def register(device: str) -> None:
    KERNELS.register("loop", device, host_sync=_loop_host_sync)(loop_kernel)
    KERNELS.register("if", device, host_sync="reads its condition on the host")(if_kernel)
