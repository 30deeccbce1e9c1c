"""The op table against the registries: every op in ``OPS`` has cases (or a stated reason not
to), every differentiable op a gradient case, every gradient helper a parent that emits it, every
op a CPU kernel, the elementwise ops the facts their kernels read, every gradient rule or a stated
reason, every layer a lowering; and each in-place kernel equal to its out-of-place run."""
from __future__ import annotations

import numpy as np
import pytest

from tests.ops.op_cases import CASES, DETERMINISTIC, DTYPES, GRAD_CASES, Case, build_loss_graph, one_node_graph
from toolkit.backend.devices import CPU
from toolkit.backend.registry import KERNELS, KernelContext
from toolkit.ops import OPS
from toolkit.runtime.plan import RuntimeState

# -- coverage and registry self-checks ------------------------------------------------------------
# Ops deliberately absent from the table, with the reason. Empty: every op, grad helpers included,
# has forward cases; helpers are differentiated only through their parent's gradient test.
TABLE_EXCLUSIONS: dict[str, str] = {
    "loop": "its body is a subgraph attribute: tests/ops/test_control_flow.py checks it (numpy, "
            "finite-difference gradients, plans against the interpreter)",
    "if": "its branches are subgraph attributes: tests/ops/test_control_flow.py checks it",
    "allreduce_start": "one half of a pair sharing a pending request: tests/parallel/test_collectives.py "
                       "checks the pair in one process, tests/parallel/test_data_parallel.py under mpiexec",
    "allreduce_wait": "the other half of that pair: tests/parallel/test_collectives.py",
    "send": "one half of a pair sharing a mailbox (a message between ranks): tests/distributed/test_pipeline_stages.py "
            "checks the pair in one process, tests/distributed/test_pipeline_parallel.py under mpiexec",
    "recv": "the other half of that pair: tests/distributed/test_pipeline_stages.py",
    "matmul_bias_gradient": "two outputs (the table's cases have one): tests/runtime/test_capture.py checks "
                            "its CPU kernel and the GPU's against numpy, and the pass that makes it",
    "fused_reduce": "its program is an attribute the table's cases cannot vary: tests/kernels/test_gpu_reductions.py "
                    "checks its CPU kernel and the GPU's against numpy, and the pass that makes it",
    **{op: "int8 quantization (integer inputs, no float32/float64 form): tests/ops/test_quant_ops.py checks its "
            "reference against ONNX Runtime, tests/kernels/test_quant_kernels.py its kernels against the reference"
       for op in ("quantize_linear", "dequantize_linear", "qconv2d", "qgemm")},
    **{op: "int8 quantization (integer inputs, no float32/float64 form): tests/quantization/test_int8_ops.py checks "
            "its kernel against an integer reference and ONNX Runtime's contrib op"
       for op in ("qadd", "qconcat", "qavg_pool2d", "qglobal_avg_pool")},
}

# Ops (not named *_grad, not constants, not random) that legitimately have no gradient rule.
NO_GRAD_RULE = {
    "iota": "it reads no input: positions of the bound sizes, like a constant",
    "all_finite": "a flag on the gradients themselves (mixed precision), never on a loss path",
    "round_precision": "made after the backward pass exists, where a CPU stores float16 as float32",
    "accuracy": "a metric: piecewise constant in the scores, never on a loss path",
    "topk": "ArgMax's op: indices are piecewise constant, and Caffe's ArgMax has no backward either",
    "bessel_correct": "only feeds the running-variance state update, which is never differentiated",
    "conv2d_max_pool2d": "made by an inference-only fusion: in a train graph the pooling gradient also "
                         "reads the convolution's output, so the fusion never fires there",
    "fused_elementwise": "made by a fusion pass after autodiff: the backward pass is already ops",
    "conv2d_blocked": "made by the layout pass, which leaves graphs with a backward pass alone",
    "max_pool2d_blocked": "made by the layout pass, which leaves graphs with a backward pass alone",
    "nhwc_conv2d": "made by the layout pass after autodiff: a train step's gradient ops are rewritten too",
    "nhwc_max_pool2d": "made by the layout pass after autodiff: a train step's gradient ops are rewritten too",
    "nhwc_avg_pool2d": "made by the layout pass after autodiff: a train step's gradient ops are rewritten too",
    "nhwc_conv2d_backward_data": "made by the layout pass after autodiff, from conv2d_grad_input",
    "nhwc_conv2d_backward_filter": "made by the layout pass after autodiff, from conv2d_grad_weight",
    "nhwc_max_pool2d_backward": "made by the layout pass after autodiff, from max_pool2d_grad",
    "nhwc_avg_pool2d_backward": "made by the layout pass after autodiff, from avg_pool2d_grad",
    "fused_epilogue": "made by a fusion pass after autodiff: the backward pass is already ops",
    "matmul_bias_gradient": "made by a fusion pass after autodiff, from gradient ops",
    "fused_reduce": "made by a fusion pass after autodiff: the backward pass is already ops",
    **{op: "int8 quantization is made from a trained graph for inference; rounding has no useful gradient"
       for op in ("quantize_linear", "dequantize_linear", "qconv2d", "qgemm", "qadd", "qconcat", "qavg_pool2d",
                  "qglobal_avg_pool")},
}
CONSTANT_OPS = {"scalar", "constant"}
# gradient helpers: named *_grad or *_grad_<what> (conv2d_grad_input, conv2d_grad_weight)
GRAD_HELPERS = {n for n in OPS if n.endswith("_grad") or "_grad_" in n}
RANDOM_OPS = {name for name, op in OPS.items() if not op.pure}


def test_every_op_in_table():
    in_table = {c.op for c in CASES}
    unknown = in_table - set(OPS)
    assert not unknown, f"table names unknown ops: {sorted(unknown)}"
    missing = set(OPS) - in_table - set(TABLE_EXCLUSIONS)
    assert not missing, f"ops with no case in the table: {sorted(missing)}"
    assert not (set(TABLE_EXCLUSIONS) & in_table), "an excluded op is in the table after all"
    for op in OPS:
        if op in TABLE_EXCLUSIONS:
            continue
        n = sum(c.op == op for c in CASES)
        minimum = 1 if op in CONSTANT_OPS else 2
        assert n >= minimum, f"op {op} has only {n} case(s)"


def test_every_differentiable_op_has_a_gradient_case():
    covered = {c.op for c in GRAD_CASES}
    differentiable = {n for n, op in OPS.items() if op.grad is not None} - RANDOM_OPS
    assert differentiable - covered - set(TABLE_EXCLUSIONS) == set()


def test_grad_helpers_are_emitted_by_their_parents():
    """Every gradient helper op appears in the backward graph of some gradient case (so the helper's forward
    test plus the parent's finite-difference test cover it)."""
    emitted = set()
    for c in GRAD_CASES:
        graph, _, _ = build_loss_graph(c, c.inputs("float64"))
        emitted |= {n.op for n in graph.nodes}
    assert GRAD_HELPERS - emitted == set()


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_op_has_a_cpu_kernel(dtype):
    missing = []
    for op in OPS:
        try:
            entry = KERNELS.lookup(op, "cpu", dtype)
        except LookupError:
            missing.append(op)
            continue
        assert callable(entry.factory)
    assert not missing, f"ops without a CPU kernel for {dtype}: {missing}"


# Elementwise ops without a scalar expression (so without generated C or CUDA code), and why.
NO_SCALAR_EXPR = {
    "cast": "a change of dtype is no step of a program that computes in one dtype",
    "dropout_mask": "random: it draws from the executor's generator, which generated code does not reach",
    "gelu_grad": "none written yet: its kernels and fused programs holding it run numpy",
}


def test_elementwise_ops_state_the_facts_kernels_read():
    """Each elementwise op says whether it may run in place, and the CPU kernel's in-place flag
    is that fact; the ops without a scalar expression are the justified ones."""
    elementwise = {n for n, op in OPS.items() if op.elementwise}
    assert len(elementwise) > 20
    for name in sorted(elementwise):
        op = OPS[name]
        assert isinstance(op.in_place, bool), f"{name} does not say whether it may run in place"
        for dtype in DTYPES:
            assert KERNELS.lookup(name, "cpu", dtype).inplace is op.in_place, name
    for name, op in OPS.items():
        if name not in elementwise:
            assert (op.in_place, op.scalar_expr, op.numpy_call) == (None, None, None), name
    assert {n for n in elementwise if OPS[n].scalar_expr is None} == set(NO_SCALAR_EXPR)


def test_native_elementwise_builders_claim_only_ops_with_a_scalar_expression():
    claimed = {op for op, device in KERNELS.natives if device == "cpu" and op in OPS and OPS[op].elementwise}
    with_expr = {n for n, op in OPS.items() if op.elementwise and op.scalar_expr is not None}
    assert claimed == with_expr


def test_grad_rules():
    lacking = {n for n, op in OPS.items() if op.grad is None and n not in GRAD_HELPERS}
    lacking -= CONSTANT_OPS | RANDOM_OPS
    assert lacking == set(NO_GRAD_RULE), (
        f"ops without a grad rule: {sorted(lacking)}; justified exceptions: {sorted(NO_GRAD_RULE)}")
    # helpers are only ever produced by a gradient rule; none is itself differentiated, except the
    # transposed convolution, which is also Deconvolution's forward (as in Caffe)
    assert {n for n in GRAD_HELPERS if OPS[n].grad is not None} == {"conv2d_grad_input"}


def test_every_layer_has_a_lowering():
    from layers import LAYERS
    assert LAYERS, "the layer catalog is empty"
    for name, ldef in LAYERS.items():
        assert ldef.type == name
        assert callable(ldef.lower), f"layer {name} has no lowering"


# -- in-place kernels ---------------------------------------------------------------------------
def inplace_cases():
    out = []
    for c in DETERMINISTIC:
        if c.op in CONSTANT_OPS:
            continue
        entry = KERNELS.lookup(c.op, "cpu", "float64")
        if not entry.inplace:
            continue
        arrays = c.inputs("float64")
        _, _, y = one_node_graph(c, arrays, c.attrs_for("float64"))
        allowed = entry.inplace_pairs(y.producer).get(0, ())
        if any(a.shape == tuple(y.shape) and str(a.dtype) == y.dtype and i in allowed for i, a in enumerate(arrays)):
            out.append(c)             # some input can be the output's storage
    return out


INPLACE_CASES = inplace_cases()


def test_inplace_kernels_are_covered():
    inplace_ops = {o for (o, d, _), e in KERNELS.entries.items() if d == "cpu" and e.inplace}
    assert inplace_ops, "no in-place kernels registered?"
    assert inplace_ops - {c.op for c in INPLACE_CASES} == set()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", INPLACE_CASES, ids=str)
def test_inplace_kernel_matches_out_of_place(case: Case, dtype):
    arrays = case.inputs(dtype)
    graph, vals, y = one_node_graph(case, arrays, case.attrs_for(dtype))
    node = y.producer
    out_shape = tuple(y.shape)
    entry = KERNELS.lookup(case.op, "cpu", dtype)

    def ctx():
        return KernelContext(node, dict(node.attrs), [a.shape for a in arrays], [out_shape], dtype, CPU,
                             RuntimeState(np.random.default_rng(0)), np)

    fresh = np.empty(out_shape, y.dtype)
    entry.factory(ctx())([a.copy() for a in arrays], [fresh])
    aliased = 0
    for i, a in enumerate(arrays):
        if a.shape != out_shape or str(a.dtype) != y.dtype or i not in entry.inplace_pairs(node).get(0, ()):
            continue
        aliased += 1
        ins = [b.copy() for b in arrays]
        buf = ins[i]
        entry.factory(ctx())(ins, [buf])
        np.testing.assert_array_equal(buf, fresh, err_msg=f"{case.id}: output aliasing input {i}")
    assert aliased
