"""Compatibility within v1: a detector service written before the contract was made strict (no
``model.rules``, no ``operating_point``, no class filter, JSON only, no EXIF orientation, no
``model_digest``: ``tests/services/prestrict_detector.py``) keeps working against the real stack.

- strict stages off (the default): it is accepted, and judged exactly as ``negt2i evaluate`` judges in
  process (EXIF-rotated photos included: it is sent upright pixels, since it does not list
  ``image.exif_orientation``), with the warning that it states no rules and no operating point in the
  orchestrator's log, ``GetServiceInfo``, the health details, ``negt2i submit``'s stderr and every results line;
- strict stages on: it is refused, and ``negt2i submit``, ``GetServiceInfo`` and health say which stage and
  why within seconds (not "not SERVING after 60 s")."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image as PILImage

from negt2i.cli import main
from negt2i.client import EvaluatorClient
from negt2i.stages.synthetic import write_geneval_layout
from tests.services.live import REPO, Proc, free_port, start_orchestrator, wait_health, wait_log
from tests.stages.test_class_filter import PROMPTS, scene

pytestmark = pytest.mark.xdist_group("services")

ROTATED = 0
"""The image stored rotated with EXIF orientation 6 (shown upright by turning it 90 degrees clockwise)."""


def _rotated_png(upright: np.ndarray) -> bytes:
    """PNG bytes whose stored pixels are ``upright`` turned 90 degrees counter-clockwise, with EXIF
    orientation 6, so that a decoder applying the orientation gets ``upright`` back."""
    exif = PILImage.Exif()
    exif[0x0112] = 6
    buf = io.BytesIO()
    PILImage.fromarray(np.ascontiguousarray(np.rot90(upright, k=1))).save(buf, format="PNG", exif=exif.tobytes())
    return buf.getvalue()


@pytest.fixture(scope="module")
def demo(live_tmp: Path) -> tuple[Path, tuple[int, int]]:
    """A third of the class-filter scenes (every category x setting), the first one stored EXIF-rotated;
    returns the folder and that image's upright (H, W)."""
    rng = np.random.default_rng(28)
    root = live_tmp / "prestrict-demo"
    entries = [(p.to_json(), [scene(p, rng)]) for p in PROMPTS[::3]]
    upright = entries[ROTATED][1][0][:, 20:]  # not square: a rotation changes (H, W)
    entries[ROTATED] = (entries[ROTATED][0], [upright])
    paths = write_geneval_layout(root, entries)
    paths[ROTATED].write_bytes(_rotated_png(upright))
    return root, (int(upright.shape[0]), int(upright.shape[1]))


@pytest.fixture(scope="module")
def prestrict(live_tmp: Path) -> Iterator[tuple[str, Path]]:
    port, log = free_port(), live_tmp / "prestrict-detector.log"
    cmd = [sys.executable, "-m", "tests.services.prestrict_detector", str(port), "--log", str(log)]
    proc = subprocess.Popen(cmd, cwd=REPO, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        end = time.monotonic() + 60
        while True:  # until it answers /readyz
            try:
                if httpx.get(f"{url}/readyz", timeout=2.0, trust_env=False).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < end, "the pre-strict detector did not start"
            time.sleep(0.1)
        yield url, log
    finally:
        proc.kill()
        proc.wait(timeout=10)


def _verdicts(path: Path) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for r in rows:
        r.pop("services", None)
        r.pop("models", None)
    return rows


def test_a_prestrict_detector_is_accepted_with_warnings_and_judged_as_in_process(
    demo: tuple[Path, tuple[int, int]], prestrict: tuple[str, Path], stage_urls: dict[str, str], live_tmp: Path,
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
):  # fmt: skip
    root, upright_hw = demo
    url, log = prestrict
    embedded = tmp_path / "embedded.jsonl"
    assert main(["evaluate", str(root), "--out", str(embedded), "--backend", "synthetic", "--no-progress"]) == 0
    orch: Proc | None = None
    try:
        orch = start_orchestrator({**stage_urls, "detector": url}, live_tmp)
        assert wait_health(orch.target, "SERVING", timeout=60) == "SERVING", orch.tail()
        wait_log(orch, "detector at http://127.0.0.1")  # the /info validation log says it
        with EvaluatorClient(orch.target) as client:
            info = client.info()
            status, details = client.health_details()
        out = tmp_path / "submitted.jsonl"
        capsys.readouterr()
        assert main(["submit", str(root), "--orchestrator", orch.target, "--out", str(out), "--no-progress"]) == 0
        err = capsys.readouterr().err
        logged = orch.log.read_text()
    finally:
        if orch is not None:
            orch.kill()
    # the validation log, GetServiceInfo, health details and submit's stderr all carry the warnings
    assert "detector at " + url + " accepted with a warning: states no rule constants" in logged
    detector = next(s for s in info.stages if s.stage == "detector")
    assert detector.refused == ""
    assert [w.split(" (")[0] for w in detector.warnings] == ["states no rule constants", "states no operating point"]
    assert "assumed to apply this run's {detection.prediction_floor: 0.005}" in detector.warnings[0]
    assert all(not s.warnings for s in info.stages if s.stage != "detector")  # ours state everything
    assert status == "SERVING" and details["detector"].startswith("accepted with warnings: states no rule constants")
    assert "warning: the detector states no rule constants" in err
    # judged exactly as in process, the EXIF-rotated photo included
    got, want = _verdicts(out), _verdicts(embedded)
    assert len(got) == len(want) == len(PROMPTS[::3]) and all(r["status"] == "ok" for r in got)
    assert got == want
    # every results line's model info names the stage as it stated itself, with the warnings
    for line in (json.loads(x) for x in out.read_text().splitlines()):
        model = line["models"]["detector"]
        assert model["backend"] == "prestrict-palette" and model["rules"] == {} and model["operating_point"] is None
        assert model["warnings"] == list(detector.warnings)
        assert "warnings" not in line["models"]["segmenter"]
    sent = [json.loads(x) for x in log.read_text().splitlines()]
    assert all(s["fields"] == ["image"] for s in sent)  # never a field it does not know (no class filter)
    assert sorted(tuple(s["hw"]) for s in sent).count(upright_hw) >= 1  # it was sent the upright pixels
    assert all(tuple(s["hw"]) != upright_hw[::-1] for s in sent)  # never the rotated stored ones


def test_strict_stages_refuse_it_and_submit_says_why_within_seconds(
    demo: tuple[Path, tuple[int, int]], prestrict: tuple[str, Path], stage_urls: dict[str, str], live_tmp: Path,
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
):  # fmt: skip
    root, _ = demo
    url, _ = prestrict
    orch = start_orchestrator({**stage_urls, "detector": url}, live_tmp, env={"NEGT2I_STRICT_STAGES": "1"})
    try:
        wait_log(orch, "detector at " + url + " refused")
        wait_log(orch, "health: the detector is refused")  # health and its details follow at the poll's end
        with EvaluatorClient(orch.target) as client:
            info = client.info()
            status, details = client.health_details()
            category = client.health_details("negt2i.v1.Evaluator/category/color")
        capsys.readouterr()
        start = time.monotonic()
        rc = main(["submit", str(root), "--orchestrator", orch.target, "--out", str(tmp_path / "r.jsonl"),
                   "--no-progress"])  # fmt: skip
        took = time.monotonic() - start
        err = capsys.readouterr().err
    finally:
        orch.kill()
    refused = next(s for s in info.stages if s.stage == "detector").refused
    assert refused.startswith("it states no rule constants (ModelInfo.rules) and strict stages are on")
    assert status == "NOT_SERVING" and details["detector"] == "refused: " + refused
    assert category[0] == "NOT_SERVING" and category[1]["detector"] == "refused: " + refused
    assert set(details) == {"detector"}  # the other stages have nothing to say
    assert rc == 3 and took < 15, (rc, took, err)
    assert "refuses a stage this run needs: the detector is refused: it states no rule constants" in err
    assert "not SERVING after" not in err


def test_conformance_passes_it_with_warnings_and_strict_fails_one_check_without_cascading(
    prestrict: tuple[str, Path],
):
    from negt2i.conformance import run_checks

    url, _ = prestrict
    loose = run_checks("detector", url, timeout=10, strict=False)
    assert all(c.passed for c in loose), [c for c in loose if not c.passed]
    info = next(c for c in loose if c.name == "GET /info")
    assert (
        "WARNING: it states no rule constants" in info.detail and "WARNING: it states no operating point" in info.detail
    )
    strict = run_checks("detector", url, timeout=10, strict=True)
    failed = [c for c in strict if not c.passed]
    assert [c.name for c in failed] == ["GET /info"], failed  # readiness and the rest are not dragged down
    assert "would refuse it: it states no rule constants (ModelInfo.rules) and strict stages are on" in failed[0].detail
