"""`toolkit serve` with buckets over a sequence length: requests of different lengths are padded up
to their bucket and batched together, each answered with its own length's outputs, equal to a plan
built for that length; a request longer than the largest bucket is a 400 that says so."""
from __future__ import annotations

import re
import threading
import urllib.request

import numpy as np
import pytest
from serve_helpers import Server

http = pytest.importorskip("tritonclient.http", reason="the test extra's tritonclient[http] is not installed")

NET = """\
name: tagger
inputs:
  data: {shape: [N, T, 6], dtype: float32}
layers:
  - {name: embed, type: InnerProduct, bottom: data, top: tok, num_output: 8, axis: 2}
  - {name: attn, type: MultiHeadAttention, bottom: tok, top: att, num_heads: 2, causal: true}
  - {name: gru, type: GRU, bottom: att, top: [seq, h], num_output: 4, bidirectional: true}
  - {name: tags, type: InnerProduct, bottom: seq, top: tags, num_output: 3, axis: 2}
  - {name: feat, type: Permute, bottom: seq, top: feat, order: [0, 2, 1]}
  - {name: pool, type: Reduction, bottom: feat, top: pooled, operation: mean, axis: 2}
outputs: [tags, pooled]
"""


def test_requests_of_different_lengths_share_a_bucket_and_get_their_own_lengths_back(tmp_path):
    import toolkit
    from toolkit.weights import save_weights
    (tmp_path / "tagger.yaml").write_text(NET)
    net = toolkit.Net(str(tmp_path / "tagger.yaml"))
    save_weights(str(tmp_path / "w.safetensors"), net.init_weights(seed=3))
    exact = toolkit.load(str(tmp_path / "tagger.yaml"), weights=str(tmp_path / "w.safetensors"))   # a plan per length
    s = Server("--weights", str(tmp_path / "w.safetensors"), "--buckets", "N=1,2,4,8 T=4,8",
               "--max-delay-ms", "1000", "--warm", net=str(tmp_path / "tagger.yaml"))
    try:
        assert "warmed 8 bucket plan(s)" in s.log, s.log          # 4 batch buckets x 2 buckets over T
        assert "buckets 1,2,4,8; buckets T=4,8," in s.log, s.log
        rng = np.random.default_rng(1)
        lengths = [3, 8, 1, 6, 4, 7]                    # buckets 4 and 8: two batches of three
        xs = [rng.standard_normal((1, t, 6)).astype(np.float32) for t in lengths]
        results: dict[int, dict] = {}

        def one(i):
            got = http.InferenceServerClient(url=s.url).infer("tagger", [_input(xs[i])])
            results[i] = {k: got.as_numpy(k) for k in ("tags", "pooled")}
        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(xs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        for i, x in enumerate(xs):
            want = exact.infer(data=x)
            assert results[i]["tags"].shape == (1, lengths[i], 3)
            np.testing.assert_allclose(results[i]["tags"], want["tags"], rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(results[i]["pooled"], want["pooled"], rtol=1e-5, atol=1e-6)
        with urllib.request.urlopen(f"http://{s.url}/metrics", timeout=5) as r:
            metrics = r.read().decode()
        # six requests in two batches (one per bucket), not six; no plan built on the request path
        assert float(re.search(r"^toolkit_batch_requests_count (\S+)", metrics, re.M).group(1)) == 2, metrics
        assert float(re.search(r"^toolkit_plans_built (\S+)", metrics, re.M).group(1)) == 8, metrics
        status, body = s.post("/v2/models/tagger/infer", _json_request(np.zeros((1, 9, 6), np.float32)))
        assert status == 400 and "T=9 is longer than the largest bucket 8" in body["error"], body
    finally:
        assert s.stop() == 0


def _input(x):
    inp = http.InferInput("data", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=True)
    return inp


def _json_request(x) -> bytes:
    import json
    return json.dumps({"inputs": [{"name": "data", "shape": list(x.shape), "datatype": "FP32",
                                   "data": x.reshape(-1).tolist()}]}).encode()


