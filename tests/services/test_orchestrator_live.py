"""The orchestrator as a real process in front of the real stage services: parity with ``negt2i evaluate``,
health, the status codes, limits, streams, and a stage killed during a stream."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from negt2i.cli import main
from negt2i.client import AsyncEvaluatorClient, ClientError, EvaluatorClient, make_request
from negt2i.core.images import ImageError, load_image
from negt2i.core.spec import parse_prompt
from negt2i.stages.demo_data import prompt_records, scene_for, write_demo
from negt2i.stages.synthetic import SceneObject, render_scene
from negt2i.wire import adapter
from negt2i.wire.v1 import evaluator_pb2
from tests.imagefiles import bomb_png, encoded, exif_rotated_jpeg
from tests.services.live import (
    REPO,
    Proc,
    free_port,
    start_orchestrator,
    start_stage,
    wait_health,
    wait_log,
    wait_ready,
)

pytestmark = pytest.mark.xdist_group("services")

DEPTH = {
    "id": "depth-x",
    "category": "depth",
    "prompt": "a photo of a dog not behind a horse",
    "include": [{"class": "dog"}, {"class": "horse"}],
    "statements": [{"kind": "relation", "subject": 0, "target": 1, "predicate": "behind", "polarity": "negated"}],
}


def _png(objs: list[SceneObject], hw: tuple[int, int] = (64, 64)) -> bytes:
    return adapter.encode_png(render_scene(objs, hw))


DOG_HORSE = _png([SceneObject("horse", (2, 10, 28, 40)), SceneObject("dog", (36, 44, 60, 60), "ellipse")])


def _rows(path: Path) -> dict[str, dict]:
    rows = {}
    for line in path.read_text().splitlines():
        r = json.loads(line)
        r.pop("services", None)
        rows[r["filename"]] = r
    return rows


@pytest.fixture(scope="session")
def demo(live_tmp: Path) -> Path:
    """24 prompts x 2 images over all categories, plus unreadable files (one a decompression bomb) and bad
    metadata."""
    root = live_tmp / "demo"
    write_demo(root, prompts=24, samples=2, seed=7)
    (root / "00000" / "samples" / "0002.png").write_bytes(b"")  # empty
    (root / "00001" / "samples" / "0002.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")  # corrupt
    (root / "00002" / "samples" / "0002.png").write_bytes(bomb_png())  # declares 40000 x 40000 pixels
    bad = root / "00099" / "samples"
    bad.mkdir(parents=True)
    (bad / "0000.png").write_bytes(DOG_HORSE)  # no metadata.jsonl
    bad_meta = root / "00100"
    (bad_meta / "samples").mkdir(parents=True)
    (bad_meta / "samples" / "0000.png").write_bytes(DOG_HORSE)
    (bad_meta / "metadata.jsonl").write_text(json.dumps({**DEPTH, "include": [{"class": "unicorn"}]}) + "\n")
    return root


@pytest.fixture(scope="session")
def embedded(demo: Path, live_tmp: Path) -> Path:
    out = live_tmp / "embedded.jsonl"
    assert main(["evaluate", str(demo), "--out", str(out), "--backend", "synthetic", "--no-progress"]) == 0
    return out


def test_parity_with_negt2i_evaluate(orchestrator: Proc, demo: Path, embedded: Path, tmp_path: Path, capsys):
    out = tmp_path / "submitted.jsonl"
    assert main(["submit", str(demo), "--orchestrator", orchestrator.target, "--out", str(out), "--no-progress"]) == 0
    got, want = out.read_text().splitlines(), embedded.read_text().splitlines()
    assert len(got) == len(want) == 53
    for g, w in zip(got, want, strict=True):  # same lines, same order; submit adds only "services"
        g_rec = json.loads(g)
        services = g_rec.pop("services", None)
        assert g_rec == json.loads(w)
        if g_rec["status"] == "ok":
            assert set(services) >= {"detector"} and all(u.startswith("http://127.0.0.1:") for u in services.values())
    rows = _rows(out)
    kinds = sorted(r["error"].split(":")[0] for r in rows.values() if r["status"] == "error")
    assert kinds == ["invalid_metadata", "missing_metadata", "unreadable_image", "unreadable_image", "unreadable_image"]
    assert "above the limit of 16777216" in rows["00002/samples/0002.png"]["error"]
    assert {r["category"] for r in rows.values() if r["status"] == "ok"} == {
        "color", "material", "directional", "proximity", "comparative", "depth"
    }  # fmt: skip
    assert 0 < sum(bool(r["correct"]) for r in rows.values()) < 48  # null on lines without a prompt
    # the continuous score travels too (the line comparison above holds it equal): partial credit exists
    scores = [(r["score"], r["correct"]) for r in rows.values() if r["status"] == "ok"]
    assert all((s == 1.0) is ok for s, ok in scores) and any(0 < s < 1 for s, _ in scores)
    # a rerun resumes: nothing left to do
    assert main(["submit", str(demo), "--orchestrator", orchestrator.target, "--out", str(out), "--no-progress"]) == 0
    assert "0 images evaluated (53 already done" in capsys.readouterr().out
    assert len(out.read_text().splitlines()) == 53


def test_service_info_names_every_stage_model(orchestrator: Proc, stage_procs: dict[str, Proc]):
    with EvaluatorClient(orchestrator.target) as client:
        info = client.info()
        assert client.health() == "SERVING" and client.health("") == "SERVING"
    assert info.api_version == "negt2i.v1" and info.rules_name == "current"
    assert [(s.stage, s.url, s.model.backend) for s in info.stages] == [
        (stage, stage_procs[stage].url, "synthetic") for stage in ("detector", "segmenter", "attributes", "depth")
    ]
    assert json.loads(info.rules_json)["digest"] == info.rules_digest
    assert info.limits.max_message_bytes == 4 << 20 and info.limits.max_image_bytes == 2 << 20


def test_the_vocabulary_is_published(orchestrator: Proc):
    from negt2i.core import vocab

    with EvaluatorClient(orchestrator.target) as client:
        info = client.info()
        answer = client.stub.GetVocabulary(evaluator_pb2.GetVocabularyRequest(), timeout=30, metadata=client.metadata)
    assert answer == info.vocabulary == adapter.vocabulary_to_proto()
    assert list(answer.classes) == list(vocab.COCO_CLASSES) and "computer mouse" in answer.classes
    by_name = {c.name: c for c in answer.categories}
    assert list(by_name) == [c.value for c in vocab.Category]
    assert list(by_name["material"].values) == ["wooden", "metal", "plastic", "glass"]
    assert list(by_name["depth"].predicates) == ["in front of", "behind"] and by_name["depth"].dead_zone
    assert "gray" in by_name["color"].answers and "gray" not in by_name["color"].values
    assert len(answer.settings) == 8 and "case-sensitive" in answer.case_rule


def test_reflection_lists_the_services(orchestrator: Proc):
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

    with grpc.insecure_channel(orchestrator.target) as channel:
        db = ProtoReflectionDescriptorDatabase(channel)
        names = set(db.get_services())
        assert {"negt2i.v1.Evaluator", "grpc.health.v1.Health"} <= names
        desc = db.FindFileContainingSymbol("negt2i.v1.Evaluator")
        assert desc.package == "negt2i.v1" and [m.name for m in desc.service[0].method] == [
            "Evaluate", "EvaluateStream", "GetServiceInfo", "GetVocabulary"
        ]  # fmt: skip


def test_unary_verdict_matches_the_embedded_pipeline(orchestrator: Proc):
    from negt2i.pipeline import Pipeline, Stages

    prompt = parse_prompt(DEPTH)
    with EvaluatorClient(orchestrator.target) as client:
        result = client.evaluate(DOG_HORSE, prompt=prompt, request_id="one", include_perception=True)
        assert client.evaluate(DOG_HORSE, prompt=prompt).perception is None  # only when asked for
    embedded = Pipeline(Stages.create(dict.fromkeys(("detector", "segmenter", "attributes", "depth"), "synthetic")))
    want = embedded.run_one(prompt, load_image_bytes(DOG_HORSE))
    assert want.verdict is not None
    assert result.request_id == "one" and result.verdict.to_json() == want.verdict.to_json()
    with EvaluatorClient(orchestrator.target) as client:  # the served verdict carries the score itself
        raw = client.stub.Evaluate(make_request(DOG_HORSE, prompt=prompt), timeout=30, metadata=client.metadata)
    assert raw.verdict.HasField("score") and raw.verdict.score == want.verdict.score
    assert [s.stage for s in result.stages] == ["detector", "segmenter", "depth"]  # only what the prompt needed
    assert result.perception is not None and want.perception is not None
    assert result.perception.detections.class_names == want.perception.detections.class_names
    assert result.perception.refined is not None and want.perception.refined is not None
    for k, mask in want.perception.refined.masks.items():
        assert (result.perception.refined[k] == mask).all()


def load_image_bytes(data: bytes):
    return adapter.decode_image(data)


def _unknown_class(req: evaluator_pb2.EvaluateRequest) -> None:
    req.prompt.objects[0].class_name = "unicorn"


def _wrong_case_class(req: evaluator_pb2.EvaluateRequest) -> None:
    req.prompt.objects[0].class_name = "Dog"


def _wrong_case_predicate(req: evaluator_pb2.EvaluateRequest) -> None:
    req.prompt.statements[0].relation.predicate = "In  Front of"


def _unknown_predicate(req: evaluator_pb2.EvaluateRequest) -> None:
    req.prompt.statements[0].relation.predicate = "beside"


def _bad_index(req: evaluator_pb2.EvaluateRequest) -> None:
    req.prompt.statements[0].relation.target = 7


@pytest.mark.parametrize(
    ("image", "mutate", "needle"),
    [
        (b"not a png", None, "image.data: not a PNG, JPEG or WebP image"),
        (b"", None, "image.data: empty image"),
        (bomb_png(), None, "image.data: image is 40000 x 40000 = 1600000000 pixels, above the limit"),
        (encoded(np.zeros((8, 8, 3), np.uint8), "TIFF"), None, "not a PNG, JPEG or WebP image (the file is TIFF)"),
        (DOG_HORSE, _unknown_class, "prompt.objects[0].class_name: unknown class 'unicorn'"),
        (DOG_HORSE, _wrong_case_class, "unknown class 'Dog' (not one of the 80 COCO classes; did you mean 'dog'?)"),
        (DOG_HORSE, _wrong_case_predicate, "unknown predicate 'In  Front of' for category depth; did you mean"),
        (DOG_HORSE, _unknown_predicate, "unknown predicate 'beside'"),
        (DOG_HORSE, _bad_index, "points at object 7"),
    ],
)
def test_invalid_argument_names_the_reason(orchestrator: Proc, image, mutate, needle):
    req = make_request(image or b"x", prompt=parse_prompt(DEPTH), request_id="r")
    req.image.data = image
    if mutate is not None:
        mutate(req)
    with EvaluatorClient(orchestrator.target) as client, pytest.raises(grpc.RpcError) as err:
        client.stub.Evaluate(req, timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert needle in err.value.details()


def test_missing_polarity_and_unknown_prompt_id(orchestrator: Proc):
    req = make_request(DOG_HORSE, prompt=parse_prompt(DEPTH), request_id="p")
    req.prompt.statements[0].polarity = evaluator_pb2.POLARITY_UNSPECIFIED
    with EvaluatorClient(orchestrator.target) as client:
        with pytest.raises(grpc.RpcError) as err:
            client.stub.Evaluate(req, timeout=30)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "statements[0].polarity" in err.value.details()
        with pytest.raises(ClientError) as cerr:
            client.evaluate(DOG_HORSE, prompt_id="no-such-prompt")
        assert cerr.value.code == "NOT_FOUND"


def test_size_limits_are_enforced(orchestrator: Proc):
    big_png = b"\x89PNG" + b"\0" * (3 << 20)  # under the 4 MiB message limit, over the 2 MiB image limit
    huge = b"\0" * (5 << 20)  # over the message limit
    with EvaluatorClient(orchestrator.target, max_message_bytes=64 << 20) as client:
        with pytest.raises(ClientError) as err:
            client.evaluate(big_png, prompt=parse_prompt(DEPTH))
        assert err.value.code == "INVALID_ARGUMENT" and "exceeds the limit" in err.value.details
        with pytest.raises(ClientError) as err:
            client.evaluate(huge, prompt=parse_prompt(DEPTH))
        assert err.value.code == "RESOURCE_EXHAUSTED"


def test_stream_answers_every_item_with_a_verdict_or_an_error(orchestrator: Proc):
    records = prompt_records(12, seed=3)
    import numpy as np

    from negt2i.stages.demo_data import scene_for

    rng = np.random.default_rng(0)
    reqs = [make_request(adapter.encode_png(scene_for(r, rng)), prompt=parse_prompt(r), request_id=f"ok{i}")
            for i, r in enumerate(records)]  # fmt: skip
    reqs.insert(5, make_request(b"garbage", prompt=parse_prompt(DEPTH), request_id="bad"))

    async def run() -> list[evaluator_pb2.EvaluateStreamResponse]:
        async with AsyncEvaluatorClient(orchestrator.target) as client:
            return [r async for r in client.stream(reqs)]

    responses = asyncio.run(run())
    by_id = {r.request_id: r for r in responses}
    assert sorted(by_id) == sorted(r.request_id for r in reqs)
    assert by_id["bad"].error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert by_id["bad"].error.field == "image.data"
    assert all(by_id[f"ok{i}"].HasField("result") for i in range(12))


def test_unavailable_stage_and_health(stage_urls: dict[str, str], live_tmp: Path):
    dead = f"http://127.0.0.1:{free_port()}"
    proc = start_orchestrator({**stage_urls, "depth": dead}, live_tmp,
                              env={"NEGT2I_RETRIES": "1", "NEGT2I_BACKOFF_S": "0.05"})  # fmt: skip
    try:
        assert wait_health(proc.target, "NOT_SERVING", timeout=30) == "NOT_SERVING"
        wait_log(proc, "NOT_SERVING (waiting for depth)")  # event: a health poll found depth down
        with EvaluatorClient(proc.target) as client:
            assert client.health() == "NOT_SERVING"  # the depth stage never answered /readyz
            assert client.health("") == "NOT_SERVING"  # overall: every stage up
            # per stage and per category (docs/api.md, "Health and discovery")
            for stage in ("detector", "segmenter", "attributes", "depth"):
                want = "NOT_SERVING" if stage == "depth" else "SERVING"
                assert client.health(f"negt2i.v1.Evaluator/stage/{stage}") == want
            for category in ("color", "material", "directional", "proximity", "comparative", "depth"):
                want = "NOT_SERVING" if category == "depth" else "SERVING"
                assert client.health(f"negt2i.v1.Evaluator/category/{category}") == want
            with pytest.raises(grpc.RpcError) as unknown:
                client.health("negt2i.v1.Evaluator/category/shape")
            assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
            listed = health_pb2_grpc.HealthStub(client.channel).List(health_pb2.HealthListRequest(), timeout=5)
            assert len(listed.statuses) == 12 and listed.statuses["negt2i.v1.Evaluator/category/color"].status == 1
            with pytest.raises(ClientError) as err:
                client.evaluate(DOG_HORSE, prompt=parse_prompt(DEPTH))
            # found down by the health poll: refused at once, nothing sent (issue 31: a down stage fails fast)
            assert err.value.code == "UNAVAILABLE" and err.value.details.startswith("depth: down: no answer at")
            assert (err.value.stage, err.value.reason) == ("depth", "STAGE_UNAVAILABLE")  # the rich error model
            assert "Error" not in err.value.details  # plain words, no exception class names
            # the SERVING categories' prompts are judged: color (detector + attributes) and every relation
            # category without depth (detector + segmenter)
            records = prompt_records(5, seed=5)  # color, material, directional, proximity, comparative
            assert [r["category"] for r in records] == ["color", "material", "directional", "proximity", "comparative"]
            for record in records:
                image = adapter.encode_png(scene_for(record, np.random.default_rng(1)))
                assert client.evaluate(image, prompt=parse_prompt(record)).verdict.prompt_id == record["id"]
    finally:
        proc.kill()


@pytest.fixture
def slow_detector(live_tmp: Path, tmp_path: Path):
    port = free_port()
    signal = tmp_path / "detector-called"
    proc = subprocess.Popen([sys.executable, "-m", "tests.services.fake_stage", "slow", str(port), "--delay", "3",
                             "--signal", str(signal)], cwd=REPO, start_new_session=True)  # fmt: skip
    try:
        yield f"http://127.0.0.1:{port}", signal
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_deadline_and_full_queue(stage_urls: dict[str, str], slow_detector: tuple[str, Path], live_tmp: Path):
    url, called = slow_detector
    env = {"NEGT2I_ITEM_TIMEOUT_S": "2", "NEGT2I_STAGE_CONCURRENCY": "1", "NEGT2I_STAGE_QUEUE": "0"}
    proc = start_orchestrator({**stage_urls, "detector": url}, live_tmp, env=env)
    try:
        assert wait_health(proc.target, "SERVING", timeout=30) == "SERVING"

        async def run() -> list[str]:
            async with AsyncEvaluatorClient(proc.target, attempts=1) as client:  # no client retries here

                async def one() -> str:
                    try:
                        await client.evaluate(DOG_HORSE, prompt=parse_prompt(DEPTH))
                    except ClientError as exc:
                        reasons.append((exc.code, exc.reason, exc.stage))  # the rich error model
                        return exc.code
                    return "OK"

                first = asyncio.ensure_future(one())
                while not called.exists():  # event: the first call reached the detector and holds its only slot
                    await asyncio.sleep(0.01)
                rest = await asyncio.gather(one(), one())
                return [await first, *rest]

        reasons: list[tuple[str, str, str]] = []
        codes = asyncio.run(run())  # no queue: the others are turned away; the first runs out of its 2 s
        assert sorted(codes) == ["DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "RESOURCE_EXHAUSTED"]
        assert sorted(reasons) == [("DEADLINE_EXCEEDED", "DEADLINE_EXCEEDED", "detector"),
                                   ("RESOURCE_EXHAUSTED", "STAGE_OVERLOADED", "detector"),
                                   ("RESOURCE_EXHAUSTED", "STAGE_OVERLOADED", "detector")]  # fmt: skip
    finally:
        proc.kill()


def test_stage_killed_during_a_stream_then_resumed(stage_urls: dict[str, str], live_tmp: Path, tmp_path: Path):
    """The segmenter dies mid-stream: its items are UNAVAILABLE and get no line, every line written is a
    complete verdict identical to the embedded one, and a rerun after the restart completes the rest."""
    demo = tmp_path / "many"
    write_demo(demo, prompts=30, samples=3, seed=11)
    embedded = tmp_path / "embedded.jsonl"
    assert main(["evaluate", str(demo), "--out", str(embedded), "--backend", "synthetic", "--no-progress"]) == 0
    seg = start_stage("segmenter", live_tmp)
    env = {"NEGT2I_RETRIES": "0", "NEGT2I_STREAM_WINDOW": "1"}
    orch = start_orchestrator({**stage_urls, "segmenter": seg.url}, live_tmp, env=env)
    out = tmp_path / "killed.jsonl"
    try:
        assert wait_health(orch.target, "SERVING", timeout=120) == "SERVING", seg.tail()
        # --attempts 1: no retry with backoff, so that the items the dead stage failed are left for the rerun
        cmd = [sys.executable, "-m", "negt2i", "submit", str(demo), "--orchestrator", orch.target, "--out", str(out),
               "--no-progress", "--attempts", "1"]  # fmt: skip
        submit = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        end = time.monotonic() + 60
        while time.monotonic() < end and (not out.exists() or len(out.read_text().splitlines()) < 6):
            time.sleep(0.02)
        seg.kill()
        stdout, stderr = submit.communicate(timeout=120)
        assert submit.returncode == 1, stdout + stderr
        assert "UNAVAILABLE" in stderr and "run the same command again" in stderr
        assert wait_health(orch.target, "NOT_SERVING", timeout=10) == "NOT_SERVING"
        first = out.read_text()
        assert first.endswith("\n")
        want = _rows(embedded)
        got = _rows(out)
        assert 6 <= len(got) < len(want)
        for name, row in got.items():
            assert row == want[name]  # nothing partial: every line is the embedded verdict
        # restart the segmenter on the same port and resume
        seg = start_stage("segmenter", live_tmp, port=seg.port)
        wait_ready(seg)
        assert wait_health(orch.target, "SERVING", timeout=30) == "SERVING"
        assert main(["submit", str(demo), "--orchestrator", orch.target, "--out", str(out), "--no-progress"]) == 0
        assert out.read_text().startswith(first)
        assert _rows(out) == want
    finally:
        orch.kill()
        seg.kill()


def test_generation_loop_example(orchestrator: Proc):
    cmd = [sys.executable, "-m", "orchestrator.examples.generation_loop", "--orchestrator", orchestrator.target,
           "--images", "6"]  # fmt: skip
    done = subprocess.run(cmd, check=False, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "6 images scored while generating" in done.stdout


def test_load_image_and_decode_image_agree(demo: Path):
    for path in sorted(demo.glob("0000[2-5]/samples/*.png")):
        try:
            pixels = load_image(path)
        except ImageError as exc:  # the bomb: the same reason either way
            with pytest.raises(adapter.WireError, match=re.escape(str(exc))):
                adapter.decode_image(path.read_bytes())
            continue
        assert (pixels == adapter.decode_image(path.read_bytes())).all()


DOG_LEFT_OF_COW = {
    "id": "directional-exif",
    "category": "directional",
    "prompt": "a photo of a dog left of a cow",
    "include": [{"class": "dog"}, {"class": "cow"}],
    "statements": [{"kind": "relation", "subject": 0, "target": 1, "predicate": "left of", "polarity": "positive"}],
}


def test_a_jpeg_rotated_by_exif_is_judged_upright_by_the_orchestrator_and_stages(orchestrator: Proc):
    """The orchestrator and the stage services decode the same bytes with the one decoder: boxes and masks
    are in the upright image's coordinates, so the verdict is the upright one."""
    upright = render_scene([SceneObject("dog", (4, 20, 24, 44)), SceneObject("cow", (40, 20, 60, 44))], (64, 96))
    with EvaluatorClient(orchestrator.target) as client:
        result = client.evaluate(exif_rotated_jpeg(upright), prompt=parse_prompt(DOG_LEFT_OF_COW))
    assert result.verdict.correct, result.verdict.reason


def test_submit_uses_the_one_results_writer(orchestrator: Proc, demo: Path, tmp_path: Path, capsys):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_bytes((REPO / "data" / "negt2ibench.jsonl").read_bytes())
    before = corpus.read_bytes()
    args = ["submit", str(demo), "--orchestrator", orchestrator.target, "--no-progress", "--limit", "4"]
    assert main([*args, "--out", str(corpus)]) == 2
    assert "is not a negt2i results file" in capsys.readouterr().err
    assert corpus.read_bytes() == before
    out = tmp_path / "r.jsonl"
    hold = (
        "import sys\nfrom negt2i.core.results import ResultsWriter\nw = ResultsWriter(sys.argv[1])\n"
        "print('locked', flush=True)\nsys.stdin.read()"
    )
    holder = subprocess.Popen([sys.executable, "-c", hold, str(out)], cwd=REPO, text=True, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE)  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        assert main([*args, "--out", str(out)]) == 2
        assert "is being written by another negt2i run" in capsys.readouterr().err
        assert out.read_bytes() == b""
    finally:
        holder.communicate("", timeout=30)
    assert main([*args, "--out", str(out)]) == 0
    assert "results file: 4 images: 3 judged, 1 error (unreadable_image 1)" in capsys.readouterr().out


def test_submit_save_perception_matches_evaluate(orchestrator: Proc, demo: Path, tmp_path: Path):
    """``--save-perception`` through the orchestrator stores exactly what the embedded run stores."""
    local = tmp_path / "embedded.jsonl"
    argv = [str(demo), "--out", str(local), "--backend", "synthetic", "--no-progress", "--save-perception"]
    assert main(["evaluate", *argv]) == 0
    out = tmp_path / "submitted.jsonl"
    side = tmp_path / "side.jsonl"
    target = orchestrator.target
    argv = [str(demo), "--orchestrator", target, "--out", str(out), "--no-progress", "--save-perception", str(side)]
    assert main(["submit", *argv]) == 0
    got = [json.loads(line) for line in side.read_text().splitlines()]
    want = [json.loads(line) for line in (tmp_path / "embedded.perception.jsonl").read_text().splitlines()]
    assert len(got) == len(want) == 48  # one per judged image; error lines have none
    assert got == want
    assert any(r["refined"] for r in got) and any(r["attributes"] for r in got)
