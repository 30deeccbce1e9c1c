"""ONNX model files: ``files`` reads them within bounds (and brings older opsets to 13),
``netfile`` writes the net file of a model (one ONNX layer). The nodes become primitives in
layers/onnx."""
