"""The Node.js client (clients/node: @grpc/grpc-js + @grpc/proto-loader over the published protos, no Python)
against a real orchestrator: health and GetServiceInfo, verdict parity with ``negt2i submit`` and the Python
client over the demo folder, error details readable from Node, and the stream's semantics (every item answered
once, matched by request_id, through the server's flow-control window)."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import json_format
from google.rpc import error_details_pb2  # noqa: F401 - ErrorInfo / BadRequest for json_format's Any
from grpc_status import rpc_status

from negt2i.cli import main
from negt2i.client import ClientError, EvaluatorClient, make_request
from negt2i.core.spec import parse_prompt
from negt2i.stages.synthetic import SceneObject, render_scene
from negt2i.wire import adapter
from negt2i.wire.v1 import evaluator_pb2
from tests.clients.conftest import NODE_CLIENT, STAGES, STREAM_WINDOW, NodeClient, _started
from tests.services.live import REPO, Proc, free_port, start_orchestrator

pytestmark = pytest.mark.xdist_group("clients")


def _jobs(folder: Path) -> list[tuple[str, Path, dict[str, Any]]]:
    """(filename, image path, prompt record) of every image of a GenEval-layout folder, in job order."""
    out = []
    for meta in sorted(folder.glob("*/metadata.jsonl")):
        record = json.loads(meta.read_text().splitlines()[0])
        for image in sorted((meta.parent / "samples").glob("*.png")):
            out.append((str(image.relative_to(folder)), image, record))
    return out


def _stream(node_client: NodeClient, *args: str) -> tuple[int, dict[str, dict[str, Any]], dict[str, Any]]:
    """Run ``stream``: (window grant, answers by request_id, summary); fails on a request_id answered twice."""
    rc, lines = node_client.run("stream", *args)
    assert rc == 0, lines
    first, *items, last = lines
    answers = {item["request_id"]: item for item in items}
    assert len(answers) == len(items), "a request_id answered more than once"
    return first["window"], answers, last["summary"]


def _set(value: Any) -> Any:
    """A value the Node client printed without its unset messages (null there, left out by MessageToDict)."""
    if isinstance(value, dict):
        return {k: _set(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_set(v) for v in value]
    return value


def _enum(prefix: str, value: str | None) -> str:
    """A results-file spelling ("negated_violated", None) as the proto enum name the Node client prints."""
    return f"{prefix}_{(value or 'unspecified').upper()}"


def test_health_and_service_info_match_the_python_client(node_client: NodeClient, clients_orchestrator: Proc):
    assert node_client.run("health") == (0, ["SERVING"])
    rc, [unknown] = node_client.run("health", "no.such.Service")
    assert rc == 1 and unknown["error"]["code_name"] == "NOT_FOUND"
    rc, [info] = node_client.run("info")
    assert rc == 0
    with EvaluatorClient(clients_orchestrator.target) as client:
        want = json_format.MessageToDict(
            client.info(), preserving_proto_field_name=True, always_print_fields_with_no_presence=True
        )
    assert info.pop("rules") == json.loads(want["rules_json"])
    assert _set(info) == want  # every field read from the published protos alone, 64-bit integers as strings
    assert info["limits"]["max_in_flight_per_stream"] == STREAM_WINDOW and info["corpus_prompts"] == 12
    rc, [vocabulary] = node_client.run("vocabulary")
    assert rc == 0 and vocabulary == want["vocabulary"] and len(vocabulary["classes"]) == 80
    for name in [*(f"stage/{s}" for s in STAGES), *(f"category/{c['name']}" for c in vocabulary["categories"])]:
        assert node_client.run("health", f"negt2i.v1.Evaluator/{name}") == (0, ["SERVING"]), name


def test_verdicts_match_negt2i_submit_and_the_python_client(
    node_client: NodeClient, clients_orchestrator: Proc, demo_folder: Path, tmp_path: Path
):
    target = clients_orchestrator.target
    out = tmp_path / "submitted.jsonl"
    assert main(["submit", str(demo_folder), "--orchestrator", target, "--out", str(out), "--no-progress"]) == 0
    rows = {r["filename"]: r for r in map(json.loads, out.read_text().splitlines())}
    window, answers, summary = _stream(node_client, str(demo_folder))
    assert window == STREAM_WINDOW and summary["sent"] == summary["verdicts"] == 48 and summary["errors"] == 0
    assert summary["max_in_flight"] == STREAM_WINDOW
    assert set(answers) == set(rows) and len(rows) == 48

    for name, row in rows.items():  # what a Node user reads, against negt2i submit's results file
        v = answers[name]["verdict"]
        assert row["status"] == "ok"
        assert (v["prompt_id"], v["prompt"], v["setting"], v["correct"], v["reason"]) == (
            row["prompt_id"], row["prompt"], row["setting"], row["correct"], row["reason"]
        )  # fmt: skip
        assert v["category"] == _enum("CATEGORY", row["category"])
        assert v["failure_class"] == _enum("ROW_FAILURE", row["failure_class"])
        assert v["config"] == row["config"] and v["evaluator_version"] == row["evaluator_version"]
        for o, want in zip(v["objects"], row["objects"], strict=True):
            assert (o["index"], o["class_name"], o["requested"], o["present"], o["counted"], o["kept"]) == (
                want["index"], want["class"], want["requested"], want["present"], want["counted"], want["kept"]
            )  # fmt: skip
            assert (o["over_count"], o["under_count"], o["fallback"], o["detections"]) == (
                want["over_count"], want["under_count"], want["fallback"], want["detections"]
            )  # fmt: skip
            assert o.get("top_score") == want["top_score"] and o["measurements"] == want["measurements"]
        for s, want in zip(v["statements"], row["statements"], strict=True):
            assert (s["index"], s["kind"], s["text"], s["requested"], s["evaluated"], s["passed"], s["dead_zone"]) == (
                want["index"], want["kind"], want["text"], want["requested"], want["evaluated"], want["passed"],
                want["dead_zone"],
            )  # fmt: skip
            assert s["polarity"] == _enum("POLARITY", want["polarity"])
            assert s["cause"] == _enum("FAILURE_CAUSE", want["cause"])
            assert (s["fired"]["values"] if s["fired"] is not None else None) == want["fired"]
            assert s["measurements"] == want["measurements"]
    correct = sum(a["verdict"]["correct"] for a in answers.values())
    assert 0 < correct < 48  # the demo has both outcomes, so agreement is not vacuous
    assert {a["verdict"]["statements"][0]["cause"] for a in answers.values()} >= {
        "FAILURE_CAUSE_UNSPECIFIED", "FAILURE_CAUSE_NEGATED_VIOLATED", "FAILURE_CAUSE_UNDETECTED_OBJECT"
    }  # fmt: skip

    # the whole Verdict message, field for field, against the Python client's over the same requests
    jobs = _jobs(demo_folder)
    requests = [make_request(p.read_bytes(), prompt=parse_prompt(r), request_id=n) for n, p, r in jobs]
    with EvaluatorClient(target) as client:
        python = {resp.request_id: resp.result.verdict for resp in client.stream(requests)}
    for name, verdict in python.items():
        got = json_format.ParseDict(answers[name]["verdict"], evaluator_pb2.Verdict(), ignore_unknown_fields=True)
        assert got == verdict, name


def test_errors_reach_node_as_status_and_details(
    node_client: NodeClient, clients_orchestrator: Proc, demo_folder: Path, tmp_path: Path
):
    image = demo_folder / "00000" / "samples" / "0000.png"
    meta = demo_folder / "00000" / "metadata.jsonl"
    record = json.loads(meta.read_text().splitlines()[0])
    unicorn = tmp_path / "unicorn.json"
    unicorn.write_text(json.dumps({**record, "include": [{"class": "unicorn"}]}))
    not_an_image = tmp_path / "notes.png"
    not_an_image.write_bytes(b"these are notes, not an image")
    prompt = parse_prompt(record)
    python_unicorn = make_request(image.read_bytes(), prompt=prompt, request_id="x")
    python_unicorn.prompt.objects[0].class_name = "unicorn"
    cases = [
        (["evaluate", str(image), "--metadata", str(unicorn)], python_unicorn,
         "INVALID_ARGUMENT", "INVALID_PROMPT", "prompt.objects[0].class_name"),
        (["evaluate", str(not_an_image), "--metadata", str(meta)],
         make_request(not_an_image.read_bytes(), prompt=prompt, request_id="x"),
         "INVALID_ARGUMENT", "UNREADABLE_IMAGE", "image.data"),
        (["evaluate", str(image), "--prompt-id", "no-such-prompt"],
         make_request(image.read_bytes(), prompt_id="no-such-prompt", request_id="x"),
         "NOT_FOUND", "UNKNOWN_PROMPT_ID", "prompt_id"),
    ]  # fmt: skip
    with EvaluatorClient(clients_orchestrator.target) as client:
        for args, python_request, code, reason, field in cases:
            rc, [out] = node_client.run(*args)
            assert rc == 1, out
            err = out["error"]  # google.rpc.Status from the grpc-status-details-bin trailer, decoded in Node
            assert (err["code_name"], err["reason"], err["field"], err["stage"]) == (code, reason, field, "request")
            assert err["metadata"]["kind"] in {"invalid_metadata", "unreadable_image", "missing_metadata"}
            assert err["message"].startswith(f"{field}: ")
            assert "object at 0x" not in err["message"] and "String should" not in err["message"]
            types = [d["@type"].split("/")[-1] for d in err["details"]]
            assert types == ["google.rpc.ErrorInfo", *(["google.rpc.BadRequest"] if code == "INVALID_ARGUMENT" else [])]
            with pytest.raises(grpc.RpcError) as exc:  # the same request from Python: the same google.rpc.Status
                client.stub.Evaluate(python_request, timeout=30)
            status = rpc_status.from_call(exc.value)
            assert status is not None and exc.value.code().name == code
            want = json_format.MessageToDict(
                status, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
            )
            assert _set({k: err[k] for k in ("code", "message", "details")}) == want

    # the same image by prompt id: the corpus's copy of the prompt gives the verdict of the inline one
    rc, [by_id] = node_client.run("evaluate", str(image), "--prompt-id", record["id"])
    rc2, [inline] = node_client.run("evaluate", str(image), "--metadata", str(meta))
    assert rc == rc2 == 0
    for key in ("correct", "reason", "statements", "objects"):
        assert by_id["verdict"][key] == inline["verdict"][key]


def test_stream_items_fail_alone_and_every_item_is_answered_once(
    node_client: NodeClient, demo_folder: Path, tmp_path: Path
):
    jobs = _jobs(demo_folder)[:12]
    not_an_image = tmp_path / "notes.png"
    not_an_image.write_bytes(b"these are notes, not an image")
    lines = [{"request_id": n, "image": str(p), "metadata": r} for n, p, r in jobs]
    name, image, record = jobs[0]
    bad = [
        {"request_id": "bad-image", "image": str(not_an_image), "metadata": record},
        {"request_id": "bad-class", "image": str(image), "metadata": {**record, "include": [{"class": "unicorn"}]}},
        {"request_id": "bad-id", "image": str(image), "prompt_id": "no-such-prompt"},
        {"request_id": "by-id", "image": str(image), "prompt_id": record["id"]},
    ]
    manifest = tmp_path / "requests.jsonl"
    manifest.write_text("".join(json.dumps(x) + "\n" for x in [*lines[:5], *bad, *lines[5:]]))
    window, answers, summary = _stream(node_client, str(manifest))
    assert window == STREAM_WINDOW and summary["max_in_flight"] == STREAM_WINDOW
    assert set(answers) == {x["request_id"] for x in [*lines, *bad]}
    assert summary["verdicts"] == 13 and summary["errors"] == 3
    errors = {rid: answers[rid]["error"] for rid in ("bad-image", "bad-class", "bad-id")}
    assert {rid: (e["code_name"], e["reason"], e["field"], e["kind"]) for rid, e in errors.items()} == {
        "bad-image": ("INVALID_ARGUMENT", "UNREADABLE_IMAGE", "image.data", "FAILURE_KIND_UNREADABLE_IMAGE"),
        "bad-class": ("INVALID_ARGUMENT", "INVALID_PROMPT", "prompt.objects[0].class_name",
                      "FAILURE_KIND_INVALID_METADATA"),
        "bad-id": ("NOT_FOUND", "UNKNOWN_PROMPT_ID", "prompt_id", "FAILURE_KIND_MISSING_METADATA"),
    }  # fmt: skip
    for e in errors.values():  # ItemError.status: the google.rpc.Status a unary call carries in its trailer
        assert (e["status"]["code"], e["status"]["message"]) == (e["code"], e["message"])
        bad_request = [d for d in e["status"]["details"] if d["@type"].endswith("/google.rpc.BadRequest")]
        assert [v["field"] for d in bad_request for v in d["field_violations"]] == (
            [e["field"]] if e["code_name"] == "INVALID_ARGUMENT" else []
        )
    assert "unknown class 'unicorn'" in errors["bad-class"]["message"]
    assert answers["by-id"]["verdict"]["correct"] == answers[name]["verdict"]["correct"]


def test_many_items_through_the_window(node_client: NodeClient, demo_folder: Path):
    """192 items through the server's window of 8 and through a client window of 3: each answered once, a
    copy's verdict the same as the first copy's."""
    window, answers, summary = _stream(node_client, str(demo_folder), "--repeat", "4")
    assert window == STREAM_WINDOW and summary["max_in_flight"] == STREAM_WINDOW
    assert summary["sent"] == summary["verdicts"] == len(answers) == 192 and summary["errors"] == 0
    names = {rid.split("#")[0] for rid in answers}
    assert len(names) == 48 and set(answers) == {f"{n}#{k}" for n in names for k in range(4)}
    for rid, answer in answers.items():
        assert answer["verdict"] == answers[rid.split("#")[0] + "#0"]["verdict"]
    window, answers, summary = _stream(node_client, str(demo_folder), "--window", "3")
    assert window == STREAM_WINDOW and summary["max_in_flight"] == 3 and len(answers) == 48


def test_the_quickstart_example_runs(node_bin: str, clients_orchestrator: Proc, demo_folder: Path):
    """clients/node/examples/quickstart.js, the Node.js example of docs/api.md, as printed there."""
    proc = subprocess.run(
        [node_bin, str(NODE_CLIENT / "examples" / "quickstart.js"), clients_orchestrator.target, str(demo_folder)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    jobs = _jobs(demo_folder)
    requests = [make_request(p.read_bytes(), prompt=parse_prompt(r), request_id=n) for n, p, r in jobs]
    with EvaluatorClient(clients_orchestrator.target) as client:
        verdicts = {resp.request_id: resp.result.verdict for resp in client.stream(requests)}
    first = verdicts["00000/samples/0000.png"]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("negt2i.v1: orchestrator ")
    assert lines[1] == f"one: correct={str(first.correct).lower()} reason={json.dumps(first.reason)}"
    assert [line for line in lines if line.startswith("bad: ")] == [
        "bad: INVALID_ARGUMENT (UNREADABLE_IMAGE) at image.data: image.data: not a PNG, JPEG or WebP image"
    ]
    assert f"window: {STREAM_WINDOW}" in lines
    assert lines[-1] == f"stream: {sum(v.correct for v in verdicts.values())}/48 correct"


def test_prompt_records_map_to_the_same_prompt_as_the_python_client(
    node_client: NodeClient, clients_orchestrator: Proc, demo_folder: Path, tmp_path: Path
):
    """docs/api.md's record -> PromptSpec table as the Node client applies it: setting and exclude as fields,
    count and polarity left to their documented defaults, GenEval's color entries, unknown keys in
    extra_json; the verdicts are the Python client's, and a setting that disagrees is refused by field."""
    image = demo_folder / "00000" / "samples" / "0000.png"
    record = json.loads((demo_folder / "00000" / "metadata.jsonl").read_text().splitlines()[0])
    cls, value = record["include"][0]["class"], record["statements"][0]["value"]
    records = {
        "fields": {**record, "setting": "pos0_neg1", "exclude": [{"class": cls, "count": 2}], "note": "kept"},
        "geneval": {"id": "00000", "tag": "color_attr", "prompt": f"a photo of a {value} {cls}",
                    "include": [{"class": cls, "count": 1, "color": value}]},
        "no-polarity": {**record, "statements": [{k: v for k, v in record["statements"][0].items()
                                                  if k != "polarity"}]},
        "bad-setting": {**record, "setting": "pos1_neg0"},
    }  # fmt: skip
    manifest = tmp_path / "records.jsonl"
    manifest.write_text("".join(json.dumps({"request_id": k, "image": str(image), "metadata": r}) + "\n"
                                for k, r in records.items()))  # fmt: skip
    _window, answers, _summary = _stream(node_client, str(manifest))
    error = answers.pop("bad-setting")["error"]
    assert (error["code_name"], error["field"]) == ("INVALID_ARGUMENT", "prompt.setting")
    requests = [make_request(image.read_bytes(), prompt=parse_prompt(records[k]), request_id=k) for k in answers]
    with EvaluatorClient(clients_orchestrator.target) as client:
        python = {resp.request_id: resp for resp in client.stream(requests)}
    for key, answer in answers.items():
        got = json_format.ParseDict(answer["verdict"], evaluator_pb2.Verdict(), ignore_unknown_fields=True)
        assert python[key].WhichOneof("outcome") == "result" and got == python[key].result.verdict, key
    assert answers["geneval"]["verdict"]["category"] == "CATEGORY_COLOR"
    assert answers["geneval"]["verdict"]["statements"][0]["polarity"] == "POLARITY_POSITIVE"
    assert answers["no-polarity"]["verdict"]["setting"] == "pos1_neg0"


def test_the_node_example_of_the_guide_runs(node_bin: str, clients_orchestrator: Proc, tmp_path: Path):
    """docs/api.md's Node.js example, as written (target, image and include root swapped in), with the
    client's installed packages: the verdict the Python client gets for the same image and prompt."""
    text = (REPO / "docs" / "api.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^```js\n(.*?)^```$", text.split("### Node.js", 1)[1], re.MULTILINE | re.DOTALL)
    assert blocks, "docs/api.md has no Node.js example"
    image = tmp_path / "dog.png"
    scene = [SceneObject("horse", (2, 10, 28, 40)), SceneObject("dog", (36, 44, 60, 60), "ellipse")]
    image.write_bytes(adapter.encode_png(render_scene(scene, (64, 64))))
    code = blocks[0].replace("127.0.0.1:50051", clients_orchestrator.target)
    code = code.replace('"dog.png"', json.dumps(str(image)))
    code = code.replace('includeDirs: ["protos"]', f"includeDirs: [{json.dumps(str(REPO / 'protos'))}]")
    script = tmp_path / "example.js"
    script.write_text(code)
    env = {**os.environ, "NODE_PATH": str(NODE_CLIENT / "node_modules")}
    proc = subprocess.run([node_bin, str(script)], capture_output=True, text=True, timeout=60, env=env, check=False)
    assert proc.returncode == 0 and not proc.stderr, proc.stderr
    record = {"id": "depth-x", "category": "depth", "prompt": "a photo of a dog not behind a horse",
              "include": [{"class": "dog"}, {"class": "horse"}],
              "statements": [{"kind": "relation", "subject": 0, "target": 1, "predicate": "behind",
                              "polarity": "negated"}]}  # fmt: skip
    with EvaluatorClient(clients_orchestrator.target) as client:
        verdict = client.evaluate(image.read_bytes(), prompt=parse_prompt(record)).verdict
    statement = verdict.statements[0]
    want = f"{str(verdict.correct).lower()} {str(statement.passed).lower()} {statement.measurements['rule']}"
    assert proc.stdout.strip() == want


def test_request_ids_are_checked_on_the_stream(node_client: NodeClient, demo_folder: Path, tmp_path: Path):
    """docs/api.md's request_id rules, seen from Node: an empty or over-long id is refused, a second send of an
    id still in flight is refused while the first is judged, every refusal names its reason."""
    _, image, record = next(j for j in _jobs(demo_folder) if j[2]["category"] == "depth")  # the slowest kind
    sends = [("same", record), ("same", record), ("", record), ("x" * 300, record), ("after", record)]
    manifest = tmp_path / "ids.jsonl"
    manifest.write_text("".join(json.dumps({"request_id": rid, "image": str(image), "metadata": r}) + "\n"
                                for rid, r in sends))  # fmt: skip
    rc, lines = node_client.run("stream", str(manifest))
    assert rc == 0 and lines[-1]["summary"]["sent"] == 5
    answers: dict[str, list[dict[str, Any]]] = {}
    for line in lines[1:-1]:
        answers.setdefault(line["request_id"], []).append(line)
    assert sorted(answers) == ["", "after", "same", "x" * 256]
    same = sorted(answers["same"], key=lambda a: "error" in a)
    assert "verdict" in same[0] and same[1]["error"]["reason"] == "DUPLICATE_REQUEST_ID"
    assert same[1]["error"]["code_name"] == "INVALID_ARGUMENT" and same[1]["error"]["field"] == "request_id"
    for rid in ("", "x" * 256):
        [answer] = answers[rid]
        assert (answer["error"]["code_name"], answer["error"]["reason"]) == ("INVALID_ARGUMENT", "INVALID_REQUEST_ID")
    assert answers["after"][0]["verdict"] == same[0]["verdict"]


def test_health_per_category_with_a_stage_down(
    node_bin: str, clients_stages: dict[str, Proc], clients_tmp: Path, demo_folder: Path
):
    """An orchestrator whose depth stage is unreachable: from Node, the overall status and category/depth are
    NOT_SERVING, the other categories SERVING and judged; a depth prompt is UNAVAILABLE naming the stage."""
    urls = {stage: proc.url for stage, proc in clients_stages.items()}
    urls["depth"] = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    env = {"NEGT2I_RETRIES": "0"}

    def color_serving(proc: Proc) -> None:
        end = time.monotonic() + 60
        with EvaluatorClient(proc.target) as client:
            while time.monotonic() < end:
                assert proc.alive(), proc.tail()
                with contextlib.suppress(ClientError, grpc.RpcError):
                    if client.health("negt2i.v1.Evaluator/category/color", timeout=2.0) == "SERVING":
                        return
                time.sleep(0.1)
        raise AssertionError(f"category/color never SERVING:\n{proc.tail()}")

    orch = _started(functools.partial(start_orchestrator, urls, clients_tmp, env=env), color_serving)
    try:
        node = NodeClient(node_bin, orch.target)
        health = {name: node.run("health", f"negt2i.v1.Evaluator{name}")[1][0]
                  for name in ("", "/stage/depth", "/stage/detector", "/category/depth", "/category/color",
                               "/category/proximity")}  # fmt: skip
        assert health == {"": "NOT_SERVING", "/stage/depth": "NOT_SERVING", "/stage/detector": "SERVING",
                          "/category/depth": "NOT_SERVING", "/category/color": "SERVING",
                          "/category/proximity": "SERVING"}  # fmt: skip
        images = {r["category"]: p for _, p, r in _jobs(demo_folder)}
        for category in ("color", "proximity"):
            image = images[category]
            rc, [out] = node.run("evaluate", str(image), "--metadata", str(image.parents[1] / "metadata.jsonl"))
            assert rc == 0 and out["verdict"]["category"] == f"CATEGORY_{category.upper()}"
        # depth prompts: those whose objects are all there need the depth map and are UNAVAILABLE (naming the
        # stage); one with an object missing is judged without it
        outcomes = []
        for _, image, record in _jobs(demo_folder):
            if record["category"] == "depth":
                rc, [out] = node.run("evaluate", str(image), "--metadata", str(image.parents[1] / "metadata.jsonl"))
                if rc == 0:
                    assert not out["verdict"]["statements"][0]["evaluated"]
                outcomes.append("ok" if rc == 0 else (out["error"]["code_name"], out["error"]["reason"],
                                                      out["error"]["stage"]))  # fmt: skip
        assert ("UNAVAILABLE", "STAGE_UNAVAILABLE", "depth") in outcomes
        assert set(outcomes) <= {"ok", ("UNAVAILABLE", "STAGE_UNAVAILABLE", "depth")}
    finally:
        orch.kill()
