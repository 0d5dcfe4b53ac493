"""The BentoML stage services as real processes: health, readiness, info, metrics, conformance."""

from __future__ import annotations

import base64
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

from negt2i.cli import main
from negt2i.conformance import run_checks
from negt2i.core.config import CURRENT, stage_rules
from tests.imagefiles import bomb_png, encoded
from tests.services.live import REPO, Proc, free_port

pytestmark = pytest.mark.xdist_group("services")


@pytest.mark.parametrize("stage", ["detector", "segmenter", "attributes", "depth"])
def test_health_info_and_metrics(stage_procs: dict[str, Proc], stage: str):
    url = stage_procs[stage].url
    assert httpx.get(f"{url}/livez", trust_env=False).status_code == 200
    assert httpx.get(f"{url}/readyz", trust_env=False).status_code == 200
    info = httpx.get(f"{url}/info", trust_env=False).json()
    assert info["contract"] == "negt2i.v1" and info["ready"] is True
    rules = stage_rules(CURRENT, stage)
    point = {"operating_point": {"prediction_floor": 0.005, "suppression": "none"}} if stage == "detector" else {}
    assert info["model"] == {
        "stage": stage, "backend": "synthetic", "model": "synthetic-palette-v1",
        "library": info["model"]["library"], "device": "cpu", "dtype": "float32", **point,
        **({"rules": rules} if rules else {}),
    }  # fmt: skip
    assert int(info["limits"]["max_request_bytes"]) == 8 << 20
    metrics = httpx.get(f"{url}/metrics", trust_env=False).text
    assert "# TYPE" in metrics and "bentoml_service" in metrics
    assert f'service_name="{stage}"' in metrics and all(  # each service reports its own metrics only
        f'service_name="{other}"' not in metrics
        for other in ("detector", "segmenter", "attributes", "depth")
        if other != stage
    )


@pytest.mark.parametrize("stage", ["detector", "segmenter", "attributes", "depth"])
def test_conformance_passes_on_our_services(stage_procs: dict[str, Proc], stage: str, capsys):
    assert main(["conformance", stage, stage_procs[stage].url]) == 0
    out = capsys.readouterr().out
    assert "FAIL" not in out and "the service conforms" in out
    assert "same results as JSON" in out  # our services list the binary body type, and it is checked


def test_request_limits_and_errors(stage_procs: dict[str, Proc]):
    url = f"{stage_procs['detector'].url}/detect"
    assert httpx.post(url, content=b"x" * ((8 << 20) + 1), trust_env=False).status_code == 413
    assert (
        httpx.post(url, json={"items": [{"image": {"data": 5}}]}, trust_env=False).json()[0]["error"]["status"] == 400
    )
    assert httpx.post(url, json={"wrong": []}, trust_env=False).status_code == 400


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (bomb_png(), "image is 40000 x 40000 = 1600000000 pixels, above the limit of 16777216"),
        (encoded(np.zeros((8, 8, 3), np.uint8), "TIFF"), "not a PNG, JPEG or WebP image (the file is TIFF)"),
    ],
)
def test_bad_images_are_item_errors_400(stage_procs: dict[str, Proc], data: bytes, needle: str):
    """The stage services decode with the one decoder: a bomb or another format fails its item (400) only."""
    good = {"image": {"data": base64.b64encode(encoded(np.full((16, 16, 3), 250, np.uint8), "PNG")).decode()}}
    bad = {"image": {"data": base64.b64encode(data).decode()}}
    results = httpx.post(
        f"{stage_procs['detector'].url}/detect", json={"items": [good, bad]}, trust_env=False, timeout=30
    ).json()
    assert "error" not in results[0]
    assert results[1]["error"]["status"] == 400 and needle in results[1]["error"]["message"]
    assert results[1]["error"]["field"] == "image"


@pytest.fixture
def broken_stage(tmp_path: Path):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tests.services.fake_stage", "broken", str(port)], cwd=REPO,
                            start_new_session=True)  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                httpx.get(f"{url}/livez", trust_env=False, timeout=1)
                break
            except httpx.HTTPError:
                import time

                time.sleep(0.1)
        yield url
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_conformance_fails_on_a_broken_service(broken_stage: str, capsys):
    assert main(["conformance", "detector", broken_stage]) == 1
    out = capsys.readouterr().out
    assert "[FAIL] GET /info" in out and "contract 'v0'" in out
    assert "[FAIL] POST /detect: one valid item" in out and "JSON array" in out
    checks = {c.name: c for c in run_checks("detector", broken_stage)}
    assert not checks["GET /metrics"].passed
    assert not checks["POST /detect: a bad item fails alone (400)"].passed
    assert checks["GET /readyz"].passed


def test_conformance_reports_an_unreachable_service(capsys):
    assert main(["conformance", "depth", f"http://127.0.0.1:{free_port()}", "--timeout", "2"]) == 1
    assert "nothing answered" in capsys.readouterr().err


def _status(url: str) -> int:
    try:
        return httpx.get(url, trust_env=False, timeout=2).status_code
    except httpx.HTTPError:
        return 0


def test_ready_only_after_the_model_is_loaded_and_dead_when_it_cannot_load(live_tmp: Path):
    import time

    from tests.services.live import start_stage, wait_ready

    env = {"NEGT2I_BACKEND_MODULES": "tests.services.slow_backend", "NEGT2I_TEST_LOAD_S": "6"}
    slow = start_stage("detector", live_tmp, backend="slow-synthetic", env=env)
    failing = start_stage("detector", live_tmp, backend="failing", env=env)
    try:
        end = time.monotonic() + 60
        while time.monotonic() < end and _status(f"{slow.url}/livez") != 200:
            time.sleep(0.1)
        assert _status(f"{slow.url}/livez") == 200, slow.tail()
        assert _status(f"{slow.url}/readyz") == 503  # up, but the model is still loading
        assert _status(f"{slow.url}/info") == 503
        assert httpx.post(f"{slow.url}/detect", json={"items": []}, trust_env=False).status_code == 503
        wait_ready(slow, timeout=60)
        assert httpx.get(f"{slow.url}/info", trust_env=False).json()["ready"] is True
        while time.monotonic() < end and _status(f"{failing.url}/livez") != 503:
            time.sleep(0.1)
        assert _status(f"{failing.url}/livez") == 503 and _status(f"{failing.url}/readyz") == 503
        assert "weights not found" in failing.tail(200)
    finally:
        slow.kill()
        failing.kill()
