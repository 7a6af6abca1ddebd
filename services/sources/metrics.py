"""Prometheus metrics of the sources process."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

BATCHES = Counter(
    "tidemark_sources_batches", "source batches recorded (bound and appended)", ["source"]
)
ROWS = Counter("tidemark_sources_rows", "update rows recorded by source batches", ["source"])
RESTARTS = Counter(
    "tidemark_sources_ingestion_restarts",
    "ingestions that failed and started over (recovery runs again)",
    ["source"],
)
RUNNING = Gauge("tidemark_sources_running", "ingestions running in this process")
BOUND_AT = Gauge(
    "tidemark_sources_bound_at_ms", "the data time of each source's latest batch", ["source"]
)
