"""Writers of the toolkit's models in other formats (ONNX)."""
