"""A layer case's net (``layer_cases.py``) made ready to compare: loaded from its text, given
random weights (biases and BatchNorm statistics moved away from 0 and 1) and random inputs of a
batch of ``BATCH``, the tops of a phase listed, and a compiled Plan's run of its graph."""
from __future__ import annotations

import numpy as np

from tests.layers.layer_cases import Case, labels, normal
from toolkit.frontend import Net
from toolkit.ir.binding import bind_symbols
from toolkit.ir.graph import FLOAT_DTYPES
from toolkit.runtime.plan import Plan

BATCH = 3


def load_net(tmp_path, case: Case) -> Net:
    path = tmp_path / f"{case.id}.yaml"
    path.write_text(case.text())
    return Net.load(str(path))


def layer_types(net: Net) -> dict[str, str]:
    return {layer.name: layer.type for layer in net.spec.layers}


def random_weights(net: Net, dtype: str, seed: int = 7) -> dict[str, np.ndarray]:
    """The net's fillers, then every bias, BatchNorm scale and running statistic moved away from
    the 0 / 1 it starts at, so that no term of the computation is trivially absent."""
    weights = net.init_weights(seed, dtype)
    rng = np.random.default_rng(seed + 1)
    types = layer_types(net)
    for key, arr in weights.items():
        layer = net.declared[key][1]              # the declaring layer: names may hold dots, as keys
        pname = key[len(layer) + 1:]              # 'weight', 'in_proj_bias', 'out_proj.bias', ...
        if pname == "bias" or pname.endswith(("_bias", ".bias")) or pname == "running_mean":
            arr[...] = rng.normal(0.0, 0.5, arr.shape)
        elif pname == "infogain":                 # a fixed matrix: not the identity it starts as
            arr[...] = rng.uniform(0.0, 1.0, arr.shape)
        elif pname == "running_var":
            arr[...] = rng.uniform(0.4, 2.5, arr.shape)
        elif pname == "weight" and types[layer] in ("BatchNorm", "Scale", "LayerNorm"):   # filled with 1
            arr[...] = rng.uniform(0.5, 1.5, arr.shape) * rng.choice([-1.0, 1.0], arr.shape)
    return weights


def random_inputs(net: Net, case: Case, dtype: str, seed: int = 11, batch: int = BATCH) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for name, spec in net.spec.inputs.items():
        shape = tuple(batch if isinstance(d, str) else d for d in spec.shape)
        kind = spec.dtype if spec.dtype not in FLOAT_DTYPES else dtype
        gen = case.gens.get(name) or (normal() if spec.dtype in FLOAT_DTYPES else labels(5))
        out[name] = gen(rng, shape, kind)
    return out


def tops_in(net: Net, phase: str) -> list[str]:
    names = []
    for layer in net.spec.layers:
        if phase in layer.phases:
            names += [t for t in layer.tops if t not in names]
    return names


def run_plan(graph, weights, inputs, names):
    plan = Plan(graph, bind_symbols(graph, {k: v.shape for k, v in inputs.items()}), weights)
    views = plan.run(inputs)
    return {n: np.array(views[n]) for n in names}
