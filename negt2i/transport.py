"""How clients reach the orchestrator: channel options, TLS, the bearer token and retry timing.

Used by ``negt2i.client`` (sync and asyncio clients, ``negt2i submit``). grpc is imported lazily.

- **Keepalive**: the channel pings every ``KEEPALIVE_MS`` (also while a stream waits for answers) and
  drops the connection when a ping is not answered within ``KEEPALIVE_TIMEOUT_MS``, so a dead or
  unreachable orchestrator surfaces as UNAVAILABLE instead of a call that never ends.
- **TLS** (``Tls``): the server's CA bundle (``ca``; the system roots when empty), and for mutual TLS the
  client's certificate and key. ``server_name`` overrides the name checked in the server certificate.
- **Token**: sent as the call metadata ``authorization: Bearer <token>`` on every call.
- **Backoff** (``backoff_delay``): ``min(cap, base x 2^attempt)`` with full jitter in ``[delay/2, delay]``.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from negt2i.core.failures import Code

KEEPALIVE_MS: Final = 30_000
"""Ping interval of client channels."""
KEEPALIVE_TIMEOUT_MS: Final = 20_000
"""A ping unanswered this long closes the connection (calls on it fail with UNAVAILABLE)."""
RETRYABLE: Final[frozenset[Code]] = frozenset({Code.RESOURCE_EXHAUSTED, Code.UNAVAILABLE})
"""Status codes the API marks retryable (docs/api.md, "Errors"): a client sends the same request again after a
backoff (the item was not judged; the call is idempotent). The clients' unary calls and
``negt2i.run.stream.StreamSubmitter`` retry exactly these."""
DEFAULT_ATTEMPTS: Final = 10
"""Sends of one request (a unary call, or one stream item) before a retryable answer is final."""


@dataclass(frozen=True)
class Tls:
    """Client TLS settings (PEM file paths)."""

    ca: str = ""
    cert: str = ""
    key: str = ""
    server_name: str = ""

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Tls | None:
        """``NEGT2I_CLIENT_TLS_CA`` / ``_CERT`` / ``_KEY`` / ``NEGT2I_CLIENT_TLS_SERVER_NAME``; None when unset."""
        e = os.environ if env is None else env
        tls = cls(
            e.get("NEGT2I_CLIENT_TLS_CA", ""),
            e.get("NEGT2I_CLIENT_TLS_CERT", ""),
            e.get("NEGT2I_CLIENT_TLS_KEY", ""),
            e.get("NEGT2I_CLIENT_TLS_SERVER_NAME", ""),
        )
        return tls if (tls.ca or tls.cert or tls.key) else None

    def credentials(self) -> Any:
        """``grpc.ChannelCredentials``."""
        import grpc

        if bool(self.cert) != bool(self.key):
            raise ValueError("mutual TLS needs both a client certificate and its key")
        return grpc.ssl_channel_credentials(
            root_certificates=Path(self.ca).read_bytes() if self.ca else None,
            private_key=Path(self.key).read_bytes() if self.key else None,
            certificate_chain=Path(self.cert).read_bytes() if self.cert else None,
        )


def token_from_env(env: dict[str, str] | None = None) -> str:
    """``NEGT2I_TOKEN``, or the content of the file ``NEGT2I_TOKEN_FILE``."""
    e = os.environ if env is None else env
    path = e.get("NEGT2I_TOKEN_FILE", "")
    if path:
        return Path(path).read_text(encoding="utf-8").strip()
    return e.get("NEGT2I_TOKEN", "").strip()


def channel_options(max_message_bytes: int, tls: Tls | None = None) -> list[tuple[str, int | str]]:
    """Channel options: message limits, keepalive, and per-call round-robin over every address the target
    resolves to (a headless Kubernetes Service lists one per orchestrator pod; gRPC keeps connections
    open, so without this one pod would take all of a client's calls)."""
    options: list[tuple[str, int | str]] = [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.lb_policy_name", "round_robin"),
        ("grpc.keepalive_time_ms", KEEPALIVE_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
    ]
    if tls is not None and tls.server_name:
        options.append(("grpc.ssl_target_name_override", tls.server_name))
    return options


def open_channel(target: str, *, max_message_bytes: int, tls: Tls | None, aio: bool = False) -> Any:
    """A sync (or ``grpc.aio``) channel, secure when ``tls`` is given."""
    import grpc

    options = channel_options(max_message_bytes, tls)
    if tls is None:
        return grpc.aio.insecure_channel(target, options=options) if aio else grpc.insecure_channel(target, options)
    creds = tls.credentials()
    if aio:
        return grpc.aio.secure_channel(target, creds, options=options)
    return grpc.secure_channel(target, creds, options=options)


def metadata(token: str) -> tuple[tuple[str, str], ...]:
    """Call metadata carrying the bearer token (empty without one)."""
    return (("authorization", f"Bearer {token}"),) if token else ()


def backoff_delay(attempt: int, base: float = 0.2, cap: float = 10.0) -> float:
    """Seconds before retry ``attempt`` (0-based): ``min(cap, base x 2^attempt)``, jittered to ``[d/2, d]``."""
    delay: float = min(cap, base * float(2 ** min(attempt, 30)))
    return delay / 2 + random.random() * delay / 2
