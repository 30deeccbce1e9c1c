"""A net is validated by the net model over the layer types it names (``layers.net_model_for``):
the validators of the catalog's other types are never built, and what a net means and what its
mistakes say are the whole catalog's."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import get_args

import pytest

from layers import LAYERS, NetSpec, net_model_for
from tests.conftest import ROOT

LENET_TYPES = {"Input", "Convolution", "ReLU", "Pooling", "InnerProduct", "SoftmaxWithLoss", "Accuracy", "Softmax"}


def test_loading_a_net_builds_the_validators_of_its_own_layer_types_only():
    # a fresh process: this one's other tests may have built any of them
    script = textwrap.dedent("""
        import json
        from toolkit.zoo.resolve import load_net
        from layers import LAYERS
        load_net("zoo:lenet")
        print(json.dumps(sorted(t for t, d in LAYERS.items() if d.params.__pydantic_complete__)))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, check=True)
    built = set(json.loads(out.stdout.strip().splitlines()[-1]))
    assert {"Convolution", "InnerProduct", "SoftmaxWithLoss"} <= built <= LENET_TYPES, sorted(built)


def _union_names(model) -> set[str]:
    """The layer types of a net model's layer union."""
    layer = get_args(model.model_fields["layers"].annotation)[0]          # Annotated[Union[...], Field]
    return {get_args(m.model_fields["type"].annotation)[0] for m in get_args(get_args(layer)[0])}


def test_the_model_for_a_net_names_its_types_and_one_type_still_makes_a_union():
    data = {"name": "n", "inputs": {"x": {"shape": [1, 4]}},
            "layers": [{"name": "fc", "type": "InnerProduct", "bottom": "x", "top": "y", "num_output": 2}],
            "train": {"solver": {"type": "adam"}}}
    model = net_model_for(data)
    spec = model.model_validate(data)
    assert type(spec.layers[0]).__name__ == type(NetSpec.model_validate(data).layers[0]).__name__
    assert net_model_for(data) is model                    # one model per set of types, kept
    assert len(_union_names(model)) == 2 and "InnerProduct" in _union_names(model)


@pytest.mark.parametrize("layers", [[], [{"type": "NoSuchLayer"}], "not a list"])
def test_a_net_that_names_no_catalog_type_gets_the_whole_catalog(layers):
    assert net_model_for({"layers": layers}) is NetSpec


def test_types_inside_blocks_count_and_others_are_left_out():
    data = {"layers": [{"type": "If", "then": [{"type": "LSTM"}], "else": [{"type": "Sigmoid"}]}]}
    assert _union_names(net_model_for(data)) == {"If", "LSTM", "Sigmoid"}
    assert len(_union_names(NetSpec)) == len(LAYERS)
