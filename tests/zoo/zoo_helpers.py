"""Helpers of the zoo tests: a CLI runner, the published model's name, a loopback HTTP server
that can break its transfers or answer like a hostile one. (Not ``helpers``: a name no other
test folder uses.)"""
from __future__ import annotations

import contextlib
import gzip
import http.server
import io
import re
import shutil
import subprocess
import threading
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from toolkit.cli import main
from toolkit.zoo.sources import parse_source

ROOT = Path(__file__).resolve().parents[2]
LENET = ROOT / "zoo" / "lenet"
NAME = "digitnet"          # lenet published under a name the shipped zoo does not have
WEIGHTS = "model.safetensors"

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="needs the git program")


def git(repo, *args):
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                   check=True, capture_output=True)


def cache_folder(cache, source_text: str):
    return cache / "zoo" / parse_source(source_text).slug / NAME


def row(out: str, name: str) -> list[str]:
    """The columns of ``zoo list``'s row for ``name`` (columns are two or more spaces apart)."""
    return re.split(r"\s{2,}", next(line for line in out.splitlines() if line.startswith(name + " ")))


def leftovers(folder):
    """Files that are neither the card nor a file it names (temporaries and the like)."""
    return sorted(p.name for p in folder.iterdir() if p.name not in ("README.md", "net.yaml", WEIGHTS)) \
        if folder.is_dir() else []


@dataclass
class Result:
    status: int
    out: str
    err: str


def run(*args) -> Result:
    """``toolkit ARGS`` in this process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main([str(a) for a in args])
    return Result(status, out.getvalue(), err.getvalue())


# A hostile answer never sends more than this, nor for longer: a client that does not stop
# fails its test instead of filling the disk.
HOSTILE_BYTES = 32 << 20
HOSTILE_S = 20
DRIP_S = 0.1


@dataclass
class Server:
    """Faults (URL path -> name): "truncate", "truncate_once" (half the file, then the connection
    closes), "endless" (zeros without end), "gzip" (the file, gzip-encoded), "gzip_endless" (zeros
    gzip-encoded, without end), "drip" (the file, a byte every DRIP_S), "drip_headers" (the
    headers, a byte every DRIP_S)."""
    root: Path
    url: str = ""
    faults: dict = field(default_factory=dict)
    hits: list = field(default_factory=list)      # URL paths, in order
    httpd: http.server.ThreadingHTTPServer | None = None
    thread: threading.Thread | None = None
    stopping: threading.Event = field(default_factory=threading.Event)

    def stop(self) -> None:
        self.stopping.set()
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()
            self.thread.join()
            self.httpd = None


def _handler(server: Server):
    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(server.root), **kwargs)

        def do_GET(self):
            server.hits.append(self.path)
            fault = server.faults.get(self.path)
            if fault in ("truncate", "truncate_once"):
                if fault == "truncate_once":
                    del server.faults[self.path]
                data = (server.root / self.path.lstrip("/")).read_bytes()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data[: len(data) // 2])        # half, then the connection closes
                self.wfile.flush()
                self.close_connection = True
                return
            if fault is not None:
                self.close_connection = True
                try:
                    self.hostile(fault)
                except OSError:            # the client hung up: what a bounded client does
                    pass
                return
            super().do_GET()

        def hostile(self, fault: str) -> None:
            started = time.monotonic()

            def going(sent: int) -> bool:
                return (sent < HOSTILE_BYTES and time.monotonic() - started < HOSTILE_S
                        and not server.stopping.is_set())

            def drip(data: bytes) -> None:
                for i in range(len(data)):
                    if not going(i):
                        return
                    self.wfile.write(data[i:i + 1])
                    self.wfile.flush()
                    time.sleep(DRIP_S)

            if fault == "drip_headers":        # a header that never ends
                drip(b"HTTP/1.0 200 OK\r\nX-Slow: " + b"x" * int(HOSTILE_S / DRIP_S))
                return
            data = (server.root / self.path.lstrip("/")).read_bytes()
            self.send_response(200)
            if fault in ("gzip", "gzip_endless"):
                self.send_header("Content-Encoding", "gzip")
            if fault == "gzip":
                data = gzip.compress(data)
            if fault in ("gzip", "drip"):
                self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if fault == "gzip":
                self.wfile.write(data)
            elif fault == "drip":
                drip(data)
            else:
                zeros = bytes(1 << 16)
                deflate = zlib.compressobj(wbits=31) if fault == "gzip_endless" else None
                sent = 0          # counted as the client decodes it
                while going(sent):
                    self.wfile.write(deflate.compress(zeros) + deflate.flush(zlib.Z_SYNC_FLUSH) if deflate else zeros)
                    sent += len(zeros)

        def log_message(self, *args):
            pass
    return Handler


def start_server(root: Path) -> Server:
    """``root`` served on 127.0.0.1 at a free port, in a thread."""
    s = Server(root)
    s.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(s))
    s.httpd.daemon_threads = True
    s.url = f"http://127.0.0.1:{s.httpd.server_address[1]}/"
    s.thread = threading.Thread(target=s.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    s.thread.start()
    return s
