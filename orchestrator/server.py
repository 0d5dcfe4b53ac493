"""The ``negt2i.v1.Evaluator`` gRPC server (grpc.aio) with health checking and reflection.

Per item (``docs/architecture.md``), the one per-image flow of ``negt2i.core.flow``
(the same as ``negt2i evaluate``'s ``Pipeline``), with its stages reached over HTTP:

1. validate the request: the prompt (inline metadata through
   ``negt2i.core.spec.parse_prompt``, or a corpus id) and the image (size limits,
   decodable) -> INVALID_ARGUMENT / NOT_FOUND with the reason;
2. ``detections`` from the detector service, for the prompt's classes (``flow.detector_request``);
3. ``flow.begin``: the detections checked against the contract, the other
   stages' requests planned;
4. the planned segmenter / attributes / depth calls, concurrently;
5. ``flow.finish``: the answers checked, the perception assembled and judged.

Any failure fails the item with a ``negt2i.core.failures.Failure`` (kind, stage, rule,
gRPC code); never a verdict from partial perception. A failed unary call ends
with the failure's code, its details in plain words, and the rich error model
(``google.rpc.Status`` with ``ErrorInfo`` / ``BadRequest``: ``negt2i.wire.errors``)
in its trailer; a failed stream item gets the same as an ``ItemError``. Each
response names the models that actually served it (``orchestrator.stages``,
identity). Health (overall, per stage, per category) and reflection (v1 and
v1alpha): ``orchestrator.discovery``. The stream contract: ``EvaluateStream``.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import signal
import sys
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, Final

import grpc
from grpc_health.v1 import health_pb2_grpc

from negt2i import __version__
from negt2i.core import flow
from negt2i.core.config import RuleConfig, load_config
from negt2i.core.failures import Code, Failure, FailureKind
from negt2i.core.spec import Prompt, SpecError, read_prompts
from negt2i.core.stage_types import STAGES, Image
from negt2i.wire import adapter, errors
from negt2i.wire.v1 import common_pb2, evaluator_pb2, evaluator_pb2_grpc
from orchestrator import discovery, guard
from orchestrator.admission import Admission, Overloaded, cgroup_memory_limit, default_budget, item_cost
from orchestrator.security import TokenAuth, server_credentials
from orchestrator.settings import Settings, SettingsError
from orchestrator.stages import RemoteStages

log = logging.getLogger("negt2i.orchestrator")
logging.getLogger("httpx").setLevel(logging.WARNING)

SERVICE_NAME = discovery.SERVICE_NAME
DEADLINE_MARGIN_S: Final = 0.5
"""An item's deadline ends this long before its call's (unary or stream), so that its DEADLINE_EXCEEDED
answer, with the rich error details, reaches the client before gRPC ends the call."""
BACKSTOP_S: Final = 0.2
"""An item still running this long after its deadline (a step that does not watch the deadline) is cut and
answered DEADLINE_EXCEEDED; less than ``DEADLINE_MARGIN_S``, so the answer still precedes the call's end."""


class Evaluator(evaluator_pb2_grpc.EvaluatorServicer):
    """The servicer."""

    def __init__(
        self,
        settings: Settings,
        stages: RemoteStages,
        config: RuleConfig,
        corpus: dict[str, Prompt],
        admission: Admission | None = None,
    ) -> None:
        self.settings = settings
        self.stages = stages
        self.config = config
        self.corpus = corpus
        self.admission = admission or _admission(settings)

    # ------------------------------------------------------------------ one item

    def _prompt(self, request: evaluator_pb2.EvaluateRequest) -> Prompt:
        source = request.WhichOneof("prompt_source")
        if source == "prompt":
            try:
                return adapter.prompt_from_proto(request.prompt)
            except adapter.WireError as exc:
                raise _invalid(FailureKind.INVALID_METADATA, exc.message, exc.field) from None
        if source == "prompt_id":
            prompt = self.corpus.get(request.prompt_id)
            if prompt is None:
                raise Failure(
                    FailureKind.MISSING_METADATA,
                    f"no prompt {guard.short(request.prompt_id)!r} in the corpus ({len(self.corpus)} prompts)",
                    field="prompt_id",
                    code=Code.NOT_FOUND,
                )
            return prompt
        raise _invalid(FailureKind.INVALID_METADATA, "set prompt or prompt_id", "prompt_source")

    async def _image(self, request: evaluator_pb2.EvaluateRequest) -> Image:
        data = request.image.data
        if not data:
            raise _invalid(FailureKind.UNREADABLE_IMAGE, "empty image", "image.data")
        if len(data) > self.settings.max_image_bytes:
            raise _invalid(
                FailureKind.UNREADABLE_IMAGE,
                f"image of {len(data)} bytes exceeds the limit of {self.settings.max_image_bytes}",
                "image.data",
            )
        try:
            return await asyncio.to_thread(
                adapter.decode_image, data, max_pixels=self.settings.max_pixels, field="image.data"
            )
        except adapter.WireError as exc:
            raise _invalid(FailureKind.UNREADABLE_IMAGE, exc.message, exc.field) from None

    async def judge_item(
        self, request: evaluator_pb2.EvaluateRequest, deadline: float
    ) -> evaluator_pb2.EvaluateResponse:
        """The verdict for one request (its envelope already checked: ``_check_envelope``), or a ``Failure``."""
        prompt = self._prompt(request)
        image = await self._image(request)
        data = request.image.data
        hw = (int(image.shape[0]), int(image.shape[1]))
        sent: dict[str, bytes] = {}  # upright bytes for stages that do not apply the EXIF orientation

        async def to(stage: str) -> bytes:
            return await self.stages.image_for(stage, data, image, sent)

        wanted = flow.detector_request(prompt, self.config)
        det, detector = await self.stages.detect(await to("detector"), hw, deadline, wanted)
        served: dict[str, common_pb2.StageService] = {"detector": detector}
        # the flow's checks and judging (distance transforms over whole masks) run on a worker thread,
        # never on the event loop
        req = await asyncio.to_thread(
            functools.partial(flow.begin, complete=request.include_perception), prompt, det, hw, self.config
        )
        calls: dict[str, Any] = {}
        if req.refine is not None:
            r = req.refine
            calls["refined"] = self.stages.segment(await to("segmenter"), r.boxes, r.reference_masks, hw, deadline)
        if req.attributes is not None:
            a = req.attributes
            names = list(a.class_names)
            calls["scores"] = self.stages.attributes(await to("attributes"), a.masks, names, a.answers, deadline)
        if req.depth:
            calls["disparity"] = self.stages.depth(await to("depth"), hw, deadline)
        answers: dict[str, Any] = {}
        for name, (value, service) in zip(calls, await _gather_all(list(calls.values())), strict=True):
            answers[name] = value
            served[service.stage] = service
        verdict, perception = await asyncio.to_thread(
            functools.partial(flow.finish, prompt, req, flow.StageAnswers(**answers), config=self.config)
        )
        response = evaluator_pb2.EvaluateResponse(
            request_id=request.request_id,
            verdict=adapter.verdict_to_proto(verdict),
            stages=[served[s] for s in STAGES if s in served],
        )
        if request.include_perception:  # RLE-encodes every mask: on a worker thread, never on the event loop
            packed = await asyncio.to_thread(adapter.perception_to_proto, perception, self.stages.depth_encoding)
            response.perception.CopyFrom(packed)
        return response

    async def _admit(self, request: Any, deadline: float) -> Any:
        """The admission ticket of a request (``orchestrator.admission``), or a RESOURCE_EXHAUSTED ``Failure``."""
        held = 0
        if isinstance(request, guard.BadMessage):
            cost = 0
        else:
            held = request.ByteSize()  # the received message, held while the item waits
            data = request.image.data
            # an oversized image is refused by judge_item; its header is not worth reading. Reading a header
            # walks a JPEG's segments (up to the image limit): on a worker thread, never on the event loop
            cost = len(data) if len(data) > self.settings.max_image_bytes else await asyncio.to_thread(item_cost, data)
        try:
            return await self.admission.acquire(cost, deadline, held)
        except Overloaded as exc:
            raise Failure(FailureKind.STAGE_ERROR, exc.message, code=Code.RESOURCE_EXHAUSTED,
                          reason=errors.Reason.SERVER_OVERLOADED) from None  # fmt: skip

    def _limits(self) -> evaluator_pb2.ServerLimits:
        """``ServiceInfo.limits``."""
        from negt2i.core import spec

        return evaluator_pb2.ServerLimits(
            max_message_bytes=self.settings.max_message_bytes,
            max_image_bytes=self.settings.max_image_bytes,
            max_pixels=self.settings.max_pixels,
            max_in_flight_per_stream=self.settings.stream_window,
            max_inflight_bytes=self.admission.budget,
            max_active_items=self.admission.max_active,
            max_waiting_items=self.admission.max_waiting,
            max_statements=spec.MAX_STATEMENTS,
            max_objects=spec.MAX_OBJECTS,
            max_text_chars=spec.MAX_TEXT_CHARS,
            max_extra_json_bytes=spec.MAX_EXTRA_BYTES,
            max_extra_json_depth=spec.MAX_EXTRA_DEPTH,
            max_request_id_chars=guard.MAX_REQUEST_ID_CHARS,
            auth_required=bool(self.settings.auth_token),
        )

    def _deadline(self, context: grpc.aio.ServicerContext[Any, Any]) -> float:
        """The item's deadline: ``item_timeout_s`` from now, or the call's deadline less ``DEADLINE_MARGIN_S``
        (so that the item's DEADLINE_EXCEEDED answer reaches the client before the call ends)."""
        left = context.time_remaining()
        budget = self.settings.item_timeout_s
        if left is not None:
            budget = min(budget, left - DEADLINE_MARGIN_S)
        return time.monotonic() + budget

    async def _judge_by(
        self, request: evaluator_pb2.EvaluateRequest, deadline: float
    ) -> evaluator_pb2.EvaluateResponse:
        """``judge_item``, cut ``BACKSTOP_S`` after ``deadline`` (DEADLINE_EXCEEDED) whatever step it is in (a
        stage call is cut at ``deadline`` itself, and its failure names the stage)."""
        budget = _time_left(deadline)
        try:
            return await asyncio.wait_for(self.judge_item(request, deadline), budget + BACKSTOP_S)
        except TimeoutError:
            raise Failure(FailureKind.STAGE_ERROR, f"no verdict within the item's deadline ({budget:.1f} s)",
                          code=Code.DEADLINE_EXCEEDED, reason=errors.Reason.DEADLINE_EXCEEDED) from None  # fmt: skip

    # ------------------------------------------------------------------ RPCs

    async def Evaluate(
        self, request: evaluator_pb2.EvaluateRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> evaluator_pb2.EvaluateResponse:
        """Judge one image against one prompt; failures carry the rich error model (``negt2i.wire.errors``)."""
        try:
            deadline = self._deadline(context)
            _check_envelope(request)
            _time_left(deadline)
            ticket = await self._admit(request, deadline)
            try:
                return await self._judge_by(request, deadline)
            finally:
                self.admission.release(ticket)
        except Failure as exc:
            await _abort(context, exc)
            raise  # unreachable: abort raises
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug: say so in plain words (the traceback is logged), never UNKNOWN
            log.exception("request %s failed", guard.loggable(str(getattr(request, "request_id", ""))))
            await _abort(context, _internal())
            raise

    async def EvaluateStream(
        self,
        request_iterator: AsyncIterator[evaluator_pb2.EvaluateRequest],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[evaluator_pb2.EvaluateStreamResponse]:
        """Judge items as they arrive, ``stream_window`` at a time; responses in completion order.

        The stream contract (docs/api.md, "Stream contract"):

        - flow control: the grant (``stream_window``) is sent as the initial metadata
          ``negt2i-max-in-flight`` (and in ``ServiceInfo.limits``); a message is read only when fewer than
          ``stream_window`` items are unanswered (an answer counts once it is written), so at most that many
          items are held per stream, and each waits for admission (``orchestrator.admission``);
        - every message read gets exactly one answer, matched by ``request_id``: a verdict or an
          ``ItemError`` (with ``status``, the rich error model);
        - ``request_id`` must be non-empty and unique among the stream's unanswered items: an empty one is
          answered INVALID_ARGUMENT (reason INVALID_REQUEST_ID, empty id), a duplicate INVALID_ARGUMENT
          (reason DUPLICATE_REQUEST_ID, the id) while the earlier item is judged and answered as usual;
          an id may be reused once its answer has been sent (a retry);
        - deadlines: each item has ``item_timeout_s`` or what is left of the stream's deadline less
          ``DEADLINE_MARGIN_S``, whichever ends first; past it the item is answered DEADLINE_EXCEEDED, so
          every item read is answered before the stream's deadline ends the call;
        - a message over ``max_message_bytes`` fails that item (RESOURCE_EXHAUSTED, MESSAGE_TOO_LARGE); one
          over gRPC's transport limit (``guard.TRANSPORT_FACTOR`` x) ends the stream (gRPC), with the items
          in flight unanswered: a client resends what it has no answer for.
        """
        out: asyncio.Queue[evaluator_pb2.EvaluateStreamResponse | None] = asyncio.Queue()
        window = asyncio.Semaphore(self.settings.stream_window)
        tasks: set[asyncio.Task[None]] = set()
        unanswered: dict[str, int] = {}  # request_id -> items read and not yet answered
        await context.send_initial_metadata(
            (("negt2i-max-in-flight", str(self.settings.stream_window)),
             ("negt2i-max-message-bytes", str(self.settings.max_message_bytes)))
        )  # fmt: skip

        def reply_id(request: Any) -> str:
            return str(request.request_id)[: guard.MAX_REQUEST_ID_CHARS]

        async def answer(request: Any, *, result: Any = None, failure: Failure | None = None) -> None:
            rid = reply_id(request)
            if rid in unanswered:
                unanswered[rid] -= 1
                if unanswered[rid] <= 0:
                    del unanswered[rid]
            if failure is not None:
                await out.put(evaluator_pb2.EvaluateStreamResponse(request_id=rid, error=_item_error(failure)))
            else:
                await out.put(evaluator_pb2.EvaluateStreamResponse(request_id=request.request_id, result=result))

        async def one(request: evaluator_pb2.EvaluateRequest, deadline: float, ticket: Any) -> None:
            try:
                try:
                    result = await self._judge_by(request, deadline)
                finally:
                    self.admission.release(ticket)
                await answer(request, result=result)
            except Failure as exc:
                await answer(request, failure=exc)
            except asyncio.CancelledError:
                raise
            except Exception:  # never lose an item silently
                log.exception("item %s failed", guard.loggable(str(getattr(request, "request_id", ""))))
                await answer(request, failure=_internal())

        async def start(request: Any) -> None:
            """Check one message and start judging it, or answer it at once."""
            rid = reply_id(request)
            try:
                _check_envelope(request)
                if not rid:
                    why = "a stream item needs a non-empty request_id (its answer carries it)"
                    raise _invalid(FailureKind.INVALID_METADATA, why, "request_id", errors.Reason.INVALID_REQUEST_ID)
                if rid in unanswered:
                    unanswered[rid] += 1
                    raise _invalid(FailureKind.INVALID_METADATA, f"request_id {guard.short(rid)!r} is already in "
                                   "flight on this stream; send it again after its answer", "request_id",
                                   errors.Reason.DUPLICATE_REQUEST_ID)  # fmt: skip
                unanswered[rid] = 1
                deadline = self._deadline(context)
                _time_left(deadline)
                ticket = await self._admit(request, deadline)
            except Failure as exc:
                await answer(request, failure=exc)
                return
            task = asyncio.create_task(one(request, deadline, ticket))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

        async def read() -> None:
            try:
                iterator = request_iterator.__aiter__()
                while True:
                    await window.acquire()  # released when an answer has been written
                    try:
                        request = await iterator.__anext__()
                    except StopAsyncIteration:
                        window.release()
                        break
                    await start(request)
                while tasks:
                    await asyncio.gather(*list(tasks), return_exceptions=True)
            finally:
                await out.put(None)

        reader = asyncio.create_task(read())
        try:
            while (item := await out.get()) is not None:
                yield item
                window.release()
            await reader
        finally:
            reader.cancel()
            for task in list(tasks):
                task.cancel()

    async def GetServiceInfo(
        self, request: evaluator_pb2.GetServiceInfoRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> evaluator_pb2.ServiceInfo:
        """Versions of the orchestrator and of every stage model."""
        return evaluator_pb2.ServiceInfo(
            api_version=adapter.CONTRACT,
            orchestrator_version=__version__,
            rules_name=self.config.name,
            rules_digest=self.config.digest(),
            stages=[self.stages.status(s) for s in STAGES],
            limits=self._limits(),
            corpus_prompts=len(self.corpus),
            rules_json=json.dumps(self.config.record(), separators=(",", ":")),
            vocabulary=adapter.vocabulary_to_proto(),
        )

    async def GetVocabulary(
        self, request: evaluator_pb2.GetVocabularyRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> evaluator_pb2.Vocabulary:
        """The vocabulary prompts may use (``ServiceInfo.vocabulary``; docs/api.md)."""
        return adapter.vocabulary_to_proto()


def _invalid(kind: FailureKind, message: str, field: str, reason: str = "") -> Failure:
    return Failure(kind, message, field=field, code=Code.INVALID_ARGUMENT, reason=reason)


def _time_left(deadline: float) -> float:
    """Seconds left before ``deadline``; a DEADLINE_EXCEEDED ``Failure`` when none are."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise Failure(FailureKind.STAGE_ERROR, "the deadline (less the answer margin) had passed before the item "
                      "could start", code=Code.DEADLINE_EXCEEDED, reason=errors.Reason.DEADLINE_EXCEEDED)  # fmt: skip
    return left


def _internal() -> Failure:
    """What a bug in the orchestrator is answered with (the traceback goes to the server's log only)."""
    return Failure(FailureKind.STAGE_ERROR, "internal error in the orchestrator (details are in the server's log)",
                   code=Code.INTERNAL, reason=errors.Reason.INTERNAL_ERROR)  # fmt: skip


def _item_error(failure: Failure) -> evaluator_pb2.ItemError:
    """The ``ItemError`` of a failure (with its rich ``status``), its message and field bounded
    (``orchestrator.guard``)."""
    err = adapter.failure_to_proto(failure)
    err.message = guard.bounded(err.message)
    err.field = guard.short(err.field, 200)
    err.status.message = err.message
    return err


async def _abort(context: grpc.aio.ServicerContext[Any, Any], failure: Failure) -> None:
    """End a unary call with the failure's code, its bounded plain-words details and the rich error model in
    the ``grpc-status-details-bin`` trailer."""
    from grpc_status import rpc_status

    text = guard.bounded(errors.plain(failure.details()))
    await context.abort_with_status(rpc_status.to_status(errors.to_status(failure, text)))


def _admission(settings: Settings) -> Admission:
    reserve = guard.reception_reserve(settings)
    limit = cgroup_memory_limit()
    budget = settings.max_inflight_bytes or default_budget(limit, reserve=reserve)
    if limit is not None and reserve + 2 * budget > limit:
        log.warning(
            "memory limit %d MiB < %d MiB (messages being received and the process, %d MiB, + 2 x the in-flight "
            "budget, %d MiB): raise the limit or lower NEGT2I_MAX_INFLIGHT_BYTES, NEGT2I_MAX_MESSAGE_BYTES, "
            "NEGT2I_MAX_RECEIVING or NEGT2I_MAX_STREAM_RECEIVING (docs/services.md, Memory before a message is read)",
            limit >> 20, (reserve + 2 * budget) >> 20, reserve >> 20, budget >> 20,
        )  # fmt: skip
    return Admission(budget, settings.max_active, settings.max_waiting, settings.max_wait_s)


def _check_envelope(request: Any) -> None:
    """What every request must satisfy before its prompt and image are looked at."""
    if isinstance(request, guard.BadMessage):
        if request.too_large:
            kind = FailureKind.UNREADABLE_IMAGE if request.image else FailureKind.INVALID_METADATA
            raise Failure(kind, request.reason, field=request.field, code=Code.RESOURCE_EXHAUSTED,
                          reason=errors.Reason.MESSAGE_TOO_LARGE)  # fmt: skip
        raise _invalid(FailureKind.INVALID_METADATA, request.reason, "request", errors.Reason.MALFORMED_REQUEST)
    if len(request.request_id) > guard.MAX_REQUEST_ID_CHARS:
        raise _invalid(
            FailureKind.INVALID_METADATA,
            f"{len(request.request_id)} characters, above the limit of {guard.MAX_REQUEST_ID_CHARS}",
            "request_id",
            errors.Reason.INVALID_REQUEST_ID,
        )
    at = guard.control_char(request.request_id)
    if at >= 0:  # it is echoed into verdicts, results files and logs: no line breaks, NUL or escapes
        raise _invalid(
            FailureKind.INVALID_METADATA,
            f"control character U+{ord(request.request_id[at]):04X} at position {at}: a request_id must be "
            "printable text",
            "request_id",
            errors.Reason.INVALID_REQUEST_ID,
        )


async def _gather_all(coros: Sequence[Any]) -> list[Any]:
    """Run concurrently; on the first failure cancel the rest and raise it."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def load_corpus(path: str) -> dict[str, Prompt]:
    """Prompts by id from the corpus file (empty, with a warning, when it does not exist)."""
    p = Path(path)
    if not p.is_file():
        log.warning("corpus %s not found: only inline prompt metadata will be accepted", path)
        return {}
    return {prompt.id: prompt for prompt in read_prompts(p)}


async def serve(settings: Settings, *, ready: asyncio.Event | None = None) -> None:
    """Run the server until SIGTERM / SIGINT."""
    config = load_config(settings.rules)
    try:
        corpus = load_corpus(settings.corpus)
    except SpecError as exc:
        raise SystemExit(f"orchestrator: corpus {settings.corpus}: {exc}") from None
    stages = RemoteStages(
        settings.urls,
        concurrency=settings.stage_concurrency,
        queue=settings.stage_queue,
        call_timeout_s=settings.call_timeout_s,
        retries=settings.retries,
        backoff_s=settings.backoff_s,
        depth_encoding=settings.depth_encoding,
        bodies=settings.stage_bodies,
        config=config,
        strict=settings.strict_stages,
    )
    options: list[tuple[str, Any]] = [
        # the receive limit, and what gRPC buffers for a call before its message is read (docs/services.md, Memory)
        *guard.transport_options(settings.max_message_bytes, settings.call_buffer_bytes),
        # clients send keepalive pings (negt2i.client: every 30 s, also on idle streams): allow them
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
        ("grpc.http2.max_ping_strikes", 0),
        # Close connections after ~5 min (in-flight calls get 30 s to finish) so that long-lived
        # round-robin clients re-resolve the headless Service and reach pods the HPA added.
        ("grpc.max_connection_age_ms", 300_000),
        ("grpc.max_connection_age_grace_ms", 30_000),
        # gRPC sets SO_REUSEPORT by default: a second orchestrator started on the same port would then
        # bind too and silently take half the connections. Refuse the port instead (start fails, says so).
        ("grpc.so_reuseport", 0),
    ]
    try:
        credentials = server_credentials(settings.tls_cert, settings.tls_key, settings.tls_client_ca)
    except (OSError, ValueError) as exc:
        raise SystemExit(f"orchestrator: TLS: {exc}") from None
    # the token first (a refused call is never counted), then the bound on open calls
    interceptors: list[grpc.aio.ServerInterceptor] = [TokenAuth(settings.auth_token)] if settings.auth_token else []
    free_heap = 2 * guard.TRANSPORT_FACTOR * settings.max_message_bytes  # trimmed above: two messages' worth
    interceptors.append(guard.CallLimit(settings.max_calls, settings.max_receiving, settings.receive_timeout_s,
                                        settings.max_wait_s, free_heap,
                                        max_stream_receiving=settings.max_stream_receiving))  # fmt: skip
    server = grpc.aio.server(options=options, interceptors=interceptors)
    evaluator = Evaluator(settings, stages, config, corpus)
    guard.add_evaluator(evaluator, server, settings.max_message_bytes)
    health = discovery.Health(config)
    await discovery.set_all(health, discovery.health_statuses({}, config))  # NOT_SERVING until polled
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    if settings.reflection:
        discovery.enable_reflection(server, (SERVICE_NAME, discovery.HEALTH_SERVICE))
    address = f"{settings.host}:{settings.port}"
    try:
        bound = server.add_secure_port(address, credentials) if credentials else server.add_insecure_port(address)
    except RuntimeError as exc:  # grpc raises RuntimeError when the address cannot be bound
        raise SystemExit(f"orchestrator: cannot listen on {address} (in use?): {exc}") from None
    await server.start()
    log.info("orchestrator %s listening on %s:%d (%s%s; rules %s, %d corpus prompts; in-flight budget %d MiB, "
             "%d items at once; strict stages %s)",
             __version__, settings.host, bound, "TLS" if credentials else "plaintext",
             ", token" if settings.auth_token else "", config.name, len(corpus),
             evaluator.admission.budget >> 20, evaluator.admission.max_active,
             "on" if settings.strict_stages else "off")  # fmt: skip
    print(f"orchestrator listening on {settings.host}:{bound}", flush=True)
    watcher = asyncio.create_task(discovery.watch_health(stages, health, settings.health_interval_s, config))
    stop = asyncio.Event()
    died: list[BaseException] = []

    def watcher_done(task: asyncio.Task[None]) -> None:
        # the health poller runs until shutdown; if it ends otherwise, health would freeze at its last
        # status (SERVING with a stage gone): stop the server instead, so the platform restarts it
        if task.cancelled() and stop.is_set():
            return
        exc = None if task.cancelled() else task.exception()
        died.append(exc or RuntimeError("the health poller ended"))
        log.critical("the stage health poller ended (%r): stopping the server", died[0], exc_info=exc)
        stop.set()

    watcher.add_done_callback(watcher_done)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if ready is not None:
        ready.set()
    try:
        await stop.wait()
    finally:
        stop.set()
        await health.enter_graceful_shutdown()
        watcher.cancel()
        await server.stop(grace=5)
        w = stages.wire
        log.info("wire: calls %s, sent %s, received %s bytes", w.calls, w.sent, w.received)
        await stages.close()
    if died:
        raise SystemExit(f"orchestrator: the stage health poller ended ({died[0]!r}); see the log")


def main(argv: list[str] | None = None) -> int:
    """``python -m orchestrator``."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        settings = Settings.from_args(argv)
    except SettingsError as exc:  # an invalid NEGT2I_* variable: one line, no traceback
        print(f"orchestrator: {exc}", file=sys.stderr)
        return 2
    asyncio.run(serve(settings))
    return 0
