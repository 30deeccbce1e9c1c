"""The kinds of caffe.proto's fields that the importer reads, by field name, checked over a parsed
prototxt or solver before anything reads it: a message where a number belongs (``lr_mult { }``),
a word where a number belongs (``num_output: abc``), or an integer beyond what its field holds
(a uint32 of 2**40) is a Problem at its place, as protobuf's own text parser would refuse it,
rather than a value the importer trips over later.

Caffe names a field the same way wherever it occurs, with the same kind, so one table by name
serves every message; where two messages give one name different integer types, the wider range
is taken. Fields not named here are left to the importer: ``type`` (a string, or a V1 enum),
``param`` (a message, or a V1 string) and ``layer`` (a message, or a Python layer's class).
"""
from __future__ import annotations

from .prototxt import Field, Ident, Message

_INT32 = (-(1 << 31), (1 << 31) - 1)
_UINT32 = (0, (1 << 32) - 1)
_INT64 = (-(1 << 63), (1 << 63) - 1)

_FLOATS = """
    alpha base base_lr beta clip_gradients coeff decay_mult delta dropout_ratio eps gamma k loss_weight lr_mult
    max mean mean_value min momentum momentum2 moving_average_fraction negative_slope power rms_decay scale
    shift std threshold value weight_decay blobs_lr weight_decay_mult""".split()
_UINT32S = """
    batch_size concat_dim crop_size dilation group kernel_h kernel_size kernel_w local_size new_height
    new_width num_output offset pad pad_h pad_w prefetch pyramid_height slice_dim slice_point stride stride_h
    stride_w top_k""".split()
_BLOB_SIZES = "channels height num width".split()   # int32 in BlobProto, uint32 in DummyData and the like
_INT32S = """
    average_loss axis display ignore_label input_dim iter_size max_iter max_level min_level num_axes
    snapshot stepsize stepvalue test_interval test_iter tiles""".split()
_INT64S = "dim random_seed sparse".split()
_BOOLS = """
    across_channels bias_term channel_shared debug_info expose_hidden global_pooling mirror normalize
    normalize_variance propagate_down shuffle snapshot_after_train test_compute_loss test_initialization
    transpose use_global_stats""".split()
_STRINGS = """
    bottom mean_file name net not_stage regularization_type lr_policy source stage top train_net test_net
    snapshot_prefix""".split()
_ENUMS = """
    backend engine norm_region normalization operation phase pool round_mode snapshot_format solver_mode
    solver_type variance_norm""".split()
_MESSAGES = """
    bias_filler exclude filler include input_shape layers shape train_state test_state
    weight_filler""".split()

KINDS: dict[str, object] = {
    **{n: "float" for n in _FLOATS}, **{n: _UINT32 for n in _UINT32S}, **{n: _INT32 for n in _INT32S},
    **{n: _INT64 for n in _INT64S}, **{n: (_INT32[0], _UINT32[1]) for n in _BLOB_SIZES},
    **{n: "enum" for n in _ENUMS}, **{n: "bool" for n in _BOOLS}, **{n: "string" for n in _STRINGS},
    **{n: "message" for n in _MESSAGES}}
_BOOL_WORDS = {"true", "false", "t", "f", "True", "False"}


def _kind_of(name: str):
    if name.endswith("_param"):
        return "message"                    # every XxxParameter of a layer, and net_param's kin
    return KINDS.get(name)


def _said(value) -> str:
    if isinstance(value, Message):
        return "a message { ... }"
    if isinstance(value, Ident):
        return f"the word '{value}'"
    if isinstance(value, str):
        return "a string"
    return f"{value!r}"


def field_problem(f: Field) -> str | None:
    """Why ``f``'s value is not of its field's kind (None when it is, or the field is not known)."""
    kind, value = _kind_of(f.name), f.value
    if kind is None:
        return None
    if kind == "message":
        return None if isinstance(value, Message) else f"{f.name} must be a message {{ ... }}, not {_said(value)}"
    if isinstance(value, Message):
        return f"{f.name} must be a value, not a message {{ ... }}"
    if kind == "enum":
        return None if isinstance(value, Ident) or type(value) is int else \
            f"{f.name} must be one of its enum's names, not {_said(value)}"
    if kind == "string":
        return None if isinstance(value, str) else f"{f.name} must be a string, not {_said(value)}"
    if kind == "bool":
        ok = (isinstance(value, Ident) and value in _BOOL_WORDS) or (type(value) is int and value in (0, 1))
        return None if ok else f"{f.name} must be true or false, not {_said(value)}"
    if kind == "float":
        return None if type(value) in (int, float) else f"{f.name} must be a number, not {_said(value)}"
    low, high = kind
    if type(value) is not int:
        return f"{f.name} must be a whole number, not {_said(value)}"
    if not low <= value <= high:
        return f"{f.name} must be from {low:,} to {high:,} (what the field holds), not {value:,}"
    return None


def field_problems(msg: Message) -> list[tuple[str, Field]]:
    """Every field of ``msg`` and the messages within whose value is not of its kind, in file
    order (the tree's depth is bounded by the parser)."""
    found = []
    for f in msg.fields:
        why = field_problem(f)
        if why is not None:
            found.append((why, f))
        elif isinstance(f.value, Message):
            found += field_problems(f.value)
    return found
