"""Who may call what, by service identity, when mTLS is on.

Each service declares a small table, a :class:`CallerPolicy`: the identity kinds allowed to
call its methods, with exceptions per method. The server's :class:`AuthorizationInterceptor`
checks every call against it (PERMISSION_DENIED otherwise) and makes the caller's identity
available to the service code as :func:`tidemark.rpc.identity.current_caller`. Health checks
and reflection stay open to every peer that completed the mTLS handshake.

Without mTLS there is no identity to check, and the server runs no such interceptor: the
embedded default trusts whoever reaches it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field

import grpc

from tidemark.errors import PermissionDenied
from tidemark.rpc.identity import Identity, peer_identity, reset_caller, set_caller
from tidemark.rpc.interceptor import CallInterceptor, Context


def kinds(*names: str) -> frozenset[str]:
    return frozenset(names)


@dataclass(frozen=True)
class CallerPolicy:
    """The identity kinds that may call a service: ``default`` for any method, ``methods``
    for the named ones (short names, e.g. ``"CompareAndAppend"``)."""

    default: frozenset[str]
    methods: Mapping[str, frozenset[str]] = field(default_factory=dict)

    def allows(self, method: str, identity: Identity) -> bool:
        return identity.kind in self.methods.get(method, self.default)


class AuthorizationInterceptor(CallInterceptor):
    """Checks each call's caller against its service's policy (keyed by the service's full
    name); services without a policy (health, reflection) are open to any verified peer."""

    def __init__(self, policies: Mapping[str, CallerPolicy]) -> None:
        self.policies = dict(policies)

    def around_call(
        self, details: grpc.HandlerCallDetails, context: Context
    ) -> AbstractAsyncContextManager[None]:
        return self._scope(details.method, context)

    @asynccontextmanager
    async def _scope(self, full_method: str, context: Context) -> AsyncIterator[None]:
        service, _, method = full_method.lstrip("/").partition("/")
        identity = peer_identity(context)
        policy = self.policies.get(service)
        if policy is not None:
            if identity is None:
                raise PermissionDenied(
                    f"{full_method}: the caller's certificate names no tidemark:// identity"
                )
            if not policy.allows(method, identity):
                raise PermissionDenied(f"{full_method}: {identity} may not call it")
        token = set_caller(identity)
        try:
            yield
        finally:
            reset_caller(token)
