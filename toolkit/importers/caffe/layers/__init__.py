"""Each Caffe layer as the toolkit's layer (a dict of the net file's keys), and its weight blobs
as the toolkit's arrays (PyTorch's layouts, which for these layers are Caffe's own).

A parameter the toolkit cannot express is a Problem at its line and column in the prototxt, and
the import goes on, so that one pass reports every one; values equal to the toolkit's defaults
are left out of the net file.

``base`` holds the registries, ``convert`` (one layer, by its type) and the readers of a layer's
parameters; ``blobs`` reads blobs as arrays; the converters, by family:

===================  ==================================================================
module               Caffe layer types
===================  ==================================================================
``activations``      ReLU Sigmoid TanH AbsVal BNLL Exp Log Dropout Threshold Clip ELU
                     Power Swish
``learned``          Convolution Deconvolution InnerProduct Embed PReLU Bias Scale
                     LSTM RNN LSTMUnit (and each one's blobs as arrays)
``normalization``    BatchNorm LRN MVN Softmax
``pooling``          Pooling SPP
``losses``           SoftmaxWithLoss EuclideanLoss SigmoidCrossEntropyLoss
                     MultinomialLogisticLoss InfogainLoss HingeLoss ContrastiveLoss
                     Accuracy
``shapes``           Concat Eltwise Reshape Flatten Slice Crop Tile ArgMax Reduction
===================  ==================================================================

Split and Silence are handled by ``convert`` itself; the data layers (``DATA_TYPES``) by the
net's reader."""
# imported for their registrations
from . import activations, learned, losses, normalization, pooling, shapes  # noqa: F401
from .base import DATA_TYPES, V1_NAMES, V1_TYPES, WEIGHTS, Context, convert, sub_message
from .blobs import blob_array, read_blob_file

__all__ = ["DATA_TYPES", "V1_NAMES", "V1_TYPES", "WEIGHTS", "Context", "blob_array", "convert", "read_blob_file",
           "sub_message"]
