"""The kernel registry's lookups and its miss message; the CLI's answer for an absent device."""
from __future__ import annotations

from pathlib import Path

import pytest

from toolkit.runtime.devices import gpu_available

from toolkit.cli import main
from toolkit.kernels import KERNELS, KernelMissing, load_device


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
