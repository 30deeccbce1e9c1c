"""Where each node of a graph runs and each weight lives.

Placement is by layer: a node runs on the device its layer names (``device:`` in the net file),
else on the default device (``--device``). Nodes made by passes keep the scope of the layer they
came from (``conv1``, ``conv1.grad``, ``conv1.sgd``, ``conv1+relu1``), which is how they are
placed; a transfer runs on its destination. The graph carries the layers' devices (its net
file's); the default comes from whoever compiles or runs it.
"""
from __future__ import annotations

from typing import Mapping

from .devices import Device, parse_device


def layer_of_scope(scope: str) -> str:
    """The layer a node came from: ``conv1.grad`` and ``conv1+relu1`` are conv1's."""
    return scope.split("+", 1)[0].split(".", 1)[0]


class Placement:
    def __init__(self, default: Device | str, layer_devices: Mapping[str, str | Device] | None = None):
        self.default = parse_device(default)
        self.layers = {name: parse_device(d) for name, d in (layer_devices or {}).items()}

    @classmethod
    def of(cls, graph, default: Device | str) -> "Placement":
        """The placement of ``graph``'s nodes: its layers' devices, else ``default``."""
        return cls(default, graph.layer_devices)

    @property
    def by_layer(self) -> bool:
        """Whether some layer names its own device (else every node runs on the default)."""
        return bool(self.layers)

    def node(self, node) -> Device:
        """Where ``node`` runs: a transfer's destination, its layer's device, or the default."""
        if node.op == "transfer":
            return parse_device(node.attrs["dst"])
        if not self.layers:
            return self.default
        # a layer's name may hold dots (an ONNX model's "layer1.0.conv1"): the longest head of
        # the scope that names a placed layer, "fc.one" of "fc.one.grad", not its first word
        head = node.scope.split("+", 1)[0]
        while head not in self.layers and "." in head:
            head = head.rsplit(".", 1)[0]
        return self.layers.get(head, self.default)

    def weight(self, weight) -> Device:
        """Where a weight lives: with the layer that owns it."""
        return self.layers.get(weight.layer, self.default)

    def devices(self, graph) -> list[Device]:
        """Every device the graph's nodes run on, the default first."""
        seen = {self.default: None}
        for node in graph.nodes:
            seen.setdefault(self.node(node), None)
        return list(seen)
