"""``negt2i generate --score`` interrupted (Ctrl-C) stops scoring at once, as ``negt2i submit`` does (the stream
submitter's one stop): the images in flight are left for the rerun, nothing goes on scoring behind the exit code,
the results file is closed, and the rerun scores exactly the rest. Its progress bar ends when the last image has
its answer ("in flight 0"), not when the last image is drawn. Against a slow stand-in orchestrator (one answer
every ``DELAY`` seconds, one at a time) and a generator that needs no model."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from negt2i.cli import main
from negt2i.core.results import ResultsWriter
from negt2i.core.spec import read_prompts
from negt2i.corpus import packaged_corpus
from negt2i.generate import ModelSpec, generate
from negt2i.generate import registry as gen_registry
from negt2i.generate.scoring import Scorer

pytest.importorskip("grpc_health")
from tests.services.standin import SlowStandIn

DELAY = 0.5
"""Seconds the stand-in takes per answer."""


@pytest.fixture
def standin() -> Iterator[SlowStandIn]:
    s = SlowStandIn(DELAY)
    yield s
    s.stop()


class Flat:
    """One flat image per seed; with ``interrupt_at``, Ctrl-C arrives during that call (1-based)."""

    def __init__(self, spec: ModelSpec, *, interrupt_at: int | None = None, **_: Any) -> None:
        self.spec, self.interrupt_at, self.calls = spec, interrupt_at, 0

    def info(self) -> dict[str, Any]:
        return {"pipeline": "Flat", "scheduler": None}

    def generate(self, prompts: Sequence[str], seeds: Sequence[int]) -> list[Image.Image]:
        self.calls += 1
        if self.calls == self.interrupt_at:
            raise KeyboardInterrupt
        return [Image.new("RGB", (self.spec.width, self.spec.height), (s % 256, 0, 0)) for s in seeds]


@pytest.fixture
def prompt_file(tmp_path: Path) -> Path:
    path = tmp_path / "prompts.jsonl"
    with packaged_corpus().open(encoding="utf-8") as corpus:
        path.write_text("".join(next(corpus) for _ in range(4)))  # 4 prompts x 4 seeds: 16 images
    return path


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _scoring_threads(before: set[threading.Thread]) -> list[str]:
    """The scorer's threads (its own, the stream submitter's) started since ``before`` and still alive."""
    now = set(threading.enumerate()) - before
    return sorted(t.name for t in now if t.name.startswith(("negt2i-score", "negt2i-stream")))


def test_ctrl_c_stops_scoring_at_once_and_the_rerun_scores_the_rest(
    standin: SlowStandIn, prompt_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
):
    runs = [3, None]  # Ctrl-C in the first run's third batch; the rerun is not interrupted
    monkeypatch.setitem(gen_registry._FACTORIES, "test-flat", lambda spec, **_: Flat(spec, interrupt_at=runs.pop(0)))
    out = tmp_path / "gen"
    results = out / "results.jsonl"
    args = ["generate", "--model", "m", "--steps", "1", "--resolution", "16x8", "--prompts", str(prompt_file),
            "--out", str(out), "--orchestrator", standin.target, "--in-flight", "4", "--batch-size", "2",
            "--no-progress", "--device", "cpu", "--generator", "test-flat"]  # fmt: skip
    before = set(threading.enumerate())
    start = time.monotonic()
    assert main(args) == 130  # Ctrl-C in the third batch
    assert time.monotonic() - start < 10
    assert "interrupted" in capsys.readouterr().err
    on_disk = sorted(p.relative_to(out).as_posix() for p in out.glob("*/samples/*.png"))
    assert len(on_disk) == 4  # two batches of two were drawn, each handed to the scorer
    scored = _lines(results)
    assert len(scored) < len(on_disk)  # the slow stand-in had not answered them all: the rest is left
    # nothing goes on scoring behind the exit code: no scoring thread left, the file stays as it is, closed
    assert not _scoring_threads(before), _scoring_threads(before)
    time.sleep(3 * DELAY)
    assert _lines(results) == scored
    ResultsWriter(results).close()  # the lock was released
    # the rerun generates the rest and scores every image that has no line, each exactly once
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "12 images generated" in printed and f"{16 - len(scored)} images evaluated" in printed
    lines = [json.loads(line) for line in _lines(results)]
    assert sorted(r["filename"] for r in lines) == sorted(p.relative_to(out).as_posix()
                                                          for p in out.glob("*/samples/*.png"))  # fmt: skip
    assert len(lines) == 16


def test_the_progress_ends_when_the_last_image_is_answered(standin: SlowStandIn, prompt_file: Path, tmp_path: Path):
    """generate() returns (and its bar ends) only once the scorer has answered every image it was handed; on a
    resume too, where the done images without a line are handed over before the first new one is drawn."""
    spec = ModelSpec("custom", "flat", "m", steps=1, width=16, height=8, dtype="float32", generator="test-flat")
    prompts = read_prompts(prompt_file)[:2]
    out = tmp_path / "gen"
    generate(spec, prompts, out, seeds=(1, 2), limit=1, generator=Flat(spec), progress=False)  # 2 done, no lines
    scorer = Scorer(standin.target, out / "results.jsonl", in_flight=3)
    try:
        summary = generate(spec, prompts, out, seeds=(1, 2), generator=Flat(spec), scorer=scorer, batch_size=2,
                           progress=False)  # fmt: skip
        assert (summary.generated, summary.skipped) == (2, 2)
        assert scorer.pending() == 0 and scorer.status() == "scored 4, in flight 0"  # before close waits
    finally:
        outcome = scorer.close()
    assert outcome.summary.evaluated == 4 and not outcome.retry
