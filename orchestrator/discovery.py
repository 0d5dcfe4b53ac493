"""Health and reflection of the orchestrator: what a client can ask before it sends work.

Health (``grpc.health.v1.Health``, ``protos/grpc/health/v1/health.proto``), one status per name:

- ``""`` and ``negt2i.v1.Evaluator``: the whole server, SERVING while every stage service answers
  ``/readyz`` (every category can be judged); readiness probes use it;
- ``negt2i.v1.Evaluator/stage/<stage>`` (``detector``, ``segmenter``, ``attributes``, ``depth``):
  SERVING while that stage answers ``/readyz``;
- ``negt2i.v1.Evaluator/category/<category>`` (``color`` ... ``depth``): SERVING while every stage the
  category needs is (``negt2i.core.plan.category_stages``): with depth down, ``category/depth`` is NOT_SERVING
  and the other five stay SERVING, and their prompts are judged as usual.

Stages are polled every ``health_interval_s``; ``List`` returns every name with its status. On shutdown
every name turns NOT_SERVING.

Details: health statuses carry no text, so every ``Check`` / ``List`` answer carries, as trailing metadata,
one ``negt2i-stage-<stage>`` entry per stage the name depends on that has something to say: why it is
refused (``refused: ...``, e.g. rule constants other than the orchestrator's) or down (``down: ...``), or
the warnings it was accepted with (``accepted with warnings: ...``, a stage of the contract before
``ModelInfo.rules``). ``negt2i submit`` reads them to say at once which stage is refused and why;
``grpcurl -v`` prints them (``Response trailers received``). ``GetServiceInfo`` has the same per stage
(``StageService.refused`` / ``warnings``).

Reflection: both ``grpc.reflection.v1.ServerReflection`` (what current tools ask first: grpcurl, the
npm reflection clients) and the older ``grpc.reflection.v1alpha.ServerReflection``. grpcio-reflection
implements only v1alpha; the two protocols are the same messages under another package name, so the v1
service is the v1alpha servicer registered under the v1 name, and the v1 descriptor (the v1alpha file
renamed) is added to the descriptor pool so that reflection can describe itself under both names.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any, Final

import grpc
from grpc_health.v1 import health_pb2
from grpc_health.v1._async import HealthServicer

from negt2i.core.config import RuleConfig
from negt2i.core.plan import category_stages
from negt2i.core.stage_types import STAGES
from negt2i.core.vocab import Category
from negt2i.wire import adapter
from negt2i.wire.v1 import evaluator_pb2

log = logging.getLogger("negt2i.orchestrator")

SERVICE_NAME: Final = evaluator_pb2.DESCRIPTOR.services_by_name["Evaluator"].full_name
"""``negt2i.v1.Evaluator``."""
HEALTH_SERVICE: Final = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
REFLECTION_V1: Final = "grpc.reflection.v1.ServerReflection"
REFLECTION_V1ALPHA: Final = "grpc.reflection.v1alpha.ServerReflection"
_V1_FILE: Final = "grpc/reflection/v1/reflection.proto"

DETAILS_PREFIX: Final = adapter.HEALTH_DETAILS_PREFIX
"""Trailing metadata key prefix of the health details: ``negt2i-stage-<stage>``."""
MAX_DETAIL_CHARS: Final = 2000
SERVING: Final = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING: Final = health_pb2.HealthCheckResponse.NOT_SERVING


def stage_name(stage: str) -> str:
    """The health name of one stage: ``negt2i.v1.Evaluator/stage/<stage>``."""
    return f"{SERVICE_NAME}/stage/{stage}"


def category_name(category: Category | str) -> str:
    """The health name of one category: ``negt2i.v1.Evaluator/category/<category>``."""
    return f"{SERVICE_NAME}/category/{Category(category).value}"


def health_statuses(up: dict[str, bool], config: RuleConfig) -> dict[str, int]:
    """Every health name's status given which stages are up (see the module docstring)."""
    every = all(up.get(s, False) for s in STAGES)
    out = {"": SERVING if every else NOT_SERVING, SERVICE_NAME: SERVING if every else NOT_SERVING}
    for stage in STAGES:
        out[stage_name(stage)] = SERVING if up.get(stage, False) else NOT_SERVING
    for category in Category:
        ok = all(up.get(s, False) for s in category_stages(category, config))
        out[category_name(category)] = SERVING if ok else NOT_SERVING
    return out


def _metadata_text(text: str) -> str:
    """``text`` as a metadata value: printable ASCII, bounded."""
    clean = "".join(c if " " <= c <= "~" else "?" for c in text)
    return clean if len(clean) <= MAX_DETAIL_CHARS else clean[: MAX_DETAIL_CHARS - 3] + "..."


def name_stages(name: str, config: RuleConfig | None) -> tuple[str, ...]:
    """The stages a health name depends on (every stage for the whole server and unknown names)."""
    prefix = f"{SERVICE_NAME}/"
    if name.startswith(prefix + "stage/") and name.rsplit("/", 1)[1] in STAGES:
        return (name.rsplit("/", 1)[1],)
    if name.startswith(prefix + "category/") and config is not None:
        try:
            return tuple(category_stages(Category(name.rsplit("/", 1)[1]), config))
        except ValueError:
            return tuple(STAGES)
    return tuple(STAGES)


class Health(HealthServicer):  # type: ignore[misc]
    """grpcio-health-checking's servicer plus ``List`` (which it does not implement) and the stage details
    in the trailing metadata of ``Check`` and ``List`` (see the module docstring)."""

    def __init__(self, config: RuleConfig | None = None) -> None:
        super().__init__()
        self.config = config
        self.details: dict[str, str] = {}
        """Stage -> why it is refused or down, or its warnings (``RemoteStages.details``)."""

    def _trailers(self, stages: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
        details = dict(self.details)
        return tuple((DETAILS_PREFIX + s, _metadata_text(details[s])) for s in stages if s in details)

    async def Check(self, request: Any, context: Any) -> Any:
        """The name's status (grpcio's), with the details of the stages it depends on as trailing metadata."""
        context.set_trailing_metadata(self._trailers(name_stages(request.service, self.config)))
        return await super().Check(request, context)

    async def List(self, request: Any, context: Any) -> Any:
        """Every name the server reports, with its status (every stage's details as trailing metadata)."""
        del request
        context.set_trailing_metadata(self._trailers(tuple(STAGES)))
        statuses = {name: health_pb2.HealthCheckResponse(status=s) for name, s in self._server_status.items()}
        return health_pb2.HealthListResponse(statuses=statuses)


async def set_all(health: Health, statuses: dict[str, int]) -> None:
    """Set every name's status."""
    for name, status in statuses.items():
        await health.set(name, status)


async def watch_health(stages: Any, health: Health, interval_s: float, config: RuleConfig) -> None:
    """Poll every stage's ``/readyz`` and keep every health name current (see the module docstring).

    A poll that raises (a bug, or an error ``stages.ready`` does not expect) counts that stage as down and is
    logged, and polling goes on: health never stays SERVING because the poller stopped. The task ends only
    when cancelled; ``serve`` treats any other end as fatal."""
    last: dict[str, bool] | None = None
    failing: set[str] = set()

    async def poll(stage: str) -> bool:
        try:
            ok = bool(await stages.ready(stage))
        except asyncio.CancelledError:
            raise
        except Exception:
            if stage not in failing:  # once per failure spell, not every interval
                log.exception("health: polling the %s stage failed; counted as down", stage)
            failing.add(stage)
            return False
        failing.discard(stage)
        return ok

    while True:
        states = await asyncio.gather(*(poll(s) for s in STAGES))
        up = dict(zip(STAGES, states, strict=True))
        details = getattr(stages, "details", None)
        if callable(details):
            health.details = details()
        if up != last:
            await set_all(health, health_statuses(up, config))
            down = [s for s in STAGES if not up[s]]
            now = not down
            log.info("health: %s%s", "SERVING" if now else "NOT_SERVING",
                     f" (waiting for {', '.join(down)})" if down else "")  # fmt: skip
            for stage in down:  # why, as the health details say it
                if stage in health.details:
                    log.info("health: the %s is %s", stage, health.details[stage])
            last = up
        await asyncio.sleep(interval_s)


def _register_v1_descriptor() -> None:
    """Add ``grpc/reflection/v1/reflection.proto`` to the default pool (the v1alpha file renamed)."""
    from google.protobuf import descriptor_pb2, descriptor_pool
    from grpc_reflection.v1alpha import reflection_pb2

    pool = descriptor_pool.Default()
    try:
        pool.FindFileByName(_V1_FILE)
        return
    except KeyError:
        pass
    fdp = descriptor_pb2.FileDescriptorProto()
    reflection_pb2.DESCRIPTOR.CopyToProto(fdp)
    old, new = ".grpc.reflection.v1alpha.", ".grpc.reflection.v1."
    fdp.name, fdp.package = _V1_FILE, "grpc.reflection.v1"
    fdp.ClearField("options")
    for message in fdp.message_type:
        for field in message.field:
            if field.type_name:
                field.type_name = field.type_name.replace(old, new)
    for service in fdp.service:
        for method in service.method:
            method.input_type = method.input_type.replace(old, new)
            method.output_type = method.output_type.replace(old, new)
    pool.AddSerializedFile(fdp.SerializeToString())


def enable_reflection(server: grpc.aio.Server, services: Iterable[str]) -> None:
    """Serve reflection v1 and v1alpha for ``services`` (and the reflection services themselves)."""
    from grpc_reflection.v1alpha import reflection_pb2
    from grpc_reflection.v1alpha._async import ReflectionServicer

    _register_v1_descriptor()
    servicer = ReflectionServicer((*services, REFLECTION_V1, REFLECTION_V1ALPHA))
    handler = {
        "ServerReflectionInfo": grpc.stream_stream_rpc_method_handler(
            servicer.ServerReflectionInfo,
            request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
            response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
        )
    }
    for name in (REFLECTION_V1, REFLECTION_V1ALPHA):
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name, handler),))
        server.add_registered_method_handlers(name, handler)
