"""The sequence models on a real GPU: the loop and if kernels, the recurrent layers in both forms
and attention train on the GPU as on the CPU, and a loop-form GRU with a symbolic T infers at
several lengths on the GPU as on the CPU. Skipped without a CUDA GPU and cupy."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from toolkit.backend.devices import gpu_available

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU with cupy (run on a GPU machine)")]


def _net_file(tmp_path: Path, zoo_name: str, loop_form: bool) -> Path:
    text = (ROOT / "zoo" / zoo_name / "net.yaml").read_text()
    if loop_form:
        text = text.replace("return_sequence: false}", "return_sequence: false, unroll: false}")
        assert "unroll: false" in text
    path = tmp_path / f"{zoo_name}{'_loop' if loop_form else ''}.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("zoo_name,loop_form", [("gru_digits", False), ("gru_digits", True),
                                                ("transformer_digits", False)])
def test_sequence_models_train_on_the_gpu_as_on_the_cpu(tmp_path, zoo_name, loop_form):
    from toolkit.frontend import Net
    from toolkit.training.trainer import Trainer

    settings = {"max_iter": 12, "display": 3, "test_interval": 6, "snapshot": 100}
    net = Net.load(str(_net_file(tmp_path, zoo_name, loop_form)),
                   overrides=[(("train", k), v) for k, v in settings.items()])
    logs = {}
    for device in ("cpu", "gpu"):
        out = tmp_path / device
        assert Trainer(net, out, device=device).run() == 0
        logs[device] = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["iter"] for r in logs["gpu"]] == [r["iter"] for r in logs["cpu"]]
    for want, got in zip(logs["cpu"], logs["gpu"]):
        for key, value in want.items():
            if isinstance(value, float) and key not in ("lr", "seconds", "wall"):
                assert abs(got[key] - value) <= 1e-3 * max(1.0, abs(value)), (key, got, want)


def test_a_symbolic_length_loop_gru_infers_on_the_gpu_at_several_lengths(tmp_path):
    from toolkit.backend.devices import to_host
    from toolkit.compile import optimize
    from toolkit.frontend import Net
    from toolkit.runtime.session import InferSession

    path = tmp_path / "gru_t.yaml"
    path.write_text("""
name: gru_t
inputs:
  data: {shape: [N, T, 5], dtype: float32}
layers:
  - {name: gru, type: GRU, bottom: data, top: [seq, h_n], num_output: 7, num_layers: 2, bidirectional: true}
  - {name: fc, type: InnerProduct, bottom: h_n, top: fc, num_output: 3, axis: -1}
outputs: [seq, fc]
""")
    net = Net.load(str(path))
    weights = net.init_weights(seed=3)
    sessions = {d: InferSession(optimize(net.graph("infer"), (), dict(weights), d), weights, d, buckets=(3,))
                for d in ("cpu", "gpu")}
    rng = np.random.default_rng(0)
    for t in (1, 4, 9):
        x = rng.standard_normal((3, t, 5)).astype(np.float32)
        cpu = sessions["cpu"].run({"data": x})
        gpu = sessions["gpu"].run({"data": x})
        for name in ("seq", "fc"):
            np.testing.assert_allclose(to_host(gpu[name]), cpu[name], rtol=1e-5, atol=1e-5, err_msg=f"T={t} {name}")
