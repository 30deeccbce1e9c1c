"""The kernel registry's lookups and its miss message, kernels loaded by a device kind's table of
modules; device names; the CLI's answer for an absent device."""
from __future__ import annotations

from pathlib import Path

import pytest

from toolkit.backend.devices import DEVICE_KINDS, CudaDevice, HostDevice, gpu_available, parse_device
from toolkit.backend.registry import KERNELS, KernelMissing, load_device
from toolkit.cli import main


def test_a_miss_names_op_device_dtype_and_what_is_registered():
    load_device("cpu")
    with pytest.raises(KernelMissing) as info:
        KERNELS.lookup("conv2d", "gpu", "float16")
    message = str(info.value)
    assert "'conv2d'" in message and "'gpu'" in message and "float16" in message
    assert "cpu/*" in message                     # what is registered for the op


def test_the_any_dtype_entry_is_an_explicit_fallback():
    load_device("cpu")
    entry = KERNELS.lookup("relu", "cpu", "float64")
    assert entry is KERNELS.entries[("relu", "cpu", "*")]
    with pytest.raises(KernelMissing, match="nothing"):
        KERNELS.lookup("no_such_op", "cpu", "float32")


@pytest.mark.skipif(gpu_available(), reason="this machine has a GPU: --device gpu runs")
def test_asking_for_an_absent_gpu_is_a_user_error(capsys):
    lenet = Path(__file__).resolve().parents[2] / "benchmarks" / "nets" / "lenet.yaml"
    assert main(["bench", str(lenet), "--batch", "2", "--device", "gpu"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --device gpu needs CuPy") and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_a_malformed_device_name_is_a_usage_error(capsys):
    lenet = Path(__file__).resolve().parents[2] / "benchmarks" / "nets" / "lenet.yaml"
    assert main(["bench", str(lenet), "--batch", "2", "--device", "tpu"]) == 2
    err = capsys.readouterr().err
    assert "unknown device 'tpu'" in err and "Traceback" not in err


def test_a_kind_loads_its_kernels_from_its_table_of_modules():
    """The registry imports a kind's modules by name (nothing below the kernels imports them);
    their import registers the kind's kernels, the control-flow ones included."""
    assert HostDevice.kernel_modules == ("toolkit.kernels.cpu", "toolkit.kernels.native")
    assert DEVICE_KINDS == {"cpu": HostDevice, "gpu": CudaDevice}
    load_device("cpu")
    assert KERNELS.has("loop", "cpu", "float32") and KERNELS.has("if", parse_device("cpu:1"), "float64")
    assert KERNELS.native("conv2d", parse_device("cpu")) is not None


def test_device_names_parse_to_their_kind():
    cpu1, gpu0 = parse_device("cpu:1"), parse_device("gpu")
    assert (type(cpu1), cpu1.index, cpu1.name, str(gpu0)) == (HostDevice, 1, "cpu:1", "gpu")
    assert parse_device(cpu1) is cpu1 and parse_device(" cpu:1 ") == cpu1 != parse_device("cpu")
    assert cpu1.host_memory and not gpu0.host_memory and gpu0.streams and not cpu1.streams
    assert cpu1.emulated_half_types == ("float16", "bfloat16") and gpu0.emulated_half_types == ("bfloat16",)
