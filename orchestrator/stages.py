"""Async clients of the four stage services (``docs/stage-contract.md``) over one pooled ``httpx.AsyncClient``.

Every call:

- waits for a slot of its stage (``stage_concurrency`` in flight); when
  ``stage_queue`` calls already wait, it fails at once with RESOURCE_EXHAUSTED;
- gets a timeout of ``min(call_timeout_s, time left until the deadline)``;
- is retried (stage calls are pure functions of their inputs, so idempotent)
  after connection errors, timeouts and HTTP 502 / 503 / 504, with exponential
  backoff, only while the deadline leaves room;
- ends in a ``negt2i.core.failures.StageError`` carrying the gRPC status it maps to:
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

Body type (``docs/stage-contract.md``, "Transport"): every stage accepts the
proto3 JSON mapping; a stage whose ``/info`` lists ``application/x-protobuf`` in
``content_types`` (ours do) gets binary protobuf bodies instead (its
``<Stage>Request`` / ``<Stage>Response``: no base64, no JSON text; about 40 ms
less CPU per image on each side at 1024 px, ``benchmarks/bench_stage_transport.py``).
A stage that lists it but answers 415 gets JSON from then on (until its model
digest changes). Building bodies, parsing answers and decoding masks (RLE) all
run on worker threads, never on the event loop.

Bytes sent and received per stage are counted (``wire``), so a request's cost
on the wire can be measured.

Connections (issue 31: cancelled streams used to wedge the pool, encode/httpcore#1093):

- an HTTP call is never cancelled mid-flight: it runs in its own task (``_request``) that the caller awaits
  through ``asyncio.shield``; a caller that gives up (its stream cancelled, its deadline passed, the stage
  marked down) leaves the call to finish on its own, bounded by the call's httpx timeouts and a hard cap,
  and the call keeps its stage slot (``_Limiter``) until it has finished, so the pool (``concurrency + 2``
  connections) is never contended by calls nobody waits for;
- health polls and ``/info`` reads use their own small client per stage (``health_clients``), so a busy or
  damaged call pool never turns a stage NOT_SERVING, and a poll never waits behind stage calls;
- a pool that still loses connections (a connection held by no request, found on two health polls in a row,
  or a call that timed out waiting for a connection while fewer calls than connections were running) is
  replaced by a new client, logged as a warning; the old one is closed once its calls have ended;
- a stage whose last health poll failed is **down** (a poll that lost its connection other than by a timeout
  is tried once more on a new connection first: it may have reached an instance that is stopping): its
  calls fail at once with UNAVAILABLE, and calls already waiting for it give up with UNAVAILABLE when it
  goes down, so items of a hung stage do not hold a stream's window for the other categories
  (``docs/services.md``);
- a stage that answers 429 (BentoML's request cap: busy) to a poll is busy, not down: it keeps its status.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import httpx
import numpy as np
from google.protobuf.message import Message
from numpy.typing import NDArray

from negt2i.core import images
from negt2i.core.config import RuleConfig
from negt2i.core.failures import Code, ContractRule, StageError
from negt2i.core.flow import DetectRequest
from negt2i.core.perception import BoolMask, Detections
from negt2i.core.stage_identity import StageCheck, check_model_info
from negt2i.wire import adapter
from negt2i.wire.stage_table import STAGE_TABLE
from negt2i.wire.v1 import common_pb2, stages_pb2

log = logging.getLogger("negt2i.orchestrator")

HARD_CAP_FACTOR: Final = 2.0
"""An HTTP call still running this many times its timeout (plus a second) after it started is cancelled: by
then it is past connecting and waiting for a pool slot (both bounded by the timeout), where httpcore closes
the connection of a cancelled request."""
HEALTH_CONNECTIONS: Final = 4
"""Connections of each stage's health client (``/readyz`` and ``/info``)."""
RETRY_STATUS: Final = frozenset({502, 503, 504})
BUSY_STATUS: Final = frozenset({429, 503})
_DIGEST: Final = re.compile(r"[0-9A-Za-z._:-]{1,64}")
"""What ``StageInfo.model_digest`` may be."""
_JSON: Final = {"content-type": adapter.JSON_TYPE}
_BINARY: Final = {"content-type": adapter.PROTOBUF_TYPE, "accept": adapter.PROTOBUF_TYPE}


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


class _Limiter:
    """At most ``slots`` calls in flight and ``queue`` waiting; beyond that, RESOURCE_EXHAUSTED."""

    def __init__(self, stage: str, slots: int, queue: int) -> None:
        self.stage = stage
        self.sem = asyncio.Semaphore(slots)
        self.queue = queue
        self.waiting = 0

    async def acquire(self) -> None:
        if self.sem.locked() and self.waiting >= self.queue:
            raise StageError(self.stage, f"queue full ({self.waiting} calls waiting)", code=Code.RESOURCE_EXHAUSTED)
        self.waiting += 1
        try:
            await self.sem.acquire()
        finally:
            self.waiting -= 1

    def release(self) -> None:
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
        bodies: str = "auto",
        client: httpx.AsyncClient | None = None,
        config: RuleConfig | None = None,
        strict: bool = False,
    ) -> None:
        """``config``: the rule config whose stage constants every stage's ``/info`` must report (None: not
        checked). ``strict``: refuse a stage that leaves its rules or operating point unstated (else it is
        accepted with warnings, ``negt2i.core.stage_identity``). ``bodies``: ``auto`` (binary where a stage lists
        it) or ``json`` (always JSON)."""
        if bodies not in ("auto", "json"):
            raise ValueError(f"bodies must be 'auto' or 'json', got {bodies!r}")
        self.bodies = bodies
        self.urls = {k: v.rstrip("/") for k, v in urls.items()}
        self.call_timeout_s = call_timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.depth_encoding = (
            common_pb2.DEPTH_ENCODING_FLOAT32 if depth_encoding == "float32" else common_pb2.DEPTH_ENCODING_FLOAT16
        )
        # one pooled client per stage: httpcore scans its whole pool on every request, so small pools are cheaper
        self._slots = concurrency
        self._limits = httpx.Limits(max_connections=concurrency + 2, max_keepalive_connections=concurrency + 2)
        self._given = client  # a client passed in (tests) serves calls and polls and is never replaced
        self.clients = {stage: client or self._new_client(self._limits) for stage in self.urls}
        health_limits = httpx.Limits(max_connections=HEALTH_CONNECTIONS, max_keepalive_connections=HEALTH_CONNECTIONS)
        self.health_clients = {stage: client or self._new_client(health_limits) for stage in self.urls}
        self.limiters = {s: _Limiter(s, concurrency, queue) for s in self.urls}
        self.running: dict[str, int] = dict.fromkeys(self.urls, 0)
        """Stage -> HTTP calls running on its call client now (awaited or abandoned)."""
        self.rebuilt: dict[str, int] = dict.fromkeys(self.urls, 0)
        """Stage -> times its call client was replaced (a lost connection found)."""
        self.down: dict[str, str] = {}
        """Stage -> why its last health poll failed (its calls fail at once with UNAVAILABLE meanwhile)."""
        self._down_events: dict[str, asyncio.Event] = {}
        self._suspects: dict[str, set[int]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self.wire = WireStats()
        self.config = config
        self.strict = strict
        self.warnings: dict[str, tuple[str, ...]] = {}
        """Stage -> what is assumed about it because its ``/info`` does not state it (``StageCheck.warnings``)."""
        self.infos: dict[str, stages_pb2.StageInfo] = {}
        self.digests: dict[str, str] = {}
        self.problems: dict[str, str] = {}
        """Stage -> why its last ``/info`` was refused (calls to it fail with UNAVAILABLE until it is fixed)."""
        self.no_binary: dict[str, str] = {}
        """Stage -> the model digest that answered a binary body with 415 (JSON is sent to it from then on)."""

    def _new_client(self, limits: httpx.Limits) -> httpx.AsyncClient:
        return httpx.AsyncClient(limits=limits, timeout=self.call_timeout_s, trust_env=False)

    async def close(self) -> None:
        """Close the pooled connections (after cancelling the calls that still run)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        clients = [*self.clients.values(), *self.health_clients.values()]
        for client in {id(c): c for c in clients}.values():
            await client.aclose()

    # ------------------------------------------------------------------ HTTP calls that are never abandoned

    async def _request(
        self, stage: str, client: httpx.AsyncClient, method: str, url: str, *, timeout: float, **kw: Any
    ) -> httpx.Response:
        """One HTTP request in its own task, awaited through ``asyncio.shield``: a caller that is cancelled
        leaves the request to finish (see the module docstring); the response body is read in full, so its
        connection goes back to the pool."""
        task = self._spawn(stage, client, method, url, timeout=timeout, **kw)
        return await asyncio.shield(task)

    def _spawn(
        self, stage: str, client: httpx.AsyncClient, method: str, url: str, *, timeout: float, **kw: Any
    ) -> asyncio.Task[httpx.Response]:
        calls = client is self.clients.get(stage)

        async def run() -> httpx.Response:
            try:
                return await asyncio.wait_for(
                    client.request(method, url, timeout=timeout, **kw), HARD_CAP_FACTOR * timeout + 1.0
                )
            except httpx.PoolTimeout:
                if calls and self.running[stage] <= self._slots:
                    self._rebuild(stage, client, f"a call waited {timeout:.1f} s for a free connection while "
                                  f"{self.running[stage]} calls were running")  # fmt: skip
                raise

        if calls:
            self.running[stage] += 1
        task = asyncio.ensure_future(run())
        self._tasks.add(task)

        def done(t: asyncio.Task[httpx.Response]) -> None:
            self._tasks.discard(t)
            if calls:
                self.running[stage] -= 1
            if not t.cancelled():
                t.exception()  # retrieved: an abandoned call's failure is nobody's error

        task.add_done_callback(done)
        return task

    def _rebuild(self, stage: str, old: httpx.AsyncClient, why: str) -> None:
        """Replace the stage's call client (its pool lost connections); the old one is closed once its calls
        have ended (they are bounded by the hard cap)."""
        if self._given is not None or self.clients.get(stage) is not old:
            return
        self.clients[stage] = self._new_client(self._limits)
        self.rebuilt[stage] += 1
        self._suspects.pop(stage, None)
        log.warning("%s at %s: connection pool rebuilt (%s)", stage, self.urls[stage], why)

        async def close_later() -> None:
            await asyncio.sleep(HARD_CAP_FACTOR * self.call_timeout_s + 2.0)
            await old.aclose()

        task = asyncio.ensure_future(close_later())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def check_pool(self, stage: str) -> None:
        """Replace the call client when a connection of its pool is held by no request (not idle, not closed,
        owned by no waiting or running request) on two checks in a row (``_rebuild``). Runs on every health
        poll."""
        client = self.clients[stage]
        pool = getattr(getattr(client, "_transport", None), "_pool", None)
        requests = getattr(pool, "_requests", None)
        if pool is None or requests is None:
            return
        owned = {id(getattr(r, "connection", None)) for r in requests}
        orphans = {id(c) for c in pool.connections if not (c.is_idle() or c.is_closed()) and id(c) not in owned}
        again = orphans & self._suspects.get(stage, set())
        if again:
            self._rebuild(stage, client, f"{len(again)} of its {len(pool.connections)} connections held by no request")
        else:
            self._suspects[stage] = orphans

    def _mark(self, stage: str, why: str) -> None:
        """Record the stage's last poll: down (``why``) or up (empty)."""
        event = self._down_events.setdefault(stage, asyncio.Event())
        if why:
            self.down[stage] = why
            event.set()
        else:
            self.down.pop(stage, None)
            if event.is_set():
                self._down_events[stage] = asyncio.Event()

    async def _until_down(self, stage: str) -> str:
        event = self._down_events.setdefault(stage, asyncio.Event())
        await event.wait()
        return self.down.get(stage, "down")

    # ------------------------------------------------------------------ health and info

    async def ready(self, stage: str, timeout_s: float = 2.0) -> bool:
        """Whether ``GET /readyz`` answers 200 and ``GET /info`` (re-read on every poll) is valid; on its own
        client (``health_clients``). A stage that answers 429 (busy: BentoML's request cap) keeps the status
        of its previous poll. Records the stage as down when not (``down``) and checks its call pool.

        Any other error (a bug, an answer nothing here expects) also records the stage as down before it is
        re-raised, so the stage's calls fail fast exactly as health says it is down (``watch_health`` logs it)."""
        try:
            return await self._poll(stage, timeout_s)
        except Exception as exc:
            self._mark(stage, f"its health poll failed ({type(exc).__name__}: {exc})")
            raise

    async def _poll(self, stage: str, timeout_s: float) -> bool:
        """One poll. A connection that fails other than by a timeout (refused, reset, closed while reading) is
        tried once more at once, on a new connection: during a blue/green swap or a rolling update a poll
        can catch the instance that is stopping while another one already answers at the same address,
        and one lost connection must not fail every item of the stage until the next poll."""
        self.check_pool(stage)
        was_up = stage not in self.down and stage in self.infos
        why = ""
        for attempt in (1, 2):
            try:
                client = self.health_clients[stage]
                r = await self._request(stage, client, "GET", f"{self.urls[stage]}/readyz", timeout=timeout_s)
                if r.status_code == 429:
                    return was_up
                if r.status_code != 200:
                    why = f"/readyz answered {r.status_code}"
                else:
                    ok = await self.read_info(stage, timeout_s)
                    if ok is None:
                        return was_up
                    if not ok:
                        why = self.problems.get(stage, "/info did not answer 200")
            except httpx.TransportError as exc:
                if attempt == 1 and not isinstance(exc, httpx.TimeoutException):
                    log.info("%s: health poll lost its connection (%s); trying a new one", stage, type(exc).__name__)
                    continue
                why = f"no answer at {self.urls[stage]} ({type(exc).__name__})"
            except (httpx.HTTPError, ValueError, adapter.WireError) as exc:
                why = f"no answer at {self.urls[stage]} ({type(exc).__name__})"
            break
        self._mark(stage, why)
        return not why

    def check_info(self, stage: str, info: stages_pb2.StageInfo) -> StageCheck:
        """Whether ``info`` is acceptable for ``stage``: its contract, then the one model check both paths
        run (``negt2i.core.stage_identity.check_model_info``: stage, model, stated rules, operating point)."""
        if info.contract != adapter.CONTRACT:
            return StageCheck(f"/info names contract {info.contract!r}, expected {adapter.CONTRACT!r}")
        if info.model_digest and not _DIGEST.fullmatch(info.model_digest):
            why = f"/info's model_digest {info.model_digest[:80]!r} is not 1 to 64 characters [0-9A-Za-z._:-]"
            return StageCheck(why)
        model = adapter.model_info_from_proto(info.model)
        if self.config is None:  # no rules to hold the stage to (tests of the transport alone)
            if model.stage != stage:
                return StageCheck(f"its model info names stage {model.stage!r}, but it serves the {stage}")
            return StageCheck("" if model.model else "its model info names no model (ModelInfo.model)")
        return check_model_info(stage, model, self.config, strict=self.strict)

    async def read_info(self, stage: str, timeout_s: float = 2.0) -> bool | None:
        """Read and validate ``GET /info``; True when it is valid (its model is then the stage's record),
        None when the stage is busy (429) and could not say."""
        url = f"{self.urls[stage]}/info"
        r = await self._request(stage, self.health_clients[stage], "GET", url, timeout=timeout_s)
        if r.status_code == 429:
            return None
        if r.status_code != 200:
            return False
        info = stages_pb2.StageInfo()
        check = StageCheck()
        try:
            info = adapter.from_json(r.json(), stages_pb2.StageInfo)
            adapter.model_info_from_proto(info.model)
        except (ValueError, adapter.WireError) as exc:
            problem = f"/info is not a valid StageInfo ({exc})"
        else:
            check = self.check_info(stage, info)
            problem = check.problem
        if problem:
            if self.problems.get(stage) != problem:
                log.error("%s at %s refused: %s", stage, self.urls[stage], problem)
            self.problems[stage] = problem
            return False
        if self.problems.pop(stage, None) is not None or self.warnings.get(stage) != check.warnings:
            for warning in check.warnings:  # once per change, not every poll
                log.warning("%s at %s accepted with a warning: %s", stage, self.urls[stage], warning)
        self.warnings[stage] = check.warnings
        self.infos[stage] = info
        self.digests[stage] = info.model_digest or adapter.model_info_from_proto(info.model).digest()
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
                    code=Code.UNAVAILABLE,
                )
        return self.service(stage)

    def service(self, stage: str) -> common_pb2.StageService:
        """The ``StageService`` record of a stage (its model as last read from ``/info``)."""
        info = self.infos.get(stage)
        model = info.model if info is not None else common_pb2.ModelInfo(stage=stage)
        return common_pb2.StageService(
            stage=stage,
            url=self.urls[stage],
            model=model,
            contract=info.contract if info else "",
            warnings=self.warnings.get(stage, ()),
        )

    def status(self, stage: str) -> common_pb2.StageService:
        """``service(stage)`` with why it is refused now (``StageService.refused``): ``GetServiceInfo``."""
        record = self.service(stage)
        record.refused = self.problems.get(stage, "")
        return record

    def details(self) -> dict[str, str]:
        """Stage -> what a user should know about it now: why it is refused or down, or its warnings
        (stages with nothing to say are left out); the orchestrator's health details."""
        out: dict[str, str] = {}
        for stage in self.urls:
            if stage in self.problems:
                out[stage] = f"refused: {self.problems[stage]}"
            elif stage in self.down:
                out[stage] = f"down: {self.down[stage]}"
            elif self.warnings.get(stage):
                out[stage] = "accepted with warnings: " + "; ".join(self.warnings[stage])
        return out

    def binary(self, stage: str) -> bool:
        """Whether calls to ``stage`` send binary protobuf bodies: its last ``/info`` lists
        ``application/x-protobuf`` and it has not answered one with 415 (at its current model digest)."""
        info = self.infos.get(stage)
        if self.bodies == "json" or info is None or adapter.PROTOBUF_TYPE not in info.content_types:
            return False
        return self.no_binary.get(stage) != self.digests.get(stage)

    # ------------------------------------------------------------------ the call

    async def call(self, stage: str, item: Message, deadline: float) -> Message:
        """POST one item to a stage and return its one result message (see the module docstring); the result
        parses as the stage's result type with no unknown field (or ``StageError``, rule ``result-schema``)."""
        if self.config is not None and stage not in self.infos and stage not in self.problems:
            with contextlib.suppress(httpx.HTTPError):  # not polled yet: read /info before the first call
                if await self.read_info(stage) is False:  # None: busy (429), the call will say
                    self.problems.setdefault(stage, "GET /info did not answer 200")
        if stage in self.problems:
            raise StageError(
                stage, f"refused: {self.problems[stage]}", rule=ContractRule.STAGE_INFO, code=Code.UNAVAILABLE
            )
        if stage in self.down:  # fail fast: nothing is sent to a stage its last health poll found down
            raise StageError(stage, f"down: {self.down[stage]}", code=Code.UNAVAILABLE)
        binary = self.binary(stage)
        # encoding (images, RLE strings) and decoding bodies run on worker threads: never on the loop
        body = await asyncio.to_thread(self._body, stage, item, binary)
        r = await self._post(stage, body, binary, deadline)
        if binary and r.status_code == 415:  # it listed the binary type but refuses it: JSON from now on
            log.warning("%s at %s answered 415 to a binary body: sending JSON", stage, self.urls[stage])
            self.no_binary[stage] = self.digests.get(stage, "")
            binary = False
            body = await asyncio.to_thread(self._body, stage, item, binary)
            r = await self._post(stage, body, binary, deadline)
        if r.status_code != 200:
            raise self._http_error(stage, r)
        return await asyncio.to_thread(self._one_result, stage, r)

    @staticmethod
    def _body(stage: str, item: Message, binary: bool) -> bytes:
        spec = STAGE_TABLE[stage]
        if binary:
            return spec.request_of([item]).SerializeToString()
        return json.dumps({"items": [adapter.to_json(item)]}, separators=(",", ":")).encode()

    async def _post(self, stage: str, body: bytes, binary: bool, deadline: float) -> httpx.Response:
        """POST a body, retried as the module docstring says; the answer when it is not retryable. Each attempt
        holds a stage slot until its HTTP call has ended, also when this caller gave up on it."""
        url = f"{self.urls[stage]}/{STAGE_TABLE[stage].route}"
        headers = _BINARY if binary else _JSON
        limiter = self.limiters[stage]
        attempt = 0
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise StageError(stage, "the deadline passed before the stage answered", code=Code.DEADLINE_EXCEEDED)
            await limiter.acquire()
            timeout = min(self.call_timeout_s, deadline - time.monotonic())
            retry_reason: str
            task = self._spawn(stage, self.clients[stage], "POST", url, content=body, headers=headers,
                               timeout=max(timeout, 0.001))  # fmt: skip
            task.add_done_callback(lambda _: limiter.release())  # the slot is held as long as the call runs
            down = asyncio.ensure_future(self._until_down(stage))
            try:
                done, _ = await asyncio.wait({task, down}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            finally:
                down.cancel()
            try:
                if down in done and task not in done:
                    raise StageError(stage, f"went down while the item waited for it ({self.down.get(stage, '')})",
                                     code=Code.UNAVAILABLE)  # fmt: skip
                if task not in done:
                    raise TimeoutError
                r = task.result()
            except (httpx.TimeoutException, TimeoutError):
                if deadline - time.monotonic() <= 0:
                    raise StageError(stage, f"no answer within {timeout:.1f} s", code=Code.DEADLINE_EXCEEDED) from None
                retry_reason = f"timed out after {timeout:.1f} s"
            except httpx.TransportError as exc:
                retry_reason = f"unreachable at {self.urls[stage]} ({type(exc).__name__})"
            else:
                self.wire.add(stage, len(body), len(r.content))
                if r.status_code not in RETRY_STATUS:
                    return r
                retry_reason = f"HTTP {r.status_code}"
                if attempt >= self.retries:
                    code = Code.RESOURCE_EXHAUSTED if r.status_code in BUSY_STATUS else Code.UNAVAILABLE
                    raise StageError(stage, f"{retry_reason} after {attempt + 1} attempts", code=code)
            if attempt >= self.retries:
                raise StageError(stage, f"{retry_reason} after {attempt + 1} attempts", code=Code.UNAVAILABLE)
            delay = min(self.backoff_s * (2**attempt), 2.0)
            if time.monotonic() + delay >= deadline:
                raise StageError(stage, f"{retry_reason}; no time left to retry", code=Code.UNAVAILABLE)
            attempt += 1
            await asyncio.sleep(delay)

    @staticmethod
    def _one_result(stage: str, r: httpx.Response) -> Message:
        """The one result of a 200 answer, in either body type (the answer's own ``Content-Type`` says which)."""
        spec = STAGE_TABLE[stage]
        ctype = r.headers.get("content-type", "").split(";")[0].strip().lower()
        try:
            if ctype == adapter.PROTOBUF_TYPE:
                results = list(adapter.from_binary(r.content, spec.response, field=stage).results)  # type: ignore[attr-defined]
                if len(results) != 1:
                    raise StageError(
                        stage, f"the stage answered {len(results)} results for one item", code=Code.INTERNAL
                    )
                result: Message = results[0]
                adapter.check_known_fields(result, field=stage)
                return result
            try:
                data = r.json()
            except ValueError:
                raise StageError(
                    stage, "the stage answered 200 with a body that is not JSON", code=Code.INTERNAL
                ) from None
            if not isinstance(data, list) or len(data) != 1 or not isinstance(data[0], dict):
                raise StageError(
                    stage, "the stage must answer a JSON array with one result per item", code=Code.INTERNAL
                )
            return adapter.from_json(data[0], spec.result, field=stage)
        except adapter.WireError as exc:
            raise StageError(stage, f"contract violation: {exc}", rule=ContractRule.RESULT_SCHEMA) from None

    @staticmethod
    def _http_error(stage: str, r: httpx.Response) -> StageError:
        text = r.text[:300]
        if r.status_code == 413:
            return StageError(stage, f"the request is too large for the stage ({text})", code=Code.INVALID_ARGUMENT)
        if r.status_code == 429:
            return StageError(stage, f"the stage is overloaded ({text})", code=Code.RESOURCE_EXHAUSTED)
        return StageError(stage, f"HTTP {r.status_code} from the stage ({text})", code=Code.INTERNAL)

    @staticmethod
    def _parse(stage: str, msg: Any) -> Any:
        """The stage's result message, or a ``StageError`` when it carries the item's ``error``."""
        try:
            adapter.check_item(msg, stage)
        except adapter.StageItemError as exc:
            code = Code.INVALID_ARGUMENT if exc.status == 400 else Code.INTERNAL
            raise StageError(stage, exc.message, field=exc.field, code=code) from None
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

    async def image_for(self, stage: str, data: bytes, pixels: NDArray[np.uint8], cache: dict[str, bytes]) -> bytes:
        """The image bytes to send ``stage``: the client's bytes, unchanged, to a stage whose ``/info`` lists
        ``image.exif_orientation`` (it applies the EXIF orientation as the orchestrator does) and for an image
        without one; else (a stage of the contract before the decoder applied it) the upright ``pixels``
        (decoded by the orchestrator) as a lossless PNG, made once per item (``cache``), so every stage sees
        the pixels the verdict is judged in."""
        if adapter.FEATURE_EXIF_ORIENTATION in await self.features(stage):
            return data
        if "upright" not in cache:

            def upright() -> bytes:  # on a worker thread: the header walk and the PNG encoding
                return data if images.orientation(data) == 1 else adapter.encode_png(pixels)

            cache["upright"] = await asyncio.to_thread(upright)
        return cache["upright"]

    async def detect(
        self, image: bytes, shape_hw: tuple[int, int], deadline: float, request: DetectRequest | None = None
    ) -> tuple[Detections, common_pb2.StageService]:
        """Detections of one image as the detector answered ``request`` (``negt2i.core.flow.detector_request``):
        the request is sent to a detector whose ``/info`` lists ``detect.classes`` (older services reject
        the unknown fields); ``negt2i.core.flow.begin`` checks the answer against the contract and applies the
        class filter, so every detector gives the rules the same detections."""
        msg_item = stages_pb2.DetectItem(image=adapter.image_to_proto(image))
        if request is not None and adapter.FEATURE_DETECT_CLASSES in await self.features("detector"):
            msg_item.classes.extend(request.classes)
            msg_item.max_per_class = request.max_per_class
        data = await self.call("detector", msg_item, deadline)

        def decode() -> tuple[Detections, str]:  # RLE masks: on a worker thread
            msg = self._parse("detector", data)
            try:
                det = adapter.detections_from_proto(msg, field="detector")
            except adapter.WireError as exc:
                raise StageError("detector", f"contract violation: {exc}", rule=ContractRule.DETECT_RESULT) from None
            return det, str(msg.model_digest)

        det, digest = await asyncio.to_thread(decode)
        return det, await self.served_by("detector", digest)

    async def segment(
        self, image: bytes, boxes: NDArray[np.float32], refs: BoolMask, shape_hw: tuple[int, int], deadline: float
    ) -> tuple[BoolMask, common_pb2.StageService]:
        """Refined masks (K, H, W) for K box prompts."""
        item = await asyncio.to_thread(adapter.segment_item, image, boxes, refs)  # RLE encoding: on a worker thread
        data = await self.call("segmenter", item, deadline)

        def decode() -> tuple[BoolMask, str]:
            msg = self._parse("segmenter", data)
            try:
                return adapter.segment_result_masks(msg, boxes.shape[0], shape_hw), str(msg.model_digest)
            except adapter.WireError as exc:
                raise StageError("segmenter", f"contract violation: {exc}", rule=ContractRule.MASK_SIZE) from None

        masks, digest = await asyncio.to_thread(decode)
        return masks, await self.served_by("segmenter", digest)

    async def attributes(
        self, image: bytes, masks: BoolMask, names: list[str], answers: tuple[str, ...], deadline: float
    ) -> tuple[NDArray[np.float32], common_pb2.StageService]:
        """Scores (K, A)."""
        item = await asyncio.to_thread(adapter.attributes_item, image, masks, names, answers)  # RLE: worker thread
        data = await self.call("attributes", item, deadline)

        def decode() -> tuple[NDArray[np.float32], str]:
            msg = self._parse("attributes", data)
            try:
                return adapter.attributes_result_scores(msg, masks.shape[0], len(answers)), str(msg.model_digest)
            except adapter.WireError as exc:
                raise StageError("attributes", f"contract violation: {exc}", rule=ContractRule.RESULT_COUNT) from None

        scores, digest = await asyncio.to_thread(decode)
        return scores, await self.served_by("attributes", digest)

    async def depth(
        self, image: bytes, shape_hw: tuple[int, int], deadline: float
    ) -> tuple[NDArray[np.float32], common_pb2.StageService]:
        """Disparity (H, W) float32."""
        depth_item = stages_pb2.DepthItem(image=adapter.image_to_proto(image), encoding=self.depth_encoding)
        data = await self.call("depth", depth_item, deadline)

        def decode() -> tuple[NDArray[np.float32], str]:
            msg = self._parse("depth", data)
            try:
                return adapter.depth_result_map(msg, shape_hw), str(msg.model_digest)
            except adapter.WireError as exc:
                raise StageError("depth", f"contract violation: {exc}", rule=ContractRule.MASK_SIZE) from None

        values, digest = await asyncio.to_thread(decode)
        return values, await self.served_by("depth", digest)
