"""ONNX ops (opset 13 and up) as the toolkit's primitives: one converter per op type, each
``(importer, node) -> [outputs]``, registered in ``convert.CONVERTERS`` by ``@converts``. What a
converter cannot express raises ``NodeError``. The converters, by family:

=================  =====================================================================
module             ONNX op types
=================  =====================================================================
``elementwise``    Relu Sigmoid Tanh Exp Log Sqrt Abs Neg Sign Erf Softplus Reciprocal
                   LeakyRelu Elu Gelu Clip HardSigmoid HardSwish Softsign Selu PRelu,
                   Identity Dropout, Add Sub Mul Div Max Min Sum Mean, Where, Greater Less
                   GreaterOrEqual LessOrEqual Equal, Cast CastLike
``products``       MatMul Gemm Einsum
``convolution``    Conv ConvTranspose
``pooling``        MaxPool AveragePool GlobalAveragePool GlobalMaxPool
``normalization``  Softmax LogSoftmax BatchNormalization LayerNormalization
                   InstanceNormalization LRN
``shapes``         Reshape Flatten Transpose Squeeze Unsqueeze Concat Slice Split Gather
                   Expand Tile Pad ConstantOfShape
``reductions``     ReduceMean ReduceSum ReduceSumSquare ReduceL2 ReduceL1 ReduceMax
                   ReduceMin ReduceLogSumExp TopK ArgMax ArgMin
``quantized``      QuantizeLinear DequantizeLinear (and the QDQ format's Conv, Gemm,
                   MatMul, Add, Concat, AveragePool, GlobalAveragePool)
``qoperator``      QLinearConv QLinearMatMul ConvInteger MatMulInteger, ONNX Runtime's
                   QGemm QLinearAdd QLinearConcat QLinearAveragePool
                   QLinearGlobalAveragePool
=================  =====================================================================

And Or Xor Not ReduceProd Pow are in ``../logic.py``, If Loop Scan in ``../control.py``, RNN
GRU LSTM in ``../recurrent.py``; ``base`` holds what the families share."""
# imported for their registrations
from . import convolution, elementwise, normalization, pooling, products, qoperator, quantized, reductions, shapes  # noqa: F401,E501
from .base import axes_input, converts, float_input

__all__ = ["axes_input", "converts", "float_input"]
