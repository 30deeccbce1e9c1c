"""The small valid net the command-line error tests break (``TINY``), and ``tiny_files``: it
written into a folder with matching weights (safetensors and npz) and a 5-row input, as the
``tiny`` fixture of ``conftest.py`` hands it out."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from cli_helpers import write_net

from toolkit.frontend import Net
from toolkit.weights import save_weights

TINY = """
name: tiny
inputs:
  data: {shape: [N, 3, 8, 8], dtype: float32}
layers:
  - {name: conv1, type: Convolution, bottom: data, top: conv1, num_output: 4, kernel_size: 3}
  - {name: relu1, type: ReLU, bottom: conv1, top: conv1}
  - {name: pool1, type: Pooling, bottom: conv1, top: pool1, pool: max, kernel_size: 2, stride: 2}
  - {name: ip1, type: InnerProduct, bottom: pool1, top: ip1, num_output: 5}
  - {name: prob, type: Softmax, bottom: ip1, top: prob}
outputs: [prob]
"""


def tiny_files(d: Path) -> dict:
    """TINY in ``d`` with matching weights (both formats) and a 5-row input: their paths by role."""
    net_path = write_net(d, TINY, "tiny.yaml")
    weights = Net.load(str(net_path)).init_weights()
    save_weights(str(d / "w.safetensors"), weights)
    save_weights(str(d / "w.npz"), weights)
    np.save(d / "x.npy", np.random.default_rng(0).standard_normal((5, 3, 8, 8)).astype(np.float32))
    return {"dir": d, "net": net_path, "weights": weights, "st": d / "w.safetensors", "npz": d / "w.npz",
            "x": d / "x.npy"}
