"""``tidemark up``'s supervision without the services: the backoff, exit reasons, the state file
``tidemark status`` reads, and the restart loop on a real process that keeps crashing."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from tidemark.local.services import ServiceSpec, planned_services, session_keys_path
from tidemark.local.supervision import Backoff, ServiceRecord, SupervisorState, exit_reason
from tidemark.local.supervisor import RunningService, supervise


def test_backoff_doubles_to_its_cap_and_starts_over_after_a_stable_run() -> None:
    backoff = Backoff(initial_s=0.5, max_s=30.0, stable_s=60.0)
    assert [backoff.delay(n) for n in range(1, 9)] == [0.5, 1, 2, 4, 8, 16, 30, 30]
    assert backoff.was_stable(60.0) and not backoff.was_stable(59.9)


def test_exit_reasons() -> None:
    assert exit_reason(-signal.SIGKILL) == "signal SIGKILL"
    assert exit_reason(3) == "exit code 3"
    assert exit_reason(0) == "exit code 0"


def test_state_file_round_trip(tmp_path: Path) -> None:
    state = SupervisorState(
        os.getpid(), 6875, {"storage": ServiceRecord(12, 1.0, 2, "signal SIGKILL", 3.0)}
    )
    state.save(tmp_path)
    loaded = SupervisorState.load(tmp_path)
    assert loaded == state and loaded.supervisor_alive()
    (tmp_path / "supervisor.json").write_text("{not json")
    assert SupervisorState.load(tmp_path) is None
    assert SupervisorState.load(tmp_path / "missing") is None


def test_a_crashing_service_is_restarted_with_growing_delays(tmp_path: Path) -> None:
    # json.tool refuses the service flags and exits with 2 at once: a service that cannot stay up.
    spec = ServiceSpec("crasher", "json.tool", 1, ())
    backoff = Backoff(initial_s=0.1, max_s=0.4, stable_s=60.0)
    service = RunningService(spec, tmp_path, tmp_path)
    delays: list[float] = []
    deadline = time.monotonic() + 60
    try:
        while service.record.restarts < 4:
            assert time.monotonic() < deadline, service.record
            before = service.restart_due
            supervise([service], backoff)
            if before is None and service.restart_due is not None:
                delays.append(round(service.restart_due - time.monotonic(), 1))
            time.sleep(0.02)
    finally:
        service.stop(time.monotonic() + 5)
    assert service.record.last_exit == "exit code 2"
    assert delays[:4] == [0.1, 0.2, 0.4, 0.4]
    assert "usage" in (tmp_path / "crasher.log").read_text()


def test_the_adapter_gets_the_data_directorys_session_keys(tmp_path: Path) -> None:
    """One keys file in the data directory: sessions survive the adapter's restarts."""
    adapter = next(s for s in planned_services(tmp_path) if s.name == "adapter")
    flag = adapter.args.index("--session-keys-file")
    assert adapter.args[flag + 1] == str(session_keys_path(tmp_path))
    assert session_keys_path(tmp_path) == tmp_path / "session-keys"
