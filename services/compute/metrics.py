"""Prometheus metrics of a compute process: its dataflows and its one-shot queries.

Step and hydration times are observed as they happen (``running.py``). The per-dataflow
gauges (hydration progress, arrangement sizes, lag, state) are taken from the same
description Status gives, every ``interval`` seconds by :func:`publish_dataflows`: reading an
arrangement's size may need a round trip to the resident Spark tasks, which a scrape should
not wait for. A dropped dataflow's series disappear at the next round. The same rounds write
the ``dataflow_state`` log lines (``state_log.py``).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from prometheus_client import Counter, Gauge, Histogram

from services.compute.state_log import StateLog
from tidemark.errors import TidemarkError
from tidemark.logging import get_logger

if TYPE_CHECKING:  # the host moves some of these metrics itself
    from services.compute.host import DataflowManager

log = get_logger("compute.metrics")

STEP_SECONDS = Histogram(
    "tidemark_compute_step_seconds",
    "time a dataflow's engine took for one step (kind=step) or its hydration (kind=hydrate)",
    ["kind"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
)
ONE_SHOTS = Counter(
    "tidemark_compute_one_shots",
    "one-shot queries evaluated, by outcome (ok, cancelled, over_budget, failed)",
    ["outcome"],
)
ONE_SHOTS_IN_FLIGHT = Gauge(
    "tidemark_compute_one_shots_in_flight", "one-shot queries waiting for or holding a worker"
)

_LABELS = ["dataflow"]
HYDRATED_ROWS = Gauge(
    "tidemark_compute_hydration_input_rows",
    "input rows a dataflow has received for its hydration (progress: divide by the expected)",
    _LABELS,
)
HYDRATION_ROWS_TOTAL = Gauge(
    "tidemark_compute_hydration_input_rows_expected",
    "input rows a dataflow's hydration reads in all (an estimate until it is done)",
    _LABELS,
)
HYDRATION_PARTS = Gauge(
    "tidemark_compute_hydration_parts",
    "storage parts of its inputs a dataflow's hydration has read (where it goes by parts)",
    _LABELS,
)
HYDRATION_PARTS_TOTAL = Gauge(
    "tidemark_compute_hydration_parts_expected",
    "storage parts of its inputs a dataflow's hydration reads in all",
    _LABELS,
)
HYDRATED = Gauge(
    "tidemark_compute_dataflow_hydrated", "1 once a dataflow has hydrated, else 0", _LABELS
)
FAILED = Gauge(
    "tidemark_compute_dataflow_failed",
    "1 while a dataflow is failed (over its memory budget, engine lost, ...), else 0",
    _LABELS,
)
RESTARTS = Gauge("tidemark_compute_dataflow_restarts", "restarts of a failed dataflow", _LABELS)
ARRANGEMENT_KEYS = Gauge(
    "tidemark_compute_arrangement_keys", "keys held in a dataflow's arrangements", _LABELS
)
ARRANGEMENT_BYTES = Gauge(
    "tidemark_compute_arrangement_bytes",
    "estimated bytes of a dataflow's operator state, over all shards",
    _LABELS,
)
INDEX_ROWS = Gauge("tidemark_compute_index_rows", "rows in a dataflow's index", _LABELS)
LAG_SECONDS = Gauge(
    "tidemark_compute_dataflow_lag_seconds",
    "how far a dataflow's output upper trails its inputs' upper",
    _LABELS,
)
_GAUGES = (
    HYDRATED_ROWS,
    HYDRATION_ROWS_TOTAL,
    HYDRATION_PARTS,
    HYDRATION_PARTS_TOTAL,
    HYDRATED,
    FAILED,
    RESTARTS,
    ARRANGEMENT_KEYS,
    ARRANGEMENT_BYTES,
    INDEX_ROWS,
    LAG_SECONDS,
)


async def publish_once(
    host: DataflowManager, shown: set[str], state_log: StateLog | None = None
) -> set[str]:
    """Sets the per-dataflow gauges from the host's description (and writes the
    ``dataflow_state`` lines due, given ``state_log``); removes the series of the dataflows
    in ``shown`` that are gone. Returns the dataflows shown now."""
    ONE_SHOTS_IN_FLIGHT.set(host.one_shots.in_flight)
    by_id = {running.dataflow_id: running for running in host.running()}
    statuses = await host.status()
    if state_log is not None:
        state_log.observe(statuses)
    for status in statuses:
        dataflow_id = status.dataflow_id
        HYDRATED_ROWS.labels(dataflow_id).set(status.hydrated_rows)
        HYDRATION_ROWS_TOTAL.labels(dataflow_id).set(status.hydration_rows_total)
        HYDRATION_PARTS.labels(dataflow_id).set(status.hydration_parts_done)
        HYDRATION_PARTS_TOTAL.labels(dataflow_id).set(status.hydration_parts_total)
        HYDRATED.labels(dataflow_id).set(1 if status.state == "running" else 0)
        FAILED.labels(dataflow_id).set(1 if status.state == "failed" else 0)
        RESTARTS.labels(dataflow_id).set(status.restarts)
        ARRANGEMENT_KEYS.labels(dataflow_id).set(status.arrangement_keys)
        INDEX_ROWS.labels(dataflow_id).set(status.index_rows)
        LAG_SECONDS.labels(dataflow_id).set(status.lag_ms / 1000)
        ARRANGEMENT_BYTES.labels(dataflow_id).set(status.state_bytes)
    current = set(by_id)
    for gone in shown - current:
        for gauge in _GAUGES:
            try:
                gauge.remove(gone)
            except KeyError:
                pass
    return current


async def publish_dataflows(host: DataflowManager, interval: float = 2.0) -> None:
    """Keeps the per-dataflow gauges and the ``dataflow_state`` log current, until
    cancelled."""
    shown: set[str] = set()
    state_log = StateLog()
    while True:
        try:
            shown = await publish_once(host, shown, state_log)
        except TidemarkError as exc:
            log.info("metrics_publish_failed", error=exc.message)
        except Exception:  # metrics must not take the process down; the log has the bug
            log.exception("metrics_publish_failed")
        await asyncio.sleep(interval)
