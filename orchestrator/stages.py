"""Async clients of the four stage services (``docs/stage-contract.md``) over one pooled ``httpx.AsyncClient``.

Every call:

- waits for a slot of its stage (``stage_concurrency`` in flight); when
  ``stage_queue`` calls already wait, it fails at once with RESOURCE_EXHAUSTED;
- gets a timeout of ``min(call_timeout_s, time left until the deadline)``;
- is retried (stage calls are pure functions of their inputs, so idempotent)
  after connection errors, timeouts and HTTP 502 / 503 / 504, with exponential
  backoff, only while the deadline leaves room;
- ends in a ``negt2i.failures.StageError`` carrying the gRPC status it maps to:
  UNAVAILABLE (stage down, or its ``/info`` not valid for this orchestrator),
  DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED (stage overloaded: 429 or 503 after the
  retries), INVALID_ARGUMENT (the stage rejected this item's inputs, or 413),
  INTERNAL (a contract violation, naming the rule).

Identity (``docs/stage-contract.md``, "When /info is read"): ``GET /info`` is read
on every health poll and validated (contract ``negt2i.v1``, the stage it names,
and the rule constants it applies against this orchestrator's config: a stage
that fails is refused with UNAVAILABLE). Every stage result carries the digest
of the model that served it; a digest other than the one last read makes the
orchestrator re-read ``/info`` at once, so the results line names the model that
actually served the item, without an outage.

Bytes sent and received per stage are counted (``wire``), so a request's cost
on the wire can be measured.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import httpx
import numpy as np
from numpy.typing import NDArray

from negt2i.config import RuleConfig, stage_rules
from negt2i.failures import StageError
from negt2i.flow import DetectRequest
from negt2i.perception import BoolMask, Detections
from negt2i.stages.base import ModelInfo
from negt2i.stages.common import filter_detections
from negt2i.wire import adapter
from negt2i.wire.stage_table import STAGE_TABLE
from negt2i.wire.v1 import common_pb2, stages_pb2

log = logging.getLogger("negt2i.orchestrator")

RETRY_STATUS: Final = frozenset({502, 503, 504})
BUSY_STATUS: Final = frozenset({429, 503})
_JSON: Final = {"content-type": "application/json"}


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
            raise StageError(self.stage, f"queue full ({self.waiting} calls waiting)", code="RESOURCE_EXHAUSTED")
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
        config: RuleConfig | None = None,
    ) -> None:
        """``config``: the rule config whose stage constants every stage's ``/info`` must report (None: not
        checked)."""
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
        self.config = config
        self.infos: dict[str, stages_pb2.StageInfo] = {}
        self.digests: dict[str, str] = {}
        self.problems: dict[str, str] = {}
        """Stage -> why its last ``/info`` was refused (calls to it fail with UNAVAILABLE until it is fixed)."""

    async def close(self) -> None:
        """Close the pooled connections."""
        for client in {id(c): c for c in self.clients.values()}.values():
            await client.aclose()

    # ------------------------------------------------------------------ health and info

    async def ready(self, stage: str, timeout_s: float = 2.0) -> bool:
        """Whether ``GET /readyz`` answers 200 and ``GET /info`` (re-read on every poll) is valid."""
        try:
            r = await self.clients[stage].get(f"{self.urls[stage]}/readyz", timeout=timeout_s)
            if r.status_code != 200:
                return False
            return await self.read_info(stage, timeout_s)
        except (httpx.HTTPError, ValueError, adapter.WireError):
            return False

    def check_info(self, stage: str, info: stages_pb2.StageInfo) -> str:
        """Why ``info`` is not acceptable for ``stage`` (empty when it is)."""
        if info.contract != adapter.CONTRACT:
            return f"/info names contract {info.contract!r}, expected {adapter.CONTRACT!r}"
        if info.model.stage != stage:
            return f"/info names stage {info.model.stage!r}, but this URL is the {stage}"
        if not info.model.model:
            return "/info names no model"
        if self.config is not None:
            want = stage_rules(self.config, stage)
            got = {k: float(v) for k, v in info.model.rules.items()}
            if got != want:
                return (f"the stage applies rule constants {got or 'unstated'}, this orchestrator's rules "
                        f"({self.config.name}) say {want}: start the stage with the same NEGT2I_RULES")  # fmt: skip
        return ""

    async def read_info(self, stage: str, timeout_s: float = 2.0) -> bool:
        """Read and validate ``GET /info``; True when it is valid (its model is then the stage's record)."""
        r = await self.clients[stage].get(f"{self.urls[stage]}/info", timeout=timeout_s)
        if r.status_code != 200:
            return False
        info = stages_pb2.StageInfo()
        try:
            info = adapter.from_json(r.json(), stages_pb2.StageInfo)
            adapter.model_info_from_proto(info.model)
        except (ValueError, adapter.WireError) as exc:
            problem = f"/info is not a valid StageInfo ({exc})"
        else:
            problem = self.check_info(stage, info)
        if problem:
            if self.problems.get(stage) != problem:
                log.error("%s at %s refused: %s", stage, self.urls[stage], problem)
            self.problems[stage] = problem
            return False
        self.problems.pop(stage, None)
        self.infos[stage] = info
        self.digests[stage] = adapter.model_info_from_proto(info.model).digest()
        return True

    async def served_by(self, stage: str, digest: str) -> common_pb2.StageService:
        """The record of the model that served a result carrying ``digest`` (``/info`` re-read when it changed)."""
        if digest and digest != self.digests.get(stage):
            with contextlib.suppress(httpx.HTTPError):
                await self.read_info(stage)
            if digest != self.digests.get(stage):
                now = self.digests.get(stage) or "none"
                raise StageError(
                    stage,
                    f"the result names model {digest}, but /info names {now} (an instance is being replaced)",
                    code="UNAVAILABLE",
                )
        return self.service(stage)

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
        if self.config is not None and stage not in self.infos and stage not in self.problems:
            with contextlib.suppress(httpx.HTTPError):  # not polled yet: read /info before the first call
                if not await self.read_info(stage):
                    self.problems.setdefault(stage, "GET /info did not answer 200")
        if stage in self.problems:
            raise StageError(stage, f"refused: {self.problems[stage]}", rule="stage-info", code="UNAVAILABLE")
        url = f"{self.urls[stage]}/{STAGE_TABLE[stage].route}"
        # encoding (base64 images, RLE strings) and decoding bodies run on worker threads: never on the loop
        body = await asyncio.to_thread(lambda: json.dumps({"items": [item]}, separators=(",", ":")).encode())
        async with self.limiters[stage]:
            attempt = 0
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise StageError(stage, "the deadline passed before the stage answered", code="DEADLINE_EXCEEDED")
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
                        raise StageError(stage, f"no answer within {timeout:.1f} s", code="DEADLINE_EXCEEDED") from None
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
                        raise StageError(stage, f"{retry_reason} after {attempt + 1} attempts", code=code)
                if attempt >= self.retries:
                    raise StageError(stage, f"{retry_reason} after {attempt + 1} attempts", code="UNAVAILABLE")
                delay = min(self.backoff_s * (2**attempt), 2.0)
                if time.monotonic() + delay >= deadline:
                    raise StageError(stage, f"{retry_reason}; no time left to retry", code="UNAVAILABLE")
                attempt += 1
                await asyncio.sleep(delay)

    @staticmethod
    def _one_result(stage: str, r: httpx.Response) -> dict[str, Any]:
        try:
            data = r.json()
        except ValueError:
            raise StageError(stage, "the stage answered 200 with a body that is not JSON", code="INTERNAL") from None
        if not isinstance(data, list) or len(data) != 1 or not isinstance(data[0], dict):
            raise StageError(stage, "the stage must answer a JSON array with one result per item", code="INTERNAL")
        result: dict[str, Any] = data[0]
        return result

    @staticmethod
    def _http_error(stage: str, r: httpx.Response) -> StageError:
        text = r.text[:300]
        if r.status_code == 413:
            return StageError(stage, f"the request is too large for the stage ({text})", code="INVALID_ARGUMENT")
        if r.status_code == 429:
            return StageError(stage, f"the stage is overloaded ({text})", code="RESOURCE_EXHAUSTED")
        return StageError(stage, f"HTTP {r.status_code} from the stage ({text})", code="INTERNAL")

    @staticmethod
    def _parse(stage: str, data: dict[str, Any]) -> Any:
        """The stage's result message (its type from the stage table), or a ``StageError``."""
        try:
            msg = adapter.from_json(data, STAGE_TABLE[stage].result, field=stage)
            adapter.check_item(msg, stage)
        except adapter.StageItemError as exc:
            code = "INVALID_ARGUMENT" if exc.status == 400 else "INTERNAL"
            raise StageError(stage, exc.message, field=exc.field, code=code) from None
        except adapter.WireError as exc:
            raise StageError(stage, f"contract violation: {exc}", rule="result-schema") from None
        return msg

    # ------------------------------------------------------------------ the four stages
    # Each returns its answer and the record of the model that served it.

    async def features(self, stage: str) -> frozenset[str]:
        """The optional contract features the stage's ``/info`` lists (read once if not read yet)."""
        if stage not in self.infos and stage not in self.problems:
            with contextlib.suppress(httpx.HTTPError, ValueError, adapter.WireError):
                await self.read_info(stage)
        info = self.infos.get(stage)
        return frozenset(info.features) if info is not None else frozenset()

    async def detect(
        self, image: bytes, shape_hw: tuple[int, int], deadline: float, request: DetectRequest | None = None
    ) -> tuple[Detections, common_pb2.StageService]:
        """Detections of one image (checked against the contract by ``negt2i.flow.begin``), filtered to
        ``request`` (``negt2i.flow.detector_request``): the request is sent to a detector whose ``/info``
        lists ``detect.classes`` (older services reject the unknown fields), and the same filter is applied
        to whatever comes back, so every detector gives the flow the same detections."""
        msg_item = stages_pb2.DetectItem(image=adapter.image_to_proto(image))
        if request is not None and adapter.FEATURE_DETECT_CLASSES in await self.features("detector"):
            msg_item.classes.extend(request.classes)
            msg_item.max_per_class = request.max_per_class
        item = await asyncio.to_thread(adapter.to_json, msg_item)
        data = await self.call("detector", item, deadline)

        def decode() -> tuple[Detections, str]:  # RLE masks: on a worker thread
            msg = self._parse("detector", data)
            try:
                det = adapter.detections_from_proto(msg, field="detector")
            except adapter.WireError as exc:
                raise StageError("detector", f"contract violation: {exc}", rule="detect-result") from None
            if request is not None:
                det = filter_detections(det, request.classes, request.max_per_class)[0]
            return det, str(msg.model_digest)

        det, digest = await asyncio.to_thread(decode)
        return det, await self.served_by("detector", digest)

    async def segment(
        self, image: bytes, boxes: NDArray[np.float32], refs: BoolMask, shape_hw: tuple[int, int], deadline: float
    ) -> tuple[BoolMask, common_pb2.StageService]:
        """Refined masks (K, H, W) for K box prompts."""
        item = await asyncio.to_thread(lambda: adapter.to_json(adapter.segment_item(image, boxes, refs)))
        data = await self.call("segmenter", item, deadline)

        def decode() -> tuple[BoolMask, str]:
            msg = self._parse("segmenter", data)
            try:
                return adapter.segment_result_masks(msg, boxes.shape[0], shape_hw), str(msg.model_digest)
            except adapter.WireError as exc:
                raise StageError("segmenter", f"contract violation: {exc}", rule="mask-size") from None

        masks, digest = await asyncio.to_thread(decode)
        return masks, await self.served_by("segmenter", digest)

    async def attributes(
        self, image: bytes, masks: BoolMask, names: list[str], answers: tuple[str, ...], deadline: float
    ) -> tuple[NDArray[np.float32], common_pb2.StageService]:
        """Scores (K, A)."""
        item = await asyncio.to_thread(lambda: adapter.to_json(adapter.attributes_item(image, masks, names, answers)))
        msg = self._parse("attributes", await self.call("attributes", item, deadline))
        try:
            scores = adapter.attributes_result_scores(msg, masks.shape[0], len(answers))
        except adapter.WireError as exc:
            raise StageError("attributes", f"contract violation: {exc}", rule="result-count") from None
        return scores, await self.served_by("attributes", msg.model_digest)

    async def depth(
        self, image: bytes, shape_hw: tuple[int, int], deadline: float
    ) -> tuple[NDArray[np.float32], common_pb2.StageService]:
        """Disparity (H, W) float32."""
        depth_item = stages_pb2.DepthItem(image=adapter.image_to_proto(image), encoding=self.depth_encoding)
        item = await asyncio.to_thread(adapter.to_json, depth_item)
        data = await self.call("depth", item, deadline)

        def decode() -> tuple[NDArray[np.float32], str]:
            msg = self._parse("depth", data)
            try:
                return adapter.depth_result_map(msg, shape_hw), str(msg.model_digest)
            except adapter.WireError as exc:
                raise StageError("depth", f"contract violation: {exc}", rule="mask-size") from None

        values, digest = await asyncio.to_thread(decode)
        return values, await self.served_by("depth", digest)
