#!/usr/bin/env python
"""`toolkit serve` with requests of random sequence lengths: buckets over T against a plan per length.

    python benchmarks/serve_lengths.py [--nets gru,decoder] [--requests 400] [--concurrency 1,8]
                                       [--max-length 128] [--length-buckets 16,32,64,128]

Each net (benchmarks/nets/gru_lengths.yaml, decoder_lengths.yaml: a stacked bidirectional GRU and
a two-block causal transformer, both over [N, T, 16]) is served three times, with random weights,
each server starting from an empty kernel cache (a server meeting these lengths for the first
time):

- buckets: `--buckets 'N=1,2,4,8 T=16,32,64,128' --warm`: every request is padded up to its
  bucket, requests of different lengths in one bucket share a batch, and no plan is built after
  the warm-up;
- per length: `--buckets 1,2,4,8`: each new length T builds plans of its own on the request path
  (the session keeps the 16 most recent), and only requests of the same length batch. Its kernels
  take the sizes when they run, so most new lengths load a library already compiled;
- per length, sizes compiled in: the same with `TOOLKIT_RUN_TIME_SIZES=0`, every new length's
  kernels compiled for it (the toolkit before run-time sizes).

Clients send single-row requests of lengths drawn uniformly from 1..--max-length, back to back
over keep-alive connections (binary tensors, pre-encoded). Every answer is checked against a
direct infer of the same row at its own length (float32 tolerance), so a wrong answer is counted,
not hidden. Reports latency percentiles, throughput and the plans the server compiled.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from serve_load import http_header, start_server  # noqa: E402  (the loopback server and raw client's pieces)

NETS = {"gru": ROOT / "benchmarks" / "nets" / "gru_lengths.yaml",
        "decoder": ROOT / "benchmarks" / "nets" / "decoder_lengths.yaml"}


def plans_built(url: str) -> int:
    with urllib.request.urlopen(f"http://{url}/metrics", timeout=10) as r:
        return int(float(re.search(r"^toolkit_plans_built (\S+)", r.read().decode(), re.M).group(1)))


def encode(url: str, model: str, x: np.ndarray) -> bytes:
    raw = x.tobytes()
    head = json.dumps({"inputs": [{"name": "data", "shape": list(x.shape), "datatype": "FP32",
                                   "parameters": {"binary_data_size": len(raw)}}],
                       "outputs": [{"name": "prob", "parameters": {"binary_data": True}}]}).encode()
    return (f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: {url}\r\nContent-Type: application/octet-stream\r\n"
            f"Content-Length: {len(head) + len(raw)}\r\nInference-Header-Content-Length: {len(head)}\r\n\r\n"
            ).encode() + head + raw


def load(url: str, model: str, pool: list[np.ndarray], want: list[np.ndarray], concurrency: int,
         requests: int) -> dict:
    host, port = url.rsplit(":", 1)
    encoded = [encode(url, model, x) for x in pool]
    latencies: list[float] = []
    errors: list[str] = []
    wrong = [0]
    left = [requests]

    header = http_header

    async def client(seed: int):
        rng = np.random.default_rng(seed)
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            while left[0] > 0:
                left[0] -= 1
                i = int(rng.integers(len(pool)))
                start = time.perf_counter()
                writer.write(encoded[i])
                head = await reader.readuntil(b"\r\n\r\n")
                body = await reader.readexactly(header(head, b"content-length"))
                elapsed = time.perf_counter() - start
                if not head.startswith(b"HTTP/1.1 200"):
                    errors.append(head.split(b"\r\n")[0].decode() + " " + body[:150].decode(errors="replace"))
                    continue
                out = np.frombuffer(body, np.float32, offset=header(head, b"inference-header-content-length"))
                latencies.append(elapsed)
                wrong[0] += not np.allclose(out.reshape(want[i].shape), want[i], rtol=1e-4, atol=1e-5)
        finally:
            writer.close()

    async def clients():
        await asyncio.gather(*(client(s) for s in range(concurrency)))

    start = time.perf_counter()
    asyncio.run(clients())
    wall = time.perf_counter() - start
    lat = np.sort(np.array(latencies)) * 1e3
    pick = (lambda q: round(float(np.percentile(lat, q)), 2)) if len(lat) else (lambda q: None)
    return {"answered": len(lat), "errors": len(errors), "wrong": wrong[0], "rps": round(len(lat) / wall, 1),
            "p50_ms": pick(50), "p90_ms": pick(90), "p99_ms": pick(99), "max_ms": pick(100),
            "first_errors": errors[:2]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nets", default="gru,decoder")
    p.add_argument("--requests", type=int, default=400)
    p.add_argument("--concurrency", default="1,8")
    p.add_argument("--max-length", type=int, default=128)
    # (--gears: the old name, still taken)
    p.add_argument("--length-buckets", "--gears", dest="length_buckets", default="16,32,64,128",
                   help="the buckets over T of the first way of serving (default: %(default)s)")
    p.add_argument("--json", metavar="FILE", help="also write the rows as JSON lines")
    args = p.parse_args(argv)
    import toolkit
    from toolkit.weights import save_weights
    rows = []
    folder = Path(tempfile.mkdtemp(prefix="serve_lengths_"))
    for key in args.nets.split(","):
        net_file = NETS[key]
        net = toolkit.Net(str(net_file))
        weights = folder / f"{key}.safetensors"
        save_weights(str(weights), net.init_weights(seed=0))
        rng = np.random.default_rng(1)
        pool = [rng.standard_normal((1, int(t), 16)).astype(np.float32)
                for t in rng.integers(1, args.max_length + 1, 256)]
        exact = toolkit.load(str(net_file), weights=str(weights), buckets=[1])
        want = [exact.infer(data=x)["prob"] for x in pool]
        modes = (("buckets", ["--buckets", f"N=1,2,4,8 T={args.length_buckets}", "--warm"], {}),
                 ("per length", ["--buckets", "1,2,4,8"], {}),
                 ("per length, sizes compiled in", ["--buckets", "1,2,4,8"], {"TOOLKIT_RUN_TIME_SIZES": "0"}))
        for mode, flags, env in modes:
            for concurrency in (int(c) for c in args.concurrency.split(",")):
                cache = tempfile.mkdtemp(prefix="kernels_", dir=folder)
                proc, url = start_server(net_file, ["--weights", str(weights), *flags], warm=False,
                                         env={**env, "TOOLKIT_CACHE": cache})
                try:
                    before = plans_built(url)
                    row = {"net": net.spec.name, "mode": mode, "concurrency": concurrency,
                           **load(url, net.spec.name, pool, want, concurrency, args.requests)}
                    row["plans_built_warm"], row["plans_built_serving"] = before, plans_built(url) - before
                finally:
                    proc.terminate()
                    proc.wait(30)
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    print(f"lengths 1..{args.max_length}, {args.requests} single-row requests per run; "
          f"buckets T={args.length_buckets}\n")
    print("| net | serving | clients | p50 ms | p90 ms | p99 ms | requests/s | plans built while serving | wrong |")
    print("|---|---|--:|--:|--:|--:|--:|--:|--:|")
    for r in rows:
        print(f"| {r['net']} | {r['mode']} | {r['concurrency']} | {r['p50_ms']} | {r['p90_ms']} | {r['p99_ms']} | "
              f"{r['rps']} | {r['plans_built_serving']} | {r['wrong'] + r['errors']} |")
    if args.json:
        Path(args.json).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
