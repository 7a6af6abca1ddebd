"""What ``tidemark up`` remembers about the services it restarts, and when it restarts them.

:class:`Backoff` decides the wait before restarting a service that exited: ``initial_s``
doubling with each crash in a row up to ``max_s``, back to ``initial_s`` once the service had
stayed up for ``stable_s`` before it crashed (a service that crashes once a day restarts at
once; one that cannot start does not spin).

:class:`SupervisorState` is the state file (``supervisor.json`` in the data directory) that the
running supervisor rewrites on every start, exit and restart, and that ``tidemark status``
reads: each service's process id, restarts and last exit reason. It is replaced atomically
(write, then rename), so a reader never sees half of it.
"""

from __future__ import annotations

import json
import os
import signal
from dataclasses import asdict, dataclass, field
from pathlib import Path

STATE_FILE = "supervisor.json"


@dataclass(frozen=True)
class Backoff:
    initial_s: float = 0.5
    max_s: float = 30.0
    stable_s: float = 60.0

    def delay(self, crashes_in_a_row: int) -> float:
        """The wait before the restart after the ``crashes_in_a_row``-th crash (1 = first)."""
        return min(self.max_s, self.initial_s * 2.0 ** max(0, crashes_in_a_row - 1))

    def was_stable(self, uptime_s: float) -> bool:
        """Whether a service that ran ``uptime_s`` before it exited counts as having worked
        (its crash count starts over)."""
        return uptime_s >= self.stable_s


def exit_reason(returncode: int) -> str:
    """``exit code 3`` or ``signal SIGKILL`` (a negative return code is the signal)."""
    if returncode < 0:
        try:
            return f"signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"signal {-returncode}"
    return f"exit code {returncode}"


@dataclass
class ServiceRecord:
    pid: int = 0
    started_at: float = 0.0
    """Wall-clock seconds of the current process's start."""
    restarts: int = 0
    last_exit: str = ""
    """The exit reason of the last process that ended by itself (``""``: none did)."""
    last_exit_at: float = 0.0


@dataclass
class SupervisorState:
    supervisor_pid: int
    base_port: int
    services: dict[str, ServiceRecord] = field(default_factory=dict)
    tls: bool = False
    """The services serve mTLS (``tidemark up --tls``)."""

    def save(self, data_dir: Path) -> None:
        path = data_dir / STATE_FILE
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(asdict(self), indent=1))
        os.replace(temporary, path)

    @classmethod
    def load(cls, data_dir: Path) -> SupervisorState | None:
        """The state a supervisor left in ``data_dir``; ``None`` if there is none or it cannot
        be read."""
        try:
            raw = json.loads((data_dir / STATE_FILE).read_text())
            services = {name: ServiceRecord(**r) for name, r in raw["services"].items()}
            return cls(
                int(raw["supervisor_pid"]),
                int(raw["base_port"]),
                services,
                bool(raw.get("tls", False)),
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def supervisor_alive(self) -> bool:
        try:
            os.kill(self.supervisor_pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
