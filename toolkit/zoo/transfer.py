"""Bounded reads from zoo sources: an HTTP transfer ends by its deadline however slowly the server
sends, pieces come content-decoded so that a caller can stop at its byte limit, and a folder's
files are read only as regular files reached through no symbolic link."""
from __future__ import annotations

import os
import queue
import re
import stat
import threading
import time
import zlib
from contextlib import closing
from pathlib import Path
from typing import Iterator

from ..errors import UserError

TIMEOUT_S = 30            # the longest wait for a server's next bytes; a card or an index has this long in all
MIN_RATE = 100_000        # bytes/s: a file has TIMEOUT_S plus a second per MIN_RATE bytes of its card's size
MAX_TEXT_BYTES = 1 << 20  # a card or an index is a few kB; a source sending more is not a zoo
CHUNK = 1 << 16


class Unreachable(UserError):
    """A source that cannot be read now: the server is down, the network is off, a clone failed."""


class Broken(Exception):
    """A transfer that failed in a way that may pass (no answer, a dropped connection, too slow):
    ``reason`` says how, without the URL."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class HttpError(Exception):
    """An answer with a status of 400 or more."""

    def __init__(self, status: int, reason: str):
        super().__init__(f"HTTP {status} {reason}")
        self.status, self.reason = status, reason


class MissingFile(Exception):
    """A file asked of a folder source is not there."""


def http_pieces(url: str, budget_s: float) -> Iterator[bytes]:
    """The body of ``url`` in pieces of at most CHUNK bytes, content-decoded, all of it within
    ``budget_s`` seconds from now (the answer's headers included). Raises HttpError, Broken, or
    a UserError naming the URL."""
    deadline = time.monotonic() + budget_s
    get = _Get(url)
    get.start()
    try:
        response = get.take(deadline, budget_s)
        if response.status_code >= 400:
            raise HttpError(response.status_code, response.reason)
        encoding = response.headers.get("Content-Encoding", "").strip().lower()
        yield from _decoded(url, encoding, iter(lambda: get.take(deadline, budget_s), b""))
    finally:
        get.stop()


def file_budget_s(size: int) -> float:
    # a card may state any integer; a wait past 10^7 s (a TB) would overflow a lock's timeout
    return TIMEOUT_S + min(size, 10**12) / MIN_RATE


class _Get(threading.Thread):
    """One GET in a thread of its own, handing over the response and then its raw body through a
    small queue: the caller's thread waits on the queue, so its deadline holds even while the
    server drips its headers, which no per-read timeout can bound. Once the caller gives up, the
    thread stops reading the body at once; a server still dripping headers keeps it (writing
    nothing) until it stops or is silent for TIMEOUT_S."""

    def __init__(self, url: str):
        super().__init__(daemon=True, name=f"zoo GET {url}")
        self.url = url
        self.handed: queue.Queue = queue.Queue(maxsize=4)
        self.stopped = threading.Event()
        self.response = None

    def run(self) -> None:
        import requests
        try:
            # identity: a server that encodes anyway is decoded by the caller, piece by piece
            with requests.get(self.url, timeout=TIMEOUT_S, stream=True,
                              headers={"Accept-Encoding": "identity"}) as response:
                self.response = response
                self._hand(response)
                while response.status_code < 400 and not self.stopped.is_set():
                    piece = response.raw.read(CHUNK, decode_content=False)
                    self._hand(piece)
                    if not piece:
                        return
        except BaseException as e:        # raised again in the caller's thread
            self._hand(e)

    def _hand(self, item) -> None:
        while not self.stopped.is_set():
            try:
                self.handed.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def take(self, deadline: float, budget_s: float):
        try:
            item = self.handed.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise Broken(f"the transfer did not finish within {budget_s:.1f} s") from None
        if isinstance(item, BaseException):
            raise _translated(item, self.url) from None
        return item

    def stop(self) -> None:
        self.stopped.set()
        try:      # ends a read that waits for the server now (urllib3 2.3 and later), not at its next byte
            self.response.raw.shutdown()
        except (AttributeError, OSError, RuntimeError, ValueError):    # not started, or already over
            pass


def _translated(error: BaseException, url: str) -> BaseException:
    import requests
    import urllib3
    if isinstance(error, (requests.ConnectionError, requests.Timeout)):
        return Broken(f"cannot reach the server ({network_reason(error)})")
    if isinstance(error, requests.RequestException):
        return UserError(f"{url}: {network_reason(error)}")
    if isinstance(error, (OSError, urllib3.exceptions.HTTPError)):       # while reading the body
        return Broken(f"the transfer broke off ({network_reason(error)})")
    return error


def _decoded(url: str, encoding: str, pieces: Iterator[bytes]) -> Iterator[bytes]:
    """The body as the file it carries. A gzip or deflate body is inflated at most CHUNK bytes at
    a time, so that a caller counting bytes stops a small body that would inflate without end."""
    if encoding in ("", "identity"):
        yield from pieces
        return
    if encoding not in ("gzip", "x-gzip", "deflate"):
        raise UserError(f"{url}: the server sent it with Content-Encoding: {encoding}, which the zoo "
                        "does not decode (it asks for the file as it is)")
    inflate = zlib.decompressobj(zlib.MAX_WBITS | 32)     # a gzip or a zlib header, told apart by its magic
    try:
        for piece in pieces:
            while piece:
                out = inflate.decompress(piece, CHUNK)
                piece = inflate.unconsumed_tail
                if out:
                    yield out
    except zlib.error as e:
        raise UserError(f"{url}: the {encoding}-encoded body does not decode ({e})") from None
    if not inflate.eof:
        raise Broken(f"the transfer broke off (the {encoding}-encoded body ends early)")


def network_reason(error: BaseException) -> str:
    """A short reason for a requests error (its messages nest several exceptions deep)."""
    text = str(error)
    m = re.search(r"\[Errno -?\d+\] [^'\")]+", text)
    if m:
        return m.group(0).strip()
    for phrase in ("Connection refused", "timed out", "Connection broken", "Name or service not known",
                   "IncompleteRead", "Read timed out"):
        if phrase in text:
            return phrase
    return type(error).__name__ + (f": {text}" if text and len(text) < 160 else "")


def folder_pieces(root: Path, name: str, file: str) -> Iterator[bytes]:
    """``root/NAME/FILE`` in pieces, when NAME is a folder and FILE a regular file in it, neither
    a symbolic link: a link could hand over any file of this machine (its hash is the card's to
    give), and a FIFO or a device could block or never end. MissingFile when either is not there."""
    folder, path = root / name, root / name / file
    folder_fd = _open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        fd = _open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder_fd)
    finally:
        os.close(folder_fd)
    with open(fd, "rb", buffering=0) as f:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise UserError(f"{path}: not a regular file (a {_KINDS.get(stat.S_IFMT(mode), 'special file')}); "
                            "a zoo source's files must be plain files")
        while True:
            try:
                piece = f.read(CHUNK)
            except OSError as e:
                raise UserError(f"{path}: {os_reason(e)}") from None
            if not piece:
                return
            yield piece


_KINDS = {stat.S_IFIFO: "FIFO", stat.S_IFCHR: "character device", stat.S_IFBLK: "block device",
          stat.S_IFSOCK: "socket", stat.S_IFDIR: "folder"}


def _open(path: Path, flags: int, dir_fd: int | None = None) -> int:
    try:
        return os.open(path.name if dir_fd is not None else path, flags | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as e:
        if path.is_symlink():      # O_NOFOLLOW refused it (ELOOP, or ENOTDIR for a folder)
            raise UserError(f"{path}: a symbolic link; a zoo source must hold its model folders and "
                            "files itself, so links are refused") from None
        if isinstance(e, (FileNotFoundError, NotADirectoryError)):
            raise MissingFile(str(path)) from None
        raise UserError(f"{path}: {os_reason(e)}") from None


def read_text(pieces: Iterator[bytes], where: str) -> str:
    """A card or an index from its pieces: at most MAX_TEXT_BYTES, UTF-8."""
    content = bytearray()
    with closing(pieces):
        for piece in pieces:
            content += piece
            if len(content) > MAX_TEXT_BYTES:
                raise UserError(f"{where}: more than {MAX_TEXT_BYTES >> 20} MiB, not a zoo card or index")
    try:
        return content.decode("utf-8")        # whatever charset a server claims
    except UnicodeDecodeError:
        raise UserError(f"{where}: not a UTF-8 text file") from None


def os_reason(error: OSError) -> str:
    """The system's words for an OS error (``No space left on device``), as every write error of
    the toolkit prints them."""
    return error.strerror or str(error)
