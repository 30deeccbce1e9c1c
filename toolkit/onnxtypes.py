"""ONNX's element types (``TensorProto.DataType`` numbers) of the dtypes a graph holds: the one
table the ONNX importer reads types by, the exporter writes them by and the test oracles share.
It stands on the ground floor, beside no other code, so that the importers (floor 2) and the
exporters (floor 3) can both read it without reaching each other."""
from __future__ import annotations

# number -> the graph's dtype; every other ONNX type (int16, float8, strings, complex...) has no
# counterpart here and is refused by name where a model holds one. uint8 and int8 are quantized
# values (int8 quantization: QuantizeLinear and its kin)
ONNX_ELEMENT_TYPES: dict[int, str] = {1: "float32", 11: "float64", 10: "float16", 16: "bfloat16",
                                      6: "int32", 7: "int64", 9: "bool", 2: "uint8", 3: "int8"}

# the graph's dtype -> its number, for writing a model
ONNX_TYPE_NUMBER: dict[str, int] = {dtype: number for number, dtype in ONNX_ELEMENT_TYPES.items()}
