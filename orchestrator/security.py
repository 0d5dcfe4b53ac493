"""Transport security of the gRPC endpoint: TLS (optionally mutual) and a bearer token.

Defaults are safe for one machine: the server binds 127.0.0.1 (``Settings.host``), reflection is off.
Exposed beyond loopback, configure:

- ``NEGT2I_TLS_CERT`` + ``NEGT2I_TLS_KEY`` (PEM files): the port speaks TLS;
- ``NEGT2I_TLS_CLIENT_CA`` (PEM): clients must present a certificate signed by this CA (mutual TLS);
- ``NEGT2I_AUTH_TOKEN`` or ``NEGT2I_AUTH_TOKEN_FILE``: every call must carry the metadata
  ``authorization: Bearer <token>`` (compared in constant time) or gets UNAUTHENTICATED. Health checks
  (``grpc.health.v1.Health``) are exempt, so that probes and load balancers need no secret.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Final

import grpc

HEALTH_PREFIX: Final = "/grpc.health.v1.Health/"
"""Methods that never need the token."""


def server_credentials(cert: str, key: str, client_ca: str = "") -> grpc.ServerCredentials | None:
    """TLS credentials from PEM files (None when ``cert`` and ``key`` are both unset)."""
    if not cert and not key:
        if client_ca:
            raise ValueError("NEGT2I_TLS_CLIENT_CA needs NEGT2I_TLS_CERT and NEGT2I_TLS_KEY")
        return None
    if not (cert and key):
        raise ValueError("TLS needs both NEGT2I_TLS_CERT and NEGT2I_TLS_KEY")
    chain = Path(cert).read_bytes()
    private = Path(key).read_bytes()
    roots = Path(client_ca).read_bytes() if client_ca else None
    return grpc.ssl_server_credentials(
        [(private, chain)], root_certificates=roots, require_client_auth=roots is not None
    )


def _deny(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    """A handler of the same response shape as ``handler`` that answers UNAUTHENTICATED without reading the
    request: it is always request-streaming, so grpc.aio never asks gRPC core for the message (a unary handler
    gets its message read, up to the transport limit, before it runs). The refused call holds at most its
    HTTP/2 stream window (``orchestrator.guard.transport_options``)."""

    async def unary(_requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    async def streaming(_requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)
        yield  # pragma: no cover - abort raises

    kw = {"request_deserializer": None, "response_serializer": None}
    if handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(streaming, **kw)
    return grpc.stream_unary_rpc_method_handler(unary, **kw)


class TokenAuth(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Require ``authorization: Bearer <token>`` on every method but health checks."""

    def __init__(self, token: str) -> None:
        if not token:
            raise ValueError("an empty token would accept anyone")
        self._want = f"Bearer {token}".encode()

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or str(details.method).startswith(HEALTH_PREFIX):
            return handler
        got = b""
        for key, value in details.invocation_metadata or ():
            if key == "authorization":
                got = value.encode() if isinstance(value, str) else bytes(value)
                break
        if got and hmac.compare_digest(got, self._want):
            return handler
        why = "missing bearer token" if not got else "invalid bearer token"
        return _deny(handler, f"{why}: send the metadata 'authorization: Bearer <token>'")
