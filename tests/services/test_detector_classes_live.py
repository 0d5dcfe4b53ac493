"""The detector's class filter through the real services: the orchestrator sends each prompt's classes and
the per-class cap to a detector that lists the feature, never to one that does not (a service of the
contract before it rejects unknown fields), and filters whatever comes back; an outside detector that
ignores the fields gives the same verdict lines and perception as ``negt2i evaluate``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from negt2i.cli import main
from negt2i.stages.synthetic import write_geneval_layout
from tests.services.live import REPO, Proc, free_port, start_orchestrator, wait_health
from tests.stages.test_class_filter import PROMPTS, scene

pytestmark = pytest.mark.xdist_group("services")


@pytest.fixture(scope="module")
def crowded(live_tmp: Path) -> Path:
    """One prompt per category x setting (every second one), each image with objects of other classes and
    sometimes a crowd of its own class above the per-class cap."""
    rng = np.random.default_rng(21)
    root = live_tmp / "crowded"
    write_geneval_layout(root, [(p.to_json(), [scene(p, rng)]) for p in PROMPTS[::2]])
    return root


def _lines(path: Path) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for r in rows:
        r.pop("services", None)
    return rows


def _run_outside(mode: str, tmp: Path) -> tuple[subprocess.Popen[bytes], str, Path]:
    port, log = free_port(), tmp / f"outside-{mode}.log"
    cmd = [sys.executable, "-m", "tests.services.outside_detector", mode, str(port), "--log", str(log)]
    proc = subprocess.Popen(cmd, cwd=REPO, start_new_session=True)
    return proc, f"http://127.0.0.1:{port}", log


@pytest.mark.parametrize("mode", ["old", "ignoring"])
def test_an_outside_detector_without_the_filter_gives_the_same_verdicts(
    mode: str, crowded: Path, stage_urls: dict[str, str], live_tmp: Path, tmp_path: Path
):
    embedded, embedded_side = tmp_path / "embedded.jsonl", tmp_path / "embedded.perception.jsonl"
    argv = [str(crowded), "--out", str(embedded), "--backend", "synthetic", "--no-progress", "--save-perception"]
    assert main(["evaluate", *argv]) == 0
    detector, url, log = _run_outside(mode, tmp_path)
    orch: Proc | None = None
    try:
        orch = start_orchestrator({**stage_urls, "detector": url}, live_tmp)
        assert wait_health(orch.target, "SERVING", timeout=60) == "SERVING", orch.tail()
        out, side = tmp_path / "submitted.jsonl", tmp_path / "side.jsonl"
        argv = [str(crowded), "--orchestrator", orch.target, "--out", str(out), "--no-progress", "--save-perception",
                str(side)]  # fmt: skip
        assert main(["submit", *argv]) == 0
    finally:
        if orch is not None:
            orch.kill()
        detector.kill()
        detector.wait(timeout=10)
    got, want = _lines(out), _lines(embedded)
    assert len(got) == len(want) == 27 and all(r["status"] == "ok" for r in got)
    assert got == want
    assert side.read_text().splitlines() == embedded_side.read_text().splitlines()
    sent = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(sent) == 27
    if mode == "old":
        assert all(fields == ["image"] for fields in sent)  # never a field the old service does not know
    else:
        assert all(fields == ["classes", "image", "max_per_class"] for fields in sent)
    # the filter mattered: other classes and crowds above the cap were in the images
    assert any(o["measurements"]["candidates"] > o["measurements"]["per_class_cap"] for r in got for o in r["objects"])


def test_the_synthetic_detector_service_gets_the_classes(orchestrator: Proc, crowded: Path, tmp_path: Path):
    """Through the session's real detector service (which lists the feature): the same lines as embedded."""
    embedded = tmp_path / "embedded.jsonl"
    assert main(["evaluate", str(crowded), "--out", str(embedded), "--backend", "synthetic", "--no-progress"]) == 0
    out = tmp_path / "submitted.jsonl"
    assert (
        main(["submit", str(crowded), "--orchestrator", orchestrator.target, "--out", str(out), "--no-progress"]) == 0
    )
    assert _lines(out) == _lines(embedded)
