"""The text of a parsed protocol buffer checked to be text. Caffe's and ONNX's messages are proto2,
whose string fields protobuf parses without checking them: a name that is not UTF-8 comes back as
``bytes`` where every reader expects ``str``. A file is checked once, as it is read, so that no
reader further on meets such a name."""
from __future__ import annotations


def undecodable_field(message) -> str | None:
    """The path (``graph.node[3].name``) of the first string field of ``message``, nested messages
    included, that does not hold UTF-8 text; None where all of them do. Only string and message
    fields are visited, so the numbers of a large tensor are not walked."""
    stack = [(message, "")]
    while stack:
        msg, path = stack.pop()
        for field, value in msg.ListFields():
            if field.type == field.TYPE_STRING:
                for i, text in enumerate([value] if isinstance(value, (str, bytes)) else value):
                    if not isinstance(text, str):
                        return f"{path}{field.name}" + ("" if isinstance(value, (str, bytes)) else f"[{i}]")
            elif field.type in (field.TYPE_MESSAGE, field.TYPE_GROUP):
                if hasattr(value, "ListFields"):
                    stack.append((value, f"{path}{field.name}."))
                else:
                    stack.extend((m, f"{path}{field.name}[{i}].") for i, m in enumerate(value)
                                 if hasattr(m, "ListFields"))
    return None
