"""The data-parallel train step as graph ops, in one process (where every sum over ranks is the
value itself): it computes what the plain train step computes; gradients fall into buckets of
about bucket_mb in the order the backward pass makes them; each bucket's all-reduce starts right
after its last gradient and is waited for right before its first update; `toolkit compile
--ranks` reports the buckets."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from toolkit.compile import optimize, solver_config, train_graph
from toolkit.frontend import Net
from toolkit.ir.binding import bind_symbols
from toolkit.optim.data_parallel import DIST_WEIGHT, DataParallel, bucket_summary
from toolkit.optim.solvers import host_values, initial_state
from toolkit.runtime.plan import Plan, RuntimeState

ROOT = Path(__file__).resolve().parents[2]
COLLECTIVE = ("allreduce_start", "allreduce_wait")


def one_step(net: Net, graph, batch: dict) -> dict[str, np.ndarray]:
    store = {k: np.array(v, order="C") for k, v in net.init_weights(0).items()}
    for name, w in graph.weights.items():
        store.setdefault(name, initial_state(w))
    cfg = solver_config(net)
    feed = {k: v for k, v in batch.items() if k in graph.inputs}
    feed.update(host_values(cfg, 0.05, 1, "float32"))
    if DIST_WEIGHT in graph.inputs:
        feed[DIST_WEIGHT] = np.float32(1.0)
    plan = Plan(graph, bind_symbols(graph, {k: np.shape(v) for k, v in feed.items()}),
                {k: store[k] for k in graph.weights}, "cpu", RuntimeState(np.random.default_rng(0)))
    for _ in range(3):
        outs = plan.run(feed)
    return {**{k: store[k] for k in graph.weights}, "loss": np.asarray(outs["@objective"])}


@pytest.mark.parametrize("net_file", ["zoo/lenet/net.yaml", "zoo/resnet/net.yaml"])
@pytest.mark.parametrize("sync", [False, True])
def test_one_rank_steps_like_the_plain_train_step(net_file, sync):
    net = Net.load(str(ROOT / net_file))
    rng = np.random.default_rng(3)
    batch = {"data": rng.standard_normal((16, 1, 8, 8)).astype(np.float32),
             "label": rng.integers(0, 10, 16).astype(np.int64), "@dist_row_mask": np.ones(16, np.float32)}
    plain = one_step(net, optimize(train_graph(net)), batch)
    graph = optimize(train_graph(net, data_parallel=DataParallel(bucket_mb=0.004, sync_batchnorm=sync)))
    assert len(bucket_summary(graph)) > 1
    parallel = one_step(net, graph, batch)
    assert plain.keys() == parallel.keys()
    for k in plain:
        np.testing.assert_allclose(parallel[k], plain[k], rtol=2e-6, atol=1e-7, err_msg=k)


def test_buckets_fill_in_gradient_order_and_are_placed_around_the_backward_pass():
    net = Net.load(str(ROOT / "zoo/resnet/net.yaml"))
    limit_mb = 0.004
    graph = optimize(train_graph(net, data_parallel=DataParallel(bucket_mb=limit_mb)))
    nodes = graph.nodes
    where = {o.id: i for i, n in enumerate(nodes) for o in n.outputs}
    starts = [i for i, n in enumerate(nodes) if n.op == "allreduce_start"]
    rows = bucket_summary(graph)
    assert [r["bucket"] for r in rows] == list(range(len(rows))) and len(rows) >= 3
    assert all(r["bytes"] >= limit_mb * 2 ** 20 for r in rows[:-1])      # only the last is short
    trainable = [w for w in graph.weights.values() if w.trainable and w.lr_mult]
    assert sum(r["tensors"] for r in rows) == len(trainable)
    assert sum(r["bytes"] for r in rows) == sum(int(np.prod(w.value.shape)) * 4 for w in trainable)
    for i in starts:
        start = nodes[i]
        ready = max(where[v.id] for v in start.inputs)
        # right after its last gradient: only other collectives in between
        assert all(n.op in COLLECTIVE for n in nodes[ready + 1: i]), [n.op for n in nodes[ready + 1: i]]
        wait = next(n for n in nodes if n.op == "allreduce_wait" and n.inputs[0].producer is start)
        j = nodes.index(wait)
        results = {o.id for o in wait.outputs}
        first = next(k for k in range(j + 1, len(nodes)) if any(v.id in results for v in nodes[k].inputs))
        assert all(n.op in COLLECTIVE for n in nodes[j + 1: first])      # right before its first reader
        assert j > i + 1                                                  # work runs in between
    # the buckets start in order, as the backward pass finishes them
    assert starts == sorted(starts) and [nodes[i].attrs["bucket"] for i in starts] == list(range(len(starts)))
    plain = optimize(train_graph(net, data_parallel=DataParallel(bucket_mb=limit_mb, overlap=False)))
    for i, n in enumerate(plain.nodes):
        if n.op == "allreduce_start":
            assert plain.nodes[i + 1].op == "allreduce_wait" and plain.nodes[i + 1].inputs[0].producer is n


def test_compile_reports_the_buckets():
    out = subprocess.run([sys.executable, "-m", "toolkit.cli", "compile", "zoo/lenet/net.yaml", "--phase", "train",
                          "--ranks", "2", "--json"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)["allreduce"]
    # LeNet's 8 parameter tensors, 13,706 float32 values, in one bucket of the default 25 MB
    assert report["ranks"] == 2 and report["buckets"] == 1 and report["bytes"] == 13706 * 4
    bad = subprocess.run([sys.executable, "-m", "toolkit.cli", "compile", "zoo/lenet/net.yaml", "--ranks", "2"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.strip() == ("error: --ranks is for --phase train "
                                                          "(the data-parallel train step)")


def test_no_mpi_import_in_a_single_process():
    code = ("import sys; from toolkit.cli import main; "
            "main(['train', 'zoo/lenet/net.yaml', '--set', 'train.max_iter=2', '--out', sys.argv[1]]); "
            "assert 'mpi4py' not in sys.modules, 'mpi4py imported'; print('ok')")
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run([sys.executable, "-c", code, tmp], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]


def test_a_launcher_without_the_dist_extra_is_an_error_naming_it():
    code = ("import sys; sys.modules['mpi4py'] = None; from toolkit.cli import main; "
            "sys.exit(main(['train', 'zoo/lenet/net.yaml', '--set', 'train.max_iter=2']))")
    env = {"PATH": "/usr/bin:/bin", "PMI_RANK": "0", "PMI_SIZE": "2"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "2 ranks" in out.stderr and "pip install 'yamlnet-toolkit[dist]'" in out.stderr


def test_sync_batchnorm_on_a_non_batch_axis_is_an_error_at_the_layer(tmp_path):
    net_file = tmp_path / "net.yaml"
    net_file.write_text(
        "name: bn_reshaped\n"
        "inputs:\n"
        "  data:  {shape: [8, 4], dtype: float32}\n"
        "  label: {shape: [4], dtype: int64}\n"
        "layers:\n"
        "  - {name: bn1, type: BatchNorm, bottom: data, top: b1}\n"
        "  - {name: r, type: Reshape, bottom: b1, top: r, shape: [4, 8]}\n"
        "  - {name: bn2, type: BatchNorm, bottom: r, top: b2}\n"
        "  - {name: ip, type: InnerProduct, bottom: b2, top: ip, num_output: 3}\n"
        "  - {name: loss, type: SoftmaxWithLoss, bottom: [ip, label], top: loss}\n")
    from toolkit.errors import UserError
    with pytest.raises(UserError) as e:
        train_graph(Net.load(str(net_file)), data_parallel=DataParallel(sync_batchnorm=True))
    assert str(e.value.problems[0]) == (
        f"{net_file}:8:34: error: layer 'bn2' (BatchNorm): sync_batchnorm needs the batch as the first axis of "
        "every BatchNorm input, as the first one has it (8); got [4, 8]")
    train_graph(Net.load(str(net_file)), data_parallel=DataParallel(sync_batchnorm=False))   # per rank: fine

