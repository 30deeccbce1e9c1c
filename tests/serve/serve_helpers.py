"""Helpers of the serve tests: a `toolkit serve` subprocess on a free loopback port, read until it
says where it listens, with its log kept. (Not ``helpers``: a name no other test folder uses.)"""
from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NET = "zoo:lenet"


class Server:
    def __init__(self, *flags: str, net: str = NET, preexec_fn=None):
        self.proc = subprocess.Popen([sys.executable, "-m", "toolkit.cli", "serve", net, "--port", "0", *flags],
                                     cwd=ROOT, stderr=subprocess.PIPE, text=True, preexec_fn=preexec_fn)
        self.lines: list[str] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                raise RuntimeError("the server exited: " + "".join(self.lines))
            self.lines.append(line)
            m = re.search(r"http://127\.0\.0\.1:(\d+)", line)
            if m:
                self.port = int(m.group(1))
                break
        else:
            raise RuntimeError("the server did not start in 60 s")
        self._drainer = threading.Thread(target=self._drain, daemon=True)
        self._drainer.start()
        self.url = f"127.0.0.1:{self.port}"

    def _drain(self):
        for line in self.proc.stderr:
            self.lines.append(line)

    @property
    def log(self) -> str:
        return "".join(self.lines)

    def terminate(self) -> None:
        """SIGTERM once: a second one, while the server shuts down, would kill it outright
        (uvicorn gives the signal back to its default handler once it has begun to stop)."""
        if not getattr(self, "terminated", False) and self.proc.poll() is None:
            self.terminated = True
            self.proc.send_signal(signal.SIGTERM)

    def stop(self) -> int:
        """SIGTERM (unless already sent), then the exit status once the log is read to its end."""
        self.terminate()
        status = self.proc.wait(timeout=30)
        self._drainer.join(10)
        return status

    def post(self, path: str, body: bytes, headers: dict | None = None) -> tuple[int, dict]:
        req = urllib.request.Request(f"http://{self.url}{path}", data=body, method="POST",
                                     headers={"Content-Type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")
