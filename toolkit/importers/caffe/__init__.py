"""``toolkit import caffe``: a Caffe net (prototxt), its weights (caffemodel) and its solver as a
net file, a weights file in the toolkit's (PyTorch's) layouts and a train section.

- ``prototxt.py``: protobuf's text format, read with each field's place in the file;
- ``proto.py``: the binary messages a caffemodel holds, as protobuf descriptors written here
  (Caffe's field numbers; V1 ``layers`` files too);
- ``layers.py``: each Caffe layer as the toolkit's, its weights blobs as the toolkit's arrays;
- ``solver.py``: a solver file as the net's train section;
- ``net.py``: the whole import: phases and stages, inputs, the net file, the weights.
"""
