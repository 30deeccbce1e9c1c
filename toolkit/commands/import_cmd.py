"""``toolkit import caffe|onnx``: a Caffe prototxt (with its caffemodel and solver) or an ONNX
model written as a net file and a weights file (and the class names of ``--labels``), checked by
loading them back before anything is written, and written into a staged folder that becomes
--out only when the whole import succeeded."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ..errors import SpecError, UserError


def run_import(args) -> int:
    # the labels file is read and checked before anything is imported: a bad one wastes no work
    labels = getattr(args, "labels", None)
    names = None
    if labels is not None:
        from ..arrayfiles.labels import read_labels
        names = read_labels(labels)
    out = Path(args.out)
    from ..fileio import refuse_own_inputs, staged_folder
    from ..training.data import INPUT_FILE
    inputs = _inputs(args)
    named = ["net.yaml", "model.safetensors"] + ([INPUT_FILE] if names is not None else []) \
        + ([Path(args.model).name] if args.format == "onnx" else [])
    refuse_own_inputs("--out", out, [out / f for f in named], inputs)      # before any work
    _check_free(out, args)
    # everything is written into a staged folder and moved into --out at the end: an import that
    # fails (weights that do not fit, labels that fit no output) leaves nothing behind, and its
    # rerun needs no --force
    with staged_folder(out) as stage:
        said, named, net = {"caffe": _caffe, "onnx": _onnx}[args.format](args, stage)
        if names is not None:
            said.append(_record_labels(stage, out, names, labels, net))
        # every file the stage moves into --out, against every file the import read (those the
        # model names, an ONNX model's data files or a prototxt's mean image, known once it is read)
        refuse_own_inputs("--out", out, [out / p.relative_to(stage) for p in sorted(stage.rglob("*"))
                                         if not p.is_dir()], inputs + named)
    for line in said:
        print(line)
    return 0


def _inputs(args) -> list[tuple[str, str | None]]:
    """The files named on the command line, which the import reads."""
    if args.format == "onnx":
        found = [("the ONNX model", args.model)]
    else:
        found = [("the prototxt", args.prototxt), ("the caffemodel", args.weights), ("the solver", args.solver)]
    return found + [("the labels file", getattr(args, "labels", None))]


def _check_free(out: Path, args) -> None:
    source = Path(args.model).name if args.format == "onnx" else None
    taken = [f for f in ("net.yaml", "model.safetensors", source) if f and (out / f).exists()]
    if taken and not args.force:
        raise UserError(f"--out {out}: holds {' and '.join(taken)} already; choose another --out, or pass --force "
                        "to replace them")


def _record_labels(stage: Path, out: Path, names: list[str], labels: str, net) -> str:
    """The class names in input.json, where ``toolkit infer``, ``serve`` and a published model's
    card find them; refused unless they fit a class score output of ``net`` (the net written,
    as the import loaded it to check it). Returns the line that says so."""
    import json

    from ..arrayfiles.labels import fit_labels
    from ..fileio import atomic_write
    from ..training.data import INPUT_FILE, MAX_INPUT_FILE_BYTES
    from .classes import score_widths
    graph = net.graph("infer", "float32")
    widths = score_widths({name: tuple(v.shape) for name, v in graph.outputs.items()})
    fit_labels(names, widths, f"--labels {labels} (nothing was imported)")
    text = json.dumps({"classes": names}, ensure_ascii=False, separators=(",", ":")) + "\n"
    if len(text.encode("utf-8")) > MAX_INPUT_FILE_BYTES:
        raise UserError(f"--labels {labels}: its names take more than the {MAX_INPUT_FILE_BYTES:,} bytes an "
                        "input description may hold")
    atomic_write(stage / INPUT_FILE, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    return f"wrote {out / INPUT_FILE}: {len(names)} class names from {labels}"


def _onnx(args, stage: Path) -> tuple[list[str], list[tuple[str, str]], object]:
    """net.yaml and model.safetensors: the model's nodes as the catalog's layers where each maps to
    one (checked to compute what the model does before anything is written), else the model's
    inputs and one ONNX layer reading a copy of MODEL.onnx (and its data files), with a note naming
    the nodes that kept it from being a net of layers. Written into ``stage``; the lines that say
    so name the files where they will be (--out), the model's data files (what it read), and the
    net written as loaded to check it."""
    from ..frontend import Net
    from ..importers.onnx.files import loaded_model
    from ..importers.onnx.netfile import blob_names, model_name, net_dict, net_text
    out = Path(args.out)
    source = Path(args.model)
    loaded = loaded_model(str(source))
    read = [("a data file of the ONNX model", str(source.parent / f.location)) for f in loaded.data_files]
    name = model_name(loaded.model, str(source))
    # every node lowered and checked before anything is written, from the net file written below
    # (a model's net file, whose problems are said of the model: no place in a file never written)
    graph_net = Net.load_onnx(args.model)
    graph_weights = graph_net.load_weights(str(source))
    layered, problems = _as_layers(source, loaded, net_dict(loaded.model, source.name, name), graph_net,
                                   graph_weights)
    if layered is not None:
        text, weights, net = layered
        _write(stage, text, weights, f"# imported from {source.name} by `toolkit import onnx`\n")
        return [f"imported {net.name}: {len(loaded.model.graph.node)} ONNX nodes as {len(net.spec.layers)} layers, "
                f"{_count(weights):,} parameters; wrote {out / 'net.yaml'} and {out / 'model.safetensors'} (the "
                "layers compute what the model does: checked on random inputs)"] + blob_names(loaded.model)[2], \
            read, net
    import shutil
    shutil.copyfile(source, stage / source.name)
    for data in loaded.data_files:        # where the copy's tensors keep their data, checked when read
        (stage / data.location).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source.parent / data.location, stage / data.location)
    _write(stage, net_text(loaded.model, source.name, name), graph_weights,
           f"# imported from {source.name} by `toolkit import onnx`: its graph runs as the ONNX layer\n")
    ops = sorted({n.op_type for n in loaded.model.graph.node})
    said = [f"imported {graph_net.name}: {len(loaded.model.graph.node)} ONNX nodes ({len(ops)} op types) as the "
            f"layer '{graph_net.spec.layers[0].name}', {_count(graph_weights):,} parameters; wrote {out / 'net.yaml'}, "
            f"{out / source.name} and {out / 'model.safetensors'}"]
    shown = problems[:5] + ([f"and {len(problems) - 5} more"] if len(problems) > 5 else [])
    said += blob_names(loaded.model)[2]          # values whose names would have become one blob's
    said.append("note: not a net of the catalog's layers, because of " + "; ".join(shown))
    said.append("note: the graph stays one ONNX layer (its nodes run as the toolkit's primitives); add layers after "
                "it, or freeze it with lr_mult: 0, to fine-tune")
    cut = _classifier_input(loaded)
    if cut is not None:
        node, value = cut
        said.append(f"note: to replace its classifier (the {node.op_type} '{node.name or node.output[0]}') by a new "
                    f"head, cut the layer where it reads: outputs: ['{value}']")
    return said, read, graph_net


def _classifier_input(loaded):
    """(the last Gemm, MatMul or Conv, the computed value it reads), else (the last node, its
    first computed input), else None."""
    nodes = list(loaded.model.graph.node)
    fixed = set(loaded.arrays) | {o for n in nodes if n.op_type == "Constant" for o in n.output}
    for kinds in (("Gemm", "MatMul", "Conv"), None):
        for node in reversed(nodes):
            if kinds is None or node.op_type in kinds:
                computed = [i for i in node.input if i and i not in fixed]
                if computed:
                    return node, computed[0]
    return None


def _count(weights: dict) -> int:
    return sum(int(np.prod(a.shape)) for a in weights.values())


def _write(out: Path, text: str, weights: dict, head: str) -> None:
    from ..fileio import atomic_write
    from ..weights import save_weights
    atomic_write(out / "net.yaml", lambda tmp: Path(tmp).write_text(head + text))
    save_weights(str(out / "model.safetensors"), weights)


def _as_layers(source: Path, loaded, base: dict, graph_net, graph_weights):
    """((net text, weights, net), []) where every node maps to a layer and the layers compute
    what the graph does on random inputs; else (None, the reasons)."""
    import yaml

    from layers.onnx.convert import import_proto, needed
    from layers.onnx.to_layers import to_layers

    from ..runtime.plan import Plan
    from ..runtime.session import batch_bindings
    from ..zoo.resolve import load_net
    imported = import_proto(loaded.model, str(source))
    nodes, _ = needed(imported.model.graph.node, [o.name for o in imported.model.graph.output])
    layers, weights, problems = to_layers(imported.importer, imported.model, nodes)
    if problems:
        return None, problems
    doc = {"name": base["name"], "inputs": base["inputs"], "layers": layers}
    if "transform" in base:                 # the input transform toolkit export wrote into the model
        doc["transform"] = base["transform"]
    text = yaml.safe_dump(doc, sort_keys=False)
    try:
        net = load_net(str(source.with_suffix(".yaml")), text=text)
        arrays = {k: np.asarray(weights[k], np.float32) for k in net.declared}
    except (UserError, KeyError) as e:
        return None, [f"the layers do not load ({str(e).splitlines()[0]})"]
    rng = np.random.default_rng(0)
    results = []
    for candidate, cw in ((net, arrays), (graph_net, graph_weights)):
        graph = candidate.graph("infer", "float32")
        bindings = batch_bindings(graph, 2)
        if not results:
            feeds = {k: (rng.integers(0, 4, v.type.concrete(bindings)) if v.dtype.startswith("int")
                         else rng.standard_normal(v.type.concrete(bindings))).astype(v.dtype)
                     for k, v in graph.inputs.items()}
        results.append(Plan(graph, bindings, {k: cw[k] for k in graph.weights}).run(feeds))
    for key, want in results[1].items():
        got = results[0].get(key)
        scale = max(float(np.abs(want).max()), 1e-6)
        if got is None or got.shape != want.shape or float(np.abs(got - want).max()) > 1e-4 * scale:
            return None, [f"the layers differ from the graph on output '{key}' (a gap in the layer writer)"]
    return (text, arrays, net), []


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


def _caffe(args, stage: Path) -> tuple[list[str], list[tuple[str, str]], object]:
    """net.yaml (and mean.npy, model.safetensors) written into ``stage``; the lines that say so,
    the files the prototxt names that were read (its mean image), and the net as loaded to check it."""
    from schemas.net import DATA_TRANSFORM_KEYS

    from ..importers.caffe.net import import_net, import_weights, read_prototxt, to_yaml
    from ..importers.caffe.solver import import_solver
    from ..zoo.resolve import load_net
    out = Path(args.out)
    net, ctx, weighted, notes = import_net(args.prototxt, tuple(args.stage), _input_shapes(args.input_shape))
    preset = getattr(args, "transform", None)
    if preset:
        given = sorted(k for k in net.get("train", {}).get("data", {}) if k in DATA_TRANSFORM_KEYS)
        if given:
            raise UserError(f"--transform {preset}: the prototxt's transform_param gives the input transform already "
                            f"({', '.join(given)}, in train.data); leave --transform out")
        net["transform"] = {"preset": preset}
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
        raise UserError("the imported net does not load (a gap in the importer; please report it): "
                        + "; ".join(str(p) for p in e.problems)) from None
    from ..fileio import atomic_write
    said = []
    atomic_write(stage / "net.yaml", lambda tmp: Path(tmp).write_text(text))
    if "mean_image" in ctx.extra:
        def write_mean(tmp: str) -> None:
            with open(tmp, "wb") as f:
                np.save(f, ctx.extra["mean_image"].astype(np.float32))
        atomic_write(stage / "mean.npy", write_mean)
        said.append(f"wrote {out / 'mean.npy'}: the mean image {list(ctx.extra['mean_image'].shape)}")
    params = sum(math.prod(shape) for key, (shape, _layer) in loaded.declared.items()
                 if not key.endswith(("running_mean", "running_var")))
    said.append(f"imported {net['name']}: {len(net['layers'])} layers, {params:,} parameters; wrote {target}")
    if weights is not None or ctx.fixed:
        said += _write_weights(args.weights, weights or {}, ctx.fixed, loaded, stage / "model.safetensors",
                               out / "model.safetensors")
    return said + [f"note: {note}" for note in notes], [("a file the prototxt names", f) for f in ctx.read], loaded


def _write_weights(caffemodel: str | None, weights: dict, fixed: dict, loaded, target: Path, shown: Path) -> list[str]:
    """The caffemodel's arrays and the matrices read from the prototxt's own files (``fixed``)
    over the fillers' values, checked against the net's declared shapes, written to ``target``;
    the lines that say so, naming the file ``shown`` (where it will be)."""
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
        parts.append(f"{len(started)} from their fillers ({', '.join(started[:6])}"
                     f"{' ...' if len(started) > 6 else ''})")
    said = [f"wrote {shown}: " + ", ".join(parts)]
    if not caffemodel:
        said.append(f"note: train from these with --weights {shown}, or the fixed matrices start as their fillers")
    return said
