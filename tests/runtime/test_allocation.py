"""Nets too big to run: weights, a plan's buffers, or a kernel's scratch the machine cannot hold
are one line naming the layer, the shape and the bytes, exit status 2, before numpy is asked
for the memory (run under an address-space limit, so that the outcome does not depend on the
machine's memory)."""
from __future__ import annotations

import pytest

from tests.bounded import ROOT, run_toolkit
from toolkit.backend.registry import KERNELS, KernelEntry, load_device
from toolkit.errors import UserError
from toolkit.frontend import Net
from toolkit.runtime.plan import Plan

LIMIT_MB = 2000


def huge_ip1(tmp_path):
    path = tmp_path / "wide.yaml"
    path.write_text(f"base: {ROOT / 'zoo' / 'lenet' / 'net.yaml'}\nname: wide\n"
                    "layers: [{name: ip1, num_output: 1000000000000}]\n")
    return path


@pytest.mark.parametrize("command", [["compile"], ["bench", "--batch", "2"], ["bench", "--batch", "2", "--train"],
                                     ["train", "--set", "train.max_iter=1"]])
def test_weights_too_big_for_the_machine_name_the_layer(tmp_path, command):
    net = huge_ip1(tmp_path)
    extra = ["--out", tmp_path / "run"] if command[0] == "train" else []
    r = run_toolkit(command[0], net, *command[1:], *extra, memory_mb=LIMIT_MB, timeout=60)
    assert r.status == 2 and len(r.lines) == 1, r.err
    assert r.lines[0].startswith("error: layer 'ip1': weight 'ip1.weight' of shape [1000000000000, 128] (float32) "
                                 "is 465.7 TiB; the net's weights need 505.7 TiB, more than the "), r.err


def test_buffers_too_big_for_the_machine_name_the_largest_value(tmp_path):
    path = tmp_path / "wide_images.yaml"
    path.write_text("name: wide_images\ninputs:\n  data: {shape: [N, 3, 8000, 8000], dtype: float32}\nlayers:\n"
                    "  - {name: conv1, type: Convolution, bottom: data, top: conv1, num_output: 8, "
                    "kernel_size: 3, pad: 1}\n"
                    "  - {name: pool, type: Pooling, bottom: conv1, top: pool, pool: ave, global_pooling: true}\n")
    r = run_toolkit("bench", path, "--batch", "1", memory_mb=LIMIT_MB, timeout=60)
    assert r.status == 2 and len(r.lines) == 1, r.err
    assert r.lines[0].startswith("error: layer 'conv1': its conv2d output [1, 8, 8000, 8000] (float32) is 1.9 GiB; "
                                 "the plan needs "), r.err
    assert " of buffers at N=1, more than the " in r.lines[0]


def test_an_input_too_big_for_the_machine_is_named(tmp_path):
    path = tmp_path / "vast.yaml"
    path.write_text("name: vast\ninputs:\n  data: {shape: [N, 100000, 100000], dtype: float32}\nlayers:\n"
                    "  - {name: total, type: Reduction, bottom: data, top: total, axis: 1}\n")
    r = run_toolkit("bench", path, "--batch", "4", memory_mb=LIMIT_MB, timeout=60)
    assert r.status == 2 and len(r.lines) == 1 and r.lines[0].startswith(
        "error: input 'data' [4, 100000, 100000] (float32) is 149.0 GiB; the plan needs 149.0 GiB of buffers at N=4, "
        "more than the "), r.err


def test_a_kernel_that_cannot_allocate_its_scratch_names_the_layer(monkeypatch):
    """A kernel factory allocates its own scratch (an im2col buffer): its MemoryError becomes a
    UserError naming the layer and the sizes."""
    load_device("cpu")
    net = Net.load(str(ROOT / "zoo" / "lenet" / "net.yaml"))
    graph = net.graph("infer")

    def no_memory(ctx):
        raise MemoryError("Unable to allocate 40.2 GiB for an array with shape (10800000000,) and data type float32")
    monkeypatch.setitem(KERNELS.entries, ("conv2d", "cpu", "*"), KernelEntry(no_memory))
    with pytest.raises(UserError) as info:
        Plan(graph, {"N": 2}, net.init_weights(), native=False)
    assert str(info.value) == ("error: layer 'conv1': its conv2d kernel cannot allocate its scratch memory at N=2 "
                               "(Unable to allocate 40.2 GiB for an array with shape (10800000000,) and data type "
                               "float32)")
