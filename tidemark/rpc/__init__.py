"""RPC plumbing shared by every Tidemark process: server bootstrap, error mapping, access
logging, request ids and client helpers."""

from tidemark.rpc.client import CLIENT_RETRY, NO_RETRY, GrpcClient, call, open_channel, stream
from tidemark.rpc.errors import error_from_rpc, status_for_exception
from tidemark.rpc.identity import Identity, current_caller
from tidemark.rpc.request_id import REQUEST_ID_KEY, current_request_id
from tidemark.rpc.server import Server, Service, announce_port, serve
from tidemark.rpc.tls import TlsSettings

__all__ = [
    "CLIENT_RETRY",
    "NO_RETRY",
    "REQUEST_ID_KEY",
    "GrpcClient",
    "Identity",
    "Server",
    "Service",
    "TlsSettings",
    "announce_port",
    "call",
    "current_caller",
    "current_request_id",
    "error_from_rpc",
    "open_channel",
    "serve",
    "status_for_exception",
    "stream",
]
