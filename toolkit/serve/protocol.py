"""The KServe v2 inference protocol's tensors, as Triton speaks it: JSON bodies with tensors as
flat lists, and the binary tensor data extension (a JSON header of ``Inference-Header-Content-
Length`` bytes followed by the raw tensors in the order the header lists them).

BYTES tensors (Triton's strings) come in as numpy object arrays of ``bytes``: in binary, each
element is a 4-byte little-endian length and that many bytes; in JSON, a string. Encoded image
files travel this way. An output asked for with ``"parameters": {"classification": K}`` is
answered as Triton's classification extension answers it: per example, the K highest values as
BYTES strings ``"VALUE:INDEX:LABEL"`` (``":LABEL"`` only where the class has a name), VALUE
written with nine decimals as Triton writes it, shape [N, min(K, C)].

Every malformed request raises BadRequest with a message naming what is wrong (HTTP 400). JSON
outputs write NaN and the infinities as the strings "NaN", "Infinity" and "-Infinity".
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import numpy as np

HEADER_LENGTH = "inference-header-content-length"

# v2 datatype <-> numpy; BF16 and BYTES have no numpy counterpart the toolkit's nets take
DATATYPES = {"BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32,
             "UINT64": np.uint64, "INT8": np.int8, "INT16": np.int16, "INT32": np.int32,
             "INT64": np.int64, "FP16": np.float16, "FP32": np.float32, "FP64": np.float64}
NAME_OF = {np.dtype(t): name for name, t in DATATYPES.items()}
MAX_DIMS = 32                     # numpy 1.x's limit (2.x takes 64); no net takes more
BYTES = "BYTES"
MAX_BYTES_ELEMENTS = 1 << 16      # BYTES elements of one input: each is a Python object to make


class BadRequest(Exception):
    """A request the protocol or the model cannot take: HTTP 400 with this message."""


def datatype_of(dtype) -> str:
    if np.dtype(dtype) == np.dtype(object):
        return BYTES
    try:
        return NAME_OF[np.dtype(dtype)]
    except KeyError:
        raise ValueError(f"dtype {dtype} has no KServe v2 datatype") from None


@dataclass
class InferRequest:
    id: str | None
    inputs: dict[str, np.ndarray]
    outputs: list[str] | None                     # None: every output
    binary_outputs: set[str] | None = field(default_factory=set)   # None: every output in binary
    classification: dict[str, int] = field(default_factory=dict)   # output -> K, its top K as strings


def _json_header(body: bytes, header_length: str | None) -> tuple[dict, bytes]:
    if header_length is None:
        json_part, binary = body, b""
    else:
        try:
            n = int(header_length)
        except ValueError:
            raise BadRequest(f"Inference-Header-Content-Length is not a number: {header_length!r}") from None
        if not 0 <= n <= len(body):
            raise BadRequest(f"Inference-Header-Content-Length {n} is outside the body's {len(body)} bytes")
        json_part, binary = body[:n], body[n:]
    try:
        doc = json.loads(json_part)
    except (ValueError, UnicodeDecodeError) as e:
        raise BadRequest(f"the request body is not valid JSON: {e}") from None
    except RecursionError:
        raise BadRequest("the request body's JSON nests too deeply") from None
    if not isinstance(doc, dict):
        raise BadRequest("the request body must be a JSON object with an \"inputs\" list")
    return doc, binary


def _tensor_from_json(name: str, shape: list[int], dtype, data) -> np.ndarray:
    count = math.prod(shape)                  # exact: a product past int64 must not wrap to a small one
    try:
        with np.errstate(over="ignore"):     # 1e300 as FP32 is inf, as a cast makes it; no warning in the log
            arr = np.asarray(data, dtype=dtype)
    except (TypeError, ValueError, OverflowError, RecursionError):
        raise BadRequest(f"input '{name}': \"data\" does not hold {np.dtype(dtype).name} values") from None
    if arr.size != count:
        raise BadRequest(f"input '{name}': \"data\" has {arr.size} values, shape {shape} needs {count}")
    return arr.reshape(shape)


def _bytes_from_binary(name: str, shape: list[int], raw: memoryview) -> np.ndarray:
    """BYTES elements of the binary extension: each a 4-byte little-endian length, then its bytes."""
    count = math.prod(shape)
    if count > MAX_BYTES_ELEMENTS:
        raise BadRequest(f"input '{name}': {count} BYTES elements, at most {MAX_BYTES_ELEMENTS} are taken")
    if count * 4 > len(raw):                  # before allocating: each element takes 4 bytes at least
        raise BadRequest(f"input '{name}': {len(raw)} bytes cannot hold the {count} BYTES elements of shape {shape}")
    out = np.empty(count, dtype=object)
    at = 0
    for i in range(count):
        if at + 4 > len(raw):
            raise BadRequest(f"input '{name}': its binary data ends inside element {i}'s length")
        size = int.from_bytes(raw[at:at + 4], "little")
        if at + 4 + size > len(raw):
            raise BadRequest(f"input '{name}': element {i} says {size} bytes, {len(raw) - at - 4} are left")
        out[i] = bytes(raw[at + 4:at + 4 + size])
        at += 4 + size
    if at != len(raw):
        raise BadRequest(f"input '{name}': {len(raw) - at} bytes of binary data after its {count} BYTES elements")
    return out.reshape(shape)


def _bytes_from_json(name: str, shape: list[int], data) -> np.ndarray:
    """BYTES elements given as JSON: a flat list of strings (as Triton's clients send them)."""
    count = math.prod(shape)
    if count > MAX_BYTES_ELEMENTS:
        raise BadRequest(f"input '{name}': {count} BYTES elements, at most {MAX_BYTES_ELEMENTS} are taken")
    if not isinstance(data, list) or not all(isinstance(v, str) for v in data):
        raise BadRequest(f"input '{name}': \"data\" of a BYTES input is a flat list of strings")
    if len(data) != count:
        raise BadRequest(f"input '{name}': \"data\" has {len(data)} values, shape {shape} needs {count}")
    out = np.empty(count, dtype=object)
    for i, v in enumerate(data):
        try:
            out[i] = v.encode("utf-8")
        except UnicodeEncodeError:            # a lone surrogate escaped in the JSON ("\udae9"): no UTF-8
            raise BadRequest(f"input '{name}': string {i} of \"data\" is not valid Unicode "
                             "(it holds a lone surrogate)") from None
    return out.reshape(shape)


def _class_count(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BadRequest(f"output '{name}': \"classification\" must be a non-negative integer (how many classes), "
                         f"not {json.dumps(value)[:40]}")
    return value


def decode_request(body: bytes, header_length: str | None) -> InferRequest:
    """The request's tensors as numpy arrays of their declared shape and datatype."""
    doc, binary = _json_header(body, header_length)
    items = doc.get("inputs")
    if not isinstance(items, list) or not items:
        raise BadRequest("the request needs a non-empty \"inputs\" list")
    params = doc.get("parameters") or {}
    if not isinstance(params, dict):
        raise BadRequest("\"parameters\" must be an object")
    inputs: dict[str, np.ndarray] = {}
    offset = 0
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise BadRequest("each input needs a \"name\"")
        name = item["name"]
        if name in inputs:
            raise BadRequest(f"input '{name}' is given twice")
        shape = item.get("shape")
        if (not isinstance(shape, list)
                or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
            raise BadRequest(f"input '{name}': \"shape\" must be a list of non-negative integers")
        if len(shape) > MAX_DIMS:
            raise BadRequest(f"input '{name}': \"shape\" has {len(shape)} dimensions, at most {MAX_DIMS} are taken")
        datatype = item.get("datatype")
        if not isinstance(datatype, str) or (datatype not in DATATYPES and datatype != BYTES):
            known = ", ".join([*DATATYPES, BYTES])
            raise BadRequest(f"input '{name}': datatype {datatype!r} is not one this server takes ({known})")
        iparams = item.get("parameters") or {}
        size = iparams.get("binary_data_size") if isinstance(iparams, dict) else None
        if datatype == BYTES:
            if size is not None:
                if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                    raise BadRequest(f"input '{name}': binary_data_size must be a non-negative integer")
                if offset + size > len(binary):
                    raise BadRequest(f"input '{name}': the body holds {len(binary) - offset} bytes of binary data, "
                                     f"binary_data_size says {size}")
                inputs[name] = _bytes_from_binary(name, shape, memoryview(binary)[offset:offset + size])
                offset += size
            elif "data" in item:
                inputs[name] = _bytes_from_json(name, shape, item["data"])
            else:
                raise BadRequest(f"input '{name}' has neither \"data\" nor binary_data_size")
            continue
        dtype = np.dtype(DATATYPES[datatype])
        if size is not None:
            if not isinstance(size, int) or size < 0:
                raise BadRequest(f"input '{name}': binary_data_size must be a non-negative integer")
            need = math.prod(shape) * dtype.itemsize
            if size != need:
                raise BadRequest(f"input '{name}': binary_data_size {size} bytes, "
                                 f"shape {shape} of {datatype} needs {need}")
            if offset + size > len(binary):
                raise BadRequest(f"input '{name}': the body holds {len(binary) - offset} bytes of binary data, "
                                 f"binary_data_size says {size}")
            arr = np.frombuffer(binary, dtype=dtype, count=size // dtype.itemsize if dtype.itemsize else 0,
                                offset=offset).reshape(shape)
            offset += size
        elif "data" in item:
            arr = _tensor_from_json(name, shape, dtype, item["data"])
        else:
            raise BadRequest(f"input '{name}' has neither \"data\" nor binary_data_size")
        inputs[name] = arr
    if offset != len(binary):
        raise BadRequest(f"the body has {len(binary) - offset} bytes of binary data that no input claims")
    all_binary = bool(params.get("binary_data_output", False))
    outputs, binary_outputs = None, (None if all_binary else set())
    classification: dict[str, int] = {}
    wanted = doc.get("outputs")
    if wanted is not None:
        if not isinstance(wanted, list):
            raise BadRequest("\"outputs\" must be a list")
        outputs, binary_outputs = [], set()
        for out in wanted:
            if not isinstance(out, dict) or not isinstance(out.get("name"), str):
                raise BadRequest("each requested output needs a \"name\"")
            oparams = out.get("parameters") or {}
            if isinstance(oparams, dict) and oparams.get("classification") is not None:
                count = _class_count(out["name"], oparams["classification"])
                if count:
                    classification[out["name"]] = count
            outputs.append(out["name"])
            if (oparams.get("binary_data", all_binary) if isinstance(oparams, dict) else all_binary):
                binary_outputs.add(out["name"])
    rid = doc.get("id")
    return InferRequest(str(rid) if rid is not None else None, inputs, outputs, binary_outputs, classification)


def classify(scores: np.ndarray, count: int, labels: list[str] | None, batched: bool) -> np.ndarray:
    """Triton's classification of an output: per example (each row of the batch axis, or the
    whole tensor without one) the ``count`` highest values, highest first (equal values in index
    order, NaN last), as BYTES "VALUE:INDEX[:LABEL]"; shape [N, min(count, C)] or [min(count, C)]."""
    arr = np.asarray(scores)
    rows = arr.reshape(len(arr) if batched and arr.ndim else 1, -1)
    k = min(count, rows.shape[1])
    keys = rows.astype(np.float64) if rows.dtype.kind in "biuf" else rows
    if keys.dtype.kind == "f":
        keys = np.where(np.isnan(keys), -np.inf, keys)
    order = np.argsort(-keys, axis=1, kind="stable")[:, :k]
    out = np.empty(order.shape, dtype=object)
    for r in range(rows.shape[0]):
        for j, index in enumerate(order[r]):
            value = rows[r, index]
            text = f"{value:.9f}" if rows.dtype.kind == "f" else str(value)
            label = labels[index] if labels is not None and index < len(labels) else None
            out[r, j] = f"{text}:{index}{':' + label if label is not None else ''}".encode("utf-8")
    return out if batched and arr.ndim else out[0]


def _bytes_payload(arr: np.ndarray) -> bytes:
    """BYTES elements in the binary extension's layout: a 4-byte little-endian length, the bytes."""
    parts = []
    for item in arr.reshape(-1):
        raw = item if isinstance(item, bytes) else str(item).encode("utf-8")
        parts += [len(raw).to_bytes(4, "little"), raw]
    return b"".join(parts)


def _binary_names(request: InferRequest, outputs: dict[str, np.ndarray]) -> set[str]:
    return set(outputs) if request.binary_outputs is None else request.binary_outputs


def json_value_count(request: InferRequest, outputs: dict[str, np.ndarray]) -> int:
    """How many values the response writes as JSON (the rest go binary)."""
    binary_names = _binary_names(request, outputs)
    return sum(arr.size for name, arr in outputs.items() if name not in binary_names)


def _json_values(arr: np.ndarray) -> list:
    """The values as a JSON list, NaN and the infinities as the strings proto3's JSON form uses
    for them (bare NaN is not JSON); numpy, and so Triton's clients, read those strings back."""
    flat = arr.reshape(-1)
    if flat.dtype == object:                  # BYTES: strings
        return [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in flat]
    if flat.dtype.kind != "f" or np.isfinite(flat).all():
        return flat.tolist()
    values = flat.astype(object)
    values[np.isnan(flat)] = "NaN"
    values[flat == np.inf] = "Infinity"
    values[flat == -np.inf] = "-Infinity"
    return values.tolist()


def encode_response(model: str, request: InferRequest, outputs: dict[str, np.ndarray]) -> tuple[bytes, dict[str, str]]:
    """The body and headers of an infer response; binary where the request asked for it."""
    binary_names = _binary_names(request, outputs)
    entries, chunks = [], []
    for name, arr in outputs.items():
        arr = np.ascontiguousarray(arr)
        entry = {"name": name, "datatype": datatype_of(arr.dtype), "shape": list(arr.shape)}
        if name in binary_names:
            raw = _bytes_payload(arr) if arr.dtype == object else arr.tobytes()
            entry["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            entry["data"] = _json_values(arr)
        entries.append(entry)
    doc = {"model_name": model, "model_version": "1", "outputs": entries}
    if request.id is not None:
        doc["id"] = request.id
    head = json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()
    if not chunks:
        return head, {"content-type": "application/json"}
    return head + b"".join(chunks), {"content-type": "application/octet-stream",
                                     HEADER_LENGTH: str(len(head))}
