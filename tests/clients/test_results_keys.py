"""docs/api.md, "The results line of a verdict", followed literally: results lines derived by hand from the
``Verdict`` messages the orchestrator answers (enum names, renamed and parsed keys, ``outcome``) equal the lines
``negt2i submit`` writes for the same images."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from negt2i.cli import main
from negt2i.client import EvaluatorClient, make_request
from negt2i.core.spec import parse_prompt
from negt2i.wire.v1 import common_pb2, evaluator_pb2
from tests.clients.test_go_client import pytestmark  # noqa: F401 - the "clients" xdist group
from tests.services.live import Proc


def _enum(value: int, enum: Any, prefix: str) -> str | None:
    name = enum.Name(value)
    return None if name.endswith("_UNSPECIFIED") else name.removeprefix(prefix).lower()


def _statement(s: evaluator_pb2.StatementVerdict) -> dict[str, Any]:
    fired = list(s.fired.values) if s.HasField("fired") else None
    outcome = None if fired is None else "holds" if s.requested in fired else "not" if fired else "dead_zone"
    return {
        "index": s.index, "kind": s.kind, "polarity": _enum(s.polarity, evaluator_pb2.Polarity, "POLARITY_"),
        "text": s.text, "objects": list(s.objects), "requested": s.requested, "evaluated": s.evaluated,
        "fired": fired, "passed": s.passed, "cause": _enum(s.cause, evaluator_pb2.FailureCause, "FAILURE_CAUSE_"),
        "dead_zone": s.dead_zone, "measurements": json.loads(s.measurements_json), "outcome": outcome,
    }  # fmt: skip


def _model(service: common_pb2.StageService) -> dict[str, Any]:
    m = service.model
    op = None
    if m.HasField("operating_point"):
        p = m.operating_point
        op = {"prediction_floor": p.prediction_floor, "suppression": p.suppression, "input_size": p.input_size}
    out = {"stage": m.stage, "backend": m.backend, "model": m.model, "revision": m.revision, "sha256": m.sha256,
           "library": m.library, "device": m.device or "cpu", "dtype": m.dtype or "float32",
           "operating_point": op, "rules": dict(m.rules)}  # fmt: skip
    return {**out, **({"warnings": list(service.warnings)} if service.warnings else {})}


def derive(
    name: str, data: bytes, response: evaluator_pb2.EvaluateResponse, info: evaluator_pb2.ServiceInfo
) -> dict[str, Any]:
    """The results line of one verdict, by the table of docs/api.md."""
    v = response.verdict
    line: dict[str, Any] = {
        "negt2i": "results/1", "filename": name, "sample": int(Path(name).stem), "status": "ok",
        "sha256": hashlib.sha256(data).hexdigest(), "prompt_id": v.prompt_id, "tag": v.tag, "prompt": v.prompt,
        "category": _enum(v.category, evaluator_pb2.Category, "CATEGORY_"), "setting": v.setting,
        "correct": v.correct, "reason": v.reason,
        "failure_class": _enum(v.failure_class, evaluator_pb2.RowFailure, "ROW_FAILURE_"),
        "objects": [
            {"index": o.index, "class": o.class_name, "requested": o.requested, "present": o.present,
             "counted": o.counted, "kept": o.kept, "fallback": o.fallback,
             "top_score": o.top_score if o.HasField("top_score") else None, "over_count": o.over_count,
             "under_count": o.under_count, "exempt": o.exempt, "detections": list(o.detections),
             "measurements": json.loads(o.measurements_json)}
            for o in v.objects
        ],
        "statements": [_statement(s) for s in v.statements],
        "config": json.loads(v.config_json), "evaluator_version": v.evaluator_version,
    }  # fmt: skip
    if v.probes:
        line["probes"] = [_statement(s) for s in v.probes]
    for key in ("source_id", "form"):
        if getattr(v, key):
            line[key] = getattr(v, key)
    assert v.HasField("score")  # this evaluator always sets it
    line["score"] = v.score
    details = {
        o.class_name: {"detections": list(o.detections), "counted": o.counted,
                       "top_score": o.top_score if o.HasField("top_score") else None}
        for o in v.objects
    }  # fmt: skip
    line["details"] = json.dumps(details, ensure_ascii=False)
    known = [s for s in info.stages if s.model.model]
    line["models"] = {**{s.stage: _model(s) for s in known}, **{s.stage: _model(s) for s in response.stages}}
    return line


def test_results_lines_derived_from_verdicts_as_documented(clients_orchestrator: Proc, demo_folder: Path,
                                                           tmp_path: Path):  # fmt: skip
    target = clients_orchestrator.target
    out = tmp_path / "submitted.jsonl"
    assert main(["submit", str(demo_folder), "--orchestrator", target, "--out", str(out), "--no-progress"]) == 0
    rows = {r["filename"]: r for r in map(json.loads, out.read_text().splitlines())}
    images: dict[str, bytes] = {}
    requests = []
    for meta in sorted(demo_folder.glob("*/metadata.jsonl")):
        record = json.loads(meta.read_text().splitlines()[0])
        for image in sorted((meta.parent / "samples").glob("*.png")):
            name = str(image.relative_to(demo_folder))
            images[name] = image.read_bytes()
            requests.append(make_request(images[name], prompt=parse_prompt(record), request_id=name))
    with EvaluatorClient(target) as client:
        responses = {r.request_id: r.result for r in client.stream(requests)}
        info = client.info()
    assert set(responses) == set(rows) and len(rows) == 48
    for name, row in rows.items():
        want = dict(row)
        assert want.pop("services") == {s.stage: s.url for s in responses[name].stages}  # the stages that served it
        assert json.loads(want.pop("metadata"))["id"] == row["prompt_id"]  # the prompt record, as JSON text
        got = derive(name, images[name], responses[name], info)
        assert list(got) == list(want) and got == want, name
