"""The server's Prometheus figures (prometheus_client, in its own registry so that two servers
in one process never share counters), exposed as text at /metrics."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import CONTENT_TYPE_LATEST

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

    def text(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
