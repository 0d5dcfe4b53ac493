"""What a streaming run needs to know of the orchestrator: its rules, its models, the health names and
stages its jobs need (``negt2i submit``, ``negt2i generate --score``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

from negt2i.client import HEALTH_SERVICE
from negt2i.core.config import RuleConfig
from negt2i.core.failures import Code
from negt2i.run.jobs import Job
from negt2i.run.output import Served

if TYPE_CHECKING:
    from negt2i.wire.v1 import common_pb2, evaluator_pb2


def rules_from_info(info: evaluator_pb2.ServiceInfo) -> RuleConfig:
    """The orchestrator's rule config (``ServiceInfo.rules_json``), checked against its digest
    (``ClientError`` INTERNAL when they disagree)."""
    from negt2i.client import ClientError

    record = json.loads(info.rules_json) if info.rules_json else {}
    record.pop("digest", None)
    config = RuleConfig.model_validate(record)
    if info.rules_digest and config.digest() != info.rules_digest:
        raise ClientError(Code.INTERNAL, f"rule config digest mismatch ({config.digest()} != {info.rules_digest})")
    return config


def served(info: evaluator_pb2.ServiceInfo, stages: Sequence[common_pb2.StageService] | None = None) -> Served:
    """The rules, and the models and services of ``stages`` (default: every stage ``info`` lists) that the
    results lines of this orchestrator record."""
    from negt2i.wire import adapter

    known = list(info.stages if stages is None else stages)
    return Served(rules_from_info(info), adapter.models_record(known), adapter.services_record(known))


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
    """The stages a run of ``jobs`` may call (``negt2i.core.plan.category_stages``; every stage when a job names a
    corpus prompt by id)."""
    from negt2i.core.plan import category_stages
    from negt2i.core.stage_types import STAGES

    out: set[str] = set()
    for job in jobs:
        if job.error is not None:
            continue
        if job.prompt is None:
            return set(STAGES)
        out.update(category_stages(job.prompt.category, config))
    return out
