"""The pipeline: passes by name (each switchable, unknown names an error listing them), the
canonicalising fixpoint, the verifier naming the pass that broke the graph, records for
``--explain``, conv + max-pool fusion, and numbers unchanged by the whole pipeline."""
from __future__ import annotations

import numpy as np
import pytest

from toolkit.compile import add_gradients, forward_graph
from toolkit.errors import UserError
from toolkit.frontend import Net
from toolkit.ir.graph import Graph
from toolkit.ops.interpreter import interpret
from toolkit.ops.verify import VerifyError, verify
from toolkit.optim.solvers import SolverConfig, add_solver
from toolkit.passes import pipeline as pipeline_module
from toolkit.passes.context import PassContext
from toolkit.passes.pipeline import (
    PIPELINE,
    PLAN_SWITCHES,
    PassFailed,
    PassRecord,
    Stage,
    UnknownPass,
    contracts,
    memory_reuse,
    no_optimize,
    pass_names,
    run_pipeline,
)
from toolkit.runtime.plan import Plan

NET = """\
name: convpool
inputs:
  data: {shape: [N, 2, 18, 18]}
layers:
  - {name: conv1, type: Convolution, bottom: data, top: conv1, num_output: 4, kernel_size: 3, pad: 1}
  - {name: pool1, type: Pooling, bottom: conv1, top: pool1, kernel_size: 2, stride: 2}
  - {name: conv2, type: Convolution, bottom: pool1, top: conv2, num_output: 5, kernel_size: 3, bias_term: false}
  - {name: pool2, type: Pooling, bottom: conv2, top: pool2, kernel_size: 3, stride: 2, pad: 1}
  - {name: conv3, type: Convolution, bottom: pool2, top: conv3, num_output: 3, kernel_size: 1}
  - {name: relu3, type: ReLU, bottom: conv3, top: conv3}
  - {name: pool3, type: Pooling, bottom: conv3, top: pool3, kernel_size: 2, stride: 1}
  - {name: side, type: Pooling, bottom: conv1, top: side, pool: ave, kernel_size: 2, stride: 2, phase: test}
  - {name: loss, type: EuclideanLoss, bottom: [pool3, pool3], top: loss, phase: train}
"""


@pytest.fixture
def net(tmp_path) -> Net:
    path = tmp_path / "net.yaml"
    path.write_text(NET)
    return Net.load(str(path))


def ops_of(graph):
    return [n.op for n in graph.nodes]


def conv_pools(graph) -> list[str]:
    """Scopes of conv + max-pool fusions, fused alone or as an epilogue's head."""
    out = [n.scope for n in graph.nodes if n.op == "conv2d_max_pool2d"]
    out += [n.scope.rsplit("+", 1)[0] for n in graph.nodes
            if n.op == "fused_epilogue" and n.attrs["head"] == "conv2d_max_pool2d"]
    return out


def test_fuses_only_where_the_pooling_is_the_sole_unpadded_reader(net):
    graph = forward_graph(net, "infer", disable=("fuse_epilogue",))
    # conv1 -> pool1 fuses; conv2 -> pool2 does not (padded pooling); conv3 -> relu -> pool3 does
    # once simplify has moved the relu after the pooling (max commutes with a monotone activation)
    assert conv_pools(graph) == ["conv1+pool1", "conv3+pool3"]
    ops = ops_of(graph)
    assert ops.count("conv2d") == 1 and ops.count("max_pool2d") == 1 and ops[-1] == "relu"
    fused = next(n for n in graph.nodes if n.op == "conv2d_max_pool2d")
    assert fused.attrs["pool_kernel"] == (2, 2)
    verify(graph)


def test_no_fusion_when_the_convolution_has_another_reader(net):
    graph = forward_graph(net, "test")            # the test phase also average-pools conv1
    assert "conv1+pool1" not in conv_pools(graph)


def test_no_conv_pool_fusion_in_train_graphs(net):
    graph = net.graph("train")
    add_solver(graph, add_gradients(graph), SolverConfig())
    graph = run_pipeline(graph, PassContext(check=True))
    assert conv_pools(graph) == []                 # the pooling gradient reads the conv output


@pytest.mark.parametrize("dtype,tol", [("float32", 1e-5), ("float64", 1e-12)])
@pytest.mark.parametrize("frozen", [False, True], ids=["weights", "frozen"])
def test_numbers_unchanged_by_the_pipeline(net, rng, dtype, tol, frozen):
    before = net.graph("infer", dtype)
    weights = {k: v.astype(dtype) for k, v in net.init_weights(3).items()}
    for k in weights:
        weights[k] += rng.uniform(-0.5, 0.5, weights[k].shape).astype(dtype)
    after = forward_graph(net, "infer", dtype, weights=weights if frozen else None)
    verify(after)
    for n in (1, 3):
        x = rng.standard_normal((n, 2, 18, 18)).astype(dtype)
        expected, _ = interpret(before, {"data": x}, weights)
        got = Plan(after, {"N": n}, {k: weights[k] for k in after.weights}).run({"data": x})
        for name in expected:
            np.testing.assert_allclose(got[name], expected[name], rtol=tol, atol=tol)


def test_passes_switch_off_by_name(net):
    ctx = PassContext(disabled={"fuse_conv_max_pool"})
    graph = run_pipeline(net.graph("infer"), ctx)
    assert conv_pools(graph) == [] and ctx.disabled == frozenset({"fuse_conv_max_pool"})
    assert memory_reuse(ctx.disabled) and not memory_reuse({"plan_memory"})     # the planner's switch
    with pytest.raises(UnknownPass, match="unknown pass 'fuse_everything'; the passes are: eliminate_dead_code"):
        run_pipeline(net.graph("infer"), PassContext(disabled={"fuse_everything"}))
    assert PIPELINE[0].name == "eliminate_dead_code" and pass_names()[-1] == "plan_memory"
    assert len(set(pass_names())) == len(PIPELINE) + len(PLAN_SWITCHES)
    # every stage of the pipeline names its function; the planner's switch is no stage
    assert all(callable(stage.run) for stage in PIPELINE) and "plan_memory" not in [s.name for s in PIPELINE]
    assert list(contracts()) == pass_names()
    assert set(no_optimize()) == set(pass_names()) - {"eliminate_dead_code", "place_devices", "schedule_collectives",
                                                      "plan_memory"}


def test_every_pass_has_a_contract_and_runs_alone(net, rng):
    """Each pass alone (every other one off) keeps the graph valid and its numbers equal."""
    before = net.graph("infer")
    weights = net.init_weights(1)
    x = rng.standard_normal((2, 2, 18, 18)).astype(np.float32)
    expected, _ = interpret(before, {"data": x}, weights)
    for stage in [*PIPELINE, *PLAN_SWITCHES]:
        assert stage.contract and stage.contract[0].islower()
        others = tuple(n for n in pass_names() if n != stage.name)
        graph = run_pipeline(net.graph("infer"), PassContext(disabled=others, check=True))
        got = Plan(graph, {"N": 2}, {k: weights[k] for k in graph.weights}).run({"data": x})
        np.testing.assert_allclose(got["pool3"], expected["pool3"], rtol=1e-5, atol=1e-6, err_msg=stage.name)


def test_records_say_what_each_pass_did(net):
    records: list[PassRecord] = []
    run_pipeline(net.graph("infer"), PassContext(check=True), records=records)
    names = [r.name for r in records]
    assert names[:5] == ["eliminate_dead_code", "fold_constants", "dedup_constants", "simplify", "eliminate_common"]
    fused = next(r for r in records if r.name == "fuse_conv_max_pool")
    assert fused.nodes_after < fused.nodes_before and fused.notes == ["fuse_conv_max_pool: conv1+pool1",
                                                                      "fuse_conv_max_pool: conv3+pool3"]
    assert fused.changed and all(r.changed for r in records if r.nodes_after != r.nodes_before)
    assert all(r.ms >= 0 for r in records)


def test_verifier_names_the_pass_that_broke_the_graph(net, monkeypatch):
    def breaks(graph: Graph, ctx: PassContext) -> bool:
        graph.nodes.reverse()
        return True
    broken = [Stage("eliminate_dead_code", breaks, "breaks the order", canonical=True)]
    monkeypatch.setattr(pipeline_module, "PIPELINE", broken)
    with pytest.raises(VerifyError, match="after pass eliminate_dead_code: .*not defined above"):
        run_pipeline(net.graph("infer"), PassContext(check=True))


def test_a_failing_pass_is_named_and_a_user_error_passes_through(net, monkeypatch):
    """A maintainer's gate: whatever a pass raises comes out naming the pass and the graph, the
    original chained as the cause; a UserError (the user's mistake) comes out as it is."""
    def divides(graph: Graph, ctx: PassContext) -> bool:
        return 1 // len([])
    monkeypatch.setattr(pipeline_module, "PIPELINE", [Stage("fold_constants", divides, "divides by zero")])
    failed = r"^pass 'fold_constants' failed on graph 'infer': ZeroDivisionError: "
    with pytest.raises(PassFailed, match=failed) as info:
        run_pipeline(net.graph("infer"))
    assert isinstance(info.value, RuntimeError) and isinstance(info.value.__cause__, ZeroDivisionError)

    def refuses(graph: Graph, ctx: PassContext) -> bool:
        raise UserError("layer 'conv1': no kernel for this")
    monkeypatch.setattr(pipeline_module, "PIPELINE", [Stage("simplify", refuses, "refuses")])
    with pytest.raises(UserError, match="^error: layer 'conv1': no kernel for this$") as info:
        run_pipeline(net.graph("infer"))
    assert not isinstance(info.value, PassFailed)

    # a failure inside a loop or if body is named once, by the pass that failed there
    inner = PassFailed("pass 'simplify' failed on graph 'body': KeyError: 3")
    def body_fails(graph: Graph, ctx: PassContext) -> bool:
        raise inner
    monkeypatch.setattr(pipeline_module, "PIPELINE", [Stage("optimize_bodies", body_fails, "fails inside")])
    with pytest.raises(PassFailed) as info:
        run_pipeline(net.graph("infer"))
    assert info.value is inner


def test_canonicalisation_reaches_a_fixpoint(net):
    """Running the pipeline again finds nothing more to do."""
    graph = run_pipeline(net.graph("infer"))
    records: list[PassRecord] = []
    run_pipeline(graph, records=records)
    assert all(r.nodes_before == r.nodes_after and not r.notes and not r.changed for r in records)


def test_verifier_names_the_broken_invariant(net):
    graph = net.graph("infer")
    verify(graph)
    graph.nodes[0], graph.nodes[1] = graph.nodes[1], graph.nodes[0]
    with pytest.raises(VerifyError, match="not defined above"):
        verify(graph)
    graph = net.graph("infer")
    graph.nodes[0].attrs = dict(graph.nodes[0].attrs, pad=(0, 0))   # the type no longer follows
    with pytest.raises(VerifyError, match="shape rule gives"):
        verify(graph)
