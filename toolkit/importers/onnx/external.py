"""Tensors of an ONNX model that keep their bytes in files beside it (``torch.onnx.export`` writes
``model.onnx`` and ``model.onnx.data`` by default), read into the ModelProto so that nothing after
it sees external data. Every such tensor is found (initializers, tensors in node attributes such as
a Constant's value, in If/Loop/Scan bodies and in functions) and checked before any file is opened
for reading or any byte allocated: its file named relative to the model's folder without ``..``,
a regular file reached through no symbolic link, its offset and length decimal numbers that fit in
the file, its dims and type giving exactly that many bytes; and all of them together no more bytes
than their files hold. Each file is then opened once and only the tensors' ranges are read.

ONNX's own loader (``onnx.load_external_data_for_model``) follows whatever path a model names; the
model file is the user's, but where it points is not to be trusted."""
from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass

from ...errors import UserError

EXTERNAL = 1                        # TensorProto.EXTERNAL

# bits per element of each TensorProto data type that can be stored as raw bytes (STRING cannot)
ELEMENT_BITS = {1: 32, 2: 8, 3: 8, 4: 16, 5: 16, 6: 32, 7: 64, 9: 8, 10: 16, 11: 64, 12: 32, 13: 64, 14: 64,
                15: 128, 16: 16, 17: 8, 18: 8, 19: 8, 20: 8, 21: 4, 22: 4, 23: 4, 24: 8, 25: 2, 26: 2}

_DECIMAL = re.compile(r"[0-9]{1,20}")
_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


@dataclass
class _Read:
    tensor: object                  # the TensorProto to fill
    what: str                       # how messages name it
    location: str
    offset: int
    nbytes: int


@dataclass(frozen=True)
class DataFile:
    """A data file as it was checked: its location relative to the model's folder and its identity,
    so that a file replaced between the check and the read is caught, and a cached model whose
    data changed is read again."""
    location: str
    device: int
    inode: int
    size: int
    mtime_ns: int


def inline_external_data(model, path: str) -> tuple[DataFile, ...]:
    """Every tensor of ``model`` (read from ``path``) that keeps its data in another file gets
    those bytes as its raw data, in place; the data files read, in the order first named."""
    folder = os.path.realpath(os.path.dirname(os.path.abspath(path)))
    reads: list[_Read] = []
    files: dict[str, DataFile] = {}
    for tensor, what in _tensors(model):
        if tensor.data_location != EXTERNAL:
            continue
        read = _planned(tensor, what, path, folder, files)
        reads.append(read)
    if not reads:
        return ()
    # tensors may share bytes, but all of them together may not ask for more than their files
    # hold: a few lines of a model must not make the reader allocate without bound
    wanted = sum(r.nbytes for r in reads)
    held = sum({(f.device, f.inode): f.size for f in files.values()}.values())      # a file named twice counts once
    if wanted > held:
        raise UserError(f"{path}: its {len(reads)} tensors with external data ask for {wanted:,} bytes, more than "
                        f"the {held:,} their {len(files)} data file(s) hold")
    by_file: dict[str, list[_Read]] = {}
    for r in reads:
        by_file.setdefault(r.location, []).append(r)
    for location, group in by_file.items():
        _read_into(path, folder, files[location], group)
    return tuple(files.values())


def _tensors(model):
    """(TensorProto, how to name it) for every tensor the model holds, subgraphs included."""
    graphs = [(model.graph, "")]
    for function in model.functions:
        yield from _node_tensors(function.node, f" in function '{_shown(function.name)}'", graphs)
    while graphs:
        graph, where = graphs.pop()
        for init in graph.initializer:
            yield init, f"initializer '{_shown(init.name)}'{where}"
        for sparse in graph.sparse_initializer:
            yield sparse.values, f"sparse initializer '{_shown(sparse.values.name)}'{where}"
            yield sparse.indices, f"the indices of sparse initializer '{_shown(sparse.values.name)}'{where}"
        yield from _node_tensors(graph.node, where, graphs)


def _node_tensors(nodes, where: str, graphs: list):
    """The tensors in ``nodes``' attributes; their subgraphs are added to ``graphs``."""
    for node in nodes:
        name = _shown(node.name or (node.output[0] if node.output else node.op_type))
        for a in node.attribute:
            what = f"{_shown(node.op_type)} node '{name}' attribute '{_shown(a.name)}'{where}"
            if a.HasField("t"):
                yield a.t, what
            for t in a.tensors:
                yield t, what
            for s in ([a.sparse_tensor] if a.HasField("sparse_tensor") else []) + list(a.sparse_tensors):
                yield s.values, what
                yield s.indices, what
            for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                graphs.append((g, f" in the body '{_shown(g.name)}' of {_shown(node.op_type)} node '{name}'{where}"))


def _planned(tensor, what: str, path: str, folder: str, files: dict[str, DataFile]) -> _Read:
    """The read of one tensor, every number and the file checked; ``files`` gains its file."""
    entries = {e.key: e.value for e in tensor.external_data}
    location = entries.get("location", "")
    if not location:
        raise UserError(f"{path}: {what} keeps its data in another file but names none (no 'location')")
    _check_location(location, what, path)
    location = "/".join(p for p in re.split(r"[/\\]", location) if p not in ("", "."))   # one name per file
    numbers = {}
    for key in ("offset", "length"):
        if key in entries:
            if not _DECIMAL.fullmatch(entries[key]):
                raise UserError(f"{path}: {what}: its external data's {key} '{_shown(entries[key], 40)}' is not a "
                                "non-negative whole number")
            numbers[key] = int(entries[key])
    if location not in files:
        files[location] = _identify(path, folder, location, what)
    size, shown = files[location].size, _shown(location)
    offset = numbers.get("offset", 0)
    if offset > size:
        raise UserError(f"{path}: {what}: its data starts at byte {offset:,} of '{shown}', which holds only "
                        f"{size:,} bytes")
    length = numbers.get("length", size - offset)
    if offset + length > size:
        raise UserError(f"{path}: {what}: its data is {length:,} bytes at offset {offset:,} of '{shown}', which "
                        f"holds only {size:,} bytes")
    nbytes = _tensor_bytes(tensor, what, path, limit=size)
    if nbytes != length:
        said = f"{length:,} bytes long" if "length" in numbers else \
            f"the {length:,} bytes from offset {offset:,} to the file's end (it gives no length)"
        raise UserError(f"{path}: {what}: its dims {list(tensor.dims)} need {_said_bytes(nbytes)}, but its external "
                        f"data in '{shown}' is {said}")
    return _Read(tensor, what, location, offset, nbytes)


def _shown(text: str, limit: int = 200) -> str:
    """A name from the model as a message shows it: on one line (control characters escaped) and
    cut at ``limit`` characters."""
    text = text if len(text) <= limit else text[:limit] + "..."
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


def _said_bytes(n: int | None) -> str:
    return "more bytes than the file holds" if n is None else f"{n:,} bytes"


def type_name(elem_type: int) -> str:
    """An ONNX element type's name (``float``, ``int8``, ...) for messages."""
    from onnx import TensorProto
    try:
        return TensorProto.DataType.Name(elem_type).lower()
    except ValueError:
        return f"number {elem_type}"


def _tensor_bytes(tensor, what: str, path: str, limit: int) -> int | None:
    """The bytes ``tensor``'s dims and type take; None where that exceeds ``limit`` (counted
    no further, so that no dims, however large, cost more than a comparison)."""
    bits = ELEMENT_BITS.get(tensor.data_type)
    if bits is None:
        raise UserError(f"{path}: {what} is {type_name(tensor.data_type)}, which is not read from another file "
                        "here")
    if any(d < 0 for d in tensor.dims):
        raise UserError(f"{path}: {what} has a negative dimension in its dims {list(tensor.dims)}")
    elements = 1
    for d in tensor.dims:
        elements *= d
        if elements == 0:
            return 0
        if elements * bits > 8 * limit:
            return None
    return (elements * bits + 7) // 8


def _check_location(location: str, what: str, path: str) -> None:
    """A location is a relative path inside the model's folder: no absolute path, no '..', no NUL."""
    if "\0" in location:
        raise UserError(f"{path}: {what} names its data file with a NUL character in it")
    shown = _shown(location)
    if os.path.isabs(location) or location.startswith(("/", "\\")) or re.match(r"[A-Za-z]:", location):
        raise UserError(f"{path}: {what} keeps its data in '{shown}', an absolute path; a data file is named "
                        "relative to the model's folder")
    if ".." in re.split(r"[/\\]", location):
        raise UserError(f"{path}: {what} keeps its data in '{shown}', outside the model's folder; a data file lies "
                        "in the model's folder or below it, named without '..'")


def _open(path: str, folder: str, location: str, what: str) -> tuple[int, os.stat_result]:
    """The file at ``location`` under ``folder`` opened for reading, with its status: each folder
    on the way opened without following a link (so that nothing swapped in while it is opened
    leads elsewhere), the file's kind checked before it is opened (a FIFO or device is never
    opened), and the opened file checked to be the one whose kind was checked."""
    parts = [p for p in re.split(r"[/\\]", location) if p not in ("", ".")]
    shown = _shown(location)
    if not parts:
        raise UserError(f"{path}: {what} keeps its data in '{shown}', which is the model's folder, not a file")
    nofollow = getattr(os, "O_NOFOLLOW", 0)
    flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
    try:
        parent = os.open(folder, flags | getattr(os, "O_DIRECTORY", 0))
    except OSError as e:
        raise UserError(f"{path}: cannot read the model's folder: {e.strerror}") from None
    try:
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            here = _shown("/".join(parts[:i + 1]))
            try:
                st = os.stat(part, dir_fd=parent, follow_symlinks=False)
            except FileNotFoundError:
                raise UserError(f"{path}: {what} keeps its data in '{shown}', and there is no '{here}' in the model's "
                                "folder") from None
            except OSError as e:
                raise UserError(f"{path}: {what}: cannot read its data file '{shown}': {e.strerror}") from None
            wanted = stat.S_ISREG if last else stat.S_ISDIR
            if not wanted(st.st_mode):
                kind = next((name for test, name in _KINDS if test(st.st_mode)), "not a regular file")
                whose = "" if last else f" (on the way, '{here}')"
                raise UserError(f"{path}: {what} keeps its data in '{shown}'{whose}, which is {kind}; a data file is "
                                "a regular file in the model's folder, reached through no link")
            try:
                fd = os.open(part, flags | nofollow | (os.O_NONBLOCK if last else getattr(os, "O_DIRECTORY", 0)),
                             dir_fd=parent)
            except OSError as e:
                raise UserError(f"{path}: {what}: cannot read its data file '{shown}': {e.strerror}") from None
            opened = os.fstat(fd)
            os.close(parent)
            parent = fd
            if (opened.st_dev, opened.st_ino) != (st.st_dev, st.st_ino):
                raise UserError(f"{path}: {what}: its data file '{shown}' changed while it was opened")
        return parent, opened
    except BaseException:
        os.close(parent)
        raise


def _identify(path: str, folder: str, location: str, what: str) -> DataFile:
    fd, st = _open(path, folder, location, what)
    os.close(fd)
    return DataFile(location, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _read_into(path: str, folder: str, checked: DataFile, group: list[_Read]) -> None:
    """The ranges ``group`` asks for, read from the file at ``checked.location`` opened once (still
    the file that was checked), each set as its tensor's raw data."""
    fd, st = _open(path, folder, checked.location, group[0].what)
    try:
        if (st.st_dev, st.st_ino, st.st_size) != (checked.device, checked.inode, checked.size):
            raise UserError(f"{path}: its data file '{_shown(checked.location)}' changed while the model was read")
        for r in group:
            data = _read_exactly(fd, r.offset, r.nbytes)
            if len(data) != r.nbytes:
                raise UserError(f"{path}: {r.what}: its data file '{_shown(checked.location)}' ended early (it "
                                "shrank while the model was read)")
            r.tensor.raw_data = data
            del r.tensor.external_data[:]
            r.tensor.data_location = 0         # DEFAULT: the bytes are in the tensor now
    except OSError as e:
        raise UserError(f"{path}: cannot read its data file '{_shown(checked.location)}': {e.strerror}") from None
    finally:
        os.close(fd)


def _read_exactly(fd: int, offset: int, n: int) -> bytes:
    """``n`` bytes from ``offset`` (fewer only at the file's end): one read may return less."""
    chunks, done = [], 0
    while done < n:
        chunk = os.pread(fd, min(n - done, 1 << 30), offset + done)
        if not chunk:
            break
        chunks.append(chunk)
        done += len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)
