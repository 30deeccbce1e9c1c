"""The pipeline's cut under each rank's memory, and by measured time (training/stages.py,
stage_costs.py, pipeline_report.py): a stage's predicted memory by hand, the fastest cut that
fits a limit, 1F1B's fewer activations in flight keeping a cut GPipe must move, the one line
when no cut fits, the memory planner's own figures under the limit, the cut by measured time,
and what ``toolkit compile --stages --explain`` says of it."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from toolkit.compile import solver_config
from toolkit.errors import UserError
from toolkit.frontend.net import Net
from toolkit.training.pipeline import build_pipeline, micro_batch_graph, planned_bytes
from toolkit.training.stage_balance import LayerCosts, choose_cut, layer_costs, layer_order, partition

MIB = 2**20
LENET = "zoo/lenet/net.yaml"
ROOT = Path(__file__).resolve().parents[2]


def four_layers(held=(0, 0, 0, 0), grads=(0, 0, 0, 0), work=(0, 0, 0, 0)) -> LayerCosts:
    """Four layers of equal time; one micro-batch's activations that each one's backward pass
    reads: 1 MiB for a and b, 1/8 MiB for c and d."""
    kept = np.diag([1.0, 1.0, 0.125, 0.125]) * MIB
    return LayerCosts(["a", "b", "c", "d"], [1.0] * 4, list(held), list(grads), kept, list(work))


def test_a_stages_predicted_memory_by_hand():
    costs = LayerCosts(["a"], [1.0], [100], [50], np.array([[30.0]]), [7])
    # held 100; the working space twice the largest value, 14. The gradients summed as the
    # backward passes make them (GPipe's stages; one running sum and the gradient being made,
    # never the M = 4 a sum at the step's end holds: 4 x 50 = 200, below). 2 micro-batches in flight: the
    # first backward pass starts with 2 x 30 kept, ends with 1 x 30 and its gradient (110); the
    # second ends with 2 x 30 (the micro-batches left, at most 2) and two gradients (160)
    assert costs.stage_bytes(0, 1, 2, 4) == 100 + 160 + 14
    # in flight 4 (GPipe): 4 x 30 = 120; 3 x 30 + 50 = 140; 2 x 30 + 2 x 50 = 160
    assert costs.stage_bytes(0, 1, 4, 4) == 100 + 160 + 14
    heavy = LayerCosts(["a"], [1.0], [100], [10], np.array([[30.0]]), [7])
    assert heavy.stage_bytes(0, 1, 2, 4) == 100 + (2 * 30 + 2 * 10) + 14
    # one micro-batch: its activations, then its gradient alone (there is no sum)
    assert costs.stage_bytes(0, 1, 1, 1) == 100 + 50 + 14
    # summed after the last backward pass (1F1B's stages): 2 in flight of 4, 2 x 30 kept + 2 x
    # 50 gradients done = 160, or all 4 gradients = 200, the more
    assert costs.stage_bytes(0, 1, 2, 4, running=False) == 100 + 200 + 14
    assert heavy.stage_bytes(0, 1, 2, 4, running=False) == 100 + (2 * 30 + 2 * 10) + 14


def test_a_value_read_by_backward_passes_of_several_layers_is_kept_by_each_stage_holding_one():
    kept = np.zeros((3, 3))
    kept[0, 2] = 8.0             # read by the backward passes of layers 0 and 2
    kept[1, 1] = 1.0
    costs = LayerCosts(["a", "b", "c"], [1.0] * 3, [0] * 3, [0] * 3, kept, [0] * 3)
    assert [costs.kept_bytes(s, e) for s, e in [(0, 1), (1, 2), (2, 3), (0, 3), (1, 3)]] == [8, 9, 8, 9, 9]


def test_the_limit_moves_the_cut_to_the_fastest_that_fits():
    costs = four_layers()
    # no limit: a, b | c, d (2 and 2 of time); GPipe holds 4 micro-batches: stage 0 keeps
    # 4 x 2 MiB = 8 MiB, stage 1 4 x 1/4 MiB = 1 MiB
    starts, free = choose_cut(costs, 2, 4, "gpipe", None)
    assert starts == free == [0, 2]
    # under 6 MiB: a | b, c, d (times 1 and 3) holds 4 and 4 x 1.25 = 5 MiB; a, b, c | d
    # would hold 8.5 MiB
    starts, free = choose_cut(costs, 2, 4, "gpipe", 6 * MIB)
    assert starts == [0, 1] and free == [0, 2]
    assert [costs.stage_bytes(0, 1, 4, 4), costs.stage_bytes(1, 4, 4, 4)] == [4 * MIB, 5 * MIB]


def test_1f1b_keeps_the_cut_that_gpipe_must_move_under_the_same_limit():
    costs = four_layers()
    # 1F1B: stage 0 holds 2 micro-batches (2 x 2 = 4 MiB), stage 1 one (1/4 MiB): a, b | c, d fits
    assert choose_cut(costs, 2, 4, "1f1b", 6 * MIB) == ([0, 2], [0, 2])
    assert choose_cut(costs, 2, 4, "gpipe", 6 * MIB)[0] == [0, 1]


def test_no_cut_that_fits_is_one_line_with_the_smallest_peak():
    costs = four_layers()
    # the cuts' largest stages: a | b, c, d 5 MiB; a, b | c, d 8; a, b, c | d 8.5
    with pytest.raises(UserError) as e:
        choose_cut(costs, 2, 4, "gpipe", 3 * MIB)
    assert str(e.value) == ("error: no cut of the train step into 2 stages fits train.distributed.stage_memory_mb "
                            "(3.000 MiB a rank): the smallest peak any cut achieves is 5.000 MiB")


WIDE = """
name: wide
inputs:
  data:  {shape: [N, 256], dtype: float32}
  label: {shape: [N], dtype: int64}
layers:
  - {name: ip1, type: InnerProduct, bottom: data, top: ip1, num_output: 256}
  - {name: relu1, type: ReLU, bottom: ip1, top: relu1}
  - {name: ip2, type: InnerProduct, bottom: relu1, top: ip2, num_output: 256}
  - {name: relu2, type: ReLU, bottom: ip2, top: relu2}
  - {name: ip3, type: InnerProduct, bottom: relu2, top: ip3, num_output: 10}
  - {name: loss, type: SoftmaxWithLoss, bottom: [ip3, label], top: loss}
"""


def test_the_layers_costs_of_a_net_by_hand(tmp_path):
    path = tmp_path / "wide.yaml"
    path.write_text(WIDE)
    net = Net.load(str(path))
    step, _, micro_of = micro_batch_graph(net, solver_config(net), 2)
    order = layer_order(step, [layer.name for layer in net.spec.layers])
    rows = 16
    costs = layer_costs(step, order, {"N": rows}, micro_of)
    ip = (256 * 256 + 256) * 4
    assert costs.held == costs.grads == [ip, 0, ip, 0, (256 * 10 + 10) * 4, 0]
    value = rows * 256 * 4
    # what the backward passes read of one micro-batch: the data (ip1's weight gradient), relu1's
    # and relu2's outputs (their own gradients and the next product's), the log-softmax and the
    # labels (the loss's gradient)
    assert costs.kept_bytes(0, 1) == value
    assert costs.kept_bytes(0, 4) == 3 * value
    assert costs.kept_bytes(4, 6) == value + rows * 10 * 4 + rows * 8
    assert costs.work == [value, value, value, value, rows * 40, rows * 40]


def lenet():
    net = Net.load(LENET)
    return net, solver_config(net)


@pytest.mark.parametrize("schedule, limit_mib", [("gpipe", 0.28), ("1f1b", 0.3)])
def test_the_memory_planners_figures_of_the_cut_are_under_the_limit(schedule, limit_mib):
    """LeNet in 2 stages of 4 micro-batches of 8 rows: the FLOPs' cut after pool1 leaves stage 1
    (the products' weights, their gradients, the activations in flight) over the limit as the
    memory planner plans it (0.294 MiB with GPipe, whose stages sum the gradients as they come;
    0.338 with 1F1B, whose 4 micro-batches' gradients wait for the last backward pass); under
    that limit the cut moves after conv2 and both stages fit."""
    net, cfg = lenet()
    limit = int(limit_mib * MIB)
    free = build_pipeline(net, cfg, 2, 4, 8, schedule=schedule)
    assert free.stages.layers[0][-1] == "pool1"
    assert max(planned_bytes(net, cfg, free.stages, 4, 8, None, schedule, None)) > limit
    p = build_pipeline(net, cfg, 2, 4, 8, schedule=schedule, memory_limit=limit)
    assert p.stages.layers[0] == ["conv1", "relu1", "pool1", "conv2"]
    assert max(planned_bytes(net, cfg, p.stages, 4, 8, None, schedule, None)) <= limit
    assert p.stages.unlimited == free.stages.layers


def test_gpipe_finds_no_cut_under_a_limit_that_1f1b_fits():
    net, cfg = lenet()
    limit = int(0.26 * MIB)
    p = build_pipeline(net, cfg, 2, 4, 8, schedule="1f1b", memory_limit=limit)
    assert p.stages.layers[0][-1] == "conv2"
    assert max(planned_bytes(net, cfg, p.stages, 4, 8, None, "1f1b", None)) <= limit
    with pytest.raises(UserError, match=r"^error: no cut of the train step into 2 stages fits "
                                        r"train.distributed.stage_memory_mb \(0.260 MiB a rank\): the smallest "
                                        r"peak any cut achieves is 0.2\d\d MiB$"):
        build_pipeline(net, cfg, 2, 4, 8, schedule="gpipe", memory_limit=limit)


def test_the_cut_balances_the_measured_time_where_given():
    """The same graph cut by FLOPs (after pool1) and by times that make the loss the slowest
    layer: its stage holds it alone."""
    net, cfg = lenet()
    step, _, micro_of = micro_batch_graph(net, cfg, 2)
    layers = [layer.name for layer in net.spec.layers]
    by_flops = partition(step, layers, 2, {"N": 8}, micro_of, 2)
    assert by_flops.layers[0][-1] == "pool1" and by_flops.by == "FLOPs"
    seconds = dict.fromkeys(layers, 1e-4) | {"loss": 5e-3}
    by_time = partition(step, layers, 2, {"N": 8}, micro_of, 2, time=seconds, by="measured time")
    assert by_time.layers[1] == ["loss"] and by_time.by == "measured time"
    assert by_time.time == pytest.approx([9e-4, 5e-3])


def compile_stages(*sets: str, as_json: bool = True) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "toolkit.cli", "compile", LENET, "--phase", "train", "--stages", "2",
               "--batch", "32", "--set", "train.distributed.micro_batches=4"]
    for s in sets:
        command += ["--set", s]
    return subprocess.run(command + (["--json"] if as_json else ["--explain"]), cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def test_compile_explains_where_the_limit_moved_the_cut():
    sets = ("train.distributed.balance=flops", "train.distributed.stage_memory_mb=0.28")
    proc = compile_stages(*sets)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["balanced_by"] == "FLOPs" and report["memory_limit_bytes"] == int(0.28 * MIB)
    moved = report["limit_moved"]
    assert moved["from"] == ["pool1"] and moved["to"] == ["conv2"] and moved["stage"] == 1
    assert moved["would_peak_bytes"] > 0.28 * MIB
    assert report["gradient_sums"] == "running"       # the limit binds: GPipe sums as it goes
    for stage in report["per_stage"]:
        assert stage["rank_bytes"] == stage["weight_bytes"] + stage["slot_bytes"] + stage["peak_bytes"]
        assert stage["rank_bytes"] <= 0.28 * MIB
    text = compile_stages(*sets, as_json=False)
    lines = text.stdout.splitlines()
    assert lines[0].endswith("balanced by FLOPs, each rank's memory under 0.280 MiB")
    said = [line for line in lines if line.startswith("the memory limit moved the cut")]
    assert said == [f"the memory limit moved the cut from after pool1 to after conv2: without it stage 1 would "
                    f"peak at {moved['would_peak_bytes'] / MIB:.3f} MiB"]
    assert any(line.startswith("each weight's gradients summed as the backward passes make them") for line in lines)


def test_compile_balances_by_measured_time_by_default_and_refuses_a_limit_no_cut_fits():
    proc = compile_stages()
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["balanced_by"] == "measured time" and report["limit_moved"] is None
    assert report["gradient_sums"] == "after the backward passes"
    assert sum(s["time_share"] for s in report["per_stage"]) == pytest.approx(1, abs=1e-3)
    proc = compile_stages("train.distributed.balance=flops", "train.distributed.stage_memory_mb=0.1")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().startswith("error: no cut of the train step into 2 stages fits "
                                          "train.distributed.stage_memory_mb (0.100 MiB a rank): the smallest "
                                          "peak any cut achieves is ")
    assert len(proc.stderr.strip().splitlines()) == 1


def test_a_memory_limited_pipeline_under_mpiexec_trains_as_one_process(tmp_path):
    """LeNet's 2 stages under 0.28 MiB a rank (the cut after conv2, not pool1) give the weights
    and losses of one process at the same batch over 30 steps."""
    from mpi_helpers import HAVE_MPI
    if not HAVE_MPI:
        pytest.skip("the dist extra (mpi4py and an MPI wheel) is not installed")
    from test_data_parallel import assert_same_training, train
    sets = ("train.max_iter=30",)
    train(tmp_path / "one", LENET, 32, 1, *sets)
    proc = train(tmp_path / "many", LENET, 32, 2, *sets, "train.distributed.stages=2",
                 "train.distributed.micro_batches=4", "train.distributed.balance=flops",
                 "train.distributed.stage_memory_mb=0.28")
    assert "balanced by FLOPs under 0.280 MiB a rank: stage 0: conv1..conv2 (4 layers" in proc.stderr
    assert_same_training(tmp_path / "one", tmp_path / "many")
