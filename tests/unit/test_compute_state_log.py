"""The ``dataflow_state`` log line: written when a dataflow is first seen and when its size
moves enough, not at every round."""

from __future__ import annotations

from structlog.testing import capture_logs

from services.compute.state_log import StateLog
from tidemark.v1 import compute_pb2


def _status(dataflow_id: str, rows: int, state: str = "running") -> compute_pb2.DataflowStatus:
    return compute_pb2.DataflowStatus(
        dataflow_id=dataflow_id,
        state=state,
        arrangement_keys=rows // 10,
        state_rows=rows,
        state_bytes=rows * 200,
    )


def _logged(state_log: StateLog, *statuses: compute_pb2.DataflowStatus) -> list[tuple[str, int]]:
    with capture_logs() as logs:
        state_log.observe(statuses)
    assert all(line["event"] == "dataflow_state" for line in logs)
    return [(line["dataflow"], line["rows"]) for line in logs]


def test_a_dataflow_is_logged_when_its_size_moves_enough() -> None:
    state_log = StateLog(fraction=0.1, floor_bytes=1000)
    assert _logged(state_log, _status("a", 100), _status("b", 0)) == [("a", 100), ("b", 0)]
    # Under 10 % of the last logged size: nothing, however many rounds.
    for rows in (101, 105, 109, 104):
        assert _logged(state_log, _status("a", rows), _status("b", 0)) == []
    assert _logged(state_log, _status("a", 111), _status("b", 0)) == [("a", 111)]
    # Small in bytes (under the floor) but no longer empty, then empty again.
    assert _logged(state_log, _status("a", 111), _status("b", 1)) == [("b", 1)]
    assert _logged(state_log, _status("a", 111), _status("b", 0)) == [("b", 0)]
    # Shrinking logs too; a failed dataflow (whose size reads as zero) does not.
    assert _logged(state_log, _status("a", 50), _status("b", 0)) == [("a", 50)]
    assert _logged(state_log, _status("a", 0, "failed")) == []


def test_a_dropped_dataflow_is_forgotten() -> None:
    state_log = StateLog(fraction=0.1, floor_bytes=1000)
    assert _logged(state_log, _status("a", 100)) == [("a", 100)]
    assert _logged(state_log) == []
    # Installed again under the same id: logged as new.
    assert _logged(state_log, _status("a", 100)) == [("a", 100)]
