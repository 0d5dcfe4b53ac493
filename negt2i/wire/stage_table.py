"""The one stage table of the wire contract: each stage's route, item and result messages, and probe item.

Read by the stage handler (routes, message types, the warm-up item), the conformance
checks (routes, result types, probe items) and the orchestrator's remote stages
(routes, result types), so a stage is described once (``docs/stage-contract.md``).
The in-process side of each stage (its protocol and backend method) is
``negt2i.stages.base``; ``method`` names it here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
from google.protobuf.message import Message
from numpy.typing import NDArray

from negt2i.core.stage_types import STAGES
from negt2i.wire import adapter
from negt2i.wire.v1 import stages_pb2

Probe = Callable[[bytes, NDArray[np.bool_], NDArray[np.float32], Sequence[str]], Message]
"""``probe(image bytes, masks (K, H, W), boxes (K, 4), class names (K))`` -> a valid item for that image."""


@dataclass(frozen=True)
class StageSpec:
    """One stage on the wire."""

    name: str
    """``detector``, ``segmenter``, ``attributes`` or ``depth``."""
    route: str
    """The POST route (``/<route>``)."""
    item: type[Message]
    result: type[Message]
    probe: Probe
    """A valid item for an image (warm-up, conformance)."""
    request: type[Message]
    """The binary body of the route (``application/x-protobuf``): ``repeated <item> items = 1``."""
    response: type[Message]
    """The binary answer of the route: ``repeated <result> results = 1``."""

    def request_of(self, items: Sequence[Message]) -> Message:
        """The route's binary body (``request``) holding ``items``."""
        make: Callable[..., Message] = self.request  # generated messages take their fields as keywords
        return make(items=items)

    def failed_result(self, error: Message) -> Message:
        """A ``result`` message that carries only ``error`` (an ``ItemError``): one item that failed."""
        make: Callable[..., Message] = self.result
        return make(error=error)


def _detect_probe(png: bytes, masks: Any, boxes: Any, names: Sequence[str]) -> Message:
    return stages_pb2.DetectItem(image=adapter.image_to_proto(png))


def _segment_probe(png: bytes, masks: Any, boxes: Any, names: Sequence[str]) -> Message:
    return adapter.segment_item(png, np.asarray(boxes, np.float32), np.asarray(masks, bool))


def _attributes_probe(png: bytes, masks: Any, boxes: Any, names: Sequence[str]) -> Message:
    return adapter.attributes_item(png, np.asarray(masks, bool), list(names), ["red", "blue", "gray"])


def _depth_probe(png: bytes, masks: Any, boxes: Any, names: Sequence[str]) -> Message:
    return stages_pb2.DepthItem(image=adapter.image_to_proto(png))


STAGE_TABLE: Final[dict[str, StageSpec]] = {
    s.name: s
    for s in (
        StageSpec(
            "detector",
            "detect",
            stages_pb2.DetectItem,
            stages_pb2.DetectResult,
            _detect_probe,
            stages_pb2.DetectRequest,
            stages_pb2.DetectResponse,
        ),
        StageSpec(
            "segmenter",
            "segment",
            stages_pb2.SegmentItem,
            stages_pb2.SegmentResult,
            _segment_probe,
            stages_pb2.SegmentRequest,
            stages_pb2.SegmentResponse,
        ),
        StageSpec(
            "attributes",
            "attributes",
            stages_pb2.AttributesItem,
            stages_pb2.AttributesResult,
            _attributes_probe,
            stages_pb2.AttributesRequest,
            stages_pb2.AttributesResponse,
        ),
        StageSpec(
            "depth",
            "depth",
            stages_pb2.DepthItem,
            stages_pb2.DepthResult,
            _depth_probe,
            stages_pb2.DepthRequest,
            stages_pb2.DepthResponse,
        ),
    )
}
"""Stage name -> ``StageSpec``, in ``STAGES`` order."""

assert tuple(STAGE_TABLE) == STAGES


def spec(stage: str) -> StageSpec:
    """The stage's ``StageSpec``; the error lists the stages."""
    try:
        return STAGE_TABLE[stage]
    except KeyError:
        raise ValueError(f"unknown stage {stage!r}; stages: {', '.join(STAGES)}") from None
