"""Helpers of the zoo tests: a CLI runner, the published model's name, a loopback HTTP server
that can break its transfers. (Not ``helpers``: a name no other test folder uses.)"""
from __future__ import annotations

import contextlib
import http.server
import io
import threading
from dataclasses import dataclass, field
from pathlib import Path

from toolkit.cli import main

ROOT = Path(__file__).resolve().parents[2]
LENET = ROOT / "zoo" / "lenet"
NAME = "digitnet"          # lenet published under a name the shipped zoo does not have


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


@dataclass
class Server:
    root: Path
    url: str = ""
    faults: dict = field(default_factory=dict)    # URL path -> "truncate" | "truncate_once"
    hits: list = field(default_factory=list)      # URL paths, in order
    httpd: http.server.ThreadingHTTPServer | None = None
    thread: threading.Thread | None = None

    def stop(self) -> None:
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
            super().do_GET()

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
