"""Files read and written safely: only regular files are read (a folder, FIFO or device named as
a file is refused before anything waits on it), reads are bounded, and a write either completes
or leaves the previous file as it was, its failure naming the file; a set of files (an import's)
is written into a staged folder and moved into place only when all of it is written; and no
command writes over a file it reads (``refuse_own_inputs``)."""
from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

from .errors import UserError

_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))


def _not_regular(path, mode: int) -> UserError:
    if stat.S_ISDIR(mode):
        return UserError(f"{path}: is a folder, not a file")
    kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
    return UserError(f"{path}: is not a regular file (it is {kind})")


def check_regular(path) -> os.stat_result:
    """The status of the regular file at ``path``; a UserError naming what it is otherwise (or
    that nothing is there), so that no reader opens a FIFO or a device."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except OSError as e:
        raise UserError(f"{path}: cannot read: {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise _not_regular(path, st.st_mode)
    return st


def open_regular(path) -> BinaryIO:
    """The regular file at ``path`` opened for reading: opened without waiting (a FIFO opens and
    is refused at once, where a plain open would wait for a writer) and checked on the opened
    file, so that what is read is what was checked."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a folder, not a file") from None
    except OSError as e:
        raise UserError(f"{path}: cannot read: {e.strerror}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise _not_regular(path, mode)
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def read_regular(path, limit: int, what: str = "file") -> bytes:
    """The bytes of the regular file at ``path`` (opened as ``open_regular`` does), read no
    further than ``limit`` bytes, which a ``what`` may not exceed (a file that grows as it is read
    is caught too). Only what the file holds is allocated: a read of ``limit`` bytes would ask
    for all of them up front, so that a small file failed where memory is bounded."""
    with open_regular(path) as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise UserError(f"{path}: a {what} may be at most {limit:,} bytes; this one is larger")
        try:
            data = f.read(size)
            total, more = len(data), []
            while total <= limit:               # it grew since: read on, in pieces
                piece = f.read(min(_PIECE, limit + 1 - total))
                if not piece:
                    break
                more.append(piece)
                total += len(piece)
        except OSError as e:
            raise UserError(f"{path}: cannot read: {e.strerror}") from None
        except MemoryError:
            raise UserError(f"{path}: a {what} of {size:,} bytes, more than the memory available to read it") \
                from None
    if more:
        data = b"".join([data, *more])
    if len(data) > limit:
        raise UserError(f"{path}: a {what} may be at most {limit:,} bytes; this one is larger")
    return data


_PIECE = 1 << 20


def _default_mode() -> int:
    """What a plain open() would give a new file under the process's umask."""
    return 0o666 & ~_umask()


def atomic_write(target: Path, write: Callable[[str], None]) -> None:
    """``write(tmp)`` fills a temporary file in the target's folder; it is synced to disk, given
    ordinary permissions, and renamed over the target. On any failure the temporary file goes
    and the target is untouched; an OS error (a full disk, a read-only folder) is raised again
    naming the target, not the temporary file, so that its one line says which file it was."""
    target = Path(target)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=target.suffix, dir=target.parent)
    except OSError as e:
        raise OSError(e.errno, e.strerror, str(target)) from None
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, _default_mode())
        os.replace(tmp, target)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise OSError(e.errno, e.strerror or os.strerror(e.errno or errno.EIO), str(target)) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def staged_folder(target: Path) -> Iterator[Path]:
    """A new empty folder to write a set of files into, moved into ``target`` only when the block
    completes: renamed to ``target`` where that does not exist yet, else each file renamed into
    it (replacing a file of the same name). On any failure the folder and what it holds go, and
    ``target`` is as it was (not even created). The folder sits in the nearest existing folder
    above ``target``, so that the renames stay on one file system."""
    target = Path(target)
    anchor = target.parent
    while not anchor.exists() and anchor != anchor.parent:
        anchor = anchor.parent
    try:
        stage = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=anchor))
    except OSError as e:
        raise OSError(e.errno, e.strerror, str(target)) from None
    try:
        yield stage
        _move_in(stage, target)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _move_in(stage: Path, target: Path) -> None:
    try:
        if target.exists() or target.is_symlink():
            for item in sorted(stage.iterdir()):
                os.replace(item, target / item.name)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            os.chmod(stage, 0o777 & ~_umask())      # mkdtemp's folder is private; a plain mkdir's is not
            os.rename(stage, target)
    except OSError as e:
        raise OSError(e.errno, e.strerror or os.strerror(e.errno or errno.EIO), str(target)) from None


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def append_line(path: Path, line: str) -> None:
    """Append ``line`` (and a newline) to ``path`` whole or not at all: a write cut short (a full
    disk) is undone, so the file keeps only complete lines; the error names the file. Only a
    regular file is appended to (a FIFO or a device is refused, as the readers refuse them)."""
    data = (line + "\n").encode()
    try:        # without waiting: a FIFO with no reader fails at once (ENXIO) instead of blocking
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0),
                     _default_mode())
    except OSError as e:
        if e.errno == errno.ENXIO:
            raise _not_regular(path, os.stat(path).st_mode) from None
        raise OSError(e.errno, e.strerror, str(path)) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise _not_regular(path, mode)
        os.set_blocking(fd, True)
        size = os.fstat(fd).st_size
        try:
            written = os.write(fd, data)
            if written != len(data):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except OSError as e:
            os.ftruncate(fd, size)
            raise OSError(e.errno, e.strerror, str(path)) from None
    finally:
        os.close(fd)


def same_file(a, b) -> bool:
    """Whether paths ``a`` and ``b`` name one file: the same real path (links and '..' resolved,
    so a file not written yet is caught too), or, where both exist, the same inode (a hard link)."""
    try:
        if os.path.realpath(a) == os.path.realpath(b):
            return True
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


def refuse_own_inputs(option: str, given, writes, inputs) -> None:
    """A UserError where a file a command would write (``writes``, the files its ``option``
    ``given`` leads to) is one of the files it reads (``inputs``: (what it is, path) pairs, a
    path None where there is none): an output never replaces an input, whatever the names."""
    for target in writes:
        for what, path in inputs:
            if path is None or not same_file(target, path):
                continue
            whose = "is" if os.path.normpath(str(target)) == os.path.normpath(str(given)) \
                else f"would write {target}, which is"
            raise UserError(f"{option} {given}: {whose} {what} {path}, an input of this command; an output never "
                            f"replaces an input: choose another {option}")
