"""The depth stage as a BentoML service: ``bentoml serve services.depth.service:Depth``.

POST /depth (JSON or binary protobuf bodies; concurrent requests merged into one model call),
GET /info, /livez, /readyz, /metrics;
the contract is ``docs/stage-contract.md``. The backend is ``NEGT2I_DEPTH_BACKEND``
(default: the paper's model), loaded once, on a thread started by ``__init__``.
"""

from __future__ import annotations

from typing import Any

import bentoml

from negt2i.wire.stage_handlers import StageSettings
from services.common import StageHttpMiddleware, StageRuntime, service_options

SETTINGS = StageSettings.from_env("depth")


@bentoml.service(**service_options(SETTINGS))
class Depth:
    """The depth stage."""

    def __init__(self) -> None:
        self.runtime = StageRuntime(SETTINGS)  # loads the model on a thread; the server answers meanwhile

    def __is_ready__(self) -> bool:
        """Ready once the model is loaded and warmed up, while its model thread answers (else /readyz 503)."""
        return self.runtime.ready()

    def __is_alive__(self) -> bool:
        """Dead once loading failed, the model thread died or a model call hangs (/livez 503)."""
        return self.runtime.alive()

    @bentoml.api(route="/depth")
    async def depth(self, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Estimate relative disparity; one DepthResult per DepthItem."""
        return await self.runtime.handle(items)


Depth.add_asgi_middleware(
    StageHttpMiddleware,
    stage="depth",
    max_request_bytes=SETTINGS.max_request_bytes,
    body_timeout_s=SETTINGS.limits.body_timeout_s,
)
