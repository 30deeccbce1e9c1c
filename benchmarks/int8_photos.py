#!/usr/bin/env python
"""int8 against float32 on real photos with real ImageNet-trained weights: SqueezeNet 1.0 from
Deep Compression's packed file (decoded by benchmarks/deep_compression.py), the toolkit's Caffe
import of its deploy file with the caffe-imagenet transform (BGR, warped to 256 x 256, centre
crop 227, minus ILSVRC 2012's mean), and ``toolkit quantize`` of it with each calibration method;
ONNX Runtime's ``quantize_static`` of ``toolkit export onnx``'s float model beside it.

The photos are other projects' files, listed with their repositories and commits in
benchmarks/int8_photos_sources.json (one ImageNet photo per class, its class known, and the Caffe
examples' own test photos, no class given). Rebuild the folder from snapshots of those
repositories, then measure:

    python benchmarks/int8_photos.py gather --repo OWNER/NAME=GIT_DIR ... --photos DIR
    python benchmarks/int8_photos.py run --photos DIR \\
        --prototxt SqueezeNet_deploy.prototxt --weights compressed_SqueezeNet.net

``--weights`` takes the packed ``.net`` or a ``.caffemodel``. The photos are split by a fixed
rule: the labelled photos whose class index is 5 modulo 10 calibrate (100 photos), every other
photo is evaluated; the two sets share no photo (checked). Each calibration method is measured
with and without bias correction (``--bias-correction on|off|both``), with cross-layer equalization
or without (``--equalize on|off|both``, default on). Reported per model: top-1 agreement
with the float32 model, the mean top-5 overlap (shared classes of the two top-5 lists, out of 5),
and on the labelled photos top-1 / top-5 accuracy.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = Path(__file__).resolve().parent / "int8_photos_sources.json"
METHODS = ("minmax", "percentile", "entropy", "mse")
CALIBRATION_RESIDUE = 5          # labelled photos with class index % 10 == 5 calibrate


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    g = sub.add_parser("gather", help="write the listed photos into a folder from repository snapshots")
    g.add_argument("--repo", action="append", default=[], metavar="OWNER/NAME=GIT_DIR",
                   help="a snapshot (a clone or a bare git directory) of a listed repository")
    g.add_argument("--photos", required=True, help="the folder to write")
    g.add_argument("--sources", default=str(SOURCES))
    r = sub.add_parser("run", help="measure int8 against float32 on the photos")
    r.add_argument("--photos", required=True, help="the folder `gather` wrote")
    r.add_argument("--prototxt", required=True, help="SqueezeNet_deploy.prototxt")
    r.add_argument("--weights", required=True, help="compressed_SqueezeNet.net or a .caffemodel")
    r.add_argument("--sources", default=str(SOURCES))
    r.add_argument("--method", action="append", choices=METHODS, help="default: all three")
    r.add_argument("--float", action="append", default=[], metavar="LAYER",
                   help="a layer the toolkit's int8 models keep in float (repeatable)")
    r.add_argument("--dtype", choices=("uint8", "int8"), default="uint8", help="the toolkit's activation type")
    r.add_argument("--bias-correction", choices=("on", "off", "both"), default="both",
                   help="the toolkit's int8 models with bias correction, without, or both (default)")
    r.add_argument("--equalize", choices=("on", "off", "both"), default="on",
                   help="the toolkit's int8 models with cross-layer equalization (default), without, or both")
    r.add_argument("--no-ort", action="store_true", help="leave ONNX Runtime's int8 out")
    r.add_argument("--limit", type=int, help="evaluate only the first N evaluation photos (a quick look)")
    r.add_argument("--json", metavar="FILE", help="write every figure here")
    return p.parse_args(argv)


def read_sources(path: str) -> list[dict]:
    """Every listed photo: {repo, commit, path, file (its name in the folder), label (index or None)}."""
    out = []
    for group in json.loads(Path(path).read_text())["groups"]:
        for entry in group["files"]:
            src, label = (entry, None) if isinstance(entry, str) else entry
            out.append({"repo": group["repo"], "commit": group["commit"], "path": src,
                        "file": group.get("prefix", "") + Path(src).name, "label": label})
    names = [e["file"] for e in out]
    if len(set(names)) != len(names):
        raise SystemExit("error: two sources share a file name in the photo folder")
    return out


def gather(args) -> int:
    given = dict(spec.split("=", 1) for spec in args.repo)
    folder = Path(args.photos)
    folder.mkdir(parents=True, exist_ok=True)
    written = missing = 0
    for e in read_sources(args.sources):
        git_dir = given.get(e["repo"])
        if git_dir is None:
            missing += 1
            continue
        blob = subprocess.run(["git", "--git-dir", git_dir if git_dir.endswith(".git") or
                               Path(git_dir, "objects").is_dir() else str(Path(git_dir, ".git")),
                               "show", f"{e['commit']}:{e['path']}"], capture_output=True)
        if blob.returncode:
            print(f"{e['repo']}:{e['path']}: {blob.stderr.decode().strip()}", file=sys.stderr)
            missing += 1
            continue
        (folder / e["file"]).write_bytes(blob.stdout)
        written += 1
    print(f"wrote {written} photos to {folder}; {missing} left out (no snapshot given, or not in it)")
    return 0 if written else 1


def split(sources: list[dict], folder: Path):
    """(calibration, evaluation) entries present in ``folder``: disjoint by construction, checked."""
    present = [e for e in sources if (folder / e["file"]).is_file()]
    calibration = [e for e in present if e["label"] is not None and e["label"] % 10 == CALIBRATION_RESIDUE]
    evaluation = [e for e in present if e not in calibration]
    assert not {e["file"] for e in calibration} & {e["file"] for e in evaluation}
    return calibration, evaluation


def read_photos(net, entries: list[dict], folder: Path):
    """The photos as the net's transform reads image files: [N, 3, 227, 227] RGB, resized and
    centre-cropped, before the mean and channel order (which ``Model.infer`` applies)."""
    import numpy as np

    from toolkit.training.data import InputTransform
    transform = InputTransform.of(net)
    (name, spec), = net.spec.inputs.items()
    layout, read = transform.image_reader(name, tuple(spec.shape[1:]))
    return name, transform, np.stack([read(str(folder / e["file"])) for e in entries])


def scores(fp32, other, labels) -> dict:
    """Top-1 agreement and mean top-5 overlap of ``other`` with ``fp32``, and ``other``'s top-1 and
    top-5 accuracy on the rows with a label."""
    import numpy as np
    a, b = fp32.reshape(len(fp32), -1), other.reshape(len(other), -1)
    top5_a, top5_b = np.argsort(-a, 1)[:, :5], np.argsort(-b, 1)[:, :5]
    overlap = [len(set(x) & set(y)) for x, y in zip(top5_a, top5_b)]
    labelled = [i for i, label in enumerate(labels) if label is not None]
    out = {"n": len(a), "top1_agree": int((a.argmax(1) == b.argmax(1)).sum()),
           "top5_overlap": float(np.mean(overlap)) / 5, "labelled": len(labelled)}
    if labelled:
        truth = np.array([labels[i] for i in labelled])
        out["top1"] = int((b[labelled].argmax(1) == truth).sum())
        out["top5"] = int(sum(t in row for t, row in zip(truth, top5_b[labelled])))
    return out


def caffemodel_of(weights: str, prototxt: str, tmp: Path) -> Path:
    """The caffemodel of ``weights``: itself, or a packed ``.net`` decoded."""
    if not weights.endswith(".net"):
        return Path(weights)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from deep_compression import caffemodel_bytes, decode, weighted_layers

    from toolkit.errors import UserError
    try:
        layers = decode(prototxt, weights)
    except UserError as e:
        raise SystemExit(str(e)) from None
    except OSError as e:
        raise SystemExit(f"error: {e.filename}: {e.strerror}") from None
    kinds = {name: kind for name, kind, _, _ in weighted_layers(prototxt)}
    out = tmp / "squeezenet.caffemodel"
    out.write_bytes(caffemodel_bytes(layers, kinds))
    return out


def ort_int8(net, weights, calibration, evaluation, tmp: Path):
    """ONNX Runtime's quantize_static (QDQ, per-channel int8 weights, int8 activations, its default
    MinMax calibration) of the exported float model, calibrated on the same photos, once as given
    and once with ``reduce_range`` (7-bit weights: ORT's advice for processors without VNNI, whose
    u8 x s8 pair sums can saturate 16 bits); the float and int8 outputs on the evaluation photos
    (each given the transformed arrays)."""
    import numpy as np
    import onnxruntime as ort
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    from toolkit.exporters.onnx_graph import export_graph
    graph = net.graph("infer", "float32")
    model = export_graph(graph, weights, net.name)
    name = model.graph.input[0].name
    paths = {"ORT fp32": tmp / "fp32.onnx", "ORT int8": tmp / "int8.onnx",
             "ORT int8, reduce_range": tmp / "int8-reduce-range.onnx"}
    paths["ORT fp32"].write_bytes(model.SerializeToString())

    class Reader:
        def __init__(self):
            self.rows = iter([{name: calibration[i:i + 1]} for i in range(len(calibration))])

        def get_next(self):
            return next(self.rows, None)
    for key, reduce_range in (("ORT int8", False), ("ORT int8, reduce_range", True)):
        quantize_static(str(paths["ORT fp32"]), str(paths[key]), Reader(), quant_format=QuantFormat.QDQ,
                        per_channel=True, reduce_range=reduce_range, activation_type=QuantType.QInt8,
                        weight_type=QuantType.QInt8)
    outs = {}
    for key, path in paths.items():
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        outs[key] = np.concatenate([sess.run(None, {name: evaluation[i:i + 16]})[-1]
                                    for i in range(0, len(evaluation), 16)])
    return outs


def run(args) -> int:
    sys.path.insert(0, str(ROOT))
    import numpy as np

    import toolkit
    from toolkit.zoo.resolve import load_net
    folder = Path(args.photos)
    calibration, evaluation = split(read_sources(args.sources), folder)
    if args.limit:
        evaluation = evaluation[:args.limit]
    if not calibration or not evaluation:
        raise SystemExit(f"error: {folder}: no photos of the list (run `gather` first)")
    labels = [e["label"] for e in evaluation]
    figures = {"calibration_photos": len(calibration), "evaluation_photos": len(evaluation),
               "labelled_evaluation_photos": sum(label is not None for label in labels), "rows": {}}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        caffemodel = caffemodel_of(args.weights, args.prototxt, tmp)
        imported = subprocess.run([sys.executable, "-m", "toolkit.cli", "import", "caffe", args.prototxt,
                                   "--weights", str(caffemodel), "--transform", "caffe-imagenet",
                                   "--out", str(tmp / "fp32")], cwd=ROOT, capture_output=True, text=True)
        if imported.returncode:
            raise SystemExit(imported.stderr.strip() or f"error: toolkit import caffe {args.prototxt} failed")
        net_file, weights_file = tmp / "fp32" / "net.yaml", tmp / "fp32" / "model.safetensors"
        net = load_net(str(net_file))
        name, transform, calib_raw = read_photos(net, calibration, folder)
        _, _, eval_raw = read_photos(net, evaluation, folder)

        def infer(model) -> np.ndarray:
            return np.concatenate([list(model.infer({name: eval_raw[i:i + 16]}).values())[-1]
                                   for i in range(0, len(eval_raw), 16)])
        started = time.time()
        fp32 = infer(toolkit.load(str(net_file), weights=str(weights_file)))
        figures["rows"]["toolkit fp32"] = scores(fp32, fp32, labels)
        print(f"toolkit fp32: {figures['rows']['toolkit fp32']} ({time.time() - started:.0f} s)", file=sys.stderr)
        choices = {"on": (True,), "off": (False,), "both": (False, True)}
        for method, equalized, corrected in [(m, e, c) for m in args.method or METHODS
                                             for e in choices[args.equalize] for c in choices[args.bias_correction]]:
            out = tmp / f"int8-{method}-{'eq' if equalized else 'plain'}-{'bc' if corrected else 'plain'}"
            started = time.time()
            result = toolkit.quantize(str(net_file), weights=str(weights_file), calibrate={name: calib_raw},
                                      out=str(out), method=method, examples=len(calib_raw), dtype=args.dtype,
                                      keep_float=args.float, bias_correction=corrected, equalize=equalized)
            took = time.time() - started
            int8 = infer(toolkit.load(str(result.net_file), weights=str(result.weights_file)))
            key = f"toolkit int8 {method}" + (", equalized" if equalized else "") \
                + (", bias corrected" if corrected else "") \
                + (f", {args.dtype} activations" if args.dtype != "uint8" else "") \
                + (f", float: {', '.join(args.float)}" if args.float else "")
            figures["rows"][key] = row = scores(fp32, int8, labels)
            row["logit_rms_error"] = float(np.sqrt(np.mean((int8.reshape(fp32.shape) - fp32) ** 2)))
            row["float_layers"] = dict(result.float_layers)
            row["quantize_seconds"] = round(took, 1)
            print(f"{key}: {row}", file=sys.stderr)
        if not args.no_ort:
            weights = net.load_weights(str(weights_file))
            as_input = transform({name: calib_raw})[name], transform({name: eval_raw})[name]
            outs = ort_int8(net, weights, *as_input, tmp)
            figures["fp32_toolkit_vs_ort_max_diff"] = float(np.abs(outs["ORT fp32"].reshape(fp32.shape) - fp32).max())
            for key, out in outs.items():
                figures["rows"][key] = scores(fp32, out, labels)
    print(table(figures))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1) + "\n")
    return 0


def table(figures: dict) -> str:
    n_label = figures["labelled_evaluation_photos"]
    lines = [f"{figures['calibration_photos']} calibration photos, {figures['evaluation_photos']} evaluation photos "
             f"({n_label} labelled), disjoint"
             + (f"; toolkit and ORT fp32 outputs differ by at most {figures['fp32_toolkit_vs_ort_max_diff']:.2g}"
                if "fp32_toolkit_vs_ort_max_diff" in figures else ""),
             "", "| model | top-1 agrees with fp32 | top-5 overlap with fp32 | top-1 accuracy | top-5 accuracy |",
             "|---|--:|--:|--:|--:|"]
    for key, r in figures["rows"].items():
        acc = (f"{100 * r['top1'] / r['labelled']:.1f}% | {100 * r['top5'] / r['labelled']:.1f}%"
               if r.get("labelled") else "- | -")
        lines.append(f"| {key} | {r['top1_agree']}/{r['n']} ({100 * r['top1_agree'] / r['n']:.1f}%) "
                     f"| {100 * r['top5_overlap']:.1f}% | {acc} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    return gather(args) if args.command == "gather" else run(args)


if __name__ == "__main__":
    raise SystemExit(main())
