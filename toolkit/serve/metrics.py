"""The server's Prometheus figures (prometheus_client, in its own registry so that two servers
in one process never share counters), exposed as text at /metrics; and the counts Triton's
statistics extension reports at /v2/models/NAME/stats (``get_inference_statistics``)."""
from __future__ import annotations

import threading
import time
from collections import defaultdict

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


class ServerMetrics:
    def __init__(self, buckets: tuple[int, ...]):
        self.registry = CollectorRegistry()
        r = self.registry
        self.queue_depth = Gauge("toolkit_queue_depth", "requests waiting for a batch", registry=r)
        self.in_flight = Gauge("toolkit_requests_in_flight", "infer requests received and not yet answered",
                               registry=r)
        self.batch_rows = Histogram("toolkit_batch_rows", "rows of each batch run (before padding)",
                                    buckets=tuple(float(b) for b in buckets), registry=r)
        self.batch_requests = Histogram("toolkit_batch_requests", "requests coalesced into each batch",
                                        buckets=(1, 2, 4, 8, 16, 32, 64, 128), registry=r)
        self.latency = Histogram("toolkit_request_latency_seconds", "infer request latency, receipt to answer",
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.requests = Counter("toolkit_requests", "infer requests answered, by HTTP status", ["code"],
                                registry=r)
        self.errors = Counter("toolkit_errors", "infer requests refused or failed, by reason", ["reason"],
                              registry=r)
        self.triton = TritonStats()
        # plans compiled so far: after --warm it stays put, or a request paid for a compile
        self.plans_built = Gauge("toolkit_plans_built", "plans compiled since the server started (--warm builds "
                                 "every bucket first)", registry=r)

    def text(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class _Duration:
    """A Triton statistics pair: how many, and their total time in nanoseconds."""

    __slots__ = ("count", "ns")

    def __init__(self):
        self.count, self.ns = 0, 0

    def add(self, seconds: float, count: int = 1) -> None:
        self.count += count
        self.ns += int(seconds * 1e9)

    def json(self) -> dict:
        return {"count": self.count, "ns": self.ns}


class TritonStats:
    """Triton's per-model statistics: requests that succeeded or failed (receipt to answer),
    time in the batcher's queue, batches executed and rows inferred, compute time per batch
    size. Updated from the event loop and the batcher's thread, hence the lock."""

    def __init__(self):
        self.lock = threading.Lock()
        self.success, self.fail, self.queue, self.compute = _Duration(), _Duration(), _Duration(), _Duration()
        self.by_batch: dict[int, _Duration] = defaultdict(_Duration)
        self.inferences = 0
        self.executions = 0
        self.last_inference_ms = 0

    def request(self, ok: bool, seconds: float) -> None:
        with self.lock:
            (self.success if ok else self.fail).add(seconds)
            if ok:
                self.last_inference_ms = int(time.time() * 1000)

    def batch(self, rows: int, waited: list[float], seconds: float) -> None:
        with self.lock:
            self.executions += 1
            self.inferences += rows
            for w in waited:
                self.queue.add(w)
            self.compute.add(seconds)
            self.by_batch[rows].add(seconds)

    def json(self, name: str, version: str = "1") -> dict:
        zero = _Duration().json()
        with self.lock:
            return {"name": name, "version": version, "last_inference": self.last_inference_ms,
                    "inference_count": self.inferences, "execution_count": self.executions,
                    "inference_stats": {"success": self.success.json(), "fail": self.fail.json(),
                                        "queue": self.queue.json(), "compute_input": zero,
                                        "compute_infer": self.compute.json(), "compute_output": zero,
                                        "cache_hit": zero, "cache_miss": zero},
                    "batch_stats": [{"batch_size": rows, "compute_input": zero, "compute_infer": d.json(),
                                     "compute_output": zero} for rows, d in sorted(self.by_batch.items())]}

