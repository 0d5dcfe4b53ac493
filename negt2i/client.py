"""Generators' side: a small client of the orchestrator (sync and async) and ``negt2i submit``.

::

    from negt2i.client import EvaluatorClient

    with EvaluatorClient("127.0.0.1:50051") as client:
        client.wait_ready(30)
        result = client.evaluate(png_bytes, prompt=prompt)      # or prompt_id="color-pos0_neg1-000"
        print(result.verdict.correct, result.verdict.reason)

``AsyncEvaluatorClient`` has the same methods as coroutines, for generation
loops that run on asyncio. Many images over one ``EvaluateStream``, in order,
with back-pressure, retries and a stall watchdog: ``negt2i.run.stream.StreamSubmitter``
(what ``negt2i submit`` and ``negt2i generate --score`` drive).

grpc is imported lazily (``negt2i`` itself never imports it).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from negt2i.core.failures import Code, Failure
from negt2i.core.spec import Prompt
from negt2i.core.verdict import Verdict
from negt2i.transport import (
    DEFAULT_ATTEMPTS,
    RETRYABLE,
    Tls,
    backoff_delay,
    metadata,
    open_channel,
    token_from_env,
)

if TYPE_CHECKING:
    from negt2i.core.perception import ImagePerception
    from negt2i.wire.v1 import common_pb2, evaluator_pb2

HEALTH_SERVICE: Final = "negt2i.v1.Evaluator"
DEFAULT_MAX_MESSAGE_BYTES: Final = 32 * 1024 * 1024


class ClientError(RuntimeError):
    """A call failed: ``code`` is the gRPC status name (``INVALID_ARGUMENT``, ``UNAVAILABLE``, ...),
    ``details`` the status text; ``failure`` what the rich error model said (``negt2i.wire.errors``: the
    offending ``field``, the ``stage``, the ``reason``), None when the answer carried none (not from an
    orchestrator, or a transport error)."""

    def __init__(self, code: Code | str, details: str, failure: Failure | None = None) -> None:
        self.code = code if isinstance(code, Code) else Code[code]
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
        if self.code is Code.CANCELLED:
            return self.failure is None
        if self.code is Code.RESOURCE_EXHAUSTED and self.failure is None:
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


def client_error(exc: Exception) -> ClientError:
    """The ``ClientError`` of a failed call (a ``grpc.RpcError``; any other exception is ``UNKNOWN``)."""
    name = exc.code().name if hasattr(exc, "code") else Code.UNKNOWN.name
    details = exc.details() if hasattr(exc, "details") else str(exc)
    return ClientError(Code.__members__.get(str(name), Code.UNKNOWN), str(details or ""), _rich_failure(exc))


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
                    raise ClientError(Code.UNAVAILABLE, f"the orchestrator at {self.target} refuses a stage this run "
                                      f"needs: {why}")  # fmt: skip
            except grpc.RpcError as exc:
                last = exc
            elapsed = time.monotonic() - start
            if not answered and elapsed >= min(connect_timeout, timeout):
                raise ClientError(Code.UNAVAILABLE, unreachable(self.target, last, self.tls, elapsed))
            if elapsed >= timeout:
                if partial and answered and len(waiting) < len(names):
                    return waiting
                what = ", ".join(n.rsplit("/", 2)[-2] + " " + n.rsplit("/", 1)[-1] if "/" in n else "the service"
                                 for n in waiting)  # fmt: skip
                why = "".join(f"; {s} {v}" for s, v in self.last_details.items() if not v.startswith("accepted"))
                raise ClientError(Code.UNAVAILABLE, f"the orchestrator at {self.target} is not SERVING after "
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
            raise client_error(exc) from None

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
                err = client_error(exc)
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
            raise client_error(exc) from None


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
            raise client_error(exc) from None

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
                err = client_error(exc)
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
            raise client_error(exc) from None
