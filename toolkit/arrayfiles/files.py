"""What every reader checks before numpy or PIL reads a byte, and the words of the errors that
all of them share."""
from __future__ import annotations

import contextlib
import csv
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError
from ..fileio import check_regular
from ..hostmem import human_bytes, too_big

NPY_MAGIC = b"\x93NUMPY"
ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")     # an archive with members, an empty one


def check_file(path: str) -> int:
    """The size of the regular file at ``path`` (a folder, FIFO or device is refused before any
    reader opens it, and could not hang one)."""
    return check_regular(path).st_size


def check_fits(where: "Where", shape: tuple, dtype, nbytes: int) -> None:
    """An array of ``nbytes`` is about to be read whole: refused, naming it, when this machine
    could not hold it, before anything of its size is allocated."""
    why = too_big(nbytes)
    if why is not None:
        what = f"array '{where.member}'" if where.member is not None else "its array"
        raise UserError(f"{where.path}: {what} is {human_bytes(nbytes)} (shape [{', '.join(map(str, shape))}], "
                        f"{dtype}), {why}")


def list_folder(path: str) -> list[Path]:
    """A folder's entries, sorted by name."""
    try:
        return sorted(Path(path).iterdir())
    except OSError as e:
        raise UserError(f"{path}: cannot read the folder ({e.strerror})") from None


def unsupported_format(path: str, what: str, choices: str) -> UserError:
    """A suffix the caller has no reader for; ``what`` says whose (weights, input, data)."""
    return UserError(f"{path}: unsupported {what} format '{Path(path).suffix}' (use {choices})")


@dataclass(frozen=True)
class Where:
    """A file being read, as its errors name it: ``kind`` is its format (.npy, .npz, CSV) and
    ``member`` the array of an .npz being read, if any."""
    path: str
    kind: str
    member: str | None = None

    def unreadable(self, reason: str) -> UserError:
        about = f"array '{self.member}': {reason}" if self.member is not None else reason
        return UserError(f"{self.path}: not a readable {self.kind} file ({about})")

    def pickled(self) -> UserError:
        what = f"array '{self.member}' holds" if self.member is not None else "holds"
        return UserError(f"{self.path}: {what} pickled objects, which are refused (they can run code)")

    @contextlib.contextmanager
    def reading(self):
        """The errors of numpy's header parser, zipfile, the csv module and the OS while reading,
        each as one line."""
        try:
            yield
        except (ValueError, OSError, EOFError, zipfile.BadZipFile, NotImplementedError, csv.Error) as e:
            raise self.unreadable(str(e).splitlines()[0] if str(e) else type(e).__name__) from None


def check_magic(path: str, kind: str) -> None:
    """An .npy starts with numpy's magic and an .npz with a zip's. Anything else is named for what
    it is, not left to the readers' errors (zipfile alone takes a zip with anything before it)."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(NPY_MAGIC))
    except OSError as e:
        raise UserError(f"{path}: cannot read: {e.strerror}") from None
    if kind == ".npy" and not head.startswith(NPY_MAGIC):
        reason = "it is an .npz archive" if head.startswith(ZIP_MAGICS) else "no .npy header"
        raise Where(path, kind).unreadable(reason)
    if kind == ".npz" and not head.startswith(ZIP_MAGICS):
        reason = "it is an .npy array" if head.startswith(NPY_MAGIC) else "not a zip archive"
        raise Where(path, kind).unreadable(reason)
