"""Prometheus metrics of the storage process: what appends write, and each collection's
shape and progress.

Appends count their batches, rows and bytes as they commit. Per collection, the metrics
describe the latest state this process committed or read: its upper's lag behind the wall
clock (how stale a read at the upper would be; the upper is in milliseconds, as the oracle
hands out times), and its batches and their bytes in the blob store (which compaction keeps
few). These are computed when Prometheus scrapes, from the states recorded here.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

from prometheus_client import Counter
from prometheus_client.core import REGISTRY, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from services.storage.state import ShardState
from tidemark.columnar import frontier_bound

APPENDED_BATCHES = Counter(
    "tidemark_storage_appended_batches", "batches written to the blob store by appends"
)
APPENDED_ROWS = Counter("tidemark_storage_appended_rows", "update rows written by appends")
APPENDED_BYTES = Counter(
    "tidemark_storage_appended_bytes", "bytes of the Parquet batches written by appends"
)
APPENDS = Counter(
    "tidemark_storage_appends", "appends committed (empty ones, which only move time, too)"
)


class CollectionsCollector(Collector):
    """The per-collection gauges, from the latest state recorded for each collection."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # recorded on the event loop, read by the scrape thread
        self._states: dict[str, ShardState] = {}

    def record(self, state: ShardState) -> None:
        with self._lock:
            self._states[state.collection_id] = state

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            states = list(self._states.values())
        now_ms = time.time() * 1000
        lag = GaugeMetricFamily(
            "tidemark_storage_upper_lag_seconds",
            "wall clock minus the collection's upper (closed collections are left out)",
            labels=["collection"],
        )
        batches = GaugeMetricFamily(
            "tidemark_storage_batches", "batches the collection consists of", labels=["collection"]
        )
        stored = GaugeMetricFamily(
            "tidemark_storage_bytes",
            "bytes of the collection's batches in the blob store",
            labels=["collection"],
        )
        for state in states:
            collection = state.collection_id
            upper = frontier_bound(state.upper)
            if upper is not None:
                lag.add_metric([collection], max(0.0, now_ms - upper) / 1000)
            batches.add_metric([collection], len(state.batches))
            stored.add_metric([collection], sum(batch.size for batch in state.batches))
        yield lag
        yield batches
        yield stored


COLLECTIONS = CollectionsCollector()
REGISTRY.register(COLLECTIONS)
