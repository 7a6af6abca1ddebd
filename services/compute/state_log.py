"""The ``dataflow_state`` log line: each dataflow's state size (keys, entries, estimated bytes,
as Status reports them), logged when it has moved enough to matter.

A line per step would drown the log, and sizes wobble as rows come and go, so a dataflow is
logged the first time it is seen running or hydrating, and again only when its estimated bytes
moved by at least ``fraction`` of the last logged figure and at least ``floor_bytes``, or when
it became empty or stopped being empty. Growth from zero to N bytes thus logs about
log(N) / log(1 + fraction) lines at most, however many steps it took.
"""

from __future__ import annotations

from collections.abc import Iterable

from services.compute.dataflow.guard import format_bytes
from services.compute.dataflow.work import StateSize
from tidemark.logging import get_logger
from tidemark.v1 import compute_pb2

log = get_logger("compute.state")

FRACTION = 0.1
FLOOR_BYTES = 1 << 20


class StateLog:
    def __init__(self, fraction: float = FRACTION, floor_bytes: int = FLOOR_BYTES) -> None:
        self.fraction = fraction
        self.floor_bytes = floor_bytes
        self._logged: dict[str, StateSize] = {}

    def observe(self, statuses: Iterable[compute_pb2.DataflowStatus]) -> None:
        """Logs the dataflows whose size moved enough since their last line; forgets the
        dataflows not among ``statuses`` (dropped)."""
        seen: set[str] = set()
        for status in statuses:
            dataflow_id = status.dataflow_id
            seen.add(dataflow_id)
            if status.state == "failed":
                continue  # its size reads as zero while failed; the failure has its own line
            size = StateSize(
                status.arrangement_keys,
                status.state_rows,
                status.state_bytes,
                status.state_spilled_bytes,
            )
            if self._moved(self._logged.get(dataflow_id), size):
                self._logged[dataflow_id] = size
                log.info(
                    "dataflow_state",
                    dataflow=dataflow_id,
                    state=status.state,
                    keys=size.keys,
                    rows=size.rows,
                    bytes=size.bytes,
                    size=format_bytes(size.bytes),
                    spilled_bytes=size.spilled_bytes,
                )
        for gone in self._logged.keys() - seen:
            del self._logged[gone]

    def _moved(self, last: StateSize | None, size: StateSize) -> bool:
        if last is None:
            return True
        if (last.rows == 0) != (size.rows == 0):
            return True
        change = abs(size.bytes - last.bytes)
        return change >= self.floor_bytes and change >= self.fraction * last.bytes
