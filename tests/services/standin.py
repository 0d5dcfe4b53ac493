"""A slow stand-in orchestrator: SERVING (the whole service and every category), a ``ServiceInfo`` with the
current rules, and each stream item answered after ``delay`` seconds, one at a time, with a final error (an
``invalid_metadata`` error line, so no model is needed). For tests of how a streaming run behaves around its
answers: ``negt2i generate --score`` interrupted, ``negt2i submit``'s closing lines."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

from negt2i.client import HEALTH_SERVICE
from negt2i.core.config import load_config
from negt2i.core.failures import Code, Failure, FailureKind
from negt2i.core.vocab import Category
from negt2i.wire import adapter
from negt2i.wire.stage_table import STAGE_TABLE
from negt2i.wire.v1 import common_pb2, evaluator_pb2
from tests.services.fault_proxy import serve_evaluator


class SlowStandIn:
    """See the module docstring; ``target`` is its address; ``stop()`` ends it."""

    def __init__(self, delay: float) -> None:
        config = load_config("current")
        stages = [common_pb2.StageService(stage=s, model=common_pb2.ModelInfo(stage=s, model=f"{s}-model"))
                  for s in STAGE_TABLE]  # fmt: skip
        self.info = evaluator_pb2.ServiceInfo(rules_json=json.dumps(config.record()), rules_digest=config.digest(),
                                              rules_name=config.name, stages=stages)  # fmt: skip
        self.delay = delay
        categories = [f"{HEALTH_SERVICE}/category/{c.value}" for c in Category]
        self.server, port = serve_evaluator(lambda req, ctx: self.info, self._stream, workers=4, serving=categories)
        self.target = f"127.0.0.1:{port}"

    def _stream(self, requests: Iterator[evaluator_pb2.EvaluateRequest], context: Any) -> Iterator[Any]:
        failure = Failure(FailureKind.INVALID_METADATA, "stand-in", code=Code.INVALID_ARGUMENT)
        error = adapter.failure_to_proto(failure)
        for request in requests:
            time.sleep(self.delay)
            if not context.is_active():  # the client went away
                return
            yield evaluator_pb2.EvaluateStreamResponse(request_id=request.request_id, error=error)

    def stop(self) -> None:
        self.server.stop(0)
