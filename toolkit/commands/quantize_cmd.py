"""``toolkit quantize``: a float model and calibration data in, an int8 model folder out
(toolkit/quantization/model.py). The calibration files are read as ``toolkit infer`` reads its
``--input`` files (CSV, .npz, images, folders), their label columns left out as there."""
from __future__ import annotations

import sys
from pathlib import Path

from ..errors import UserError


def run_quantize(args) -> int:
    from ..frontend.spec import parse_overrides
    from ..quantization.model import DEFAULT_EQUALIZE, quantize_model
    from ..training.data import InputTransform, recorded_input
    from ..zoo.resolve import load_net
    from .io import open_inputs
    net = load_net(args.net, parse_overrides(args.overrides))
    weights = net.default_weights(args.weights)
    if weights is None:
        raise UserError(f"{args.net}: no weights to quantize: give --weights FILE")
    graph = net.graph("infer", "float32")
    about = recorded_input(net.file)
    # a CSV of training data has columns no infer input reads: the label, by its recorded name or
    # as an input the infer phase does not use
    unused = ({about["label_column"]} if about.get("label_column") else set()) | \
        (set(net.spec.inputs) - set(graph.inputs))
    transform = InputTransform.of(net)
    shapes = {name: tuple(v.shape) for name, v in graph.inputs.items()}
    names = ", ".join(Path(spec.partition("=")[2] or spec).name for spec in args.calibrate)
    with open_inputs(args.calibrate, list(graph.inputs), list(net.spec.inputs), shapes, drop_columns=unused,
                     image_reader=transform.image_reader if transform else None,
                     note=lambda line: print(line, file=sys.stderr)) as stream:
        model = quantize_model(net, weights, stream, args.out, data_name=names, method=args.method,
                               max_examples=args.examples, dtype=args.dtype, keep_float=args.float or (),
                               data_files=_files_and_rows(stream), bias_correction=args.bias_correction,
                               equalize=DEFAULT_EQUALIZE if args.equalize is None else args.equalize)
    kept = ", ".join(f"{name} ({why})" for name, why in model.float_layers.items()) or "none"
    print(f"quantized {net.name}: {len(model.tops)} tops calibrated by {args.method} over {model.examples} "
          f"examples of {names}; {args.dtype} activations, int8 weights per channel; float layers: {kept}")
    if model.equalized:
        readers = len({r for rs in model.equalized.values() for r in rs})
        print(f"equalization: {len(model.equalized)} layers' output channels scaled against the weights of the "
              f"{readers} layers that read them")
    if args.bias_correction:
        print(f"bias correction: {len(model.bias_corrected)} convolutions and InnerProducts corrected by the mean "
              f"error of their int8 form over the calibration examples")
    print(f"wrote {model.net_file} and {model.weights_file}; `toolkit compile {model.net_file} --explain` "
          "says which layers run in int8")
    return 0


def _files_and_rows(stream) -> list[tuple[str, int]]:
    """Each calibration file's name and the rows it holds (a file read for several inputs, as an
    .npz is, counted once)."""
    found: dict[str, int] = {}
    for rows in stream.inputs.values():
        for piece, path in rows.pieces:
            if piece.rows is not None:
                found.setdefault(Path(path).name, piece.rows)
    return list(found.items())
