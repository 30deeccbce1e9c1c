"""The binary messages of a .caffemodel that the importer reads (and the tests write), declared
here as protobuf descriptors with Caffe's own field numbers (caffe.proto): a NetParameter's
layers (``layer``, field 100, and the V1 ``layers``, field 2, that old files hold), each with its
name, type and weight blobs. Everything else a caffemodel carries (the layer parameters, which
the prototxt gives) is left unparsed by protobuf, as unknown fields.

protobuf is the ``caffe`` extra, imported when a caffemodel is read or written.
"""
from __future__ import annotations

from functools import lru_cache

# FieldDescriptorProto types and labels
_DOUBLE, _FLOAT, _INT64, _INT32, _STRING, _MESSAGE = 1, 2, 3, 5, 9, 11
_OPTIONAL, _REPEATED = 1, 3

# message -> [(field, number, type, label, message type or None, packed)]
MESSAGES = {
    "BlobShape": [("dim", 1, _INT64, _REPEATED, None, True)],
    "BlobProto": [("num", 1, _INT32, _OPTIONAL, None, False), ("channels", 2, _INT32, _OPTIONAL, None, False),
                  ("height", 3, _INT32, _OPTIONAL, None, False), ("width", 4, _INT32, _OPTIONAL, None, False),
                  ("data", 5, _FLOAT, _REPEATED, None, True), ("diff", 6, _FLOAT, _REPEATED, None, True),
                  ("shape", 7, _MESSAGE, _OPTIONAL, "BlobShape", False),
                  ("double_data", 8, _DOUBLE, _REPEATED, None, True),
                  ("double_diff", 9, _DOUBLE, _REPEATED, None, True)],
    "LayerParameter": [("name", 1, _STRING, _OPTIONAL, None, False), ("type", 2, _STRING, _OPTIONAL, None, False),
                       ("bottom", 3, _STRING, _REPEATED, None, False), ("top", 4, _STRING, _REPEATED, None, False),
                       ("blobs", 7, _MESSAGE, _REPEATED, "BlobProto", False)],
    "V1LayerParameter": [("bottom", 2, _STRING, _REPEATED, None, False), ("top", 3, _STRING, _REPEATED, None, False),
                         ("name", 4, _STRING, _OPTIONAL, None, False), ("type", 5, _INT32, _OPTIONAL, None, False),
                         ("blobs", 6, _MESSAGE, _REPEATED, "BlobProto", False)],
    "NetParameter": [("name", 1, _STRING, _OPTIONAL, None, False),
                     ("layers", 2, _MESSAGE, _REPEATED, "V1LayerParameter", False),
                     ("input", 3, _STRING, _REPEATED, None, False), ("input_dim", 4, _INT32, _REPEATED, None, False),
                     ("layer", 100, _MESSAGE, _REPEATED, "LayerParameter", False)],
}

PACKAGE = "toolkit_caffe"


def need_protobuf():
    from ...errors import UserError
    try:
        import google.protobuf  # noqa: F401
    except ImportError:
        raise UserError("reading a .caffemodel needs protobuf: pip install 'yamlnet-toolkit[caffe]'") from None


@lru_cache(maxsize=None)
def classes() -> dict[str, type]:
    """The message classes, by name (built once)."""
    need_protobuf()
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    file = descriptor_pb2.FileDescriptorProto(name="toolkit_caffe.proto", package=PACKAGE, syntax="proto2")
    for name, fields in MESSAGES.items():
        message = file.message_type.add(name=name)
        for field_name, number, kind, label, type_name, packed in fields:
            f = message.field.add(name=field_name, number=number, type=kind, label=label)
            if type_name:
                f.type_name = f".{PACKAGE}.{type_name}"
            if packed:
                f.options.packed = True
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    make = getattr(message_factory, "GetMessageClass", None)
    if make is None:                          # protobuf before 4.22
        make = message_factory.MessageFactory(pool).GetPrototype
    return {name: make(pool.FindMessageTypeByName(f"{PACKAGE}.{name}")) for name in MESSAGES}
