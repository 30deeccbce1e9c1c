#!/usr/bin/env python
"""Load on `toolkit serve` over loopback: throughput and latency at several concurrencies, with
the dynamic batcher and without it (batch-1 serving).

    python benchmarks/serve_load.py [NET] [--requests 2000] [--concurrency 1,8,32] [--client raw|triton]

For each configuration it starts a server (`--warm`; without the batcher: `--buckets 1`), and
every client sends single-row requests back to back over its own keep-alive connection, each a
row drawn from a fixed pool of random inputs, with binary tensors (the KServe binary extension).
Every response is checked against a direct infer of the same row (toolkit.load, float32 rounding
tolerance: a row batched with others runs in another bucket), so a lost or mismatched answer is
counted, not hidden. Bounded: --requests per run, and a run stops after --seconds.

The load comes from one separate process. `--client raw` (the default) is a lean asyncio client
with pre-encoded requests, in the manner of Triton's perf_analyzer: on a 2-core machine the
server and the load share the cores, and a heavy client measures itself. `--client triton` uses
Triton's Python client from threads instead. Also reports the server's RSS before and after a
run of random batch sizes, and each bucket's first request after `--warm` against later ones.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def start_server(net: str, flags: list[str], warm: bool = True,
                 env: dict | None = None) -> tuple[subprocess.Popen, str]:
    """`toolkit serve NET` on a free loopback port; returns it and its address once it listens.
    ``env``: variables set for the server, over this process's."""
    proc = subprocess.Popen([sys.executable, "-m", "toolkit.cli", "serve", str(net), "--port", "0",
                             *(["--warm"] if warm else []), *flags], cwd=ROOT, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})
    for line in proc.stderr:
        m = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        if m:
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
            return proc, f"127.0.0.1:{m.group(1)}"
    raise SystemExit("the server did not start")


def http_header(head: bytes, name: bytes) -> int:
    """An integer header of a raw HTTP response head (``name`` in lower case)."""
    for line in head.split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == name:
            return int(value)
    raise ValueError(f"no {name.decode()} header")


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return -1


def _summary(concurrency: int, latencies: list[float], errors: list[str], mismatched: int, wall: float) -> dict:
    lat = sorted(latencies)
    return {"concurrency": concurrency, "answered": len(lat), "errors": len(errors), "mismatched": mismatched,
            "throughput_rps": round(len(lat) / wall, 1),
            "p50_ms": round(1e3 * lat[len(lat) // 2], 2) if lat else None,
            "p99_ms": round(1e3 * lat[min(len(lat) - 1, int(0.99 * len(lat)))], 2) if lat else None,
            "first_errors": errors[:3]}


def run_load_raw(url: str, model_name: str, input_name: str, output_name: str, pool: np.ndarray, want: np.ndarray,
                 concurrency: int, requests: int, seconds: float) -> dict:
    """Each client: one keep-alive connection, requests pre-encoded, the binary answer parsed."""
    import asyncio

    host, port = url.rsplit(":", 1)
    head_of = {}
    encoded = []
    for i in range(len(pool)):
        raw = pool[i: i + 1].tobytes()
        head = json.dumps({"inputs": [{"name": input_name, "shape": [1, *pool.shape[1:]], "datatype": "FP32",
                                       "parameters": {"binary_data_size": len(raw)}}],
                           "outputs": [{"name": output_name, "parameters": {"binary_data": True}}]}).encode()
        head_of[i] = len(head)
        encoded.append((f"POST /v2/models/{model_name}/infer HTTP/1.1\r\nHost: {url}\r\n"
                        f"Content-Type: application/octet-stream\r\nContent-Length: {len(head) + len(raw)}\r\n"
                        f"Inference-Header-Content-Length: {len(head)}\r\n\r\n").encode() + head + raw)
    latencies: list[float] = []
    errors: list[str] = []
    mismatched = [0]
    left = [requests]
    deadline = time.monotonic() + seconds

    header = http_header

    async def client(seed: int):
        rng = np.random.default_rng(seed)
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            while left[0] > 0 and time.monotonic() < deadline:
                left[0] -= 1
                i = int(rng.integers(len(pool)))
                start = time.perf_counter()
                try:
                    writer.write(encoded[i])
                    head = await reader.readuntil(b"\r\n\r\n")
                    body = await reader.readexactly(header(head, b"content-length"))
                except (OSError, ValueError, asyncio.IncompleteReadError) as e:
                    errors.append(f"{type(e).__name__}: {e}"[:200])
                    return                       # the connection is gone or out of step
                elapsed = time.perf_counter() - start
                if not head.startswith(b"HTTP/1.1 200"):
                    errors.append(head.split(b"\r\n")[0].decode() + " " + body[:150].decode(errors="replace"))
                    continue
                json_len = header(head, b"inference-header-content-length")
                out = np.frombuffer(body, dtype=np.float32, offset=json_len).reshape(want[i: i + 1].shape)
                latencies.append(elapsed)
                mismatched[0] += not np.allclose(out, want[i: i + 1], rtol=1e-4, atol=1e-6)
        finally:
            writer.close()

    async def all_clients():
        await asyncio.gather(*(client(s) for s in range(concurrency)))

    start = time.perf_counter()
    try:
        import uvloop
        uvloop.run(all_clients())
    except ImportError:
        asyncio.run(all_clients())
    return _summary(concurrency, latencies, errors, mismatched[0], time.perf_counter() - start)


def run_load_triton(url: str, model_name: str, input_name: str, output_name: str, pool: np.ndarray, want: np.ndarray,
             concurrency: int, requests: int, seconds: float) -> dict:
    import tritonclient.http as http

    latencies: list[float] = []
    errors: list[str] = []
    mismatched = [0]
    counter = iter(range(requests))
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def client_thread(seed: int):
        client = http.InferenceServerClient(url=url, network_timeout=60)
        rng = np.random.default_rng(seed)
        while time.monotonic() < deadline:
            with lock:
                if next(counter, None) is None:
                    return
            i = int(rng.integers(len(pool)))
            inp = http.InferInput(input_name, [1, *pool.shape[1:]], "FP32")
            inp.set_data_from_numpy(pool[i: i + 1], binary_data=True)
            start = time.perf_counter()
            try:
                out = client.infer(model_name, [inp]).as_numpy(output_name)
            except Exception as e:            # counted: a lost request is a result, not a crash
                with lock:
                    errors.append(str(e)[:200])
                continue
            elapsed = time.perf_counter() - start
            ok = np.allclose(out, want[i: i + 1], rtol=1e-4, atol=1e-6)
            with lock:
                latencies.append(elapsed)
                mismatched[0] += not ok

    threads = [threading.Thread(target=client_thread, args=(s,)) for s in range(concurrency)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return _summary(concurrency, latencies, errors, mismatched[0], time.perf_counter() - start)


def rss_across_random_batches(url: str, pid: int, model_name: str, input_name: str, shape: tuple,
                              n: int = 1000) -> dict:
    import tritonclient.http as http
    client = http.InferenceServerClient(url=url)
    rng = np.random.default_rng(7)

    def one(rows: int) -> float:
        x = rng.standard_normal((rows, *shape)).astype(np.float32)
        inp = http.InferInput(input_name, list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        start = time.perf_counter()
        client.infer(model_name, [inp])
        return time.perf_counter() - start

    client.is_server_ready()          # the connection is set up before any timed request
    # after --warm: each bucket's first request against its later ones
    firsts, laters = {}, {}
    for rows in (1, 2, 4, 8, 16, 32, 64):
        firsts[rows] = one(rows)
        laters[rows] = statistics.median(one(rows) for _ in range(5))
    before = rss_kib(pid)
    for _ in range(n):
        one(int(rng.integers(1, 200)))
    after = rss_kib(pid)
    return {"rss_before_kib": before, "rss_after_kib": after, "requests": n,
            "first_vs_later_ms": {r: [round(1e3 * firsts[r], 2), round(1e3 * laters[r], 2)] for r in firsts}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("net", nargs="?", default="zoo:lenet")
    p.add_argument("--requests", type=int, default=2000, help="requests per run (default: %(default)s)")
    p.add_argument("--concurrency", default="1,8,32")
    p.add_argument("--seconds", type=float, default=60.0, help="a run stops after this long (default: %(default)s)")
    p.add_argument("--max-delay-ms", default="2")
    p.add_argument("--client", choices=("raw", "triton"), default="raw",
                   help="the load generator (default: %(default)s, see above)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    import toolkit

    model = toolkit.load(args.net)
    inp, out = model.inputs[0], model.outputs[0]
    shape = tuple(inp.shape[1:])
    pool = np.random.default_rng(0).standard_normal((256, *shape)).astype(np.float32)
    want = model.infer({inp.name: pool})[out.name]
    report = {"net": args.net, "client": args.client, "runs": []}
    load = run_load_raw if args.client == "raw" else run_load_triton
    # the load runs in its own process, so that neither it nor the server waits on the other's GIL
    workers = multiprocessing.get_context("spawn").Pool(1)
    for label, flags in (("dynamic batcher", ["--max-delay-ms", args.max_delay_ms]),
                         ("batch-1 serving", ["--buckets", "1", "--max-delay-ms", "0"])):
        proc, url = start_server(args.net, flags)
        try:
            for c in (int(x) for x in args.concurrency.split(",")):
                row = workers.apply(load, (url, model.name, inp.name, out.name, pool, want, c, args.requests,
                                           args.seconds))
                row["mode"] = label
                report["runs"].append(row)
                print(json.dumps(row), file=sys.stderr)
            if label == "dynamic batcher":
                report["memory"] = rss_across_random_batches(url, proc.pid, model.name, inp.name, shape)
                print(json.dumps(report["memory"]), file=sys.stderr)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
    workers.close()
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    print(f"{args.net}, single-row requests over loopback, {args.client} client, {args.requests} per run\n")
    print("| serving | clients | answered | lost | mismatched | requests/s | p50 | p99 |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|")
    for r in report["runs"]:
        print(f"| {r['mode']} | {r['concurrency']} | {r['answered']} | {r['errors']} | {r['mismatched']} | "
              f"{r['throughput_rps']} | {r['p50_ms']} ms | {r['p99_ms']} ms |")
    m = report["memory"]
    print(f"\nRSS {m['rss_before_kib'] / 1024:.1f} MiB before and {m['rss_after_kib'] / 1024:.1f} MiB after "
          f"{m['requests']} requests of 1 to 199 rows; first / later request per bucket (ms): {m['first_vs_later_ms']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
