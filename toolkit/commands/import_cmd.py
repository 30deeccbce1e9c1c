"""``toolkit import caffe``: a Caffe prototxt (with its caffemodel and solver) written as a net
file and a weights file, checked by loading them back before anything is written."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ..errors import SpecError, UserError


def run_import(args) -> int:
    return {"caffe": _caffe, "onnx": _onnx}[args.format](args)


def _onnx(args) -> int:
    """DIR/net.yaml (the model's inputs and one ONNX layer reading DIR/MODEL.onnx), DIR/MODEL.onnx
    (the model's graph) and DIR/model.safetensors (its initializers as the layer's weights)."""
    import shutil

    from ..fileio import atomic_write
    from ..importers.onnx.files import loaded_model
    from ..importers.onnx.netfile import net_text
    from ..weights import save_weights
    from ..zoo.resolve import load_net
    out = Path(args.out)
    source = Path(args.model)
    copy = out / source.name
    taken = [f for f in ("net.yaml", "model.safetensors", source.name) if (out / f).exists()]
    if taken and not args.force:
        raise UserError(f"--out {out}: holds {' and '.join(taken)} already; choose another --out, or pass --force "
                        "to replace them")
    loaded = loaded_model(str(source))
    name = loaded.model.graph.name or source.stem
    text = net_text(loaded.model, source.name, name)
    net = load_net(str(source))                  # every node lowered and checked before anything is written
    weights = net.load_weights(str(source))
    out.mkdir(parents=True, exist_ok=True)
    if source.resolve() != copy.resolve():
        atomic_write(copy, lambda tmp: shutil.copyfile(source, tmp))
    head = f"# imported from {source.name} by `toolkit import onnx`: its graph runs as the ONNX layer\n"
    atomic_write(out / "net.yaml", lambda tmp: Path(tmp).write_text(head + text))
    save_weights(str(out / "model.safetensors"), weights)
    params = sum(int(np.prod(a.shape)) for a in weights.values())
    ops = sorted({n.op_type for n in loaded.model.graph.node})
    print(f"imported {net.name}: {len(loaded.model.graph.node)} ONNX nodes ({len(ops)} op types) as the layer "
          f"'{net.spec.layers[0].name}', {params:,} parameters; wrote {out / 'net.yaml'}, {copy} and "
          f"{out / 'model.safetensors'}")
    print("note: the graph stays one ONNX layer (its nodes run as the toolkit's primitives); add layers after it, "
          "or freeze it with lr_mult: 0, to fine-tune")
    last = loaded.model.graph.node[-1] if loaded.model.graph.node else None
    if last is not None and last.input:
        print(f"note: to replace its last node ({last.op_type}) by a new head, cut the layer where that node reads: "
              f"outputs: ['{last.input[0]}']")
    return 0


def _input_shapes(items: list[str]) -> dict[str, list[int]]:
    shapes = {}
    for item in items:
        name, sep, dims = item.partition("=")
        try:
            values = [int(d) for d in dims.split(",") if d.strip()]
        except ValueError:
            values = []
        if not sep or not name or not values or min(values) < 1:
            raise UserError(f"--input-shape {item}: expected NAME=C,H,W (positive whole numbers), e.g. data=3,227,227")
        shapes[name] = values
    return shapes


def _caffe(args) -> int:
    from ..importers.caffe.net import import_net, import_weights, read_prototxt, to_yaml
    from ..importers.caffe.solver import import_solver
    from ..zoo.resolve import load_net
    out = Path(args.out)
    taken = [f for f in ("net.yaml", "model.safetensors") if (out / f).exists()]
    if taken and not args.force:
        raise UserError(f"--out {out}: holds {' and '.join(taken)} already; choose another --out, or pass --force "
                        "to replace them")
    net, ctx, weighted, notes = import_net(args.prototxt, tuple(args.stage), _input_shapes(args.input_shape))
    if args.solver:
        train = import_solver(read_prototxt(args.solver), ctx, notes)
        net["train"] = {**net.get("train", {}), **train}
        accumulate = net["train"].pop("iter_size", 1)
        if accumulate != 1:
            data = net["train"].setdefault("data", {})
            if "batch_size" in data:
                data["batch_size"] *= accumulate
            notes.append(f"iter_size {accumulate}: Caffe accumulates {accumulate} batches before each update; here "
                         f"one batch {accumulate} times larger (train.data.batch_size), the same gradient but for "
                         "BatchNorm's batch statistics")
    weights = import_weights(args.weights, weighted, ctx, notes) if args.weights else None
    if ctx.problems:
        raise SpecError(*sorted(ctx.problems, key=lambda p: (p.location.file, p.location.line, p.location.col)))
    text = to_yaml(net, args.prototxt)
    target = out / "net.yaml"
    try:
        loaded = load_net(str(target), text=text)      # what `toolkit check` will say, before writing
    except UserError as e:
        raise UserError(f"the imported net does not load (a gap in the importer; please report it): "
                        + "; ".join(str(p) for p in e.problems)) from None
    out.mkdir(parents=True, exist_ok=True)
    from ..fileio import atomic_write
    atomic_write(target, lambda tmp: Path(tmp).write_text(text))
    if "mean_image" in ctx.extra:
        def write_mean(tmp: str) -> None:
            with open(tmp, "wb") as f:
                np.save(f, ctx.extra["mean_image"].astype(np.float32))
        atomic_write(out / "mean.npy", write_mean)
        print(f"wrote {out / 'mean.npy'}: the mean image {list(ctx.extra['mean_image'].shape)}")
    params = sum(math.prod(shape) for key, (shape, _layer) in loaded.declared.items()
                 if not key.endswith(("running_mean", "running_var")))
    print(f"imported {net['name']}: {len(net['layers'])} layers, {params:,} parameters; wrote {target}")
    if weights is not None or ctx.fixed:
        _write_weights(args.weights, weights or {}, ctx.fixed, loaded, out / "model.safetensors")
    for note in notes:
        print(f"note: {note}")
    return 0


def _write_weights(caffemodel: str | None, weights: dict, fixed: dict, loaded, target: Path) -> None:
    """The caffemodel's arrays and the matrices read from the prototxt's own files (``fixed``)
    over the fillers' values, checked against the net's declared shapes."""
    from ..weights import check_weights, save_weights
    source = caffemodel or "the prototxt's files"
    report = check_weights(source, {**weights, **fixed}, loaded.declared, allow_missing=True)
    if report.reshaped:
        raise UserError(*(f"{source}: weight '{k}' of layer '{layer}' has shape {list(a)} there, the prototxt "
                          f"makes it {list(b)}" for k, layer, a, b in report.reshaped))
    arrays = loaded.init_weights(seed=0)
    for key in report.copied:
        arrays[key] = np.asarray({**weights, **fixed}[key], dtype=np.float32)
    save_weights(str(target), arrays)
    started = [k for k, _layer, _shape in report.new]
    parts = []
    if caffemodel:
        parts.append(f"{len(report.copied) - len(fixed)} arrays from {caffemodel}")
    if fixed:
        parts.append(f"{', '.join(sorted(fixed))} from the prototxt's files")
    if started:
        parts.append(f"{len(started)} from their fillers ({', '.join(started[:6])}{' ...' if len(started) > 6 else ''})")
    print(f"wrote {target}: " + ", ".join(parts))
    if not caffemodel:
        print(f"note: train from these with --weights {target}, or the fixed matrices start as their fillers")
