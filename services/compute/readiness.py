"""When a compute process is ready: it has caught up with the catalog and hydrated what the
catalog held when it started.

At start, the process is ready once its catalog controller has applied the catalog up to the
time it started following it (so every index and materialized view of the cluster is
installed) and each of those dataflows has hydrated (or failed: a failed dataflow is reported
by Status and the metrics, and is restarted; it does not keep the whole cluster unready).
From then on, hydration no longer matters (a new view hydrating must not take the cluster out
of service); only a catalog subscription that keeps failing does.
"""

from __future__ import annotations

from services.compute.controller import CatalogController
from services.compute.host import DataflowManager
from services.compute.running import HYDRATING


class ComputeReadiness:
    """The process's readiness check (``tidemark.rpc.server.Readiness``)."""

    def __init__(self, host: DataflowManager, controller: CatalogController | None) -> None:
        self.host = host
        self.controller = controller
        self._started = controller is None

    def __call__(self) -> str | None:
        controller = self.controller
        if controller is None:
            return None
        if controller.follow_error is not None:
            return f"following the catalog fails: {controller.follow_error}"
        if self._started:
            return None
        if not controller.caught_up:
            return (
                f"catching up with the catalog: applied below catalog time "
                f"{controller.applied_upper}, started at {controller.started_at}"
            )
        hydrating = sorted(
            running.dataflow_id for running in self.host.running() if running.state == HYDRATING
        )
        if hydrating:
            return f"hydrating {len(hydrating)} dataflow(s): {', '.join(hydrating[:10])}"
        self._started = True
        return None
