"""Generators' side: a small client of the orchestrator (sync and async) and ``negt2i submit``.

::

    from negt2i.client import EvaluatorClient

    with EvaluatorClient("127.0.0.1:50051") as client:
        client.wait_ready(30)
        result = client.evaluate(png_bytes, prompt=prompt)      # or prompt_id="color-pos0_neg1-000"
        print(result.verdict.correct, result.verdict.reason)

``AsyncEvaluatorClient`` has the same methods as coroutines, for generation
loops that run on asyncio. ``submit`` streams a GenEval-layout folder (or a
manifest) through ``EvaluateStream`` and writes the same results file as
``negt2i evaluate`` (``negt2i.results``), in job order, resumable: items that
failed for a transient reason (a stage UNAVAILABLE, DEADLINE_EXCEEDED,
RESOURCE_EXHAUSTED) get no line at all, so a rerun judges exactly those.

grpc is imported lazily (``negt2i`` itself never imports it).
"""

from __future__ import annotations

import contextlib
import json
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from negt2i.config import RuleConfig
from negt2i.failures import Failure, FailureKind
from negt2i.spec import Prompt
from negt2i.transport import RETRYABLE, Tls, backoff_delay, metadata, open_channel, token_from_env
from negt2i.verdict import Verdict

if TYPE_CHECKING:
    from negt2i.evaluate import Job, Summary
    from negt2i.perception import ImagePerception
    from negt2i.wire.v1 import common_pb2, evaluator_pb2

HEALTH_SERVICE: Final = "negt2i.v1.Evaluator"
DEFAULT_MAX_MESSAGE_BYTES: Final = 32 * 1024 * 1024
TRANSIENT: Final[frozenset[str]] = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "CANCELLED"})
"""Status codes after which an item is retried by the next run rather than written as an error line."""
DEFAULT_ITEM_TIMEOUT_S: Final = 600.0
"""``submit``: an item unanswered this long (from its first send) ends the run with a clear error."""
DEFAULT_ATTEMPTS: Final = 10
"""Sends of one item (or unary call) before a RESOURCE_EXHAUSTED / UNAVAILABLE answer is final."""


class ClientError(RuntimeError):
    """A call failed: ``code`` is the gRPC status name (``INVALID_ARGUMENT``, ``UNAVAILABLE``, ...),
    ``details`` the status text; ``failure`` what the rich error model said (``negt2i.wire.errors``: the
    offending ``field``, the ``stage``, the ``reason``), None when the answer carried none (not from an
    orchestrator, or a transport error)."""

    def __init__(self, code: str, details: str, failure: Failure | None = None) -> None:
        self.code = code
        self.details = details
        self.failure = failure
        super().__init__(f"{code}: {details}")

    @property
    def field(self) -> str:
        """The offending request field (INVALID_ARGUMENT), or ``""``."""
        return self.failure.field if self.failure else ""

    @property
    def stage(self) -> str:
        """The stage that failed (``detector`` ... ``depth``, ``judge``), or ``""``."""
        return self.failure.stage if self.failure else ""

    @property
    def reason(self) -> str:
        """``ErrorInfo.reason`` (``negt2i.wire.errors.Reason``), or ``""``."""
        return self.failure.reason if self.failure else ""

    @property
    def retryable(self) -> bool:
        """Whether sending the same request again may succeed: UNAVAILABLE; RESOURCE_EXHAUSTED from the
        orchestrator (its rich error model says so: not an oversized message); CANCELLED that this client did
        not ask for (gRPC cancels calls still running when a server ends an old connection: documented in
        docs/api.md). A RESOURCE_EXHAUSTED without the rich error model comes from gRPC's transport (a message
        or metadata over its limits): sending it again cannot succeed."""
        if self.code == "CANCELLED":
            return self.failure is None
        if self.code == "RESOURCE_EXHAUSTED" and self.failure is None:
            return False
        return self.code in RETRYABLE and self.reason != "MESSAGE_TOO_LARGE"


@dataclass(frozen=True)
class EvaluateResult:
    """A verdict and the stage services (with their models) that produced it."""

    request_id: str
    verdict: Verdict
    stages: tuple[common_pb2.StageService, ...]
    perception: ImagePerception | None = None
    """What the stages saw (without the disparity map), when asked for with ``include_perception``."""

    @classmethod
    def from_proto(cls, msg: evaluator_pb2.EvaluateResponse) -> EvaluateResult:
        from negt2i.wire import adapter

        perception = adapter.perception_from_proto(msg.perception) if msg.HasField("perception") else None
        return cls(msg.request_id, adapter.verdict_from_proto(msg.verdict), tuple(msg.stages), perception)


def make_request(
    image: bytes,
    *,
    prompt: Prompt | None = None,
    prompt_id: str | None = None,
    request_id: str = "",
    include_perception: bool = False,
) -> evaluator_pb2.EvaluateRequest:
    """An ``EvaluateRequest``: encoded image bytes and inline metadata or a corpus prompt id."""
    from negt2i.wire import adapter
    from negt2i.wire.v1 import evaluator_pb2

    if (prompt is None) == (prompt_id is None):
        raise ValueError("give exactly one of prompt and prompt_id")
    req = evaluator_pb2.EvaluateRequest(
        request_id=request_id or uuid.uuid4().hex,
        image=adapter.image_to_proto(image),
        include_perception=include_perception,
    )
    if prompt is not None:
        req.prompt.CopyFrom(adapter.prompt_to_proto(prompt))
    else:
        req.prompt_id = str(prompt_id)
    return req


def _room(end: float | None, delay: float) -> bool:
    """Whether a retry after ``delay`` seconds still starts before ``end``."""
    import time

    return end is None or time.monotonic() + delay < end


def _error(exc: Exception) -> ClientError:
    code = exc.code().name if hasattr(exc, "code") else "UNKNOWN"
    details = exc.details() if hasattr(exc, "details") else str(exc)
    return ClientError(str(code), str(details or ""), _rich_failure(exc))


def _rich_failure(exc: Exception) -> Failure | None:
    """The ``Failure`` in a failed call's ``grpc-status-details-bin`` trailer (``negt2i.wire.errors``)."""
    if not hasattr(exc, "trailing_metadata"):
        return None
    try:
        from grpc_status import rpc_status

        from negt2i.wire import errors

        status = rpc_status.from_call(exc)
    except Exception:  # no or malformed details: a plain status
        return None
    return None if status is None else errors.failure_from_status(status)


CONNECT_TIMEOUT_S: Final = 5.0
REFUSED_AFTER_S: Final = 2.0
"""``wait_serving`` reports a stage refusal once every waiting health name has been refused this long."""
"""``wait_serving``: how long a health check may go unanswered before the orchestrator is called unreachable."""


def unreachable(target: str, exc: Exception | None, tls: Tls | None, waited: float) -> str:
    """One sentence on why nothing at ``target`` answered (from gRPC's error text): nothing listens, a TLS
    handshake failed (TLS on one side only, or a certificate the other side refuses), or no answer at all."""
    details = str(exc.details() if exc is not None and hasattr(exc, "details") else exc or "")
    low = details.lower()
    cut = details if len(details) <= 300 else details[:297] + "..."
    if any(k in low for k in ("ssl", "handshake", "certificate", "tls", "wrong_version")):
        hint = ("the server may speak plaintext (drop --tls-ca / --tls-cert), or not trust this client's "
                "certificate, or its certificate is not signed by --tls-ca" if tls is not None
                else "the server speaks TLS: pass --tls-ca (and --tls-cert / --tls-key for mutual TLS)")  # fmt: skip
        return f"the TLS handshake with {target} failed: {hint} ({cut})"
    if "connection refused" in low:
        return f"nothing listens at {target} (connection refused): start the orchestrator or check --orchestrator"
    if any(k in low for k in ("socket closed", "connection reset", "end of tcp stream", "eof")):
        if tls is None:
            return (f"{target} closed the connection while it was being set up: the server may require TLS "
                    f"(pass --tls-ca) ({cut})")  # fmt: skip
        return (f"{target} closed the TLS connection while it was being set up: the server may require a client "
                f"certificate (--tls-cert / --tls-key) or not trust this one, or not speak TLS ({cut})")  # fmt: skip
    return f"no answer from the orchestrator at {target} within {waited:.0f} s ({cut or 'no connection'})"


def needed_health(jobs: Sequence[Job]) -> list[str]:
    """The health names a run of ``jobs`` needs SERVING: one per category of its prompts
    (``negt2i.v1.Evaluator/category/<category>``; the detector's stage for prompts without statements), and
    the whole service when a job names a corpus prompt by id (its category is known to the server only). Jobs
    that already failed locally (no metadata) need nothing."""
    names: list[str] = []
    for job in jobs:
        if job.error is not None:
            continue
        if job.prompt is None:
            return [HEALTH_SERVICE]
        category = job.prompt.category
        names.append(f"{HEALTH_SERVICE}/category/{category.value}" if category is not None
                     else f"{HEALTH_SERVICE}/stage/detector")  # fmt: skip
    return sorted(set(names)) or [HEALTH_SERVICE]


def needed_stages(jobs: Sequence[Job], config: RuleConfig) -> set[str]:
    """The stages a run of ``jobs`` may call (``negt2i.plan.category_stages``; every stage when a job names a
    corpus prompt by id)."""
    from negt2i.plan import category_stages
    from negt2i.stage_types import STAGES

    out: set[str] = set()
    for job in jobs:
        if job.error is not None:
            continue
        if job.prompt is None:
            return set(STAGES)
        out.update(category_stages(job.prompt.category, config))
    return out


def item_transient(err: evaluator_pb2.ItemError) -> bool:
    """Whether a stream item answered with ``err`` is left for a rerun rather than written as an error line
    (its code is in ``TRANSIENT``, and it is not an oversized message: see ``item_retryable``)."""
    code = _code_name(err.code)
    return code in TRANSIENT and (code not in RETRYABLE or item_retryable(err))


def item_retryable(err: evaluator_pb2.ItemError) -> bool:
    """Whether a stream item answered with ``err`` may succeed when sent again (its code is RESOURCE_EXHAUSTED
    or UNAVAILABLE, and its ``ErrorInfo.reason`` is not ``MESSAGE_TOO_LARGE``)."""
    from negt2i.wire import adapter

    return _code_name(err.code) in RETRYABLE and adapter.failure_from_proto(err).reason != "MESSAGE_TOO_LARGE"


class EvaluatorClient:
    """Blocking client of ``negt2i.v1.Evaluator``.

    ``tls`` (``negt2i.transport.Tls``, default from ``NEGT2I_CLIENT_TLS_*``) makes the channel secure,
    ``token`` (default ``NEGT2I_TOKEN`` / ``NEGT2I_TOKEN_FILE``) is sent as a bearer token, and ``evaluate``
    retries RESOURCE_EXHAUSTED / UNAVAILABLE with backoff (``attempts`` sends) within its timeout.
    """

    def __init__(
        self,
        target: str,
        *,
        timeout: float | None = 300.0,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        tls: Tls | None = None,
        token: str | None = None,
        attempts: int = DEFAULT_ATTEMPTS,
    ):
        from negt2i.wire.v1 import evaluator_pb2_grpc

        self.target = target
        self.timeout = timeout
        self.attempts = max(1, attempts)
        self.metadata = metadata(token_from_env() if token is None else token)
        self.last_details: dict[str, str] = {}
        """Stage -> what the last health poll said about it (``health_details``)."""
        tls = Tls.from_env() if tls is None else tls
        self.tls = tls
        self.channel = open_channel(target, max_message_bytes=max_message_bytes, tls=tls)
        self.stub = evaluator_pb2_grpc.EvaluatorStub(self.channel)

    def __enter__(self) -> EvaluatorClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the channel."""
        self.channel.close()

    def health(self, service: str = HEALTH_SERVICE, timeout: float = 5.0) -> str:
        """The health status name (``SERVING``, ``NOT_SERVING``, ...)."""
        return self.health_details(service, timeout)[0]

    def health_details(self, service: str = HEALTH_SERVICE, timeout: float = 5.0) -> tuple[str, dict[str, str]]:
        """The health status name and the orchestrator's details of the stages the name depends on: stage ->
        ``refused: ...``, ``down: ...`` or ``accepted with warnings: ...`` (the ``negt2i-stage-<stage>`` trailing
        metadata; empty from an orchestrator that sends none)."""
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        from negt2i.wire.adapter import HEALTH_DETAILS_PREFIX

        stub = health_pb2_grpc.HealthStub(self.channel)
        request = health_pb2.HealthCheckRequest(service=service)
        resp, call = stub.Check.with_call(request, timeout=timeout, metadata=self.metadata)
        details = {str(k)[len(HEALTH_DETAILS_PREFIX) :]: str(v) for k, v in call.trailing_metadata() or ()
                   if str(k).startswith(HEALTH_DETAILS_PREFIX)}  # fmt: skip
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)), details

    def wait_ready(self, timeout: float = 60.0, interval: float = 0.25) -> bool:
        """Poll the health service until SERVING (True) or ``timeout`` seconds passed (False)."""
        import time

        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                if self.health(timeout=min(5.0, max(end - time.monotonic(), 0.1))) == "SERVING":
                    return True
            except Exception:  # not up yet
                pass
            time.sleep(interval)
        return False

    def wait_serving(
        self,
        services: Sequence[str] = (HEALTH_SERVICE,),
        *,
        timeout: float = 60.0,
        connect_timeout: float = CONNECT_TIMEOUT_S,
        interval: float = 0.25,
        partial: bool = False,
        refused_after: float = REFUSED_AFTER_S,
    ) -> list[str]:
        """Poll health until every name in ``services`` is SERVING (``needed_health`` gives the names a run
        needs); returns the names still not SERVING (empty). ``ClientError`` (UNAVAILABLE) with one clear
        sentence when nothing answers a health check within ``connect_timeout`` seconds (nothing listens, or TLS
        on one side only: ``unreachable``), or when a name is still not SERVING after ``timeout`` seconds (the
        names are listed, with what the orchestrator says about their stages); with ``partial``, the names not
        SERVING then are returned instead when at least one name is SERVING (a run judges what it can; the rest
        is left for a rerun).

        A name that waits only for stages the orchestrator *refuses* (health details ``refused: ...``, e.g.
        another rules file) does not wait for ``timeout``: once every waiting name has been refused for
        ``refused_after`` seconds, the refusal is the answer (``ClientError`` naming each refused stage and
        why, or, with ``partial`` and a name SERVING, the waiting names). ``last_details`` keeps the details
        of the last poll (stage -> text)."""
        import time

        import grpc

        start = time.monotonic()
        names = list(dict.fromkeys(services)) or [HEALTH_SERVICE]
        answered = False
        last: Exception | None = None
        waiting = names
        refused_since: float | None = None
        while True:
            left = start + timeout - time.monotonic()
            try:
                now_waiting = []
                refusing = True  # every waiting name waits only for refused stages
                said: dict[str, str] = {}
                for name in names:
                    try:
                        status, details = self.health_details(name, timeout=max(0.1, min(5.0, left, connect_timeout)))
                    except grpc.RpcError as exc:
                        if exc.code() != grpc.StatusCode.NOT_FOUND:  # a name an older server does not report
                            raise
                        status, details = self.health_details(HEALTH_SERVICE, timeout=max(0.1, min(5.0, left)))
                    answered = True
                    said.update(details)
                    if status != "SERVING":
                        now_waiting.append(name)
                        refusing = refusing and any(v.startswith("refused:") for v in details.values())
                waiting = now_waiting
                self.last_details = said
                if not waiting:
                    return []
                refused_since = (refused_since or time.monotonic()) if refusing else None
                if refused_since is not None and time.monotonic() - refused_since >= refused_after:
                    if partial and len(waiting) < len(names):
                        return waiting
                    why = "; ".join(f"the {s} is {v}" for s, v in said.items() if v.startswith("refused:"))
                    raise ClientError("UNAVAILABLE", f"the orchestrator at {self.target} refuses a stage this run "
                                      f"needs: {why}")  # fmt: skip
            except grpc.RpcError as exc:
                last = exc
            elapsed = time.monotonic() - start
            if not answered and elapsed >= min(connect_timeout, timeout):
                raise ClientError("UNAVAILABLE", unreachable(self.target, last, self.tls, elapsed))
            if elapsed >= timeout:
                if partial and answered and len(waiting) < len(names):
                    return waiting
                what = ", ".join(n.rsplit("/", 2)[-2] + " " + n.rsplit("/", 1)[-1] if "/" in n else "the service"
                                 for n in waiting)  # fmt: skip
                why = "".join(f"; {s} {v}" for s, v in self.last_details.items() if not v.startswith("accepted"))
                raise ClientError("UNAVAILABLE", f"the orchestrator at {self.target} is not SERVING after "
                                  f"{timeout:.0f} s (not yet serving: {what}{why})")  # fmt: skip
            time.sleep(interval)

    def info(self) -> evaluator_pb2.ServiceInfo:
        """Versions of the orchestrator and of every stage model."""
        from negt2i.wire.v1 import evaluator_pb2

        try:
            return self.stub.GetServiceInfo(  # type: ignore[no-any-return]
                evaluator_pb2.GetServiceInfoRequest(), timeout=30, metadata=self.metadata
            )
        except Exception as exc:
            raise _error(exc) from None

    def evaluate(
        self,
        image: bytes,
        *,
        prompt: Prompt | None = None,
        prompt_id: str | None = None,
        request_id: str = "",
        timeout: float | None = None,
        include_perception: bool = False,
    ) -> EvaluateResult:
        """Judge one image; raises ``ClientError`` with the status code (after the retries)."""
        import time

        req = make_request(
            image, prompt=prompt, prompt_id=prompt_id, request_id=request_id, include_perception=include_perception
        )
        budget = timeout or self.timeout
        end = None if budget is None else time.monotonic() + budget
        attempt = 0
        while True:
            left = None if end is None else end - time.monotonic()
            try:
                resp = self.stub.Evaluate(req, timeout=left, metadata=self.metadata)
                return EvaluateResult.from_proto(resp)
            except Exception as exc:
                err = _error(exc)
                delay = backoff_delay(attempt)
                attempt += 1
                if not err.retryable or attempt >= self.attempts or not _room(end, delay):
                    raise err from None
                time.sleep(delay)

    def stream_call(self, requests: Iterable[evaluator_pb2.EvaluateRequest], *, timeout: float | None = None) -> Any:
        """The raw ``EvaluateStream`` call (an iterator of responses with ``cancel()`` and
        ``initial_metadata()``); grpc errors are raised as ``grpc.RpcError``."""
        return self.stub.EvaluateStream(iter(requests), timeout=timeout, metadata=self.metadata)

    def stream(
        self, requests: Iterable[evaluator_pb2.EvaluateRequest], *, timeout: float | None = None
    ) -> Iterator[evaluator_pb2.EvaluateStreamResponse]:
        """``EvaluateStream``: responses as they complete (per-item errors inside them)."""
        try:
            yield from self.stream_call(requests, timeout=timeout)
        except Exception as exc:
            raise _error(exc) from None


class AsyncEvaluatorClient:
    """asyncio client of ``negt2i.v1.Evaluator`` (same methods and options as ``EvaluatorClient``, awaited)."""

    def __init__(
        self,
        target: str,
        *,
        timeout: float | None = 300.0,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        tls: Tls | None = None,
        token: str | None = None,
        attempts: int = DEFAULT_ATTEMPTS,
    ):
        from negt2i.wire.v1 import evaluator_pb2_grpc

        self.target = target
        self.timeout = timeout
        self.attempts = max(1, attempts)
        self.metadata = metadata(token_from_env() if token is None else token)
        tls = Tls.from_env() if tls is None else tls
        self.channel = open_channel(target, max_message_bytes=max_message_bytes, tls=tls, aio=True)
        self.stub = evaluator_pb2_grpc.EvaluatorStub(self.channel)

    async def __aenter__(self) -> AsyncEvaluatorClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the channel."""
        await self.channel.close()

    async def info(self) -> evaluator_pb2.ServiceInfo:
        """Versions of the orchestrator and of every stage model."""
        from negt2i.wire.v1 import evaluator_pb2

        try:
            return await self.stub.GetServiceInfo(  # type: ignore[no-any-return]
                evaluator_pb2.GetServiceInfoRequest(), timeout=30, metadata=self.metadata
            )
        except Exception as exc:
            raise _error(exc) from None

    async def evaluate(
        self,
        image: bytes,
        *,
        prompt: Prompt | None = None,
        prompt_id: str | None = None,
        request_id: str = "",
        timeout: float | None = None,
        include_perception: bool = False,
    ) -> EvaluateResult:
        """Judge one image; raises ``ClientError`` with the status code (after the retries)."""
        import asyncio
        import time

        req = make_request(
            image, prompt=prompt, prompt_id=prompt_id, request_id=request_id, include_perception=include_perception
        )
        budget = timeout or self.timeout
        end = None if budget is None else time.monotonic() + budget
        attempt = 0
        while True:
            left = None if end is None else end - time.monotonic()
            try:
                resp = await self.stub.Evaluate(req, timeout=left, metadata=self.metadata)
                return EvaluateResult.from_proto(resp)
            except Exception as exc:
                err = _error(exc)
                delay = backoff_delay(attempt)
                attempt += 1
                if not err.retryable or attempt >= self.attempts or not _room(end, delay):
                    raise err from None
                await asyncio.sleep(delay)

    async def stream(
        self, requests: AsyncIterator[evaluator_pb2.EvaluateRequest] | Iterable[evaluator_pb2.EvaluateRequest]
    ) -> AsyncIterator[evaluator_pb2.EvaluateStreamResponse]:
        """``EvaluateStream``: responses as they complete."""
        call = self.stub.EvaluateStream(requests, metadata=self.metadata)
        try:
            async for resp in call:
                yield resp
        except Exception as exc:
            raise _error(exc) from None


# --------------------------------------------------------------------------- negt2i submit


@dataclass
class SubmitOutcome:
    """What ``submit`` did: the evaluate-style summary plus the items left for a rerun."""

    summary: Summary
    retry: list[str] = field(default_factory=list)
    """Filenames that failed transiently (no line written; a rerun judges them)."""
    stream_error: str | None = None
    """Why the stream itself ended early, if it did."""
    retried: int = 0
    """Sends repeated after RESOURCE_EXHAUSTED / UNAVAILABLE (of an item, or of a failed stream's items)."""
    answers: int = 0
    """Responses received (retried ones included)."""


def _record_of(
    resp: evaluator_pb2.EvaluateStreamResponse,
    job: Job,
    *,
    config: RuleConfig,
    models: dict[str, Any],
    services: dict[str, str],
    outcome: SubmitOutcome,
    perceptions: dict[str, tuple[Verdict, ImagePerception, bool]] | None = None,
    sha256: str | None = None,
) -> dict[str, Any] | None:
    """The results line of one stream response (None: transient failure, no line)."""
    from negt2i.evaluate import error_line, verdict_line
    from negt2i.wire import adapter

    if resp.HasField("result"):
        verdict = adapter.verdict_from_proto(resp.result.verdict)
        served = adapter.models_record(list(resp.result.stages))  # the models that actually served this item
        record = verdict_line(job, verdict, {**models, **served}, sha256)
        if perceptions is not None and resp.result.HasField("perception"):
            seen = resp.result.perception
            perceptions[job.filename] = (verdict, adapter.perception_from_proto(seen), seen.used_depth)
        record["services"] = adapter.services_record(list(resp.result.stages)) or services
        return record
    err = resp.error
    code = _code_name(err.code)
    if item_transient(err):
        outcome.retry.append(job.filename)
        print(f"warning: {job.filename}: {code}: {err.message} (left for a rerun)", file=sys.stderr)
        return None
    return error_line(job, adapter.failure_from_proto(err), config, models, sha256)


def _rules_from_info(info: evaluator_pb2.ServiceInfo) -> RuleConfig:
    record = json.loads(info.rules_json) if info.rules_json else {}
    record.pop("digest", None)
    config = RuleConfig.model_validate(record)
    if info.rules_digest and config.digest() != info.rules_digest:
        raise ClientError("INTERNAL", f"rule config digest mismatch ({config.digest()} != {info.rules_digest})")
    return config


class _Feeder:
    """The request side of ``submit``'s streams: new items and due retries, never more than ``window``
    unanswered (the server's grant). Thread-safe: grpc pulls requests on its own thread."""

    def __init__(self, indices: Sequence[int], window: int) -> None:
        import collections
        import threading

        self.window = max(1, window)
        self.new: collections.deque[int] = collections.deque(indices)
        self.retry: list[tuple[float, int]] = []  # heap of (due, index)
        self.outstanding: dict[int, float] = {}  # index -> when it was sent
        self.generation = 0
        self.cond = threading.Condition()

    def finished(self) -> bool:
        with self.cond:
            return not (self.new or self.retry or self.outstanding)

    def requests(self, make: Callable[[int], evaluator_pb2.EvaluateRequest | None]) -> Iterator[Any]:
        """The request iterator of one stream; it ends when every item is answered (or the stream is
        abandoned with ``abandon``)."""
        import heapq
        import time

        with self.cond:
            generation = self.generation
        while True:
            with self.cond:
                while True:
                    if self.generation != generation:
                        return
                    now = time.monotonic()
                    index: int | None = None
                    if len(self.outstanding) < self.window:
                        if self.retry and self.retry[0][0] <= now:
                            index = heapq.heappop(self.retry)[1]
                        elif self.new:
                            index = self.new.popleft()
                    if index is not None:
                        self.outstanding[index] = now
                        break
                    if not (self.new or self.retry or self.outstanding):
                        return
                    wait = self.retry[0][0] - now if self.retry else 1.0
                    self.cond.wait(timeout=min(max(wait, 0.01), 1.0))
            request = make(index)
            if request is None:  # failed locally (unreadable file): answered already
                self.answered(index)
                continue
            yield request

    def answered(self, index: int) -> None:
        with self.cond:
            self.outstanding.pop(index, None)
            self.cond.notify_all()

    def again(self, index: int, delay: float) -> None:
        import heapq
        import time

        with self.cond:
            self.outstanding.pop(index, None)
            heapq.heappush(self.retry, (time.monotonic() + delay, index))
            self.cond.notify_all()

    def oldest(self) -> float | None:
        """When the longest-unanswered item was sent (None: nothing is outstanding)."""
        with self.cond:
            return min(self.outstanding.values()) if self.outstanding else None

    def abandon(self, delay: float) -> list[int]:
        """End the current stream's iterator; its unanswered items are sent again after ``delay``."""
        import heapq
        import time

        with self.cond:
            self.generation += 1
            lost = list(self.outstanding)
            for index in lost:
                heapq.heappush(self.retry, (time.monotonic() + delay, index))
            self.outstanding.clear()
            self.cond.notify_all()
            return lost

    def drain(self) -> list[int]:
        """Stop: every item not yet answered (never sent, waiting for a retry, or in flight)."""
        with self.cond:
            self.generation += 1
            left = list(self.new) + [i for _, i in self.retry] + list(self.outstanding)
            self.new.clear()
            self.retry.clear()
            self.outstanding.clear()
            self.cond.notify_all()
            return sorted(left)


def submit(
    jobs: Sequence[Job],
    out: str | Path,
    target: str,
    *,
    limit: int | None = None,
    timeout: float | None = None,
    item_timeout: float = DEFAULT_ITEM_TIMEOUT_S,
    attempts: int = DEFAULT_ATTEMPTS,
    progress: bool = True,
    client: EvaluatorClient | None = None,
    save_perception: str | Path | None = None,
    retry_errors: bool = False,
    replace_changed: bool = False,
) -> SubmitOutcome:
    """Stream ``jobs`` (the first ``limit``) to the orchestrator at ``target`` and write ``out`` like
    ``negt2i evaluate`` (see the module docstring). ``save_perception`` as for ``negt2i evaluate`` (the
    orchestrator is asked for the perception with ``include_perception``).

    Flow control and retries: at most ``ServiceInfo.limits.max_in_flight_per_stream`` items are unanswered
    at once; an item answered RESOURCE_EXHAUSTED / UNAVAILABLE is sent again after a jittered exponential
    backoff (``negt2i.transport.backoff_delay``), up to ``attempts`` sends, while its ``item_timeout`` (from
    its first send) and the whole run's ``timeout`` leave room. A stream that fails with one of those codes
    (orchestrator restarting, connection lost) is reopened with backoff and its unanswered items resent.
    When no answer arrives for ``item_timeout`` seconds while items are in flight, the run stops with a
    clear error (``stream_error``); what was not judged gets no line (a rerun judges it).

    The results file is written by the one results writer (``negt2i.results.ResultsWriter``: locked before
    anything is sent, refused unless new or ours) and resumed by content exactly like ``negt2i evaluate``
    (``retry_errors``, ``replace_changed``); each image is read, hashed and checked by the one decoder
    (``negt2i.evaluate.read_job``) before it is sent.
    """
    import threading
    import time

    from tqdm import tqdm

    from negt2i.evaluate import Loaded, error_line, finish_summary, plan_run, read_job
    from negt2i.perception_file import PerceptionWriter
    from negt2i.results import ResultsFileError, ResultsWriter
    from negt2i.wire import adapter

    writer = ResultsWriter(out)  # the one writer, locked before anything is sent
    own = client is None
    try:
        cl = client or EvaluatorClient(target)
    except BaseException:
        writer.close()
        raise
    try:
        info = cl.info()
        config = _rules_from_info(info)
        selected = list(jobs[:limit] if limit is not None else jobs)
        # only the stages these jobs' categories need must be known (a colour-only folder runs with the
        # segmenter down); the results lines record the models of the stages the orchestrator has reached
        need = needed_stages(selected, config)
        refused = {s.stage: s.refused for s in info.stages if s.refused and s.stage in need}
        if refused and ("detector" in refused or len(refused) == len(need)):  # nothing could be judged
            raise ClientError("UNAVAILABLE", "the orchestrator refuses " + "; ".join(
                f"the {stage}: {why}" for stage, why in refused.items()))  # fmt: skip
        for s in info.stages:  # a stage accepted on assumptions (e.g. of the contract before ModelInfo.rules)
            for warning in s.warnings if s.stage in need else ():
                print(f"warning: the {s.stage} {warning}", file=sys.stderr)
        missing = [s.stage for s in info.stages if not s.model.model and s.stage in need]
        if "detector" in missing or len(missing) == len(need):  # nothing could be judged
            raise ClientError("UNAVAILABLE", f"the orchestrator has not reached {', '.join(missing)} yet; retry")
        if missing:  # the items that need them are answered UNAVAILABLE at once and left for a rerun
            print(f"warning: the orchestrator has not reached {', '.join(missing)}: images that need it are left "
                  "for a rerun", file=sys.stderr)  # fmt: skip
        known = [s for s in info.stages if s.model.model]
        models = adapter.models_record(known)
        services = adapter.services_record(known)
        todo, summary = plan_run(
            writer, selected, config, models, retry_errors=retry_errors, replace_changed=replace_changed
        )
        outcome = SubmitOutcome(summary)
        pending: dict[int, dict[str, Any] | None] = {}
        local: dict[int, Failure] = {}
        hashes: dict[int, str | None] = {}
        sends: dict[int, int] = {}
        first_sent: dict[int, float] = {}
        window = int(info.limits.max_in_flight_per_stream) or 32
        max_image = int(info.limits.max_image_bytes)
        feeder = _Feeder(range(len(todo)), window)
        run_end = None if timeout is None else time.monotonic() + timeout

        def make(i: int) -> evaluator_pb2.EvaluateRequest | None:
            job = todo[i]
            try:  # the same read, hash and decoder check (and message) as negt2i evaluate
                loaded = read_job(job)
            except Exception as exc:  # never let one image end the stream for all the others
                why = f"{job.filename}: {type(exc).__name__}: {exc}"
                loaded = Loaded(None, error=Failure(FailureKind.UNREADABLE_IMAGE, why))
            hashes[i] = loaded.sha256
            if loaded.error is None and 0 < max_image < len(loaded.data):
                # what the orchestrator would refuse, refused here: a message over its transport limit would
                # end the whole stream
                why = f"{job.filename}: image of {len(loaded.data)} bytes exceeds the limit of {max_image}"
                loaded = Loaded(loaded.sha256, error=Failure(FailureKind.UNREADABLE_IMAGE, why, field="image.data"))
            if loaded.error is not None or job.prompt is None:
                local[i] = loaded.error or Failure(FailureKind.MISSING_METADATA, "no prompt")
                return None
            sends[i] = sends.get(i, 0) + 1
            first_sent.setdefault(i, time.monotonic())
            return make_request(
                loaded.data, prompt=job.prompt, request_id=str(i), include_perception=save_perception is not None
            )

        bar = tqdm(total=len(todo), unit="img", disable=not progress, dynamic_ncols=True, desc="submit")
        next_index = 0
        side = None if save_perception is None else PerceptionWriter(save_perception)
        perceptions: dict[str, tuple[Verdict, ImagePerception, bool]] = {}
        with writer, side if side is not None else contextlib.nullcontext():

            def flush() -> None:
                nonlocal next_index
                while next_index < len(todo):
                    if next_index in local:
                        record: dict[str, Any] | None = error_line(
                            todo[next_index], local.pop(next_index), config, models, hashes.get(next_index)
                        )
                    elif next_index in pending:
                        record = pending.pop(next_index)
                    else:
                        return
                    if record is not None:
                        seen = perceptions.pop(record["filename"], None)
                        if side is not None and seen is not None:  # written in job order, before its line
                            side.write(record["filename"], record["sample"], *seen[:2], used_depth=seen[2])
                        if record["status"] == "error":
                            summary.errors[str(record["error_kind"])] += 1
                        else:
                            summary.correct += int(record["correct"])
                        writer.write(record)
                        summary.evaluated += 1
                    next_index += 1
                    bar.update(1)

            def give_up(i: int) -> None:
                pending[i] = None
                outcome.retry.append(todo[i].filename)

            def handle(resp: evaluator_pb2.EvaluateStreamResponse) -> None:
                try:
                    i = int(resp.request_id)
                    todo[i]
                except (ValueError, IndexError):
                    print(f"warning: ignoring an answer for unknown request {resp.request_id[:64]!r}", file=sys.stderr)
                    return
                if resp.HasField("error") and item_retryable(resp.error):
                    delay = backoff_delay(sends.get(i, 1) - 1)
                    now = time.monotonic()
                    room = now + delay - first_sent.get(i, now) < item_timeout and _room(run_end, delay)
                    if sends.get(i, 0) < attempts and room:
                        outcome.retried += 1
                        bar.set_postfix(retried=outcome.retried, refresh=False)
                        feeder.again(i, delay)
                        return
                feeder.answered(i)
                pending[i] = _record_of(
                    resp, todo[i], config=config, models=models, services=services, outcome=outcome,
                    perceptions=perceptions if side is not None else None,
                    sha256=hashes.get(i),
                )  # fmt: skip
                flush()

            stream_failures = 0
            while not feeder.finished():
                stalled: list[str] = []
                stop_watch = threading.Event()
                left = None if run_end is None else run_end - time.monotonic()
                if left is not None and left <= 0:
                    outcome.stream_error = f"DEADLINE_EXCEEDED: the run's timeout of {timeout:.0f} s passed"
                    break
                call = cl.stream_call(feeder.requests(make), timeout=left)

                def watch(call: Any = call, stalled: list[str] = stalled, stop: threading.Event = stop_watch) -> None:
                    last = time.monotonic()
                    seen = outcome.answers
                    while not stop.wait(0.5):
                        if outcome.answers != seen:
                            seen, last = outcome.answers, time.monotonic()
                        oldest = feeder.oldest()
                        if oldest is not None and time.monotonic() - max(oldest, last) > item_timeout:
                            stalled.append(
                                f"the orchestrator at {target} stopped answering: no answer for {item_timeout:.0f} s "
                                f"with {len(feeder.outstanding)} images in flight"
                            )
                            call.cancel()
                            return

                watcher = threading.Thread(target=watch, name="submit-watchdog", daemon=True)
                watcher.start()
                try:
                    for resp in call:
                        outcome.answers += 1
                        stream_failures = 0
                        handle(resp)
                except ResultsFileError:  # the results file cannot be written (full disk): not the stream's fault
                    call.cancel()
                    raise
                except Exception as exc:  # grpc.RpcError: the stream itself failed
                    err = _error(exc)
                    if stalled:
                        outcome.stream_error = stalled[0]
                        break
                    delay = backoff_delay(stream_failures)
                    stream_failures += 1
                    if err.retryable and stream_failures < attempts and _room(run_end, delay):
                        lost = feeder.abandon(delay)
                        outcome.retried += len(lost)
                        print(
                            f"warning: the stream ended ({err.code}: {err.details[:200]}); reconnecting in "
                            f"{delay:.1f} s and resending {len(lost)} images",
                            file=sys.stderr,
                        )
                        time.sleep(delay)
                        continue
                    outcome.stream_error = str(err)
                    break
                finally:
                    stop_watch.set()
                    watcher.join()
            # items never answered (the run stopped early) get no line: left for a rerun
            for i in feeder.drain():
                if i not in pending and i not in local:
                    give_up(i)
            for i in range(next_index, len(todo)):
                if i not in pending and i not in local:
                    give_up(i)
            flush()
        bar.close()
        writer.close()
        finish_summary(summary, out)
        return outcome
    finally:
        writer.close()
        if own:
            cl.close()


def _code_name(code: int) -> str:
    import grpc

    for status in grpc.StatusCode:
        if status.value[0] == code:
            return str(status.name)
    return f"CODE_{code}"
