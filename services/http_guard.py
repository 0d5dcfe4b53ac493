"""Connection limits of the stage services, below the ASGI app (issue 31, item 5: a stage locked out by idle
connections).

BentoML runs each service in uvicorn with a request cap (``traffic.max_concurrency``: beyond it, HTTP 429)
and no limit on connections or on the time a connection may take to send its request headers. A few hundred
connections that send nothing, or half a header line, used to be held for good. Here:

- **header read timeout**: a connection that has not sent a complete request head within
  ``NEGT2I_HEADER_TIMEOUT_S`` (10 s) of connecting, or of the first byte of its next request on a kept-alive
  connection, is closed (the body has its own timeout, ``NEGT2I_BODY_TIMEOUT_S``, in
  ``services.common.StageHttpMiddleware``; an idle kept-alive connection is closed by uvicorn after its
  keep-alive timeout);
- **connections per peer**: at most ``NEGT2I_MAX_CONNECTIONS_PER_PEER`` (128) open connections from one IP
  address; a connection beyond is closed at once (logged once a minute per peer). An orchestrator holds at most
  ``NEGT2I_STAGE_CONCURRENCY + 6`` connections to a stage (its call pool and its health client), so this
  leaves room for several orchestrators behind one address.
- ``GET /info`` bypasses BentoML's request cap, like ``/readyz`` and ``/livez`` (``allow_info_past_the_cap``):
  it is what the orchestrator's health poll reads, and a busy stage must not look dead.

BentoML builds uvicorn's ``Config`` itself, so the limits are installed as uvicorn's ``auto`` HTTP protocol
(``install``, called when ``services.common`` is imported, i.e. in the worker process before uvicorn starts):
the protocol uvicorn would have picked, with these limits added.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import time
from typing import Any, ClassVar

log = logging.getLogger("negt2i.services")

DEFAULT_HEADER_TIMEOUT_S = 10.0
DEFAULT_MAX_CONNECTIONS_PER_PEER = 128


def _auto_protocol() -> type[asyncio.Protocol]:
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    return AutoHTTPProtocol


class GuardedHTTPProtocol(_auto_protocol()):  # type: ignore[misc]
    """uvicorn's HTTP protocol with a header read timeout and a per-peer connection limit (module docstring)."""

    header_timeout_s: ClassVar[float] = float(os.environ.get("NEGT2I_HEADER_TIMEOUT_S", DEFAULT_HEADER_TIMEOUT_S))
    max_per_peer: ClassVar[int] = int(
        os.environ.get("NEGT2I_MAX_CONNECTIONS_PER_PEER", DEFAULT_MAX_CONNECTIONS_PER_PEER)
    )
    peers: ClassVar[collections.Counter[str]] = collections.Counter()
    """Open connections per peer address (of this worker process)."""
    refused: ClassVar[int] = 0
    """Connections closed at once (over the per-peer limit)."""
    timed_out: ClassVar[int] = 0
    """Connections closed because their request head did not arrive in time."""
    _warned: ClassVar[dict[str, float]] = {}

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._peer = str(self.client[0]) if self.client else ""
        self._head_timer: asyncio.TimerHandle | None = None
        type(self).peers[self._peer] += 1
        if self.peers[self._peer] > self.max_per_peer:
            type(self).refused += 1
            now = time.monotonic()
            if now - self._warned.get(self._peer, -120.0) > 60.0:
                self._warned[self._peer] = now
                log.warning("%s has %d connections open, above the limit of %d: closing the new ones",
                            self._peer, self.peers[self._peer] - 1, self.max_per_peer)  # fmt: skip
            transport.close()
            return
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if getattr(self, "_peer", None) is not None:
            type(self).peers[self._peer] -= 1
            if self.peers[self._peer] <= 0:
                del type(self).peers[self._peer]
            self._peer = None  # counted once
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._waiting_for_head():
            self._arm()  # armed once per head: dribbling bytes does not extend it
        else:
            self._disarm()

    def _waiting_for_head(self) -> bool:
        cycle = getattr(self, "cycle", None)
        return cycle is None or bool(getattr(cycle, "response_complete", False))

    def _arm(self) -> None:
        if getattr(self, "_head_timer", None) is None:
            self._head_timer = asyncio.get_running_loop().call_later(self.header_timeout_s, self._head_late)

    def _disarm(self) -> None:
        timer = getattr(self, "_head_timer", None)
        if timer is not None:
            timer.cancel()
            self._head_timer = None

    def _head_late(self) -> None:
        self._head_timer = None
        if self._waiting_for_head() and not self.transport.is_closing():
            type(self).timed_out += 1
            self.transport.close()


def allow_info_past_the_cap() -> None:
    """Let ``GET /info`` past BentoML's request cap (``MaxConcurrencyMiddleware``), like its health routes."""
    from bentoml._internal.server.http.traffic import MaxConcurrencyMiddleware

    MaxConcurrencyMiddleware.BYPASS_PATHS = frozenset({*MaxConcurrencyMiddleware.BYPASS_PATHS, "/info"})


def install() -> None:
    """Make ``GuardedHTTPProtocol`` uvicorn's ``auto`` HTTP protocol and let ``/info`` past the request cap."""
    from uvicorn import config

    config.HTTP_PROTOCOLS["auto"] = f"{__name__}:GuardedHTTPProtocol"
    allow_info_past_the_cap()
