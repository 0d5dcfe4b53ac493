"""negt2i generate --orchestrator: a tiny random-weight diffusers pipeline generates, a real orchestrator
process (synthetic stages) scores while it generates; negt2i evaluate on the folder agrees."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from negt2i.cli import main
from negt2i.core.spec import dumps_prompt, read_prompts
from tests.generate.tiny import build_pipeline
from tests.services.live import REPO, Proc, free_port, start_orchestrator, wait_health

pytestmark = pytest.mark.xdist_group("services")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_pipeline(tmp_path_factory.mktemp("tiny") / "pipe")


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _by_file(path: Path) -> dict[str, dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    by = {r["filename"]: r for r in rows}
    assert len(by) == len(rows), "one line per image"
    return by


def test_generate_scores_while_generating_and_evaluate_agrees(orchestrator: Proc, tiny: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]):  # fmt: skip
    corpus = read_prompts(REPO / "data" / "negt2ibench.jsonl")
    picked = [corpus[0], corpus[1700], corpus[4000]]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(dumps_prompt(p) + "\n" for p in picked))
    out = tmp_path / "gen"
    cmd = ["generate", "--model", str(tiny), "--steps", "2", "--resolution", "32", "--guidance", "7.5",
           "--prompts", str(prompts), "--seeds", "42,43", "--out", str(out), "--orchestrator", orchestrator.target,
           "--in-flight", "2", "--batch-size", "2", "--device", "cpu", "--no-progress"]  # fmt: skip
    assert main(cmd) == 0
    printed = capsys.readouterr().out
    assert "6 images generated" in printed and "6 images evaluated" in printed
    results = out / "results.jsonl"
    live = _by_file(results)
    assert sorted(live) == [f"0000{i}/samples/000{k}.png" for i in range(3) for k in range(2)]
    assert all(r["status"] == "ok" and r["services"] for r in live.values())
    assert {r["prompt_id"] for r in live.values()} == {p.id for p in picked}
    # Scored afterwards, in-process: the same verdicts.
    embedded = tmp_path / "embedded.jsonl"
    assert main(["evaluate", str(out), "--out", str(embedded), "--backend", "synthetic", "--no-progress"]) == 0
    afterwards = _by_file(embedded)
    assert afterwards.keys() == live.keys()
    for name, row in live.items():
        assert {k: v for k, v in row.items() if k != "services"} == afterwards[name], name
    capsys.readouterr()
    # A rerun: nothing to generate, nothing to score.
    assert main(cmd) == 0
    printed = capsys.readouterr().out
    assert "0 images generated" in printed and "0 images evaluated (6 already done" in printed
    # Results lost for two images (e.g. the orchestrator went away): a rerun scores exactly those.
    lines = results.read_text().splitlines()
    results.write_text("\n".join(lines[:4]) + "\n")
    assert main(cmd) == 0
    printed = capsys.readouterr().out
    assert "0 images generated" in printed and "2 images evaluated (4 already done" in printed
    assert _by_file(results) == live


def test_at_most_in_flight_images_are_unanswered(orchestrator: Proc, tiny: Path, tmp_path: Path):
    from negt2i.generate import ModelSpec, generate
    from negt2i.generate.scoring import Scorer
    from negt2i.run.jobs import discover

    prompts = read_prompts(REPO / "data" / "negt2ibench.jsonl")[:3]
    spec = ModelSpec("custom", "tiny", str(tiny), steps=2, width=32, height=32, dtype="float32")
    out = tmp_path / "gen"
    generate(spec, prompts, out, seeds=(42, 43), batch_size=3, device="cpu", progress=False)
    for bound in (1, 3):
        scorer = Scorer(orchestrator.target, tmp_path / f"results-{bound}.jsonl", in_flight=bound)
        scorer.start()  # generate() starts it itself; here the scorer is used on its own
        for job in discover(out):
            scorer.submit(job, job.path.read_bytes())
        outcome = scorer.close()
        assert outcome.summary.evaluated == 6 and not outcome.retry and outcome.stream_error is None
        assert 1 <= scorer.max_in_flight <= bound
        assert scorer.status() == "scored 6, in flight 0"
    # The bound was the limit, not the pace: with room for 3, more than one was in flight at once.
    assert scorer.max_in_flight > 1


def test_generation_waits_for_scoring_only_at_the_bound(stage_urls: dict[str, str], tiny: Path, tmp_path: Path,
                                                        live_tmp: Path):  # fmt: skip
    # A detector that answers after 2 s: with room for 3 in flight, three images are handed over at once
    # (the generator never waits), the fourth waits until an answer frees a slot.
    from negt2i.generate import ModelSpec, generate
    from negt2i.generate.scoring import Scorer
    from negt2i.run.jobs import discover

    delay = 2.0
    port = free_port()
    slow = subprocess.Popen([sys.executable, "-m", "tests.services.fake_stage", "slow", str(port), "--delay",
                             str(delay)], cwd=REPO, start_new_session=True)  # fmt: skip
    orch = start_orchestrator({**stage_urls, "detector": f"http://127.0.0.1:{port}"}, live_tmp)
    try:
        assert wait_health(orch.target, "SERVING", timeout=60) == "SERVING", orch.tail()
        prompts = read_prompts(REPO / "data" / "negt2ibench.jsonl")[:2]
        spec = ModelSpec("custom", "tiny", str(tiny), steps=1, width=32, height=32, dtype="float32")
        out = tmp_path / "gen"
        generate(spec, prompts, out, seeds=(42, 43), batch_size=4, device="cpu", progress=False)
        jobs = discover(out)
        scorer = Scorer(orch.target, tmp_path / "results.jsonl", in_flight=3)
        scorer.start()
        start = time.monotonic()
        for job in jobs[:3]:
            scorer.submit(job, job.path.read_bytes())
        handed_over = time.monotonic() - start
        scorer.submit(jobs[3], jobs[3].path.read_bytes())
        waited = time.monotonic() - start - handed_over
        outcome = scorer.close()
        assert handed_over < delay / 2 < waited, (handed_over, waited)
        assert outcome.summary.evaluated == 4 and not outcome.retry
        assert scorer.max_in_flight == 3
    finally:
        orch.kill()
        slow.kill()
        slow.wait(timeout=10)


def test_scoring_survives_an_orchestrator_restart(stage_urls: dict[str, str], tiny: Path, tmp_path: Path,
                                                  live_tmp: Path):  # fmt: skip
    # The orchestrator closes connections after ~5 min and pods restart: a long generation run must keep
    # scoring. The scorer reopens its stream, re-sends what was unanswered, and every image gets one line.
    from negt2i.generate import ModelSpec, generate
    from negt2i.generate.scoring import Scorer
    from negt2i.run.jobs import discover

    prompts = read_prompts(REPO / "data" / "negt2ibench.jsonl")[:3]
    spec = ModelSpec("custom", "tiny", str(tiny), steps=1, width=32, height=32, dtype="float32")
    out = tmp_path / "gen"
    generate(spec, prompts, out, seeds=(42, 43), batch_size=3, device="cpu", progress=False)
    jobs = discover(out)
    port = free_port()
    first = start_orchestrator(stage_urls, live_tmp, args=["--port", str(port)])
    second: Proc | None = None
    try:
        target = f"127.0.0.1:{port}"
        assert wait_health(target, "SERVING", timeout=60) == "SERVING", first.tail()
        scorer = Scorer(target, tmp_path / "results.jsonl", in_flight=2)
        scorer.start()
        for job in jobs[:2]:
            scorer.submit(job, job.path.read_bytes())
        first.kill()
        second = start_orchestrator(stage_urls, live_tmp, args=["--port", str(port)])
        for job in jobs[2:]:
            scorer.submit(job, job.path.read_bytes())
        outcome = scorer.close()
        assert outcome.stream_error is None and not outcome.retry, (outcome, second.tail())
        assert outcome.summary.evaluated == 6
        assert sorted(_by_file(tmp_path / "results.jsonl")) == sorted(job.filename for job in jobs)
    finally:
        first.kill()
        if second is not None:
            second.kill()
