"""``toolkit export onnx``: a net's infer (or test) phase as an ONNX model, its weights as
initializers, its symbolic dimensions kept dynamic, its input transform as nodes in front (and in
the metadata, for readers) unless --no-transform."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from ..errors import UserError

TRANSFORM_KEY = "toolkit.input_transform"


def run_export(args) -> int:
    return {"onnx": _onnx}[args.format](args)


def transform_record(net) -> dict | None:
    """The net's input transform as plain data (which inputs, each one's steps), or None."""
    from ..training.data import InputTransform
    transform = InputTransform.of(net)
    return None if transform is None else transform.record()


# the passes after ``quantize``, which turn the int8 graph into kernels' forms (blocked layouts,
# fused epilogues) that ONNX has no node for
AFTER_QUANTIZE = ("choose_layout", "batch_gemms", "fuse_conv_max_pool", "fuse_elementwise", "fuse_epilogue",
                  "fuse_bias_gradient", "fuse_reductions")


def quantized_graph(graph, weights):
    """The infer graph of a net with a quantization section as ``toolkit infer`` runs it: its
    weights frozen and the passes through ``quantize`` run (int8 convolutions and products with
    their int8 weights and int32 biases as constants), written by onnx_quant.py as QDQ."""
    from ..compile import optimize
    return optimize(graph, AFTER_QUANTIZE, dict(weights))


def _onnx(args) -> int:
    try:
        import onnx  # noqa: F401
    except ImportError:
        raise UserError("toolkit export onnx needs the onnx package: pip install 'yamlnet-toolkit[onnx]'") from None
    from ..exporters.onnx_graph import DEFAULT_OPSET, export_graph
    from ..fileio import atomic_write, refuse_own_inputs
    from ..frontend.spec import parse_overrides
    from ..zoo.resolve import load_net
    from .io import net_inputs
    net = load_net(args.net, parse_overrides(args.overrides))
    weights_path = net.default_weights(args.weights)
    out = Path(args.output)
    if out.is_dir():                           # before the export's work, as the next check
        raise UserError(f"-o {out}: a folder; give the model file's name, e.g. {out / (net.name + '.onnx')}")
    refuse_own_inputs("-o", out, [out], net_inputs(net, weights_path))
    weights = net.load_weights(weights_path, dtype="float32")
    graph = net.graph(args.phase, "float32")
    quantized = getattr(graph, "quantization", None) is not None
    if quantized:
        graph, weights = quantized_graph(graph, weights), {}
    metadata = {"toolkit.net": net.name, "toolkit.phase": args.phase}
    record = transform_record(net)
    in_graph = record is not None and not args.no_transform
    if record is not None:
        # the metadata says, for readers, what the transform is and whether the nodes in front do it
        metadata[TRANSFORM_KEY] = json.dumps({**record, "in_graph": in_graph})
        if args.no_transform:
            print("the input transform is left out (--no-transform): the model takes the inputs as the transform "
                  f"leaves them; it stays in the metadata '{TRANSFORM_KEY}'", file=sys.stderr)
    model = export_graph(graph, weights, net.name, args.opset or DEFAULT_OPSET, metadata,
                         input_transforms=record["steps"] if in_graph else None)
    data = model.SerializeToString()
    atomic_write(out, lambda tmp: Path(tmp).write_bytes(data))
    dynamic = sorted({d.dim_param for v in model.graph.input for d in v.type.tensor_type.shape.dim if d.dim_param})
    if quantized:
        qdq = sum(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in model.graph.node)
        print(f"int8: the quantized layers as QDQ ({qdq} QuantizeLinear/DequantizeLinear nodes, int8 weights per "
              "output channel)", file=sys.stderr)
    print(f"wrote {out}: {net.name} ({args.phase} phase), opset {model.opset_import[0].version}, "
          f"{len(model.graph.node)} nodes, {len(model.graph.initializer)} initializers, "
          f"{len(data) / 1e6:.1f} MB" + (f"; dynamic: {', '.join(dynamic)}" if dynamic else ""))
    return 0
