"""`toolkit serve` against Triton's own HTTP client and raw HTTP: health, metadata, JSON and
binary infer equal to a direct infer, bad requests answered 400/404/413 naming what is wrong, a
full queue answered 503 at once, the batcher coalescing, and SIGTERM finishing what is in flight
before exiting 0. Each test starts its server on a free loopback port and stops it."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
import urllib.request

import numpy as np
import pytest
from serve_helpers import NET, ROOT, Server

http = pytest.importorskip("tritonclient.http", reason="the test extra's tritonclient[http] is not installed")


@pytest.fixture(scope="module")
def server():
    s = Server("--warm")
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def model():
    import toolkit
    return toolkit.load(NET)


def _input(x, binary=True, name="data", datatype="FP32"):
    inp = http.InferInput(name, list(x.shape), datatype)
    inp.set_data_from_numpy(x, binary_data=binary)
    return inp


def test_triton_client_health_metadata_and_infer_json_and_binary(server, model):
    client = http.InferenceServerClient(url=server.url)
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("lenet")
    meta = client.get_server_metadata()
    assert meta["name"] == "toolkit" and "binary_tensor_data" in meta["extensions"]
    mm = client.get_model_metadata("lenet")
    assert mm["inputs"] == [{"name": "data", "datatype": "FP32", "shape": [-1, 1, 8, 8]}]
    assert mm["outputs"] == [{"name": "prob", "datatype": "FP32", "shape": [-1, 10]}]
    rng = np.random.default_rng(0)
    for rows in (1, 3, 64, 100):
        x = rng.standard_normal((rows, 1, 8, 8)).astype(np.float32)
        want = model.infer(data=x)["prob"]
        for binary in (True, False):
            out = http.InferRequestedOutput("prob", binary_data=binary)
            got = client.infer("lenet", [_input(x, binary)], outputs=[out]).as_numpy("prob")
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7, err_msg=f"rows {rows} binary {binary}")
        got = client.infer("lenet", [_input(x)]).as_numpy("prob")          # no outputs named: all, binary
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_bad_requests_name_what_is_wrong(server):
    client = http.InferenceServerClient(url=server.url)
    x = np.zeros((2, 1, 8, 8), np.float32)
    cases = [([_input(np.zeros((2, 1, 8, 9), np.float32))], "shape [2, 1, 8, 9]"),
             ([_input(x.astype(np.float64), datatype="FP64")], "datatype FP64, the model takes FP32"),
             ([_input(x, name="image")], "no input 'image'")]
    for inputs, message in cases:
        with pytest.raises(http.InferenceServerException) as e:
            client.infer("lenet", inputs)
        assert e.value.status() == "400" and message in e.value.message(), e.value
    with pytest.raises(http.InferenceServerException) as e:
        client.infer("lenet", [_input(x)], outputs=[http.InferRequestedOutput("logits")])
    assert "no output 'logits'" in e.value.message()
    with pytest.raises(http.InferenceServerException) as e:
        client.infer("resnet", [_input(x)])
    assert e.value.status() == "404" and "unknown model 'resnet'" in e.value.message()
    raw = [(b"{not json", "not valid JSON"),
           (b'{"inputs": []}', 'non-empty "inputs"'),
           (json.dumps({"inputs": [{"name": "data", "shape": [1, 1, 8, 8], "datatype": "FP32",
                                    "data": [0.0] * 10}]}).encode(), "has 10 values, shape [1, 1, 8, 8] needs 64"),
           (json.dumps({"inputs": [{"name": "data", "shape": [1, 1, 8, 8], "datatype": "STRING",
                                    "data": []}]}).encode(), "datatype 'STRING'")]
    for body, message in raw:
        status, doc = server.post("/v2/models/lenet/infer", body)
        assert status == 400 and message in doc["error"], (status, doc)
    head = json.dumps({"inputs": [{"name": "data", "shape": [1, 1, 8, 8], "datatype": "FP32",
                                   "parameters": {"binary_data_size": 256}}]}).encode()
    status, doc = server.post("/v2/models/lenet/infer", head + b"\0" * 100,
                              {"Inference-Header-Content-Length": str(len(head))})
    assert status == 400 and "binary_data_size says 256" in doc["error"], doc
    # the versioned route answers like the plain one; other versions and methods are refused
    good = json.dumps({"inputs": [{"name": "data", "shape": [1, 1, 8, 8], "datatype": "FP32",
                                   "data": [0.0] * 64}]}).encode()
    status, doc = server.post("/v2/models/lenet/versions/1/infer", good)
    assert status == 200 and doc["outputs"][0]["shape"] == [1, 10], doc
    status, doc = server.post("/v2/models/lenet/versions/2/infer", good)
    assert status == 404 and "no version '2'" in doc["error"], doc
    status, doc = server.post("/v2/models/lenet/infer/extra", good)
    assert status == 404 and doc["error"] == "no route /v2/models/lenet/infer/extra", doc
    # the server kept serving through all of that
    assert client.infer("lenet", [_input(x)]).as_numpy("prob").shape == (2, 10)


def test_a_body_over_the_limit_is_refused_and_a_full_queue_answers_503_at_once():
    s = Server("--max-body-mb", "0.01", "--max-queue", "1", "--max-delay-ms", "1500", "--buckets", "1,2,4,8")
    try:
        big = np.zeros((64, 1, 8, 8), np.float32)           # 16 KiB of tensor, over 10 KiB
        client = http.InferenceServerClient(url=s.url, network_timeout=30)
        with pytest.raises(http.InferenceServerException) as e:
            client.infer("lenet", [_input(big)])
        assert e.value.status() == "413" and "over the limit" in e.value.message()
        # one request of 1 row waits up to 1.5 s for company (the queue's one place); the next is refused
        results = {}
        first = threading.Thread(target=lambda: results.setdefault(
            "first", http.InferenceServerClient(url=s.url).infer("lenet", [_input(big[:1])]).as_numpy("prob")))
        first.start()
        time.sleep(0.3)
        start = time.monotonic()
        with pytest.raises(http.InferenceServerException) as e:
            client.infer("lenet", [_input(big[:1])])
        refused_in = time.monotonic() - start
        assert e.value.status() == "503" and "queue is full" in e.value.message()
        assert refused_in < 0.5, refused_in
        first.join(10)
        assert results["first"].shape == (1, 10)
    finally:
        assert s.stop() == 0


def test_the_batcher_coalesces_concurrent_requests_and_sigterm_finishes_them():
    s = Server("--max-delay-ms", "1000")
    try:
        import toolkit
        model = toolkit.load(NET)
        rng = np.random.default_rng(1)
        xs = [rng.standard_normal((1 + i % 3, 1, 8, 8)).astype(np.float32) for i in range(8)]
        results: dict[int, np.ndarray] = {}

        def one(i):
            results[i] = http.InferenceServerClient(url=s.url).infer("lenet", [_input(xs[i])]).as_numpy("prob")
        threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        depth, deadline = 0.0, time.monotonic() + 0.8
        while depth < 8 and time.monotonic() < deadline:      # all 8 wait for the one batch
            with urllib.request.urlopen(f"http://{s.url}/metrics", timeout=5) as r:
                depth = float(re.search(r"^toolkit_queue_depth (\S+)", r.read().decode(), re.M).group(1))
        assert depth == 8, depth
        assert s.proc.poll() is None
        s.terminate()                        # stop accepting; the 8 must still be answered
        for t in threads:
            t.join(15)
        assert s.stop() == 0
        assert "stopped: 8 infer request(s) answered, 0 refused" in s.log, s.log
        assert sorted(results) == list(range(8))
        for i, x in enumerate(xs):
            # another bucket: float32 rounding
            np.testing.assert_allclose(results[i], model.infer(data=x)["prob"], rtol=1e-5, atol=1e-6)
        with pytest.raises(Exception):
            http.InferenceServerClient(url=s.url, connection_timeout=2).is_server_live()
    finally:
        s.stop()


def test_metrics_count_batches_rows_and_errors(server):
    client = http.InferenceServerClient(url=server.url)
    client.infer("lenet", [_input(np.zeros((5, 1, 8, 8), np.float32))])
    with urllib.request.urlopen(f"http://{server.url}/metrics", timeout=10) as r:
        text = r.read().decode()
    for name in ("toolkit_queue_depth", "toolkit_batch_rows_bucket", "toolkit_request_latency_seconds_bucket",
                 "toolkit_requests_total", "toolkit_errors_total"):
        assert name in text, name
    rows = float(re.search(r"^toolkit_batch_rows_sum (\S+)", text, re.M).group(1))
    assert rows >= 5


def test_flag_mistakes_and_a_taken_port_are_one_line_errors_with_status_2():
    import socket
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    try:
        port = taken.getsockname()[1]
        for flags, message in ((["--max-delay-ms", "-1"], "error: --max-delay-ms must be 0 or more, got -1"),
                               (["--timeout-s", "0"], "error: --timeout-s must be more than 0, got 0"),
                               (["--max-connections", str(10**9)], f"error: --max-connections {10**9} is over the"),
                               (["--port", str(port)], f"error: cannot listen on 127.0.0.1:{port}:")):
            result = subprocess.run([sys.executable, "-m", "toolkit.cli", "serve", NET, *flags], cwd=ROOT,
                                    capture_output=True, text=True, timeout=60)
            lines = result.stderr.strip().splitlines()
            assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith(message), result.stderr
    finally:
        taken.close()


def test_triton_client_reads_the_model_config_and_the_statistics(server):
    client = http.InferenceServerClient(url=server.url)
    config = client.get_model_config("lenet")
    assert config["name"] == "lenet" and config["max_batch_size"] == 64
    assert config["input"] == [{"name": "data", "data_type": "TYPE_FP32", "dims": [1, 8, 8]}]
    assert config["output"] == [{"name": "prob", "data_type": "TYPE_FP32", "dims": [10]}]
    assert config["dynamic_batching"]["preferred_batch_size"] == [1, 2, 4, 8, 16, 32, 64]
    before = client.get_inference_statistics("lenet")["model_stats"][0]
    x = np.zeros((3, 1, 8, 8), np.float32)
    for _ in range(2):
        client.infer("lenet", [_input(x)])
    with pytest.raises(Exception):
        client.infer("lenet", [_input(np.zeros((3, 2, 8, 8), np.float32))])      # a wrong shape: a failure
    after = client.get_inference_statistics("lenet")["model_stats"][0]
    assert after["name"] == "lenet" and after["version"] == "1"
    stats, was = after["inference_stats"], before["inference_stats"]
    assert stats["success"]["count"] - was["success"]["count"] == 2
    assert stats["fail"]["count"] - was["fail"]["count"] == 1
    assert after["inference_count"] - before["inference_count"] == 6           # rows
    assert after["execution_count"] - before["execution_count"] == 2
    assert stats["compute_infer"]["ns"] > was["compute_infer"]["ns"] and after["last_inference"] > 0
    assert any(b["batch_size"] == 3 for b in after["batch_stats"])
    everything = client.get_inference_statistics()
    assert [m["name"] for m in everything["model_stats"]] == ["lenet"]
    with pytest.raises(Exception, match="unknown model 'other'"):
        client.get_model_config("other")
