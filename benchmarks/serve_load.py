#!/usr/bin/env python
"""Load on `toolkit serve` from Triton's HTTP client, on loopback: throughput and latency at
several concurrencies, with the dynamic batcher and without it (batch-1 serving).

    python benchmarks/serve_load.py [NET] [--requests 2000] [--concurrency 1,8,32] [--seconds 60]

For each configuration it starts a server (`--warm`; without the batcher: `--buckets 1`), and
every client thread sends single-row requests back to back, each a row drawn from a fixed pool
of random inputs. Every response is checked against a direct infer of the same row
(toolkit.load, float32 rounding tolerance: a row batched with others runs in another bucket), so
a lost or mismatched answer is counted, not hidden. Bounded: --requests per run, and a run stops
after --seconds. Also reports the server's RSS before and after a run of random batch sizes.
"""
from __future__ import annotations

import argparse
import json
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


def start_server(net: str, flags: list[str]) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "toolkit.cli", "serve", net, "--port", "0", "--warm", *flags],
                            cwd=ROOT, stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:
        m = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        if m:
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
            return proc, f"127.0.0.1:{m.group(1)}"
    raise SystemExit("the server did not start")


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return -1


def run_load(url: str, model_name: str, input_name: str, output_name: str, pool: np.ndarray, want: np.ndarray,
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
    wall = time.perf_counter() - start
    lat = sorted(latencies)
    return {"concurrency": concurrency, "answered": len(lat), "errors": len(errors), "mismatched": mismatched[0],
            "throughput_rps": round(len(lat) / wall, 1),
            "p50_ms": round(1e3 * lat[len(lat) // 2], 2) if lat else None,
            "p99_ms": round(1e3 * lat[min(len(lat) - 1, int(0.99 * len(lat)))], 2) if lat else None,
            "first_errors": errors[:3]}


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
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    import toolkit

    model = toolkit.load(args.net)
    inp, out = model.inputs[0], model.outputs[0]
    shape = tuple(inp.shape[1:])
    pool = np.random.default_rng(0).standard_normal((256, *shape)).astype(np.float32)
    want = model.infer({inp.name: pool})[out.name]
    report = {"net": args.net, "runs": []}
    for label, flags in (("dynamic batcher", ["--max-delay-ms", args.max_delay_ms]),
                         ("batch-1 serving", ["--buckets", "1", "--max-delay-ms", "0"])):
        proc, url = start_server(args.net, flags)
        try:
            for c in (int(x) for x in args.concurrency.split(",")):
                row = run_load(url, model.name, inp.name, out.name, pool, want, c, args.requests, args.seconds)
                row["mode"] = label
                report["runs"].append(row)
                print(json.dumps(row), file=sys.stderr)
            if label == "dynamic batcher":
                report["memory"] = rss_across_random_batches(url, proc.pid, model.name, inp.name, shape)
                print(json.dumps(report["memory"]), file=sys.stderr)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    print(f"{args.net}, single-row requests over loopback, Triton's HTTP client, {args.requests} per run\n")
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
