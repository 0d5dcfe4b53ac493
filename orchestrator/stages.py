"""Async clients of the four stage services (``docs/stage-contract.md``) over one pooled ``httpx.AsyncClient``.

Every call:

- waits for a slot of its stage (``stage_concurrency`` in flight); when
  ``stage_queue`` calls already wait, it fails at once with RESOURCE_EXHAUSTED;
- gets a timeout of ``min(call_timeout_s, time left until the deadline)``;
- is retried (stage calls are pure functions of their inputs, so idempotent)
  after connection errors, timeouts and HTTP 502 / 503 / 504, with exponential
  backoff, only while the deadline leaves room;
- ends in a ``StageCallError`` carrying the gRPC status it maps to:
  UNAVAILABLE (stage down), DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED (stage
  overloaded: 429 or 503 after the retries), INVALID_ARGUMENT (the stage
  rejected this item's inputs, or 413), INTERNAL (a contract violation).

Bytes sent and received per stage are counted (``wire``), so a request's cost
on the wire can be measured.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import httpx
import numpy as np
from numpy.typing import NDArray

from negt2i.perception import BoolMask, Detections
from negt2i.stages.base import ModelInfo
from negt2i.wire import adapter
from negt2i.wire.stage_handlers import ROUTES
from negt2i.wire.v1 import common_pb2, stages_pb2

RETRY_STATUS: Final = frozenset({502, 503, 504})
BUSY_STATUS: Final = frozenset({429, 503})
_JSON: Final = {"content-type": "application/json"}


class StageCallError(Exception):
    """A stage call failed; ``code`` is the gRPC status name it maps to."""

    def __init__(self, code: str, stage: str, message: str, *, field: str = "") -> None:
        self.code = code
        self.stage = stage
        self.message = message
        self.field = field
        super().__init__(f"{stage}: {message}")


@dataclass
class WireStats:
    """Bytes and calls per stage (request bodies and response bodies, HTTP headers excluded)."""

    calls: dict[str, int] = field(default_factory=dict)
    sent: dict[str, int] = field(default_factory=dict)
    received: dict[str, int] = field(default_factory=dict)

    def add(self, stage: str, sent: int, received: int) -> None:
        self.calls[stage] = self.calls.get(stage, 0) + 1
        self.sent[stage] = self.sent.get(stage, 0) + sent
        self.received[stage] = self.received.get(stage, 0) + received

    def total(self) -> int:
        return sum(self.sent.values()) + sum(self.received.values())


class _Limiter:
    """At most ``slots`` calls in flight and ``queue`` waiting; beyond that, RESOURCE_EXHAUSTED."""

    def __init__(self, stage: str, slots: int, queue: int) -> None:
        self.stage = stage
        self.sem = asyncio.Semaphore(slots)
        self.queue = queue
        self.waiting = 0

    async def __aenter__(self) -> None:
        if self.sem.locked() and self.waiting >= self.queue:
            raise StageCallError("RESOURCE_EXHAUSTED", self.stage, f"queue full ({self.waiting} calls waiting)")
        self.waiting += 1
        try:
            await self.sem.acquire()
        finally:
            self.waiting -= 1

    async def __aexit__(self, *_: object) -> None:
        self.sem.release()


class RemoteStages:
    """The stage services reached over HTTP; one instance per orchestrator process."""

    def __init__(
        self,
        urls: Mapping[str, str],
        *,
        concurrency: int = 8,
        queue: int = 256,
        call_timeout_s: float = 60.0,
        retries: int = 3,
        backoff_s: float = 0.1,
        depth_encoding: str = "float16",
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self.urls = {k: v.rstrip("/") for k, v in urls.items()}
        self.call_timeout_s = call_timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.depth_encoding = (
            common_pb2.DEPTH_ENCODING_FLOAT32 if depth_encoding == "float32" else common_pb2.DEPTH_ENCODING_FLOAT16
        )
        # one pooled client per stage: httpcore scans its whole pool on every request, so small pools are cheaper
        limits = httpx.Limits(max_connections=concurrency + 2, max_keepalive_connections=concurrency + 2)
        self.clients = {
            stage: client or httpx.AsyncClient(limits=limits, timeout=call_timeout_s, trust_env=False)
            for stage in self.urls
        }
        self.limiters = {s: _Limiter(s, concurrency, queue) for s in self.urls}
        self.wire = WireStats()
        self.infos: dict[str, stages_pb2.StageInfo] = {}
        self._up: dict[str, bool] = {}

    async def close(self) -> None:
        """Close the pooled connections."""
        for client in {id(c): c for c in self.clients.values()}.values():
            await client.aclose()

    # ------------------------------------------------------------------ health and info

    async def ready(self, stage: str, timeout_s: float = 2.0) -> bool:
        """Whether ``GET /readyz`` answers 200 (and ``GET /info`` was read once)."""
        try:
            r = await self.clients[stage].get(f"{self.urls[stage]}/readyz", timeout=timeout_s)
            if r.status_code != 200:
                self._up[stage] = False
                return False
            if not self._up.get(stage):  # (re)appeared: read its model again, it may have been replaced
                info = await self.clients[stage].get(f"{self.urls[stage]}/info", timeout=timeout_s)
                if info.status_code != 200:
                    return False
                self.infos[stage] = adapter.from_json(info.json(), stages_pb2.StageInfo)
                self._up[stage] = True
            return True
        except (httpx.HTTPError, ValueError, adapter.WireError):
            self._up[stage] = False
            return False

    def service(self, stage: str) -> common_pb2.StageService:
        """The ``StageService`` record of a stage (its model as last read from ``/info``)."""
        info = self.infos.get(stage)
        model = info.model if info is not None else common_pb2.ModelInfo(stage=stage)
        return common_pb2.StageService(
            stage=stage, url=self.urls[stage], model=model, contract=info.contract if info else ""
        )

    def model_info(self, stage: str) -> ModelInfo:
        """The core ``ModelInfo`` of a stage."""
        return adapter.model_info_from_proto(self.service(stage).model)

    # ------------------------------------------------------------------ the call

    async def call(self, stage: str, item: dict[str, Any], deadline: float) -> dict[str, Any]:
        """POST one item to a stage and return its one JSON result (see the module docstring)."""
        url = f"{self.urls[stage]}/{ROUTES[stage]}"
        # encoding (base64 images, RLE strings) and decoding bodies run on worker threads: never on the loop
        body = await asyncio.to_thread(lambda: json.dumps({"items": [item]}, separators=(",", ":")).encode())
        async with self.limiters[stage]:
            attempt = 0
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise StageCallError("DEADLINE_EXCEEDED", stage, "the deadline passed before the stage answered")
                timeout = min(self.call_timeout_s, left)
                retry_reason: str
                try:
                    # httpx's timeout bounds each network operation; wait_for bounds the whole call
                    r = await asyncio.wait_for(
                        self.clients[stage].post(
                            url, content=body, headers={"content-type": "application/json"}, timeout=timeout
                        ),
                        timeout,
                    )
                except (httpx.TimeoutException, TimeoutError):
                    if deadline - time.monotonic() <= 0:
                        raise StageCallError("DEADLINE_EXCEEDED", stage, f"no answer within {timeout:.1f} s") from None
                    retry_reason = f"timed out after {timeout:.1f} s"
                except httpx.TransportError as exc:
                    retry_reason = f"unreachable at {self.urls[stage]} ({type(exc).__name__})"
                else:
                    self.wire.add(stage, len(body), len(r.content))
                    if r.status_code == 200:
                        return await asyncio.to_thread(self._one_result, stage, r)
                    if r.status_code not in RETRY_STATUS:
                        raise self._http_error(stage, r)
                    retry_reason = f"HTTP {r.status_code}"
                    if attempt >= self.retries:
                        code = "RESOURCE_EXHAUSTED" if r.status_code in BUSY_STATUS else "UNAVAILABLE"
                        raise StageCallError(code, stage, f"{retry_reason} after {attempt + 1} attempts")
                if attempt >= self.retries:
                    raise StageCallError("UNAVAILABLE", stage, f"{retry_reason} after {attempt + 1} attempts")
                delay = min(self.backoff_s * (2**attempt), 2.0)
                if time.monotonic() + delay >= deadline:
                    raise StageCallError("UNAVAILABLE", stage, f"{retry_reason}; no time left to retry")
                attempt += 1
                await asyncio.sleep(delay)

    @staticmethod
    def _one_result(stage: str, r: httpx.Response) -> dict[str, Any]:
        try:
            data = r.json()
        except ValueError:
            raise StageCallError("INTERNAL", stage, "the stage answered 200 with a body that is not JSON") from None
        if not isinstance(data, list) or len(data) != 1 or not isinstance(data[0], dict):
            raise StageCallError("INTERNAL", stage, "the stage must answer a JSON array with one result per item")
        result: dict[str, Any] = data[0]
        return result

    @staticmethod
    def _http_error(stage: str, r: httpx.Response) -> StageCallError:
        text = r.text[:300]
        if r.status_code == 413:
            return StageCallError("INVALID_ARGUMENT", stage, f"the request is too large for the stage ({text})")
        if r.status_code == 429:
            return StageCallError("RESOURCE_EXHAUSTED", stage, f"the stage is overloaded ({text})")
        return StageCallError("INTERNAL", stage, f"HTTP {r.status_code} from the stage ({text})")

    @staticmethod
    def _parse(stage: str, data: dict[str, Any], cls: type[Any]) -> Any:
        try:
            msg = adapter.from_json(data, cls, field=stage)
            adapter.check_item(msg, stage)
        except adapter.StageItemError as exc:
            code = "INVALID_ARGUMENT" if exc.status == 400 else "INTERNAL"
            raise StageCallError(code, stage, exc.message, field=exc.field) from None
        except adapter.WireError as exc:
            raise StageCallError("INTERNAL", stage, f"contract violation: {exc}") from None
        return msg

    # ------------------------------------------------------------------ the four stages

    async def detect(self, image: bytes, shape_hw: tuple[int, int], deadline: float) -> Detections:
        """Detections of one image (validated against its size)."""
        item = await asyncio.to_thread(adapter.to_json, stages_pb2.DetectItem(image=adapter.image_to_proto(image)))
        data = await self.call("detector", item, deadline)

        def decode() -> Detections:  # RLE masks: on a worker thread
            msg = self._parse("detector", data, stages_pb2.DetectResult)
            try:
                return adapter.detections_from_proto(msg, field="detector")
            except adapter.WireError as exc:
                raise StageCallError("INTERNAL", "detector", f"contract violation: {exc}") from None

        det = await asyncio.to_thread(decode)
        if det.shape_hw != shape_hw:
            raise StageCallError("INTERNAL", "detector", f"detections are for {det.shape_hw}, the image is {shape_hw}")
        return det

    async def segment(
        self, image: bytes, boxes: NDArray[np.float32], refs: BoolMask, shape_hw: tuple[int, int], deadline: float
    ) -> BoolMask:
        """Refined masks (K, H, W) for K box prompts."""
        item = await asyncio.to_thread(lambda: adapter.to_json(adapter.segment_item(image, boxes, refs)))
        data = await self.call("segmenter", item, deadline)

        def decode() -> BoolMask:
            msg = self._parse("segmenter", data, stages_pb2.SegmentResult)
            try:
                return adapter.segment_result_masks(msg, boxes.shape[0], shape_hw)
            except adapter.WireError as exc:
                raise StageCallError("INTERNAL", "segmenter", f"contract violation: {exc}") from None

        return await asyncio.to_thread(decode)

    async def attributes(
        self, image: bytes, masks: BoolMask, names: list[str], answers: tuple[str, ...], deadline: float
    ) -> NDArray[np.float32]:
        """Scores (K, A)."""
        item = await asyncio.to_thread(lambda: adapter.to_json(adapter.attributes_item(image, masks, names, answers)))
        msg = self._parse("attributes", await self.call("attributes", item, deadline), stages_pb2.AttributesResult)
        try:
            return adapter.attributes_result_scores(msg, masks.shape[0], len(answers))
        except adapter.WireError as exc:
            raise StageCallError("INTERNAL", "attributes", f"contract violation: {exc}") from None

    async def depth(self, image: bytes, shape_hw: tuple[int, int], deadline: float) -> NDArray[np.float32]:
        """Disparity (H, W) float32."""
        depth_item = stages_pb2.DepthItem(image=adapter.image_to_proto(image), encoding=self.depth_encoding)
        item = await asyncio.to_thread(adapter.to_json, depth_item)
        data = await self.call("depth", item, deadline)

        def decode() -> NDArray[np.float32]:
            msg = self._parse("depth", data, stages_pb2.DepthResult)
            try:
                return adapter.depth_result_map(msg, shape_hw)
            except adapter.WireError as exc:
                raise StageCallError("INTERNAL", "depth", f"contract violation: {exc}") from None

        return await asyncio.to_thread(decode)
