"""Which inputs of ONNX's quantized ops are scales and zero points: the importer keeps those
constants (per-channel scales are not parameters to train), and the converters of ops/ read
them. A module of its own so that convert.py reads the table without importing the converters."""
from __future__ import annotations

# the inputs of each quantized op that are scales or zero points: constants, never parameters
QUANT_PARAMS = {"QuantizeLinear": (1, 2), "DequantizeLinear": (1, 2), "QLinearConv": (1, 2, 4, 5, 6, 7),
                "QLinearMatMul": (1, 2, 4, 5, 6, 7), "QGemm": (1, 2, 4, 5, 7, 8), "MatMulInteger": (2, 3),
                "ConvInteger": (2, 3), "QLinearAdd": (1, 2, 4, 5, 6, 7), "QLinearAveragePool": (1, 2, 3, 4),
                "QLinearGlobalAveragePool": (1, 2, 3, 4)}


def quantization_parameters(nodes) -> set[str]:
    """The names the model's quantized ops read as scales or zero points (kept as constants)."""
    names = set()
    for node in nodes:
        # QLinearConcat: the output's scale and zero point, then (value, scale, zero point) per input
        positions = [i for i in range(len(node.input)) if i % 3 != 2] if node.op_type == "QLinearConcat" else \
            QUANT_PARAMS.get(node.op_type, ())
        for i in positions:
            if i < len(node.input) and node.input[i]:
                names.add(node.input[i])
    return names
