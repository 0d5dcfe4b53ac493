"""The attributes stage as a BentoML service: ``bentoml serve services.attributes.service:Attributes``.

POST /attributes (JSON or binary protobuf bodies; concurrent requests merged into one model call),
GET /info, /livez, /readyz, /metrics;
the contract is ``docs/stage-contract.md``. The backend is ``NEGT2I_ATTRIBUTES_BACKEND``
(default: the paper's model), loaded once, on a thread started by ``__init__``.
"""

from __future__ import annotations

from typing import Any

import bentoml

from negt2i.wire.stage_handlers import StageSettings
from services.common import StageHttpMiddleware, StageRuntime, service_options

SETTINGS = StageSettings.from_env("attributes")


@bentoml.service(**service_options(SETTINGS))
class Attributes:
    """The attributes stage."""

    def __init__(self) -> None:
        self.runtime = StageRuntime(SETTINGS)  # loads the model on a thread; the server answers meanwhile

    def __is_ready__(self) -> bool:
        """Ready once the model is loaded and warmed up, while its model thread answers (else /readyz 503)."""
        return self.runtime.ready()

    def __is_alive__(self) -> bool:
        """Dead once loading failed, the model thread died or a model call hangs (/livez 503)."""
        return self.runtime.alive()

    @bentoml.api(route="/attributes")
    async def attributes(self, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Score instance crops against attribute values; one AttributesResult per AttributesItem."""
        return await self.runtime.handle(items)


Attributes.add_asgi_middleware(
    StageHttpMiddleware,
    stage="attributes",
    max_request_bytes=SETTINGS.max_request_bytes,
    body_timeout_s=SETTINGS.limits.body_timeout_s,
)
