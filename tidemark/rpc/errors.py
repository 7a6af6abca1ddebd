"""The one place where exceptions become gRPC statuses, and statuses become exceptions again.

Server side, service code just raises: a :class:`~tidemark.errors.TidemarkError` reaches the
client as its own code and message; ``NotImplementedError`` as UNIMPLEMENTED; anything else is a
bug, logged here with its traceback and reported to the client as INTERNAL with a short message
that names the request id (never the traceback or the exception's text, which may leak
internals). A handler that calls ``context.abort`` itself is left alone.

Client side, :func:`error_from_rpc` turns a failed call back into the Tidemark exception for
its code, keeping the server's message, so callers handle one family of exceptions whether the
failing code ran locally or remotely.

UNAVAILABLE carries two meanings in Tidemark: :class:`~tidemark.errors.Unavailable` (nothing
happened, safe to retry) and :class:`~tidemark.errors.Indeterminate` (the request may have taken
effect). Both travel as UNAVAILABLE; the second is marked in the trailing metadata so the
client neither retries it blindly nor mistakes it for the first.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Any, cast

import grpc
import grpc.aio

from tidemark.errors import Indeterminate, TidemarkError, error_for_status
from tidemark.logging import get_logger
from tidemark.rpc.interceptor import CallInterceptor, Context
from tidemark.rpc.request_id import current_request_id

INDETERMINATE_KEY = "tidemark-indeterminate"
# How gRPC's core describes a connection that broke while a call was in flight: the request
# may have reached the server and taken effect before it died, so the outcome is unknown.
# (A connection that could not be made at all says "failed to connect": nothing was sent.)
_LOST_CONNECTION = (
    "socket closed",
    "connection reset",
    "broken pipe",
    "goaway",
    "keepalive watchdog",
    "end of tcp stream",
    "stream removed",
    "connection aborted",
)

log = get_logger("tidemark.rpc")


def status_for_exception(exc: BaseException, method: str = "") -> tuple[grpc.StatusCode, str]:
    """The status code and client-facing message for an exception raised by service code.
    Call it from the ``except`` block: a bug (INTERNAL) is logged here with its traceback."""
    if isinstance(exc, TidemarkError):
        return exc.code, exc.message
    if isinstance(exc, grpc.aio.AioRpcError):
        # A raw stub call to another service failed; pass its outcome on like the client
        # helpers would have, as the matching Tidemark error.
        return status_for_exception(error_from_rpc(exc), method)
    if isinstance(exc, NotImplementedError):
        return grpc.StatusCode.UNIMPLEMENTED, f"{method or 'this method'} is not implemented"
    log.exception("unhandled_error", method=method)
    request_id = current_request_id()
    suffix = f" (request id {request_id})" if request_id else ""
    return grpc.StatusCode.INTERNAL, f"internal error{suffix}; the server log has the details"


def _is_indeterminate(exc: BaseException) -> bool:
    if isinstance(exc, grpc.aio.AioRpcError):
        return isinstance(error_from_rpc(exc), Indeterminate)
    return isinstance(exc, Indeterminate)


class ErrorMappingInterceptor(CallInterceptor):
    """Turns exceptions escaping service code into gRPC statuses (see the module docs)."""

    @asynccontextmanager
    async def around_call(
        self, details: grpc.HandlerCallDetails, context: Context
    ) -> AsyncIterator[None]:
        try:
            yield
        except grpc.aio.AbortError:
            # The handler chose its status with context.abort; it is already set.
            raise
        except Exception as exc:
            code, message = status_for_exception(exc, details.method)
            trailing = tuple(context.trailing_metadata() or ())
            if _is_indeterminate(exc):
                trailing += ((INDETERMINATE_KEY, "1"),)
            await context.abort(code, message, trailing)


def error_from_rpc(error: grpc.aio.AioRpcError) -> TidemarkError:
    """The Tidemark exception for a failed call, with the server's message."""
    code = error.code()
    message = error.details() or code.name
    # grpc.aio hands back (key, value) pairs; grpc-stubs describes the sync API's type.
    trailing = cast("Iterable[tuple[str, Any]]", error.trailing_metadata() or ())
    if code == grpc.StatusCode.UNAVAILABLE and (
        any(key == INDETERMINATE_KEY for key, _ in trailing)
        or any(sign in message.lower() for sign in _LOST_CONNECTION)
    ):
        return Indeterminate(message)
    return error_for_status(code, message)
