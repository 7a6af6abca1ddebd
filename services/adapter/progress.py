"""How far a running Execute has come, for ``Adapter.StatementProgress``.

A client that wants progress names its Execute call (``ExecuteRequest.statement_id``) and,
while the call runs, asks the same adapter about that id from a second call. While the call
runs it is registered here (:meth:`RunningStatements.running`) with the statement it is at;
its reads name each compute peek they make (:func:`peek_name`), and a progress question is
answered by asking that compute process about that peek alone (``Status`` with its query
id): waiting for dataflows to hydrate, or parts and rows done by Spark.

The registration is found through a context variable, so the reading code deep down needs no
parameter for it; calls without a ``statement_id`` register nothing and name no peeks. Only
the user who made the call may ask about it: an id is no secret a client must keep.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass

from tidemark.clients.compute import ComputeClient
from tidemark.errors import TidemarkError
from tidemark.logging import get_logger
from tidemark.v1 import adapter_pb2

log = get_logger("services.adapter.progress")

STATEMENT_TEXT_CHARS = 200


@dataclass
class StatementActivity:
    """One running Execute call that asked to be followed."""

    statement_id: str
    user: str
    started: float
    statement: str = ""
    """The statement it is at (cut to ``STATEMENT_TEXT_CHARS``)."""
    peek: tuple[ComputeClient, str] | None = None
    """The compute process and query id of the peek in flight, if any."""


_current: ContextVar[StatementActivity | None] = ContextVar("statement_activity", default=None)


@contextlib.contextmanager
def peek_name(compute: ComputeClient) -> Iterator[str]:
    """A query id for a peek on ``compute`` made for the statement running in this context
    (and the statement's activity pointing at it for the block), or ``""`` when nobody
    follows the statement."""
    activity = _current.get()
    if activity is None:
        yield ""
        return
    query_id = f"stmt-{uuid.uuid4().hex[:16]}"
    activity.peek = (compute, query_id)
    try:
        yield query_id
    finally:
        if activity.peek is not None and activity.peek[1] == query_id:
            activity.peek = None


class RunningStatements:
    """The Execute calls running on this adapter that carry a statement id."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._running: dict[str, StatementActivity] = {}

    @contextlib.contextmanager
    def running(self, statement_id: str, user: str) -> Iterator[StatementActivity | None]:
        """Registers the call for the block (nothing when ``statement_id`` is empty)."""
        if not statement_id:
            yield None
            return
        activity = StatementActivity(statement_id, user, self.clock())
        self._running[statement_id] = activity
        token = _current.set(activity)
        try:
            yield activity
        finally:
            _current.reset(token)
            if self._running.get(statement_id) is activity:
                del self._running[statement_id]

    async def progress(self, statement_id: str, user: str) -> adapter_pb2.StatementProgressResponse:
        activity = self._running.get(statement_id)
        if activity is None or activity.user != user:
            return adapter_pb2.StatementProgressResponse(running=False)
        response = adapter_pb2.StatementProgressResponse(
            running=True,
            statement=activity.statement,
            elapsed_ms=max(0, round((self.clock() - activity.started) * 1000)),
        )
        peek = activity.peek
        if peek is None:
            return response
        compute, query_id = peek
        try:
            query = await compute.query_progress(query_id)
        except TidemarkError as exc:
            # Progress is a courtesy: the statement itself reports what went wrong.
            log.info("statement_progress_unavailable", statement=statement_id, error=exc.message)
            return response
        if query is None:
            return response
        response.state = query.state
        response.waiting_for.extend(query.waiting_for)
        response.parts_done = query.parts_done
        response.parts_total = query.parts_total
        response.rows_done = query.rows_done
        response.rows_total = query.rows_total
        return response
