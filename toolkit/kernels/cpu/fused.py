"""CPU kernels of the fused ops: an elementwise program run block by block, and epilogues.

A program's steps run over one block of the group's shape at a time (about BLOCK_BYTES per
value), so a chain of k ops reads and writes main memory once instead of k times: the block's
intermediates stay in cache. Each step is the same numpy expression the unfused kernel runs, so
fused and unfused results are bit for bit equal. Small groups run as one block, with no indexing.
"""
from __future__ import annotations

import numpy as np

from ...backend.registry import KERNELS, KernelContext, register_kernel
from ...ir.graph import Node
from ...ops.base import get_op
from ...ops.elementwise import ELEMENTWISE_IMPL
from ...ops.fused import head_parts

# Blocking: a group whose values are each at least BLOCKING_MIN_BYTES runs block by block, a
# block being about BLOCK_BYTES per value. Measured on a 2-core EPYC (1 MiB L2 per core, 32 MiB
# L3) with an SGD-momentum update chain (six numpy calls, two outputs): over 1.6 MB values, six
# whole-array calls took 290 us and 128 KiB blocks 360 us (every pass already hits the cache,
# and each block costs one numpy call per step); over 4 MB both took 1.0 ms; over 9 MB, 16 MB
# and 64 MB, 512 KiB blocks took 2.9 / 4.7 / 27 ms against 3.3 / 7.2 / 30 ms unblocked.
BLOCKING_MIN_BYTES = 4 << 20
BLOCK_BYTES = 1 << 19


def _blocks(shape: tuple[int, ...], itemsize: int) -> list[tuple]:
    """Index tuples that cut ``shape`` into row-major blocks of about BLOCK_BYTES (leading axes
    as single indices, one axis in chunks, the rest whole); [()] for one block, everything."""
    total = int(np.prod(shape, dtype=np.int64)) * itemsize
    if total < BLOCKING_MIN_BYTES or not shape:
        return [()]
    inner = itemsize
    axis = len(shape) - 1
    while axis > 0 and inner * shape[axis] <= BLOCK_BYTES:
        inner *= shape[axis]
        axis -= 1
    chunk = max(1, BLOCK_BYTES // inner)
    blocks = []
    for lead in np.ndindex(*shape[:axis]):
        for start in range(0, shape[axis], chunk):
            blocks.append(tuple(lead) + (slice(start, min(start + chunk, shape[axis])),))
    return blocks


def _operand_index(block: tuple, in_shape: tuple[int, ...], out_rank: int) -> tuple:
    """The part of a (possibly broadcasting) operand that meets ``block`` of the output."""
    shift = out_rank - len(in_shape)
    index = []
    for k, sel in enumerate(block):
        j = k - shift
        if j < 0:
            continue
        if in_shape[j] == 1:
            index.append(0 if isinstance(sel, int) else slice(None))
        else:
            index.append(sel)
    return tuple(index)


class ProgramRunner:
    """Runs a fused program over preallocated arrays, as straight-line Python generated once per
    kernel (no per-step dispatch in the hot loop). Outputs are written in their own arrays; other
    steps write scratch, released after their last reader (never to the step reading it, so an
    op that cannot run in place never does)."""

    def __init__(self, program, outputs, in_shapes, out_shape, dtype, head_shape=None, views=(), scratch=None):
        dtype = np.dtype(dtype)
        out_shape = tuple(out_shape)
        in_shapes = [tuple(s) for s in in_shapes]
        view_index = {}
        for i, view in enumerate(views or ()):
            if view:                          # read input i through a slice (a strided view)
                axis, start, stop = view
                index = [slice(None)] * len(in_shapes[i])
                index[axis] = slice(start, stop)
                view_index[i] = tuple(index)
                in_shapes[i] = in_shapes[i][:axis] + (stop - start,) + in_shapes[i][axis + 1:]
        self.blocks = _blocks(out_shape, dtype.itemsize)
        blocked = self.blocks != [()]
        first = self.blocks[0]
        block_shape = ((first[-1].stop - first[-1].start,) + out_shape[len(first):]) if blocked else out_shape
        out_of = {step: k for k, step in enumerate(outputs)}
        last_read: dict[int, int] = {}
        for s, (_op, args, _attrs) in enumerate(program):
            for ref in args:
                if ref[0] == "t":
                    last_read[ref[1]] = s
        used = sorted({r[1] for _op, args, _attrs in program for r in args if r[0] == "x"})
        namespace: dict = {"np": np}
        source = {}
        for i in used:
            if i in view_index:
                namespace[f"v{i}"] = view_index[i]
                source[i] = f"ins[{i}][v{i}]"
            else:
                source[i] = f"ins[{i}]"
        body: list[str] = []
        free: list[str] = []
        names: list[str] = []
        scratch_names: list[str] = []
        for s, (op, args, attrs) in enumerate(program):
            if s in out_of:
                dest = f"o{out_of[s]}"
            elif free:
                dest = free.pop()
            else:
                dest = f"s{s}"
                slot = len(scratch_names)       # scratch slots are numbered in allocation order
                scratch_names.append(dest)
                namespace[dest] = scratch(slot, block_shape, dtype) if scratch else np.empty(block_shape, dtype)
            target = dest
            if blocked and s not in out_of:
                target = f"{dest}[:n]"
            operands = [f"x{r[1]}" if r[0] == "x" else names[r[1]] if r[0] == "t" else "h" for r in args]
            numpy_call = get_op(op).numpy_call
            if numpy_call is not None:      # the unfused kernel's own call, written out: no call of a wrapper
                body.append(numpy_call.format(*operands, out=target))
            else:
                namespace[f"f{s}"] = ELEMENTWISE_IMPL[op]
                kwargs = "".join(f", {k}={v!r}" for k, v in attrs)
                body.append(f"f{s}({', '.join(operands)}, out={target}{kwargs})")
            names.append(target)
            for t, last in last_read.items():
                if last == s and t not in out_of:
                    free.append(names[t].split("[")[0])
        lines = ["def run(ins, outs, h=None):"]
        if not blocked:
            lines += [f"    x{i} = {source[i]}" for i in used]
            lines += [f"    o{k} = outs[{k}]" for k in range(len(outputs))]
            lines += [f"    {line}" for line in body]
        else:
            rank = len(out_shape)
            namespace["blocks"] = [
                (b, b[-1].stop - b[-1].start, [_operand_index(b, tuple(in_shapes[i]), rank) for i in used])
                for b in self.blocks]
            lines.append("    for b, n, idx in blocks:")
            lines += [f"        x{i} = {source[i]}[idx[{j}]]" for j, i in enumerate(used)]
            lines += [f"        o{k} = outs[{k}][b]" for k in range(len(outputs))]
            if head_shape is not None:
                lines.append("        h = h_full[b] if h_full is not None else None")
            lines += [f"        {line}" for line in body]
            if head_shape is not None:
                lines[0] = "def run(ins, outs, h_full=None):"
        code = "\n".join(lines) + "\n"
        exec(compile(code, "<fused program>", "exec"), namespace)
        self.source = code
        self.run = namespace["run"]

    def __call__(self, ins, outs, head=None) -> None:
        self.run(ins, outs, head)


def elementwise_inplace_pairs(node: Node) -> dict[int, tuple[int, ...]]:
    """Output k may overwrite input i (of its own shape: the planner checks) when no step after
    the one producing output k reads input i, and that step, if it reads input i, can run in
    place. Block by block, every read of input i's block then precedes the write over it."""
    program = node.attrs["program"]
    viewed = {i for i, view in enumerate(node.attrs.get("views", ())) if view}
    last_read: dict[int, int] = {}
    for s, (_op, args, _attrs) in enumerate(program):
        for ref in args:
            if ref[0] == "x":
                last_read[ref[1]] = s
    pairs = {}
    for k, s in enumerate(node.attrs["outputs"]):
        op, args, _attrs = program[s]
        reads = {r[1] for r in args if r[0] == "x"}
        pairs[k] = tuple(i for i, last in sorted(last_read.items())
                         if last <= s and i not in viewed and (i not in reads or get_op(op).in_place))
    return pairs


def _scratch(ctx: KernelContext):
    """Scratch borrowed from the plan's runtime (shared by every fused kernel of a share, so the
    temporaries of one kernel reuse the cache lines of the last); fresh arrays without one."""
    if ctx.runtime is None or not hasattr(ctx.runtime, "scratch_array"):
        return None
    return lambda slot, shape, dtype: ctx.runtime.scratch_array((ctx.share, slot), shape, dtype)


@register_kernel("fused_elementwise", "cpu", inplace=elementwise_inplace_pairs)
def fused_elementwise_cpu(ctx: KernelContext):
    runner = ProgramRunner(ctx.attrs["program"], ctx.attrs["outputs"], ctx.in_shapes, ctx.out_shapes[0], ctx.dtype,
                           views=ctx.attrs.get("views", ()), scratch=_scratch(ctx))

    def run(ins, outs):
        runner(ins, outs)
    return run


@register_kernel("fused_epilogue", "cpu")
def fused_epilogue_cpu(ctx: KernelContext):
    """The head's kernel writes the first output's array (or scratch, where the program still
    reads the head after that output is written); the program then runs over it in blocks."""
    head, head_attrs, k = head_parts(ctx.attrs)
    program, outputs = ctx.attrs["program"], ctx.attrs["outputs"]
    group_shape = tuple(ctx.out_shapes[0])
    head_node = Node(head, ctx.node.inputs[:k], head_attrs, ctx.node.scope)
    head_ctx = KernelContext(head_node, head_attrs, ctx.in_shapes[:k], [group_shape], ctx.dtype, ctx.device,
                             ctx.runtime, ctx.xp)
    head_fn = KERNELS.lookup(head, ctx.device, ctx.dtype).factory(head_ctx)
    scratch = _scratch(ctx)
    runner = ProgramRunner(program, outputs, ctx.in_shapes, group_shape, ctx.dtype, head_shape=group_shape,
                           views=ctx.attrs.get("views", ()), scratch=scratch)
    first = outputs[0]
    late_reader = any(("h",) in args for _op, args, _attrs in program[first + 1:])
    unsafe_write = ("h",) in program[first][1] and not get_op(program[first][0]).in_place
    head_buffer = None
    if late_reader or unsafe_write:          # the slot after the program's own temporaries
        head_buffer = scratch(len(program), group_shape, ctx.dtype) if scratch else np.empty(group_shape, ctx.dtype)

    def run(ins, outs):
        target = outs[0] if head_buffer is None else head_buffer
        head_fn(ins[:k], [target])
        runner(ins, outs, target)
    return run
