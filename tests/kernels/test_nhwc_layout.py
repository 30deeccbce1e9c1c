"""The channels-last layout on a GPU (passes/layout_nhwc.py, ops/nhwc.py, kernels/gpu/nhwc.py).

Unmarked tests run on the numpy stand-in for CuPy with the host build of cuDNN's entry points
(tests/runtime/fake_cudnn.c, which reads NHWC strides and the KRSC filter): the channels-last
ops' GPU kernels equal the CPU's on the op table's cases, through cuDNN; a ResNet block
(conv-BN-ReLU-conv-BN-add-ReLU-pool) in float16 compiles for the GPU to channels-last
convolutions with one reorder in and one out, equal to the same graph without the pass and to
the CPU's float32; a float16 train step runs its convolutions of every direction channels last
and takes the NCHW step's losses; what the rule keeps NCHW (float32, a lone convolution, cuDNN
switched off) stays NCHW. The ``gpu`` tests run the block, ResNet-50 and the train step on a
device."""
from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest

from tests.runtime.gpu_stand_in import CXX, RAW_MODULE, STAND_IN, run_stand_in
from toolkit.backend.devices import gpu_available

needs_cxx = pytest.mark.skipif(CXX is None, reason="emulating CUDA kernels needs a C++ compiler (g++ or c++)")

NHWC_OPS = ("to_nhwc", "from_nhwc", "nhwc_conv2d", "nhwc_max_pool2d", "nhwc_avg_pool2d", "nhwc_conv2d_backward_data",
            "nhwc_conv2d_backward_filter", "nhwc_max_pool2d_backward", "nhwc_avg_pool2d_backward")

BLOCK = textwrap.dedent("""\
    name: block
    inputs:
      data: {shape: [N, 16, 8, 8], dtype: float32}
    layers:
      - {name: conv1, type: Convolution, bottom: data, top: conv1, num_output: 16, kernel_size: 3, pad: 1,
         bias_term: false}
      - {name: bn1, type: BatchNorm, bottom: conv1, top: conv1}
      - {name: relu1, type: ReLU, bottom: conv1, top: conv1}
      - {name: conv2, type: Convolution, bottom: conv1, top: conv2, num_output: 16, kernel_size: 3, pad: 1,
         bias_term: false}
      - {name: bn2, type: BatchNorm, bottom: conv2, top: conv2}
      - {name: add, type: Eltwise, bottom: [data, conv2], top: add}
      - {name: relu2, type: ReLU, bottom: add, top: add}
      - {name: pool, type: Pooling, bottom: add, top: pool, pool: max, kernel_size: 3, stride: 2, pad: 1}
    outputs: [pool]
""")

# one conv between two ops that cannot follow the layout: its reorders cost what it saves
LONE = textwrap.dedent("""\
    name: lone
    inputs:
      data: {shape: [N, 8, 6, 6], dtype: float32}
    layers:
      - {name: soft_in, type: Softmax, bottom: data, top: soft_in}
      - {name: conv, type: Convolution, bottom: soft_in, top: conv, num_output: 8, kernel_size: 3, pad: 1}
      - {name: soft_out, type: Softmax, bottom: conv, top: soft_out}
    outputs: [soft_out]
""")

# (how, the net, batch, dtype, disable, train) -> the graph's ops, its layout notes, its outputs
PLANS_SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    from toolkit.backend.registry import load_device
    from toolkit.benchmarking import bench_plan
    from toolkit.compile import optimize
    from toolkit.frontend import Net
    load_device("gpu")
    from toolkit.kernels.gpu import nhwc
    report = []
    for path, device, dtype, disable, train in json.loads(sys.argv[1]):
        net = Net.load(path)
        plan, inputs = bench_plan(net, 2, train, dtype=dtype, disable=tuple(disable), device=device)
        outs = {k: np.array(v, dtype=np.float64).tolist() for k, v in plan.run(inputs).items()} if not train else {}
        ops = [n.attrs["head"] if n.op == "fused_epilogue" else n.op for n in plan.graph.nodes]
        notes = []
        if not train:
            optimize(net.graph("infer", dtype), tuple(disable), net.init_weights(seed=0, dtype=dtype), device,
                     check=True, notes=notes)
        report.append({"ops": ops, "notes": [n for n in notes if n.startswith("choose_layout")], "outs": outs})
    report.append(sorted(f"{how}: {why}" for (how, why), _n in nhwc.CHOSEN.items()))
    print(json.dumps(report))
""")


def _plans(tmp_path, runs, **env) -> tuple[list[dict], list[str]]:
    result = run_stand_in(STAND_IN + RAW_MODULE + PLANS_SCRIPT, tmp_path, json.dumps(runs), env_extra=env)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    return report[:-1], report[-1]


def _net(tmp_path, text: str, name: str) -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return str(path)


@needs_cxx
def test_a_resnet_block_in_float16_runs_channels_last_with_one_reorder_each_way(tmp_path):
    block = _net(tmp_path, BLOCK, "block")
    (cpu, nchw, nhwc), chosen = _plans(tmp_path, [[block, "cpu", None, [], False],
                                                  [block, "gpu", "float16", ["choose_layout"], False],
                                                  [block, "gpu", "float16", [], False]])
    assert "nhwc_conv2d" not in nchw["ops"] and nchw["ops"].count("conv2d") == 2, nchw["ops"]
    assert nhwc["ops"].count("nhwc_conv2d") == 2 and "conv2d" not in nhwc["ops"], nhwc["ops"]
    assert nhwc["ops"].count("to_nhwc") == 1 and nhwc["ops"].count("from_nhwc") == 1, nhwc["ops"]
    assert "nhwc_max_pool2d" in nhwc["ops"] and "max_pool2d" not in nhwc["ops"], nhwc["ops"]
    assert nhwc["notes"] == ["choose_layout: 2 of 2 convolutions channels last (NHWC) on the GPU, 4 op(s) follow "
                             "the layout; reorders: 1 to NHWC, 1 back to NCHW"], nhwc["notes"]
    assert nchw["notes"] == []
    assert chosen == ["cudnn: "], chosen
    want = np.array(cpu["outs"]["pool"])
    got, plain = np.array(nhwc["outs"]["pool"]), np.array(nchw["outs"]["pool"])
    assert want.shape == got.shape == (2, 16, 4, 4)
    scale = float(np.abs(want).max())
    np.testing.assert_allclose(got, plain, rtol=0, atol=1e-3 * scale)         # both float16 through cuDNN
    np.testing.assert_allclose(got, want, rtol=0, atol=4e-3 * scale)          # float16 against float32


@needs_cxx
def test_what_the_rule_keeps_nchw_stays_nchw(tmp_path):
    from tests.runtime.gpu_stand_in import ROOT
    block, lone = _net(tmp_path, BLOCK, "block"), _net(tmp_path, LONE, "lone")
    (fp32, single, train), _chosen = _plans(tmp_path, [[block, "gpu", "float32", [], False],
                                                       [lone, "gpu", "float16", [], False],
                                                       [str(ROOT / "zoo" / "resnet" / "net.yaml"), "gpu", "float32",
                                                        [], True]])
    for report in (fp32, single, train):
        assert not set(NHWC_OPS) & set(report["ops"]), report["ops"]
        assert report["notes"] == [], report["notes"]
    (off,), chosen = _plans(tmp_path, [[block, "gpu", "float16", [], False]], TOOLKIT_CUDNN="0")
    assert not set(NHWC_OPS) & set(off["ops"]) and chosen == [], (off["ops"], chosen)


@needs_cxx
def test_inception_and_the_small_resnet_in_float16_equal_their_nchw_plans(tmp_path):
    """A concatenation along channels, a max pooling of the block's input and global average
    pooling follow the layout: one reorder in, none out (the pooled [N, C, 1, 1] is a reshape)."""
    from tests.runtime.gpu_stand_in import ROOT
    for path in (ROOT / "benchmarks" / "nets" / "inception.yaml", ROOT / "zoo" / "resnet" / "net.yaml"):
        (nchw, nhwc), _chosen = _plans(tmp_path, [[str(path), "gpu", "float16", ["choose_layout"], False],
                                                  [str(path), "gpu", "float16", [], False]])
        assert nhwc["ops"].count("from_nhwc") == 0 and nhwc["ops"].count("to_nhwc") <= 1, (path, nhwc["ops"])
        assert "conv2d" not in nhwc["ops"], nhwc["ops"]
        for k, want in nchw["outs"].items():
            np.testing.assert_allclose(nhwc["outs"][k], want, rtol=0, atol=1e-3, err_msg=str(path))


TRAIN_SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    from toolkit.backend.registry import load_device
    from toolkit.benchmarking import bench_plan
    from toolkit.frontend import Net
    from toolkit import settings
    load_device("gpu")
    net = Net.load(sys.argv[1])
    # a train step in float16 (mixed precision), or in float32 under the float32 policy argv[4]
    dtype = None if len(sys.argv) > 3 and sys.argv[3] == "float32" else "float16"
    precision = sys.argv[4] if len(sys.argv) > 4 else None
    report = {}
    for label, disable in (("nchw", ("choose_layout",)), ("nhwc", ())):
        with settings.use(precision=precision):
            plan, inputs = bench_plan(net, int(sys.argv[2]), True, dtype=dtype, disable=disable, device="gpu")
        ops = [n.attrs["head"] if n.op == "fused_epilogue" else n.op for n in plan.graph.nodes]
        losses = []
        for _ in range(3):
            loss = plan.run(inputs)["loss"]
            losses.append(float(np.asarray(loss.get() if hasattr(loss, "get") else loss, dtype=np.float64)))
        report[label] = {"ops": {op: ops.count(op) for op in set(ops)}, "losses": losses}
    print(json.dumps(report))
""")


def train_report(run, net_path, batch: int, dtype: str = "float16", precision: str = "strict") -> dict:
    """The ops and the first three losses of a train step (float16: mixed precision), NCHW and
    channels last; ``run(script, *args)`` runs the script on the stand-in or on the device."""
    return json.loads(run(TRAIN_SCRIPT, net_path, batch, dtype, precision).strip().splitlines()[-1])


def check_train_report(report: dict, rtol: float, reorders_in: int = 0) -> None:
    """Every convolution direction channels last; ``reorders_in`` to NHWC (the small ResNet's
    1-channel image is a reshape) and none back (global pooling's [N, C, 1, 1] is a reshape)."""
    nchw, nhwc = report["nchw"]["ops"], report["nhwc"]["ops"]
    for op, channels_last in (("conv2d", "nhwc_conv2d"), ("conv2d_grad_input", "nhwc_conv2d_backward_data"),
                              ("conv2d_grad_weight", "nhwc_conv2d_backward_filter")):
        assert nhwc.get(channels_last) == nchw[op] and op not in nhwc, (op, nchw, nhwc)
    assert nhwc.get("to_nhwc", 0) == reorders_in and nhwc.get("from_nhwc", 0) == 0, nhwc
    np.testing.assert_allclose(report["nhwc"]["losses"], report["nchw"]["losses"], rtol=rtol)


@needs_cxx
def test_a_float16_train_step_runs_every_convolution_channels_last_with_the_nchw_losses(tmp_path):
    """The small ResNet's mixed-precision step: forward, input-gradient and weight-gradient
    convolutions through cuDNN channels last, BatchNorm's training statistics and their
    gradients, pooling and the residual sums following; three steps' losses equal the NCHW
    step's (float16 activations summed in another order: 1e-3)."""
    from tests.runtime.gpu_stand_in import ROOT

    def on_stand_in(script, *args):
        result = run_stand_in(STAND_IN + RAW_MODULE + script, tmp_path, *args)
        assert result.returncode == 0, result.stderr[-3000:]
        return result.stdout
    report = train_report(on_stand_in, ROOT / "zoo" / "resnet" / "net.yaml", 4)
    check_train_report(report, rtol=1e-3)
    assert report["nhwc"]["ops"]["nhwc_conv2d_backward_filter"] == 6, report["nhwc"]["ops"]
    # Inception's module: its concatenation's gradient (slices of channels) follows the layout too
    report = train_report(on_stand_in, ROOT / "benchmarks" / "nets" / "inception.yaml", 1)
    check_train_report(report, rtol=1e-3, reorders_in=1)


@needs_cxx
def test_a_float32_train_step_goes_channels_last_under_tf32_only(tmp_path):
    """float32 under the tf32 policy: every convolution direction channels last, the losses the
    NCHW step's (the stand-in's cuDNN computes in float32 either way; BatchNorm's sums are taken
    in another order channels last, 3e-5 apart by the third step); under strict, NCHW."""
    from tests.runtime.gpu_stand_in import ROOT

    def on_stand_in(script, *args):
        result = run_stand_in(STAND_IN + RAW_MODULE + script, tmp_path, *args)
        assert result.returncode == 0, result.stderr[-3000:]
        return result.stdout
    net = ROOT / "zoo" / "resnet" / "net.yaml"
    check_train_report(train_report(on_stand_in, net, 4, "float32", "tf32"), rtol=1e-4)
    strict = train_report(on_stand_in, net, 4, "float32", "strict")
    assert "nhwc_conv2d" not in strict["nhwc"]["ops"] and strict["nhwc"]["ops"] == strict["nchw"]["ops"], strict


NETS_SCRIPT = textwrap.dedent("""
    import json, sys
    from toolkit.backend.registry import load_device
    from toolkit.compile import optimize
    from toolkit.frontend import Net
    load_device("gpu")
    net = Net.load(sys.argv[1])
    notes = []
    graph = optimize(net.graph("infer", "float16"), (), net.init_weights(seed=0, dtype="float16"), "gpu", notes=notes)
    ops = [n.attrs["head"] if n.op == "fused_epilogue" else n.op for n in graph.nodes]
    counts = {op: ops.count(op) for op in ("conv2d", "nhwc_conv2d", "to_nhwc", "from_nhwc")}
    # two reorders never meet: neither reads the other's result
    counts["meeting"] = sum(n.op in ("to_nhwc", "from_nhwc") and n.inputs[0].producer is not None
                            and n.inputs[0].producer.op in ("to_nhwc", "from_nhwc") for n in graph.nodes)
    print(json.dumps(counts))
""")


@needs_cxx
@pytest.mark.parametrize("name, convolutions, back", [("resnet50", 53, 0), ("mobilenet_v2", 53, 0),
                                                      ("inception", 6, 0), ("vgg16", 13, 1)])
def test_the_real_nets_in_float16_compile_channels_last_with_one_reorder_in(tmp_path, name, convolutions, back):
    """Every convolution of the benchmark nets channels last, the image reordered once; none
    back where global pooling ends the body (a reshape), one where VGG's classifier flattens."""
    from tests.runtime.gpu_stand_in import ROOT
    result = run_stand_in(STAND_IN + NETS_SCRIPT, tmp_path, ROOT / "benchmarks" / "nets" / f"{name}.yaml")
    assert result.returncode == 0, result.stderr[-3000:]
    counts = json.loads(result.stdout.strip().splitlines()[-1])
    assert counts == {"conv2d": 0, "nhwc_conv2d": convolutions, "to_nhwc": 1, "from_nhwc": back, "meeting": 0}, counts


CASES_SCRIPT = textwrap.dedent("""
    import sys
    from tests.runtime.gpu_stand_in import compare_case
    from tests.ops.op_cases import CASES, feeds, one_node_graph
    from toolkit.backend.registry import load_device
    load_device("gpu")
    from toolkit.kernels.gpu import nhwc
    ran = 0
    for dtype in ("float32", "float16"):
        for case in CASES:
            if case.op in sys.argv[1].split(","):
                compare_case(case, dtype, feeds, one_node_graph)
                ran += 1
    print(ran, sorted(how for how, _why in nhwc.CHOSEN))
""")


@needs_cxx
def test_the_channels_last_kernels_on_the_gpu_equal_the_cpu_kernels(tmp_path):
    result = run_stand_in(STAND_IN + RAW_MODULE + CASES_SCRIPT, tmp_path, ",".join(NHWC_OPS))
    assert result.returncode == 0, result.stderr[-3000:]
    ran, how = result.stdout.strip().splitlines()[-1].split(" ", 1)
    assert int(ran) == 2 * 35 and set(eval(how)) == {"cudnn"}, result.stdout


def test_the_cpu_kernels_of_the_channels_last_ops_equal_their_references(rng):
    """The numpy kernels (the im2col fallback of the GPU's convolution among them) against
    ops/nhwc.py's references, which go through the NCHW ones."""
    from tests.ops.op_cases import CASES, feeds, one_node_graph
    from toolkit.runtime.plan import Plan, RuntimeState
    for case in [c for c in CASES if c.op in NHWC_OPS]:
        arrays = case.inputs("float32")
        graph, _vals, y = one_node_graph(case, arrays, case.attrs_for("float32"))
        graph.outputs["y"] = y
        got = Plan(graph, {}, {}, "cpu", RuntimeState(rng), native=False).run(feeds(arrays))["y"]
        want = case.ref(*[a.astype(np.float64) for a in arrays])
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=case.id)


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU with cupy (run on a GPU machine)")
def test_a_resnet_block_channels_last_on_the_device(tmp_path):
    """The block at batch 8 in float16 on the device: channels last (one reorder each way, the
    convolutions on cuDNN's NHWC kernels) equals NCHW within 1e-2 of the output's scale."""
    from toolkit.backend.registry import load_device
    from toolkit.benchmarking import bench_plan
    from toolkit.frontend import Net
    load_device("gpu")
    from toolkit.kernels.gpu import dnn, nhwc
    if dnn.unavailable():
        pytest.skip(dnn.unavailable())
    net = Net.load(_net(tmp_path, BLOCK.replace("[N, 16, 8, 8]", "[N, 64, 56, 56]").replace(
        "num_output: 16", "num_output: 64"), "block"))
    nhwc.CHOSEN.clear()
    outs, ops = {}, {}
    for label, disable in (("nchw", ("choose_layout",)), ("nhwc", ())):
        plan, inputs = bench_plan(net, 8, False, dtype="float16", disable=disable, device="gpu")
        out = plan.run(inputs)["pool"]
        outs[label] = np.asarray(out.get() if hasattr(out, "get") else out, dtype=np.float32)
        ops[label] = [n.attrs["head"] if n.op == "fused_epilogue" else n.op for n in plan.graph.nodes]
    assert ops["nhwc"].count("nhwc_conv2d") == 2 and ops["nhwc"].count("to_nhwc") == 1, ops["nhwc"]
    assert ops["nhwc"].count("from_nhwc") == 1 and "nhwc_conv2d" not in ops["nchw"], ops
    assert set(how for how, _why in nhwc.CHOSEN) == {"cudnn"}, nhwc.CHOSEN
    scale = float(np.abs(outs["nchw"]).max())
    assert np.isfinite(outs["nhwc"]).all() and scale > 0
    np.testing.assert_allclose(outs["nhwc"], outs["nchw"], rtol=0, atol=1e-2 * scale)


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU with cupy (run on a GPU machine)")
def test_resnet50_in_float16_channels_last_on_the_device():
    """ResNet-50's infer graph at batch 4 in float16: every convolution channels last on cuDNN,
    one reorder in (the image) and none out (global pooling's [N, C, 1, 1] is a reshape), the
    class probabilities equal the NCHW plan's within 1e-2."""
    from tests.runtime.gpu_stand_in import ROOT
    from toolkit.backend.registry import load_device
    from toolkit.benchmarking import bench_plan
    from toolkit.frontend import Net
    load_device("gpu")
    from toolkit.kernels.gpu import dnn, nhwc
    if dnn.unavailable():
        pytest.skip(dnn.unavailable())
    net = Net.load(str(ROOT / "benchmarks" / "nets" / "resnet50.yaml"))
    nhwc.CHOSEN.clear()
    outs, ops = {}, {}
    for label, disable in (("nchw", ("choose_layout",)), ("nhwc", ())):
        plan, inputs = bench_plan(net, 4, False, dtype="float16", disable=disable, device="gpu")
        out = next(iter(plan.run(inputs).values()))
        outs[label] = np.asarray(out.get() if hasattr(out, "get") else out, dtype=np.float32)
        ops[label] = [n.attrs["head"] if n.op == "fused_epilogue" else n.op for n in plan.graph.nodes]
    nchw_convolutions = sum(op.startswith("conv2d") for op in ops["nchw"])        # conv2d_max_pool2d among them
    assert ops["nhwc"].count("nhwc_conv2d") == nchw_convolutions == 53, (ops["nhwc"], ops["nchw"])
    assert ops["nhwc"].count("to_nhwc") == 1 and ops["nhwc"].count("from_nhwc") == 0, ops["nhwc"]
    assert nhwc.CHOSEN["cudnn", ""] == 53, nhwc.CHOSEN
    assert np.isfinite(outs["nhwc"]).all()
    np.testing.assert_allclose(outs["nhwc"], outs["nchw"], rtol=0, atol=1e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU with cupy (run on a GPU machine)")
def test_a_float16_train_step_channels_last_on_the_device():
    """The small ResNet's mixed-precision step at batch 64 on the device: every convolution
    direction channels last on cuDNN, three steps' losses equal the NCHW step's within 2e-2."""
    import subprocess
    import sys

    from tests.runtime.gpu_stand_in import ROOT

    def on_device(script, *args):
        result = subprocess.run([sys.executable, "-c", script, *map(str, args)], capture_output=True, text=True,
                                cwd=ROOT, timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
        return result.stdout
    check_train_report(train_report(on_device, ROOT / "zoo" / "resnet" / "net.yaml", 64), rtol=2e-2)
