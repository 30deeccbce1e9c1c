"""Running the inference server: bind (127.0.0.1 unless told otherwise), serve with uvicorn under a
connection limit and deadlines until SIGTERM or SIGINT, then stop accepting, answer what is in
flight, say what was answered and refused, and exit 0."""
from __future__ import annotations

import json
import signal
import socket
import sys
from collections import Counter
from http import HTTPStatus

try:
    import resource
except ImportError:                          # Windows: no descriptor limit to read
    resource = None

from ..errors import UserError

KEEP_ALIVE_S = 5                             # an idle keep-alive connection closes after this (uvicorn's default)
MAX_HEAD_BYTES = 64 * 1024                   # a request line and headers longer than this: 431


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise UserError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def connection_limit(requested: int | None) -> int:
    """The most connections served at once: what the descriptor limit (RLIMIT_NOFILE) leaves after
    headroom for the process's own files (the model's, the workers' pipes), or fewer if asked."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0] if resource is not None else 512
    if soft == getattr(resource, "RLIM_INFINITY", None):
        soft = 1 << 16
    most = soft - max(64, soft // 8)
    if most < 1:
        raise UserError(f"the descriptor limit (ulimit -n) of {soft} leaves no room for connections; raise it")
    if requested is None:
        return most
    if requested > most:
        raise UserError(f"--max-connections {requested} is over the {most} the descriptor limit (ulimit -n) "
                        f"of {soft} leaves room for; raise that limit or ask for fewer")
    return requested


def _answer(status: int, message: str) -> bytes:
    """A whole HTTP response in the protocol's error shape, for the connection to close after."""
    body = json.dumps({"error": message}, separators=(",", ":")).encode()
    return (f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode() + body


def http_protocol(max_connections: int, timeout_s: float, tally: Counter):
    """uvicorn's HTTP/1.1 protocol (httptools' parser, a dependency: its callbacks say where a
    request stands) with TCP_NODELAY, a connection limit and deadlines.

    A connection waiting for a request (new, between keep-alive requests, or still sending its
    request line and headers) must finish the head within ``timeout_s``; one that has sent part
    of it is answered 408, a silent one closed. A head over MAX_HEAD_BYTES is answered 431. A
    client that stops reading its answer for ``timeout_s`` is cut off. At ``max_connections``, a
    new connection closes the one that has waited longest for its request, or is answered 503 if
    every one has a request in hand (uvicorn's limit_concurrency cannot do this: it looks only at
    complete heads). Bodies have their own deadline, in the app."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    # connections waiting for a request's head -> since when, longest first; one timer, for the
    # first to expire, stands for all their deadlines (no timer set and cancelled per request)
    waiting: dict = {}
    sweep = None

    def sweep_expired(loop) -> None:
        nonlocal sweep
        sweep = None
        while waiting:
            conn, since = next(iter(waiting.items()))
            if loop.time() - since < timeout_s:
                sweep = loop.call_at(since + timeout_s, sweep_expired, loop)
                return
            conn.dawdled()                   # which takes it off the list

    class Protocol(HttpToolsProtocol):
        def connection_made(self, transport):
            super().connection_made(transport)
            sock = transport.get_extra_info("socket")
            if sock is not None:
                # The response leaves as two writes (headers, then body); with Nagle's algorithm on,
                # the second waits for the client's delayed ACK of the first: 40 ms on every
                # keep-alive request (measured: 44 ms per request before, 3.6 ms after).
                try:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                except OSError:
                    pass                     # not TCP (a Unix socket): nothing to turn off
            self.write_deadline = None
            self.in_head, self.head_bytes = False, 0      # between a request's first byte and its headers' end
            if len(self.connections) > max_connections:
                if not waiting:
                    tally["refused_at_limit"] += 1
                    self.refuse(503, f"the server has {max_connections} connections open, its limit; retry later")
                    return
                tally["evicted"] += 1
                next(iter(waiting)).close_waiting()
            self.wait_for_head()

        def wait_for_head(self) -> None:
            nonlocal sweep
            waiting[self] = self.loop.time()
            if sweep is None:
                sweep = self.loop.call_at(waiting[self] + timeout_s, sweep_expired, self.loop)

        def stop_waiting(self) -> None:
            waiting.pop(self, None)

        def close_waiting(self) -> None:
            self.stop_waiting()
            self.transport.close()

        def refuse(self, status: int, message: str) -> None:
            self.stop_waiting()
            self.transport.write(_answer(status, message))
            self.transport.close()

        def dawdled(self) -> None:
            if self.transport.is_closing():      # closed by uvicorn (keep-alive, shutdown): going anyway
                self.stop_waiting()
                return
            if self.in_head:
                tally["timed_out"] += 1
                self.refuse(408, f"the request line and headers did not arrive within {timeout_s:g} s")
                return
            if self.cycle is None:               # not a keep-alive connection expiring: one that never asked
                tally["timed_out"] += 1
            self.close_waiting()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.in_head and not self.transport.is_closing():
                # httptools keeps whatever head it is sent: bound it
                self.head_bytes += len(data)
                if self.head_bytes > MAX_HEAD_BYTES:
                    tally["head_too_large"] += 1
                    self.refuse(431, f"the request line and headers are over {MAX_HEAD_BYTES} bytes")

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self.in_head, self.head_bytes = True, 0

        def on_headers_complete(self) -> None:
            self.in_head = False
            self.stop_waiting()
            super().on_headers_complete()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            # a pipelined request may have started: then the connection is not waiting
            if not self.transport.is_closing() and self.cycle.response_complete:
                self.wait_for_head()

        def pause_writing(self) -> None:
            super().pause_writing()
            self.write_deadline = self.loop.call_later(timeout_s, self.unread)

        def resume_writing(self) -> None:
            super().resume_writing()
            if self.write_deadline is not None:
                self.write_deadline.cancel()
                self.write_deadline = None

        def unread(self) -> None:
            # the client stopped reading its answer: the handler waits on the transport until it goes
            self.write_deadline = None
            tally["unread"] += 1
            self.transport.abort()

        def connection_lost(self, exc) -> None:
            self.stop_waiting()
            if self.write_deadline is not None:
                self.write_deadline.cancel()
            super().connection_lost(exc)

        def send_400_response(self, msg: str) -> None:
            # uvicorn's answer to bytes that are not HTTP, in the protocol's error shape
            tally["malformed"] += 1
            self.refuse(400, "the request is not valid HTTP/1.1")

    return Protocol


def serve(model, host: str, port: int, max_delay_ms: float, max_queue: int, max_body_bytes: int,
          shutdown_timeout_s: float | None = 30.0, timeout_s: float = 30.0, max_connections: int | None = None,
          labels: list[str] | None = None, decode_images=None) -> int:
    import uvicorn

    from .app import InferenceServer
    from .offload import worker_count

    max_connections = connection_limit(max_connections)
    server_state = InferenceServer(model, max_delay_ms, max_queue, max_body_bytes, timeout_s, worker_count(),
                                   labels, decode_images)
    sock = bind(host, port)
    bound = sock.getsockname()[1]
    config = uvicorn.Config(server_state.app(), log_level="warning", access_log=False, lifespan="on",
                            http=http_protocol(max_connections, timeout_s, server_state.tally), loop="auto",
                            proxy_headers=False, timeout_graceful_shutdown=shutdown_timeout_s,
                            timeout_keep_alive=KEEP_ALIVE_S)
    server = uvicorn.Server(config)
    shown = f"[{host}]" if ":" in host else host
    per_symbol = "".join(f"; buckets {k}={','.join(map(str, v))}" for k, v in model.session.dim_buckets.items())
    print(f"serving '{model.name}' on http://{shown}:{bound} (KServe v2; buckets {','.join(map(str, model.buckets))}"
          f"{per_symbol}, max delay {max_delay_ms:g} ms, max queue {max_queue})", file=sys.stderr, flush=True)
    # uvicorn stops gracefully on SIGTERM / SIGINT and then raises the signal again under the
    # handler it found: let that be a quiet one, so that a clean shutdown exits 0
    stopped_by = []
    previous = {sig: signal.signal(sig, lambda signum, frame: stopped_by.append(signum))
                for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        server.run(sockets=[sock])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    print(shutdown_line(server_state.tally), file=sys.stderr, flush=True)
    return 0


# the connection events http_protocol counts, as the shutdown line names them
CONNECTION_EVENTS = (("evicted", "closed while waiting, to make room at the connection limit"),
                     ("refused_at_limit", "refused at the connection limit (503)"),
                     ("timed_out", "closed for sending no whole request head in time"),
                     ("unread", "cut off for not reading their answer in time"),
                     ("head_too_large", "refused for headers over the limit (431)"),
                     ("malformed", "refused as not HTTP (400)"))


def shutdown_line(tally: Counter) -> str:
    line = (f"stopped: {tally['answered']} infer request(s) answered, {tally['refused']} refused (4xx, or 503 "
            f"with the queue full), {tally['failed']} failed (500, or cut off at the shutdown timeout), "
            f"{tally['abandoned']} abandoned by their client")
    events = [f"{tally[key]} {what}" for key, what in CONNECTION_EVENTS if tally[key]]
    return line + ("; connections: " + ", ".join(events) if events else "")
