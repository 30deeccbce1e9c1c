"""`toolkit serve` against hostile or broken clients on the loopback address: bodies that nest
deeply or declare overflowing shapes, connections that dawdle or pile up under a low descriptor
limit, large JSON bodies beside a small request (and the worker processes that decode them),
non-finite outputs, and the shutdown line's counts. Each answer is checked for its status, its
JSON error and its time, and the log for tracebacks."""
from __future__ import annotations

import asyncio
import json
import os
import random
import re
import resource
import select
import socket
import threading
import time
import urllib.request
from http.client import HTTPResponse, RemoteDisconnected

import numpy as np
import pytest
from serve_helpers import Server

from toolkit.serve.offload import INLINE_JSON_BYTES, INLINE_JSON_VALUES, Offload, WorkerDied
from toolkit.serve.protocol import BadRequest, decode_request

http = pytest.importorskip("tritonclient.http", reason="the test extra's tritonclient[http] is not installed")

INFER = "/v2/models/lenet/infer"
GOOD = json.dumps({"inputs": [{"name": "data", "shape": [1, 1, 8, 8], "datatype": "FP32",
                               "data": [0.0] * 64}]}).encode()


@pytest.fixture(scope="module")
def server():
    s = Server("--warm")
    yield s
    assert s.stop() == 0


def _json_input(shape, data) -> bytes:
    return json.dumps({"inputs": [{"name": "data", "shape": shape, "datatype": "FP32", "data": data}]}).encode()


def _answer(sock: socket.socket) -> tuple[int | None, dict | None]:
    """The status and JSON body of the next answer on ``sock``; None, None if it closed without one."""
    response = HTTPResponse(sock)
    try:
        response.begin()
    except RemoteDisconnected:
        return None, None
    return response.status, json.loads(response.read())


def _exchange(port: int, data: bytes, wait: float = 10) -> tuple[float, int | None, dict | None]:
    """Send ``data`` on a new connection and read the answer: the seconds that took, its status
    and its JSON body."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(wait)
        start = time.monotonic()
        if data:
            sock.sendall(data)
        status, doc = _answer(sock)
        return time.monotonic() - start, status, doc


def _no_traceback(log: str) -> None:
    assert "Traceback" not in log and "Exception in ASGI" not in log, log


# -- finding 1: malformed and overflowing requests -------------------------------------------------

def test_deep_nesting_and_overflowing_shapes_are_400_naming_the_fault(server):
    deep = (b'{"inputs":[{"name":"data","shape":[1,1,8,8],"datatype":"FP32","data":'
            + b"[" * 100_000 + b"]" * 100_000 + b"}]}")
    binary_head = json.dumps({"inputs": [{"name": "data", "shape": [2**62, 2**62], "datatype": "FP32",
                                          "parameters": {"binary_data_size": 4}}]}).encode()
    cases = [(deep, {}, "the request body's JSON nests too deeply"),
             (deep.replace(b"[" * 100_000 + b"]" * 100_000, b"[" * 500 + b"0" + b"]" * 500), {},
              "\"data\" does not hold float32 values"),                # JSON can, numpy cannot, nest 500 deep
             (_json_input([2**62, 2**62], [0.0]), {},
              f"\"data\" has 1 values, shape [{2**62}, {2**62}] needs {2**124}"),
             (_json_input([2**64], [0.0]), {}, f"needs {2**64}"),
             (_json_input([1] * 70, [0.0]), {}, "\"shape\" has 70 dimensions, at most 32 are taken"),
             (json.dumps({"inputs": [{"name": "data", "shape": [1], "datatype": [], "data": [0]}]}).encode(), {},
              "datatype [] is not one this server takes"),
             (binary_head + b"\0" * 4, {"Inference-Header-Content-Length": str(len(binary_head))},
              f"binary_data_size 4 bytes, shape [{2**62}, {2**62}] of FP32 needs {2**124 * 4}")]
    for body, headers, message in cases:
        start = time.monotonic()
        status, doc = server.post(INFER, body, headers)
        assert status == 400 and message in doc["error"], (message, status, doc)
        assert time.monotonic() - start < 5, message
    status, doc = server.post(INFER, GOOD)
    assert status == 200 and doc["outputs"][0]["shape"] == [1, 10]
    _no_traceback(server.log)


def test_the_decoder_refuses_hostile_documents_with_bad_request_alone():
    """A seeded fuzz of the v2 document: whatever the client sends, decode_request raises
    BadRequest (a 400) or returns, never another exception (a 500 and a traceback)."""
    rng = random.Random(0)
    atoms = [None, True, 0, -1, 2**70, 1.5, float("nan"), "", "FP32", "BOOL", [], {}, [1], [[1, 2], [3]],
             ["NaN"], {"binary_data_size": 4}, [2**40, 2**40], [1] * 40]

    def anything(depth=0):
        roll = rng.random()
        if depth > 2 or roll < 0.5:
            return rng.choice(atoms)
        if roll < 0.75:
            return [anything(depth + 1) for _ in range(rng.randint(0, 3))]
        keys = ["name", "shape", "datatype", "data", "parameters", "binary_data_size", "outputs", "binary_data"]
        return {rng.choice(keys): anything(depth + 1) for _ in range(rng.randint(0, 3))}

    for _ in range(3000):
        item = {"name": rng.choice(["data", 1]), "shape": anything(),
                "datatype": rng.choice(["FP32", "INT8", anything()])}
        item[rng.choice(["data", "parameters"])] = anything()
        doc = {"inputs": [item], rng.choice(["outputs", "parameters", "id"]): anything()}
        body = json.dumps(doc).encode()
        header_length = rng.choice([None, None, str(len(body)), "x", "-1"])
        try:
            decode_request(body + b"\0" * rng.randint(0, 8) if header_length else body, header_length)
        except BadRequest:
            pass


# -- finding 2: connections that dawdle or pile up -------------------------------------------------

def test_connections_that_dawdle_are_answered_408_or_closed_within_the_timeout():
    s = Server("--timeout-s", "1")
    try:
        elapsed, status, doc = _exchange(s.port, b"POST /v2/models/lenet/infer HTTP/1.1\r\nHost: x\r\n")
        assert status == 408 and doc["error"] == "the request line and headers did not arrive within 1 s"
        assert 0.9 < elapsed < 4, elapsed
        elapsed, status, doc = _exchange(s.port, b"")                 # connects and says nothing
        assert status is None and 0.9 < elapsed < 4, (status, elapsed)
        elapsed, status, doc = _exchange(s.port, b"POST /v2/models/lenet/infer HTTP/1.1\r\nHost: x\r\n"
                                                 b"Content-Length: 1000\r\n\r\n{\"inp")
        assert status == 408 and doc["error"] == "the request body did not arrive within 1 s (5 bytes came)"
        assert 0.9 < elapsed < 4, elapsed

        # a head trickled a byte at a time, on a keep-alive connection after a good request
        sock = socket.create_connection(("127.0.0.1", s.port))
        sock.settimeout(10)
        sock.sendall(b"POST /v2/models/lenet/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(GOOD)
                     + GOOD)
        assert _answer(sock)[0] == 200
        start = time.monotonic()
        sock.sendall(b"GET /v2 HTTP/1.1\r\nX-Slow: ")
        while time.monotonic() - start < 5 and not select.select([sock], [], [], 0.1)[0]:
            sock.sendall(b"a")
        status, doc = _answer(sock)
        sock.close()
        assert status == 408 and "did not arrive within 1 s" in doc["error"] and time.monotonic() - start < 4

        elapsed, status, doc = _exchange(s.port, b"GET /v2 HTTP/1.1\r\n" + b"X-Pad: " + b"a" * 70_000)
        assert status == 431 and doc["error"] == "the request line and headers are over 65536 bytes"
        assert elapsed < 2, elapsed
        elapsed, status, doc = _exchange(s.port, b"\x16\x03\x01 not http\r\n\r\n")
        assert status == 400 and doc["error"] == "the request is not valid HTTP/1.1" and elapsed < 2
        assert s.post(INFER, GOOD)[0] == 200
        assert s.stop() == 0
    finally:
        s.stop()
    _no_traceback(s.log)
    assert ("stopped: 2 infer request(s) answered, 1 refused (4xx, or 503 with the queue full), 0 failed "
            "(500, or cut off at the shutdown timeout), 0 abandoned by their client; connections: "
            "3 closed for sending no whole request head in time, 1 refused for headers over the limit (431), "
            "1 refused as not HTTP (400)") in s.log, s.log


def _lower_descriptor_limit():
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))


def test_idle_connections_under_a_low_descriptor_limit_leave_room_for_a_good_request():
    s = Server(preexec_fn=_lower_descriptor_limit)
    idle = []
    try:
        for _ in range(300):
            sock = socket.create_connection(("127.0.0.1", s.port))
            sock.sendall(b"POST /v2/models/lenet/infer HTTP/1.1\r\nHost: x\r\n")    # and never more
            idle.append(sock)
        start = time.monotonic()
        status, doc = s.post(INFER, GOOD)
        assert status == 200 and doc["outputs"][0]["shape"] == [1, 10] and time.monotonic() - start < 5
        assert s.stop() == 0
    finally:
        for sock in idle:
            sock.close()
        s.stop()
    _no_traceback(s.log)
    # 256 descriptors leave room for 192 connections: the 109 beyond them closed the longest waiting
    assert "connections: 109 closed while waiting, to make room at the connection limit" in s.log, s.log


def test_at_the_connection_limit_with_every_connection_busy_a_new_one_is_answered_503():
    s = Server("--max-connections", "2")
    busy = []
    try:
        for _ in range(2):                              # requests in hand: their bodies still to come
            sock = socket.create_connection(("127.0.0.1", s.port))
            sock.sendall(b"POST /v2/models/lenet/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(GOOD))
            busy.append(sock)
        time.sleep(0.3)
        # the third is answered and closed at once, before it writes (a client that has written
        # by then may read a reset instead: the server does not linger, to keep its descriptors)
        elapsed, status, doc = _exchange(s.port, b"")
        assert status == 503 and doc["error"] == "the server has 2 connections open, its limit; retry later"
        assert elapsed < 2
        for sock in busy:                               # the busy ones are still served
            sock.sendall(GOOD)
            assert _answer(sock)[0] == 200
        assert s.stop() == 0
    finally:
        for sock in busy:
            sock.close()
        s.stop()
    assert "1 refused at the connection limit (503)" in s.log, s.log


# -- finding 3: large JSON bodies beside a small request --------------------------------------------

def test_a_one_row_request_is_answered_promptly_while_others_send_large_json_bodies(server):
    # 24 MB of JSON each, about half a second of parsing; a shape the model refuses once parsed,
    # so that what is timed is the decoding (one batch runs at a time, so a large valid request
    # would hold the batcher too)
    rows = 27_778
    big = (b'{"inputs":[{"name":"data","shape":[%d,1,8,9],"datatype":"FP32","data":[' % rows
           + b"0.123456789," * (rows * 72 - 1) + b"0.5]}]}")
    answers, latencies = [], []

    def send_big():
        answers.append(server.post(INFER, big))
    senders = [threading.Thread(target=send_big) for _ in range(4)]
    for t in senders:
        t.start()
    time.sleep(0.2)
    while any(t.is_alive() for t in senders):
        start = time.monotonic()
        status, doc = server.post(INFER, GOOD)
        latencies.append(time.monotonic() - start)
        assert status == 200 and doc["outputs"][0]["shape"] == [1, 10]
        time.sleep(0.02)
    for t in senders:
        t.join()
    assert len(answers) == 4 and all(status == 400 and "shape [27778, 1, 8, 9], the model takes [-1, 1, 8, 8]"
                                     in doc["error"] for status, doc in answers), answers
    assert len(latencies) >= 3 and max(latencies) < 1.0, latencies


def test_large_json_requests_decoded_and_encoded_in_workers_equal_a_direct_infer(server):
    import toolkit
    x = np.random.default_rng(2).standard_normal((500, 1, 8, 8)).astype(np.float32)
    body = _json_input(list(x.shape), x.reshape(-1).tolist())
    assert len(body) > INLINE_JSON_BYTES and 500 * 10 > INLINE_JSON_VALUES        # both go to a worker
    status, doc = server.post(INFER, body)
    assert status == 200 and doc["outputs"][0]["shape"] == [500, 10]
    want = toolkit.load("zoo:lenet").infer(data=x)["prob"]
    np.testing.assert_allclose(np.array(doc["outputs"][0]["data"], np.float32).reshape(500, 10), want,
                               rtol=1e-5, atol=1e-6)


def test_a_worker_that_dies_is_reported_and_replaced():
    async def run():
        offload = Offload(1)
        try:
            with pytest.raises(WorkerDied, match="died"):
                await offload.run(os._exit, 1)
            return await offload.run(decode_request, GOOD, None)
        finally:
            offload.close()
    assert asyncio.run(run()).inputs["data"].shape == (1, 1, 8, 8)


# -- finding 4: outputs that are not finite --------------------------------------------------------

LOG_NET = """\
name: lognet
inputs:
  data: {shape: [N, 4]}
layers:
  - {name: log, type: Log, bottom: data, top: log}
outputs: [log]
"""


def test_non_finite_outputs_are_json_strings_that_triton_clients_read_back(tmp_path):
    from safetensors.numpy import save_file
    (tmp_path / "net.yaml").write_text(LOG_NET)
    save_file({}, str(tmp_path / "none.safetensors"))             # the net has no weights
    s = Server("--weights", str(tmp_path / "none.safetensors"), net=str(tmp_path / "net.yaml"))
    try:
        x = np.array([[1.0, 0.0, -1.0, np.inf]], np.float32)
        want = np.array([[0.0, -np.inf, np.nan, np.inf]], np.float32)

        def no_bare_constants(name):
            raise AssertionError(f"bare {name} in the response: not JSON")
        body = json.dumps({"inputs": [{"name": "data", "shape": [1, 4], "datatype": "FP32",
                                       "data": [1.0, 0.0, -1.0, "Infinity"]}]})
        request = urllib.request.Request(f"http://{s.url}/v2/models/lognet/infer", data=body.encode(), method="POST")
        with urllib.request.urlopen(request, timeout=30) as r:
            doc = json.loads(r.read(), parse_constant=no_bare_constants)
        assert doc["outputs"][0]["data"] == [0.0, "-Infinity", "NaN", "Infinity"], doc
        client = http.InferenceServerClient(url=s.url)
        inp = http.InferInput("data", [1, 4], "FP32")
        inp.set_data_from_numpy(x, binary_data=True)
        for binary in (False, True):
            out = http.InferRequestedOutput("log", binary_data=binary)
            got = client.infer("lognet", [inp], outputs=[out]).as_numpy("log")
            assert got.dtype == np.float32
            np.testing.assert_array_equal(got, want)
        assert s.stop() == 0
    finally:
        s.stop()
    _no_traceback(s.log)


# -- finding 5: what the shutdown line says ----------------------------------------------------------

def test_the_shutdown_line_counts_what_was_answered_refused_and_failed():
    s = Server("--shutdown-timeout", "1")
    slow = []
    try:
        assert s.post(INFER, GOOD)[0] == 200
        assert s.post(INFER, _json_input([1, 1, 8, 9], [0.0] * 72))[0] == 400
        for _ in range(2):                              # bodies still coming when SIGTERM arrives
            sock = socket.create_connection(("127.0.0.1", s.port))
            sock.settimeout(10)
            sock.sendall(b"POST /v2/models/lenet/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"inp")
            slow.append(sock)
        time.sleep(0.3)
        start = time.monotonic()
        s.terminate()
        for sock in slow:
            assert _answer(sock) == (503, {"error": "the server stopped before this request was answered "
                                                    "(its shutdown timeout ran out)"})
        assert s.stop() == 0 and time.monotonic() - start < 5
    finally:
        for sock in slow:
            sock.close()
        s.stop()
    _no_traceback(s.log)
    assert re.search(r"^stopped: 1 infer request\(s\) answered, 1 refused \(4xx, or 503 with the queue full\), "
                     r"2 failed \(500, or cut off at the shutdown timeout\), 0 abandoned by their client$",
                     s.log, re.M), s.log
