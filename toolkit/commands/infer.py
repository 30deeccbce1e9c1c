"""``toolkit infer``: the infer phase on .npy/.npz inputs, through batch buckets."""
from __future__ import annotations

import numpy as np

from ..compile import disabled_passes, optimize
from ..frontend import Net
from ..runtime.session import DEFAULT_BUCKETS, InferSession
from .io import check_output_path, read_inputs, write_outputs
from .devices import check_device, resolve_dtype


def run_infer(args) -> int:
    args.device = check_device(args.device)
    args.dtype = resolve_dtype(args.dtype, args.device)
    net = Net.load(args.net)
    disable = disabled_passes(net, args.disable, args.no_optimize)
    graph = net.graph("infer", args.dtype)
    if args.output:   # before loading weights and running: a bad name wastes no work
        check_output_path(args.output, list(graph.outputs))
    weights = net.load_weights(net.default_weights(args.weights), allow_missing=args.allow_missing, dtype=args.dtype)
    shapes = {name: tuple(v.shape) for name, v in graph.inputs.items()}
    arrays = read_inputs(args.input, list(graph.inputs), list(net.spec.inputs), shapes)
    graph = optimize(graph, disable, weights, args.device)     # the weights frozen into the graph
    session = InferSession(graph, weights, args.device, args.buckets or DEFAULT_BUCKETS)
    outputs = session.run(arrays)
    if args.output:
        write_outputs(args.output, outputs)
        shapes = ", ".join(f"{k} {list(v.shape)}" for k, v in outputs.items())
        print(f"wrote {args.output}: {shapes}")
    else:
        with np.printoptions(precision=5, suppress=True, threshold=200):
            for name, value in outputs.items():
                print(f"{name} {list(value.shape)} {value.dtype}:\n{value}")
    return 0
