"""``toolkit export onnx``: a net's infer (or test) phase as an ONNX model, its weights as
initializers, its symbolic dimensions kept dynamic and its input transform in the metadata."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..errors import UserError

TRANSFORM_KEY = "toolkit.input_transform"


def run_export(args) -> int:
    return {"onnx": _onnx}[args.format](args)


def transform_metadata(net) -> str | None:
    """The net's input transform as JSON, for the model's metadata: which inputs, (x - mean) * scale,
    the mean a number, a value per channel or an image, and the centre crop."""
    from ..train.data import InputTransform, mean_of
    transform = InputTransform.of(net)
    if transform is None:
        return None
    data = transform.data_spec
    mean = mean_of(data, transform.base)
    record = {"inputs": transform.applies_to, "formula": "(x - mean) * scale",
              "scale": data.scale, "mean": None if mean is None else np.squeeze(mean, 0).tolist()
              if mean.ndim == 4 else np.asarray(mean).reshape(-1).tolist(),
              "crop_size": data.crop_size}
    return json.dumps(record)


def _onnx(args) -> int:
    try:
        import onnx  # noqa: F401
    except ImportError:
        raise UserError("toolkit export onnx needs the onnx package: pip install 'toolkit[onnx]'") from None
    from ..exporters.onnx_graph import DEFAULT_OPSET, export_graph
    from ..fileio import atomic_write
    from ..zoo.resolve import load_net
    from .train_cmd import parse_overrides
    net = load_net(args.net, parse_overrides(args.overrides))
    weights = net.load_weights(net.default_weights(args.weights), dtype="float32")
    graph = net.graph(args.phase, "float32")
    metadata = {"toolkit.net": net.name, "toolkit.phase": args.phase}
    transform = transform_metadata(net)
    if transform is not None:
        metadata[TRANSFORM_KEY] = transform
    model = export_graph(graph, weights, net.name, args.opset or DEFAULT_OPSET, metadata)
    out = Path(args.output)
    if out.is_dir():
        raise UserError(f"-o {out}: a folder; give the model file's name, e.g. {out / (net.name + '.onnx')}")
    data = model.SerializeToString()
    atomic_write(out, lambda tmp: Path(tmp).write_bytes(data))
    dynamic = sorted({d.dim_param for v in model.graph.input for d in v.type.tensor_type.shape.dim if d.dim_param})
    print(f"wrote {out}: {net.name} ({args.phase} phase), opset {model.opset_import[0].version}, "
          f"{len(model.graph.node)} nodes, {len(model.graph.initializer)} initializers, "
          f"{len(data) / 1e6:.1f} MB" + (f"; dynamic: {', '.join(dynamic)}" if dynamic else ""))
    return 0
