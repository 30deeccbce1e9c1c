"""Automatic placement from the command line: ``toolkit compile NET --place auto --devices
cpu,cpu:1 [--emit placed.yaml]``, and a net file's ``placement: auto``.

The placer (toolkit/placement/schedules.py's ``auto``) chooses a device for each layer of the
phase compiled; the choice becomes the layers' ``device:`` keys, of the net compiled here and of
the file ``--emit`` writes (readable, editable, trainable). The devices default to ``--device``
and a second arena of the host (``cpu,cpu:1``; ``gpu,cpu`` under ``--device gpu``). The devices
run as this toolkit's plans run them (placer.host_sharing): the host's devices as core groups,
each beside the others (runtime/device_groups.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..backend.devices import CPU, Device, parse_device
from ..backend.options import check_device
from ..compile import disabled_passes
from ..errors import UserError
from ..fileio import atomic_write
from ..frontend import Net
from ..frontend.render import render_net
from ..frontend.spec import parse_overrides
from ..ir.graph import Graph
from ..placement.cost import measured_model
from ..placement.model import CostModel, FlopsModel, Link
from ..placement.placer import Schedule, host_sharing
from ..placement.schedules import auto
from ..runtime.parallel import default_threads
from ..settings import current
from ..zoo.resolve import load_net

# The FLOP-rate model's figures, where a device is not measured (a GPU): the host at about
# 30 GFLOP/s with a 5 us call, a GPU at 20 TFLOP/s; copies within the host at 10 GB/s, to and
# from a GPU at 12 GB/s after 10 us. Rough: they rank placements, they do not time them.
RATES = {"cpu": 30e9, "gpu": 20e12}
LINKS = {("cpu", "gpu"): Link(1e-5, 12e9), ("gpu", "cpu"): Link(1e-5, 12e9)}


@dataclass
class Placed:
    """The placer's choice for a compile: the net with its layers' ``device:`` keys, the choice."""
    net: Net
    devices: list[Device]
    schedule: Schedule
    runs: str           # how the devices run the plan, as the simulation took it
    model: str          # which cost model predicted it


def parse_devices(text: str) -> list[Device]:
    """``cpu,cpu:1`` as devices, each checked to run here (a GPU needs CuPy and a GPU)."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        raise UserError("--devices: name at least one device, e.g. --devices cpu,cpu:1")
    devices = [check_device(parse_device(n)) for n in names]
    if len(set(devices)) != len(devices):
        raise UserError(f"--devices {text}: a device is named twice")
    return devices


def default_devices(device: Device) -> list[Device]:
    """``--device`` and a second host arena (``cpu`` -> ``cpu,cpu:1``; ``gpu`` -> ``gpu,cpu``)."""
    device = parse_device(device)
    other = parse_device("cpu:1") if device.host_memory else CPU
    return [device, other] if other != device else [device, parse_device("cpu")]


def check_emit(path: str) -> Path:
    target = Path(path)
    if target.is_dir():
        raise UserError(f"--emit {path}: a folder; name the net file to write, e.g. --emit placed.yaml")
    if not target.parent.is_dir():
        raise UserError(f"--emit {path}: no folder {target.parent} to write it in")
    return target


def cost_model(devices: list[Device], device: Device, bindings) -> tuple[Callable[[Graph], CostModel], str]:
    """The model the placer asks of a graph, and its name: the measured one (placement/cost.py:
    this machine's timings of the graph's kernels, measured once and cached) where every device
    is the host's, else the FLOP-rate model (a GPU's kernels are not measured)."""
    if device.host_memory and all(d.host_memory for d in devices):
        return (lambda graph: measured_model(graph, bindings, device)), "measured model (this machine's kernel timings)"
    flops = FlopsModel(bindings, RATES, links=LINKS)
    return (lambda graph: flops), "FLOP-rate model (rough: it ranks placements, it does not time them)"


def place_net(args, net: Net) -> Placed | None:
    """The placer's choice for ``toolkit compile`` (None when neither ``--place auto`` nor the net's
    ``placement: auto`` asks for one); ``--emit`` writes it."""
    wanted = args.place == "auto" or getattr(net.spec, "placement", None) == "auto"
    if not wanted:
        if args.emit:
            raise UserError("--emit writes the placer's choice: give --place auto (or placement: auto in the net file)")
        if args.devices:
            raise UserError("--devices names the devices --place auto chooses among: give --place auto")
        return None
    target = check_emit(args.emit) if args.emit else None
    devices = parse_devices(args.devices) if args.devices else default_devices(args.device)
    graph = net.graph(args.phase)
    bindings = {s: args.batch for s in graph.symbols()}
    sharing = host_sharing(devices, concurrent=current().concurrent, threads=default_threads())
    weights = net.init_weights() if args.phase != "train" else None
    disable = disabled_passes(net, args.disable, args.no_optimize)
    model_of, model_name = cost_model(devices, args.device, bindings)
    # the inputs arrive on --device, whichever devices the layers may go to
    schedule = auto(net, args.phase, None, bindings, devices, sharing, weights, disable, default=args.device,
                    model_of=model_of)
    # in the net's order, for the reader; what is not a layer of the file (a solver's scalars) is left out
    schedule.layers = {spec.name: schedule.layers[spec.name] for spec in net.spec.layers
                       if spec.name in schedule.layers}
    # as key paths, not --set texts: a layer's name may hold a dot
    keys = [(("layers", layer, "device"), device) for layer, device in schedule.layers.items()]
    placed = load_net(args.net, parse_overrides(list(args.overrides)) + keys + [(("placement",), None)])
    if target is not None:
        text = "\n".join(line for line in render_net(placed, folder=target.parent).splitlines()
                         if line != "placement: null") + "\n"
        atomic_write(target, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    return Placed(placed, devices, schedule, sharing.describe(), model_name)


def placement_report(placed: Placed) -> dict:
    """The ``placement`` object of ``toolkit compile --json``."""
    s = placed.schedule
    return {"devices": [str(d) for d in placed.devices], "how": s.how, "predicted_ms": round(s.seconds * 1e3, 4),
            "layers": s.layers, "busy_ms": {k: round(v * 1e3, 4) for k, v in s.busy.items()},
            "memory_bytes": s.memory, "runs": placed.runs, "model": placed.model}


def print_placement(report: dict) -> None:
    p = report["placement"]
    print(f"placement over {', '.join(p['devices'])} ({p['how']}): predicted step {p['predicted_ms']:.3f} ms "
          f"by the {p['model']}; {p['runs']}")
    by_device: dict[str, list[str]] = {}
    for layer, device in p["layers"].items():
        by_device.setdefault(device, []).append(layer)
    for device, layers in by_device.items():
        print(f"  {device}: {', '.join(layers)}")
