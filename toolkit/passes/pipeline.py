"""The graph pass pipeline: one visible, named list of passes, each switchable by name.

Canonicalising passes (dead code, constant folding, dedup, simplification, CSE) run first, to
a fixpoint, and again after every transforming pass that changed the graph, so that what a
transform leaves behind (a BatchNorm's scale now computed from constants, a weight concat,
duplicate slices) is folded and merged before the next one looks. Every stage names its
function; ``plan_memory`` is no stage but a switch of the same kind (``PLAN_SWITCHES``): the
memory planner runs when a plan is built, and ``--disable`` turns it off like a pass.

Each pass says whether it changed the graph (context.py); ``run_pipeline`` verifies the graph
after every pass when asked (tests, ``toolkit compile``), naming the pass that broke it, and
records what each did for ``toolkit compile --explain``. An exception a pass raises comes out
as ``PassFailed`` naming the pass and the graph (a user's mistake, a ``UserError``, as it is).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from ..errors import UserError
from ..ir.graph import Graph
from ..ops.control import bodies_of
from ..ops.flops import graph_flops
from ..ops.verify import VerifyError, verify
from .batchnorm import fold_batch_norm
from .bias_grad import fuse_bias_gradient
from .collectives import schedule_collectives
from .constants import dedup_constants, fold_constants
from .context import PassContext
from .control import eliminate_dead_branches
from .cse import eliminate_common
from .fuse import fuse_conv_max_pool, fuse_elementwise, fuse_epilogue
from .fuse_casts import fuse_casts
from .fuse_reductions import fuse_reductions
from .gemm import batch_gemms
from .layout import choose_layout
from .place import place_devices
from .prune import eliminate_dead_code
from .quantize import quantize
from .simplify import simplify


@dataclass(frozen=True)
class Stage:
    name: str
    run: Callable[[Graph, PassContext], bool]      # changes the graph; says whether it did
    contract: str
    canonical: bool = False           # part of the canonicalising group, repeated to a fixpoint


@dataclass(frozen=True)
class PlanSwitch:
    """A step that runs when a plan is built, not on the graph, switched off by name like a pass."""
    name: str
    contract: str


class PassFailed(RuntimeError):
    """A pass raised: the message names the pass and the graph, the original is the cause."""


def optimize_bodies(graph: Graph, ctx: PassContext) -> bool:
    """The whole pipeline on every loop and if body, with the passes switched off for the graph
    also off there (and device placement: a body runs where its node does), so a loop's step is
    folded, fused and batched like any graph."""
    inner = PassContext(ctx.device, ctx.disabled | {"place_devices"}, check=ctx.check)
    changed = False
    for node in graph.nodes:
        for body in bodies_of(node):
            body.graph.layer_devices = graph.layer_devices
            body.graph.precision = graph.precision
            before = len(body.graph.nodes)
            changed |= _run_stages(body.graph, inner, None, None)
            if len(body.graph.nodes) != before:
                ctx.note(f"optimize_bodies: '{node.scope}': its body went from {before} to "
                         f"{len(body.graph.nodes)} nodes")
    return changed


PIPELINE: list[Stage] = [
    Stage("eliminate_dead_code", eliminate_dead_code,
          "drop nodes no output or update depends on", canonical=True),
    Stage("fold_constants", fold_constants,
          "evaluate pure nodes on constants (and shape-derived factors) at compile time", canonical=True),
    Stage("dedup_constants", dedup_constants,
          "merge constants equal in dtype, shape and bytes", canonical=True),
    Stage("simplify", simplify,
          "algebraic identities from the rule table (x*1, transpose chains, scalings, ...)", canonical=True),
    Stage("eliminate_common", eliminate_common,
          "merge pure nodes with equal op, inputs and attributes", canonical=True),
    Stage("eliminate_dead_branches", eliminate_dead_branches,
          "an if on a constant condition becomes its taken branch; unread loop outputs and "
          "body inputs are dropped", canonical=True),
    Stage("fold_batch_norm", fold_batch_norm,
          "static per-channel scale and shift (BatchNorm on running statistics, Scale) into the "
          "preceding convolution's or InnerProduct's weights and bias"),
    Stage("quantize", quantize,
          "an infer graph whose net has a quantization section: convolutions and InnerProducts with scales as "
          "int8 qconv2d / qgemm (ReLU folded in), quantize_linear and dequantize_linear where int8 begins and ends"),
    Stage("choose_layout", choose_layout,
          "convolutions the blocked kernels run faster in the blocked channel layout (NCHW16c), with the ops "
          "that follow them; reorders where the layouts meet"),
    Stage("batch_gemms", batch_gemms,
          "matmuls sharing an operand, sums of matmuls, and small same-shape matmuls as one GEMM"),
    Stage("fuse_conv_max_pool", fuse_conv_max_pool,
          "conv2d -> max_pool2d as one kernel where the pooling is the convolution's only reader"),
    Stage("fuse_elementwise", fuse_elementwise,
          "chains of elementwise ops of one shape as one blocked pass over memory"),
    Stage("fuse_epilogue", fuse_epilogue,
          "a GEMM or convolution and the elementwise ops on its result as one kernel"),
    Stage("fuse_bias_gradient", fuse_bias_gradient,
          "a weight gradient g^T x and the bias gradient (g's row sum) as one GEMM with a bias-gradient "
          "epilogue, where the device's kernel pays"),
    Stage("fuse_reductions", fuse_reductions,
          "a per-channel sum or mean (BatchNorm's statistics and their gradients) of an elementwise group read "
          "by nothing else as one kernel that computes the group as it reduces, where the device's kernel pays"),
    Stage("fuse_casts", fuse_casts,
          "a mixed-precision step's casts between float16 and float32 done by the fused kernels that load or "
          "store the value, where the device's fused kernels store both types"),
    Stage("optimize_bodies", optimize_bodies,
          "the whole pipeline on every loop and if body"),
    Stage("place_devices", place_devices,
          "a transfer wherever a value crosses from one device to another (layers' device: keys)"),
    Stage("schedule_collectives", schedule_collectives,
          "data-parallel training: each gradient bucket's all-reduce starts after its last gradient "
          "and is waited for before its first update"),
]

# read by whoever builds a plan (``memory_reuse``), not run by the pipeline
PLAN_SWITCHES: list[PlanSwitch] = [
    PlanSwitch("plan_memory",
               "when a plan is built: reuse dead buffers and run kernels in place (off: one buffer per value)"),
]

# A fixpoint is normally reached in two or three rounds; the cap only guards against a rule
# pair that undoes each other.
MAX_CANONICAL_ROUNDS = 8


@dataclass
class PassRecord:
    name: str
    nodes_before: int
    nodes_after: int
    ms: float
    flops_after: object = None        # a Dim: FLOPs of the graph after the pass
    notes: list[str] = field(default_factory=list)
    memory: dict | None = None        # filled by callers that bind shapes (toolkit compile)
    changed: bool = False             # what the pass said: it changed the graph


def pass_names() -> list[str]:
    """Every name ``--disable`` takes: the pipeline's stages in order, then the plan's switches."""
    return [stage.name for stage in PIPELINE] + [switch.name for switch in PLAN_SWITCHES]


def contracts() -> dict[str, str]:
    """What each name of ``pass_names`` does, in that order."""
    return {step.name: step.contract for step in [*PIPELINE, *PLAN_SWITCHES]}


# What --no-optimize switches off: every pass but dead-code elimination (which only removes work
# nothing needs, such as the label input of an infer graph), device placement (without which a
# net placed on several devices cannot run) and the memory planner (buffer reuse changes no value).
ALWAYS_ON = ("eliminate_dead_code", "place_devices", "schedule_collectives", "plan_memory")


def no_optimize() -> tuple[str, ...]:
    return tuple(name for name in pass_names() if name not in ALWAYS_ON)


class UnknownPass(ValueError):
    """A pass name that the pipeline does not have (the message lists the ones it has)."""


def check_pass_names(names) -> None:
    unknown = [n for n in names if n not in pass_names()]
    if unknown:
        raise UnknownPass(f"unknown pass{'es' if len(unknown) > 1 else ''} {', '.join(repr(n) for n in unknown)}; "
                          f"the passes are: {', '.join(pass_names())}")


def run_pipeline(graph: Graph, ctx: PassContext | None = None, records: list[PassRecord] | None = None,
                 observe: Callable[[PassRecord, Graph], None] | None = None) -> Graph:
    """Run every pass of PIPELINE that ``ctx`` does not switch off over ``graph`` (in place; it
    is returned). ``observe(record, graph)`` is called after each pass run (``toolkit compile``
    adds memory figures there)."""
    _run_stages(graph, ctx or PassContext(), records, observe)
    return graph


def _run_stages(graph: Graph, ctx: PassContext, records: list[PassRecord] | None,
                observe: Callable[[PassRecord, Graph], None] | None) -> bool:
    """The pipeline over ``graph``; whether any pass changed it."""
    check_pass_names(ctx.disabled)
    enabled = [s for s in PIPELINE if s.name not in ctx.disabled]
    canonical = [s for s in enabled if s.canonical]
    changed_any = False

    def run(stage: Stage) -> bool:
        nonlocal changed_any
        before = len(graph.nodes)
        notes_before = len(ctx.notes)
        start = time.perf_counter()
        changed = _run_pass(stage, graph, ctx)
        ms = (time.perf_counter() - start) * 1e3
        if ctx.check:
            try:
                verify(graph)
            except VerifyError as e:
                raise VerifyError(f"after pass {stage.name}: {e}") from None
        if records is not None:
            record = PassRecord(stage.name, before, len(graph.nodes), ms, graph_flops(graph),
                                ctx.notes[notes_before:], changed=changed)
            if observe is not None:
                observe(record, graph)
            records.append(record)
        changed_any |= changed
        return changed

    def canonicalize() -> None:
        for _ in range(MAX_CANONICAL_ROUNDS):
            changed = False
            for stage in canonical:
                changed |= run(stage)
            if not changed:
                return

    canonicalize()
    for stage in enabled:
        if not stage.canonical and run(stage):
            canonicalize()
    return changed_any


def _run_pass(stage: Stage, graph: Graph, ctx: PassContext) -> bool:
    """``stage`` over ``graph``; a failure inside it says which pass failed on which graph. A
    user's mistake (a UserError) and a failure already named (a pass inside ``optimize_bodies``)
    pass through as they are, and so does running out of memory."""
    try:
        return stage.run(graph, ctx)
    except (UserError, PassFailed, MemoryError):
        raise
    except Exception as e:
        raise PassFailed(f"pass '{stage.name}' failed on graph '{graph.phase}': {type(e).__name__}: {e}") from e


def memory_reuse(disabled) -> bool:
    """Whether plans reuse buffers: ``plan_memory`` is a pass name, but the planner runs when a
    plan is built (runtime/memory.py), so whoever builds one asks here."""
    return "plan_memory" not in disabled
