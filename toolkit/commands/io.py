"""The commands' input arrays, named by ``--input [NAME=]FILE``, and their output arrays.

Inputs are opened as streams (``open_inputs``) of toolkit.arrayfiles readers: an .npy, a stored
.npz member, a CSV and a folder of images are read a range of rows at a time, so that an input far
larger than memory runs through ``toolkit infer`` chunk by chunk; ``read_inputs`` reads them whole."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator, Mapping

import numpy as np

from ..arrayfiles import (
    IMAGE_SUFFIXES,
    CsvRows,
    ImageRows,
    Rows,
    check_file,
    image_files,
    image_layout,
    open_npy,
    open_npz,
    unsupported_format,
)
from ..errors import UserError
from ..fileio import atomic_write

_INPUT_FORMATS = ".npy, .npz, .csv or an image"
# The names a label column has in training data: Caffe's label top, and what `toolkit data` names
# the column of a zoo net's label input. Such a column of a CSV whose examples would otherwise not
# fit is left out where no input of the net is named so (a deploy net reads the features only).
LABEL_NAMES = ("label",)


class _Reshaped(Rows):
    """A CSV's rows in the input's example shape when the sizes agree (64 columns feed [N, 1, 8, 8]),
    without the columns ``dropped`` (the label column of training data)."""

    def __init__(self, table: Rows, example: tuple, path: str, dropped: tuple[int, ...] = ()):
        self.table, self.rows, self.dtype, self.dropped = table, table.rows, table.dtype, list(dropped)
        kept = (table.row_shape[0] - len(self.dropped),)
        self.row_shape = _fit_example(kept, example, path)

    def read(self, start: int, stop: int) -> np.ndarray:
        rows = self.table.read(start, stop)
        if self.dropped:
            rows = np.delete(rows, self.dropped, axis=1)
        return rows.reshape((stop - start,) + self.row_shape)

    def close(self) -> None:
        self.table.close()


def _fit_example(row_shape: tuple, example: tuple, path: str) -> tuple:
    if not example or not all(isinstance(d, int) for d in example) or row_shape == example:
        return row_shape
    if int(np.prod(row_shape)) != int(np.prod(example)):
        raise UserError(f"{path}: examples of shape {list(row_shape)} do not fit the input's {list(example)}")
    return example


# ---------------------------------------------------------------------------------------------
# Inputs: the pieces of each input, stacked along the batch, read in step
# ---------------------------------------------------------------------------------------------

class _InputRows:
    """One input: its pieces (several CSVs or images stacked, or one array) as one row range."""

    def __init__(self, pieces: list[tuple[Rows, str]]):
        self.pieces = pieces           # (piece, the path it came from)

    @property
    def rows(self) -> int | None:
        if any(p.rows is None for p, _ in self.pieces):
            return None
        return sum(p.rows for p, _ in self.pieces)

    @property
    def shape(self) -> tuple:
        piece = self.pieces[0][0]
        return piece.row_shape if self.rows is None else (self.rows,) + tuple(piece.row_shape)

    def read(self, start: int, stop: int) -> np.ndarray:
        if self.rows is None:
            return self.pieces[0][0].read(0, 0)
        parts, base = [], 0
        for piece, _ in self.pieces:
            lo, hi = max(start - base, 0), min(stop - base, piece.rows)
            if lo < hi:
                parts.append(piece.read(lo, hi))
            base += piece.rows
        if not parts:
            return self.pieces[0][0].read(0, 0)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)


class InputStream:
    """The inputs of a run, read together a range of rows at a time (``chunks``) or whole
    (``read_all``). Close it (or use ``with``) to close the files it holds open."""

    def __init__(self, inputs: dict[str, _InputRows]):
        self.inputs = inputs

    def __enter__(self) -> "InputStream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for rows in self.inputs.values():
            for piece, _ in rows.pieces:
                piece.close()

    def shapes(self) -> dict[str, tuple]:
        """Each input's whole shape (rows first), as read_inputs would give it."""
        return {name: rows.shape for name, rows in self.inputs.items()}

    def dtypes(self) -> dict[str, np.dtype]:
        return {name: rows.pieces[0][0].dtype for name, rows in self.inputs.items()}

    @property
    def rows(self) -> int | None:
        """The rows every input has (checked by ``check_rows``); None if some input has no batch axis."""
        counts = [r.rows for r in self.inputs.values()]
        return None if not counts or None in counts else max(counts)

    def check_rows(self) -> None:
        """Inputs read in step must have as many rows each."""
        counts = {name: r.rows for name, r in self.inputs.items()}
        if len(set(counts.values())) > 1:
            said = ", ".join(f"'{name}' {n} ({', '.join(dict.fromkeys(p for _, p in self.inputs[name].pieces))})"
                             for name, n in counts.items())
            raise UserError(f"the inputs have different numbers of rows: {said}; they are read row by row "
                            "together, so they must match")

    def read(self, start: int, stop: int) -> dict[str, np.ndarray]:
        return {name: rows.read(start, stop) for name, rows in self.inputs.items()}

    def row_names(self) -> list[str] | None:
        """The file name of each row where an input's rows are image files (one image, one
        row), else None (rows are then numbered)."""
        for rows in self.inputs.values():
            pieces = [piece for piece, _ in rows.pieces]
            if pieces and all(isinstance(piece, ImageRows) for piece in pieces):
                return [Path(p).name if len(pieces) == 1 and len(pieces[0].paths) > 1 else str(p)
                        for piece in pieces for p in piece.paths]
        return None

    def read_all(self) -> dict[str, np.ndarray]:
        return {name: rows.read(0, rows.rows or 0) for name, rows in self.inputs.items()}

    def chunks(self, size: int | None) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
        """(rows, arrays) for ``size`` rows at a time, in step across the inputs; everything at once
        when ``size`` is None or some input has no batch axis. An input without rows still gives
        one (empty) chunk, so that the run says what is wrong with it."""
        total = self.rows
        if size is None or total is None:
            yield (total or 0), self.read_all()
            return
        self.check_rows()
        start = 0
        while start < total or start == 0:
            stop = min(start + size, total)
            yield stop - start, self.read(start, stop)
            if stop == total:
                return
            start = stop


def open_inputs(specs: list[str], needed: list[str], all_inputs: list[str],
                shapes: dict[str, tuple] | None = None, drop_columns: set[str] = frozenset(),
                image_reader=None, note=None) -> InputStream:
    """``[NAME=]FILE`` items -> an InputStream of the needed inputs. An unnamed file goes to the
    only needed input; an .npz gives arrays by name (arrays for inputs this phase does not use are
    ignored); a folder gives its images in the order of their names. Images and CSV rows are
    stacked along the batch when the same input is given several times; their examples take the
    input's shape when the sizes agree (a 64-column row feeds [N, 1, 8, 8]). Headers and names are
    checked here; rows are read when asked for. A CSV column whose header names one of
    ``drop_columns`` (the label column of training data) is left out; so is one named as a label
    is (LABEL_NAMES) but no input, when its examples fit only without it, and an .npz array that
    names no input when the others give every needed input: each said by ``note`` (a function of
    one line), as the net's inputs are not what the file was written for. ``image_reader`` (an
    InputTransform's: (name, layout) -> (the layout read, path -> array)) reads image files as the
    input transform resizes and crops them; without it they are warped to the input's size."""
    shapes = shapes or {}
    note = note or (lambda line: None)
    labels = frozenset(LABEL_NAMES) - set(all_inputs)
    arrays: dict[str, _InputRows] = {}
    stacked: dict[str, list[tuple[Rows, str]]] = {}
    opened: list[Rows] = []
    try:
        for spec in specs:
            name, sep, path = spec.partition("=")
            if not sep:
                name, path = "", spec
            if Path(path).suffix == ".npz" and not Path(path).is_dir():
                loaded = open_npz(path)
                opened.extend(loaded.values())
                if name:
                    if name not in loaded:
                        raise UserError(f"{path}: has no array '{name}' (it has: {', '.join(loaded) or 'none'})")
                    loaded = {name: loaded[name]}
                loaded = _named_inputs(loaded, path, needed, all_inputs, note)
                for key, piece in loaded.items():
                    if key in needed:
                        if key in arrays or key in stacked:
                            raise UserError(f"--input {spec}: input '{key}' is given twice")
                        arrays[key] = _InputRows([(piece, path)])
                continue
            if not name:
                if len(needed) != 1:
                    raise UserError(f"{path}: say which input it is (NAME={path}); the net needs "
                                    f"{', '.join(needed)}")
                name = needed[0]
            if name not in all_inputs:
                raise UserError(f"--input {spec}: the net has no input '{name}' (inputs: {', '.join(all_inputs)})")
            if name not in needed:
                continue
            folder = Path(path).is_dir()
            if not folder:
                check_file(path)
            stacks = folder or Path(path).suffix.lower() in (".csv",) + IMAGE_SUFFIXES
            if name in arrays or (name in stacked and not stacks):
                raise UserError(f"--input {spec}: input '{name}' is given twice")
            piece = _open_file(path, name, shapes.get(name, ()), folder, drop_columns, image_reader, labels, note)
            opened.append(piece)
            if not stacks:
                arrays[name] = _InputRows([(piece, path)])
                continue
            earlier = stacked.setdefault(name, [])
            if earlier and tuple(earlier[0][0].row_shape) != tuple(piece.row_shape):
                raise UserError(f"--input {spec}: its examples have shape {list(piece.row_shape)}, the ones "
                                f"before it for input '{name}' {list(earlier[0][0].row_shape)}")
            earlier.append((piece, path))
        for name, pieces in stacked.items():
            arrays[name] = _InputRows(pieces)
        missing = [n for n in needed if n not in arrays]
        if missing:
            raise UserError(f"no array given for input {', '.join(repr(m) for m in missing)}")
    except BaseException:
        for piece in opened:
            piece.close()
        raise
    return InputStream({n: arrays[n] for n in arrays})


def _named_inputs(loaded: dict, path: str, needed: list[str], all_inputs: list[str], note) -> dict:
    """An .npz's arrays less those that name no input of the net, left out (and said) only when
    the others give every needed input: else the first such name is the mistake (a misspelt
    input), as the missing input would be."""
    strangers = [key for key in loaded if key not in all_inputs]
    if strangers and any(n not in loaded for n in needed):
        raise UserError(f"{path}: array '{strangers[0]}' matches no input of the net "
                        f"(inputs: {', '.join(all_inputs)})")
    for key in strangers:
        note(f"note: {path}: left out array '{key}': no input of the net is named so")
    return {key: piece for key, piece in loaded.items() if key not in strangers}


def _label_columns(table: CsvRows, dropped: tuple, example: tuple, labels: frozenset) -> tuple:
    """The columns of ``table`` named as a label is (``labels``: no input's name) that stand
    between its examples and the input's ``example`` shape: those whose leaving out makes the rest
    fit it exactly; none where that is not so (another column, or none, is the misfit)."""
    if not table.header or not example or not all(isinstance(d, int) for d in example):
        return ()
    found = tuple(i for i, column in enumerate(table.header) if column in labels and i not in dropped)
    kept = table.columns - len(dropped)
    if not found or kept == int(np.prod(example)) or kept - len(found) != int(np.prod(example)):
        return ()
    return found


def _open_file(path: str, name: str, shape: tuple, folder: bool, drop_columns=frozenset(), image_reader=None,
               labels: frozenset = frozenset(), note=None) -> Rows:
    """The rows for input ``name`` of ``shape`` from a file other than an .npz, or from a folder of
    images (``labels``, ``note``: see open_inputs)."""
    suffix = Path(path).suffix
    if folder:
        layout = image_layout(path, name, shape)
        paths = image_files(path)
        if not paths:
            raise UserError(f"{path}: the folder has no image files ({', '.join(IMAGE_SUFFIXES)})")
        return ImageRows(paths, *(image_reader(name, layout) if image_reader else (layout,)))
    if suffix.lower() == ".csv":
        table = CsvRows(path)
        dropped = tuple(i for i, column in enumerate(table.header or ()) if column in drop_columns)
        left_out = _label_columns(table, dropped, tuple(shape[1:]), labels)
        for i in left_out:
            note(f"note: {path}: left out column '{table.header[i]}': no input of the net is named so")
        dropped = tuple(sorted(dropped + left_out))
        try:
            return _Reshaped(table, tuple(shape[1:]), path, dropped)
        except BaseException:
            table.close()
            raise
    if suffix.lower() in IMAGE_SUFFIXES:
        layout = image_layout(path, name, shape)
        return ImageRows([path], *(image_reader(name, layout) if image_reader else (layout,)))
    if suffix != ".npy":
        raise unsupported_format(path, "input", _INPUT_FORMATS)
    return open_npy(path)


def read_inputs(specs: list[str], needed: list[str], all_inputs: list[str],
                shapes: dict[str, tuple] | None = None) -> dict[str, np.ndarray]:
    """``[NAME=]FILE`` items -> whole arrays by input name (see ``open_inputs``)."""
    with open_inputs(specs, needed, all_inputs, shapes) as stream:
        return stream.read_all()


def check_output_path(path: str, outputs: list[str] | None = None) -> None:
    """The --output mistakes that can be found before anything runs (``outputs``: the output
    names, once known)."""
    target = Path(path)
    if target.suffix not in (".npz", ".npy", ".csv"):
        raise UserError(f"--output {path}: use a .npz, .npy or .csv file name")
    if outputs is not None and target.suffix == ".npy" and len(outputs) != 1:
        raise UserError(f"--output {path}: a .npy file holds one array, the net has {len(outputs)} outputs "
                        f"({', '.join(outputs)}); use .npz")
    if not target.parent.exists():
        raise UserError(f"--output {path}: folder {target.parent} does not exist")


def write_outputs(path: str, outputs: Mapping[str, np.ndarray]) -> None:
    """Atomic write of .npz (keyed by output name) or .npy (exactly one output)."""
    target = Path(path)
    check_output_path(path, list(outputs))
    if target.suffix == ".csv":
        raise UserError(f"--output {path}: CSV is written by `toolkit infer` (write_csv_outputs)")

    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:
            if target.suffix == ".npy":
                np.save(f, next(iter(outputs.values())))
            else:
                np.savez(f, **outputs)
    atomic_write(target, write)


def write_csv_outputs(path: str, outputs: Mapping[str, np.ndarray], row_names: list[str] | None,
                      classes: list[str] | None, top: int = 1) -> None:
    """One row per example: ``file`` (the image it came from) or ``row`` (its number), then each
    output: a value per example as one column; a row of class scores ([N, C], or [N, C, 1, 1] of
    a net that ends in global pooling) as its best class, the class's name where names are known
    (a labels file, or an image folder's subfolders) and its score, or with ``top`` K > 1 as K
    such triples, best first (``prob_top1_class``, ...); any other shape is refused (write .npz)."""
    import csv
    import io

    from ..arrayfiles.labels import score_width, top_k
    rows = {len(v) for v in outputs.values() if np.ndim(v) >= 1}
    if len(rows) != 1 or any(np.ndim(v) == 0 for v in outputs.values()):
        raise UserError(f"--output {path}: a CSV holds one row per example, and the outputs do not share their "
                        "first axis; use .npz")
    n = rows.pop()
    header = ["file" if row_names else "row"]
    columns = [row_names if row_names else list(range(n))]
    for name, value in outputs.items():
        value = np.asarray(value)
        width = score_width(value.shape) if value.dtype.kind == "f" else None
        if value.ndim >= 1 and value.size == n:
            header.append(name)
            columns.append(value.reshape(n).tolist())
        elif width is not None:
            best, scores = top_k(value, top)
            names = classes if classes and len(classes) == width else None
            for rank in range(best.shape[1]):
                prefix = name if top == 1 else f"{name}_top{rank + 1}"
                header += [f"{prefix}_class"] + ([f"{prefix}_name"] if names else []) + [f"{prefix}_score"]
                columns += [best[:, rank].tolist()] + ([[names[i] for i in best[:, rank]]] if names else []) + \
                    [scores[:, rank].tolist()]
        else:
            raise UserError(f"--output {path}: output '{name}' has shape {list(value.shape)}, which is not one value "
                            "or one row of class scores per example; use .npz")
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(zip(*columns))
    atomic_write(Path(path), lambda tmp: Path(tmp).write_text(text.getvalue()))


def net_inputs(net, weights: str | None = None) -> list[tuple[str, str]]:
    """The files a command that loads ``net`` reads: the net file, its bases, the weights, the
    mean image its transform names (as (what, path) pairs, for ``refuse_own_inputs``)."""
    files = [("the net file", net.files[0])] + [("a base of the net", f) for f in net.files[1:]]
    if weights:
        files.append(("the weights file", weights))
    from ..training.data import mean_file_of
    mean = mean_file_of(net)
    if mean is not None:
        files.append(("the mean file", mean))
    return files
