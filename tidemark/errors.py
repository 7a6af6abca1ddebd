"""The errors Tidemark raises, each tied to the gRPC status a client sees.

Library and service code raise these; the RPC layer (``tidemark.rpc``) turns them into
status codes in one place, and the client helpers turn status codes back into them, so a
caller handles the same exception whether the failing code ran in-process or remotely.
"""

from __future__ import annotations

import grpc


class TidemarkError(Exception):
    """Base class. ``code`` is the gRPC status a remote caller receives."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidArgument(TidemarkError):
    """Malformed input, or times outside the allowed range."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class ValueTooLarge(InvalidArgument):
    """A value exceeds what the backend can store in one record."""


class NotFound(TidemarkError):
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(TidemarkError):
    code = grpc.StatusCode.ALREADY_EXISTS


class FailedPrecondition(TidemarkError):
    """The request is well formed but the state does not allow it (an upper mismatch, a
    since beyond the requested time, a capability downgraded backwards)."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class PermissionDenied(TidemarkError):
    """Unknown, expired, dropped or foreign capability."""

    code = grpc.StatusCode.PERMISSION_DENIED


class Unauthenticated(TidemarkError):
    code = grpc.StatusCode.UNAUTHENTICATED


class Aborted(TidemarkError):
    """A lost compare-and-set race; the client may retry."""

    code = grpc.StatusCode.ABORTED


class Unavailable(TidemarkError):
    """A backend is down or unreachable. The request had no effect (determinate)."""

    code = grpc.StatusCode.UNAVAILABLE


class Indeterminate(Unavailable):
    """The outcome is unknown: the request may or may not have taken effect (e.g. a timeout
    after the write was sent). Callers must re-read state before deciding what happened."""


class DeadlineExceeded(TidemarkError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Cancelled(TidemarkError):
    code = grpc.StatusCode.CANCELLED


class ResourceExhausted(TidemarkError):
    """A request needs more than its budget (memory, rows) allows; it was stopped and
    changed nothing."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Internal(TidemarkError):
    code = grpc.StatusCode.INTERNAL


_BY_CODE: dict[grpc.StatusCode, type[TidemarkError]] = {
    cls.code: cls
    for cls in (
        InvalidArgument,
        NotFound,
        AlreadyExists,
        FailedPrecondition,
        PermissionDenied,
        Unauthenticated,
        Aborted,
        Unavailable,
        DeadlineExceeded,
        Cancelled,
        ResourceExhausted,
        Internal,
    )
}


def error_for_status(code: grpc.StatusCode, message: str) -> TidemarkError:
    """The Tidemark exception a client raises for a failed call with ``code``."""
    return _BY_CODE.get(code, Internal)(message)
