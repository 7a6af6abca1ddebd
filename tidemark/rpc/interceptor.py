"""Server interceptors defined by what happens around one call.

A ``grpc.aio`` interceptor only gets to swap a method's handler, and a handler comes in four
shapes (unary or streaming requests and responses), each of which may be a coroutine, an async
generator or a plain function. :func:`wrap_handler` hides that: it runs the original behaviour
inside an async context manager, so an interceptor is one ``async with`` body that sees the
call start, end, and any exception the service code raised.

Streaming responses are re-emitted with ``context.write`` from a coroutine rather than yielded
from a wrapping async generator: when the client goes away, the cancellation then reaches the
context manager in the call's own task right away, instead of whenever the abandoned generator
happens to be garbage collected.

gRPC pays for every interceptor on every call (a coroutine, a continuation, a new handler), so
the server runs its built-in interceptors as one :class:`InterceptorChain`: one wrapper whose
scope enters theirs one inside the other, built once per method when nothing runs inside it.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from typing import Any

import grpc
import grpc.aio

from tidemark.errors import InvalidArgument

Context = grpc.aio.ServicerContext[Any, Any]
CallScope = Callable[[Context], AbstractAsyncContextManager[None]]
Behaviour = Callable[..., Any]


class _Malformed:
    """What a request that does not parse as its message type becomes, so that the call is
    answered INVALID_ARGUMENT inside the interceptors (gRPC itself would answer UNKNOWN)."""

    def __init__(self, error: Exception) -> None:
        self.error = error


def _lenient(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if deserializer is None:
        return None
    parse = deserializer

    def deserialize(data: bytes) -> Any:
        try:
            return parse(data)
        except Exception as exc:
            return _Malformed(exc)

    return deserialize


def _checked(request: Any) -> Any:
    """``request``, or InvalidArgument if it did not parse; a request stream is checked item by
    item as the service reads it."""
    if isinstance(request, _Malformed):
        raise InvalidArgument(f"malformed request: {request.error}")
    if isinstance(request, AsyncIterator):
        return _checked_stream(request)
    return request


async def _checked_stream(requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
    async for request in requests:
        yield _checked(request)


def _run_single(behaviour: Behaviour, scope: CallScope) -> Behaviour:
    async def run(request: Any, context: Context) -> Any:
        async with scope(context):
            result = behaviour(_checked(request), context)
            if inspect.isawaitable(result):
                result = await result
            return result

    return run


async def _write_all(responses: AsyncIterator[Any], context: Context) -> None:
    try:
        async for response in responses:
            await context.write(response)
    finally:
        # Run the generator's own cleanup now, in this task, even if the call was cancelled.
        close = getattr(responses, "aclose", None)
        if close is not None:
            await close()


def _run_streaming(behaviour: Behaviour, scope: CallScope) -> Behaviour:
    async def run(request: Any, context: Context) -> None:
        async with scope(context):
            result = behaviour(_checked(request), context)
            if inspect.isawaitable(result):
                # Reader/writer style: the handler wrote its responses itself.
                await result
            elif isinstance(result, AsyncIterator):
                await _write_all(result, context)
            elif result is not None:
                for response in result:
                    await context.write(response)

    return run


def wrap_handler(
    handler: grpc.RpcMethodHandler[Any, Any], scope: CallScope
) -> grpc.RpcMethodHandler[Any, Any]:
    """A handler that behaves like ``handler`` but runs each call inside ``scope(context)``."""
    deserializer = _lenient(handler.request_deserializer)
    serializer = handler.response_serializer
    if handler.request_streaming and handler.response_streaming:
        assert handler.stream_stream is not None
        return grpc.stream_stream_rpc_method_handler(
            _run_streaming(handler.stream_stream, scope), deserializer, serializer
        )
    if handler.request_streaming:
        assert handler.stream_unary is not None
        return grpc.stream_unary_rpc_method_handler(
            _run_single(handler.stream_unary, scope), deserializer, serializer
        )
    if handler.response_streaming:
        assert handler.unary_stream is not None
        return grpc.unary_stream_rpc_method_handler(
            _run_streaming(handler.unary_stream, scope), deserializer, serializer
        )
    assert handler.unary_unary is not None
    return grpc.unary_unary_rpc_method_handler(
        _run_single(handler.unary_unary, scope), deserializer, serializer
    )


class CallInterceptor(grpc.aio.ServerInterceptor, ABC):  # type: ignore[type-arg]
    """Base class: subclasses say what happens around each call in :meth:`around_call`."""

    @abstractmethod
    def around_call(
        self, details: grpc.HandlerCallDetails, context: Context
    ) -> AbstractAsyncContextManager[None]:
        """Entered before the service code runs and exited after it finished or raised."""

    def unknown_method(self, details: grpc.HandlerCallDetails) -> None:
        """Called for a method no service implements (gRPC answers UNIMPLEMENTED)."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Any:
        handler = await continuation(handler_call_details)
        if handler is None:
            self.unknown_method(handler_call_details)
            return None

        def scope(context: Context) -> AbstractAsyncContextManager[None]:
            return self.around_call(handler_call_details, context)

        return wrap_handler(handler, scope)


class CallDetails(grpc.HandlerCallDetails):
    """The method and invocation metadata of one call, as interceptors receive them."""

    __slots__ = ("invocation_metadata", "method")

    def __init__(self, method: str, invocation_metadata: Any) -> None:
        self.method = method
        self.invocation_metadata = invocation_metadata


class InterceptorChain(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """Several :class:`CallInterceptor` run as one gRPC interceptor, the first outermost.

    ``innermost`` says that no other interceptor runs inside the chain, so the handler gRPC
    resolves for a method is always the same one: it is then wrapped once per method and
    reused, instead of once per call.
    """

    def __init__(self, interceptors: Sequence[CallInterceptor], *, innermost: bool) -> None:
        self.interceptors = tuple(interceptors)
        self.innermost = innermost
        self._wrapped: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Any:
        method = handler_call_details.method
        wrapped = self._wrapped.get(method)
        if wrapped is not None:
            return wrapped
        handler = await continuation(handler_call_details)
        if handler is None:
            for interceptor in self.interceptors:
                interceptor.unknown_method(handler_call_details)
            return None
        wrapped = wrap_handler(handler, self._scope_for(method))
        if self.innermost:
            self._wrapped[method] = wrapped
        return wrapped

    def _scope_for(self, method: str) -> CallScope:
        interceptors = self.interceptors

        @asynccontextmanager
        async def scope(context: Context) -> AsyncIterator[None]:
            # Built from the context, not from the details gRPC passed in: a wrapped handler
            # may serve many calls.
            details = CallDetails(method, context.invocation_metadata())
            async with AsyncExitStack() as scopes:  # nested like successive `async with`s
                for interceptor in interceptors:
                    await scopes.enter_async_context(interceptor.around_call(details, context))
                yield

        return scope
