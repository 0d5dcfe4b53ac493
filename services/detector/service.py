"""The detector stage as a BentoML service: ``bentoml serve services.detector.service:Detector``.

POST /detect (JSON or binary protobuf bodies; concurrent requests merged into one model call),
GET /info, /livez, /readyz, /metrics;
the contract is ``docs/stage-contract.md``. The backend is ``NEGT2I_DETECTOR_BACKEND``
(default: the paper's model), loaded once, on a thread started by ``__init__``.
"""

from __future__ import annotations

from typing import Any

import bentoml

from negt2i.wire.stage_handlers import StageSettings
from services.common import StageHttpMiddleware, StageRuntime, service_options

SETTINGS = StageSettings.from_env("detector")


@bentoml.service(**service_options(SETTINGS))
class Detector:
    """The detector stage."""

    def __init__(self) -> None:
        self.runtime = StageRuntime(SETTINGS)  # loads the model on a thread; the server answers meanwhile

    def __is_ready__(self) -> bool:
        """Ready once the model is loaded and warmed up, while its model thread answers (else /readyz 503)."""
        return self.runtime.ready()

    def __is_alive__(self) -> bool:
        """Dead once loading failed, the model thread died or a model call hangs (/livez 503)."""
        return self.runtime.alive()

    @bentoml.api(route="/detect")
    async def detect(self, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Detect COCO objects with instance masks; one DetectResult per DetectItem."""
        return await self.runtime.handle(items)


Detector.add_asgi_middleware(
    StageHttpMiddleware,
    stage="detector",
    max_request_bytes=SETTINGS.max_request_bytes,
    body_timeout_s=SETTINGS.limits.body_timeout_s,
)
