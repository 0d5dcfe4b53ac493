"""``negt2i conformance`` can fail: one faulty detector service per contract violation (real processes on
127.0.0.1, written from the contract alone) is caught by the check that names the rule; the correct one passes."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from negt2i.cli import main
from negt2i.conformance import run_checks
from negt2i.stages.synthetic import SceneObject, render_scene
from negt2i.wire import adapter
from tests.services.faulty_detector import FAULTS
from tests.services.live import REPO, free_port

CAUGHT_BY = {
    "mask-size": "one valid item",
    "unicorn": "one valid item",
    "capitalised": "one valid item",
    "below-floor": "one valid item",
    "normalised-boxes": "one valid item",
    "box-off-image": "one valid item",
    "no-411": "no Content-Length (411)",
    "no-413": "oversized body (413)",
    "unknown-fields": "unknown field",
    "ready-early": "readiness",
    "info-contract": "GET /info",
    "info-stage": "GET /info",
    "no-operating-point": "GET /info",
    "wrong-digest": "one valid item",
}
"""The check that must fail for each fault (a substring of its name)."""

RULE_IN_DETAIL = {
    "unicorn": "[class-vocabulary]",
    "capitalised": "[class-vocabulary]",
    "below-floor": "[score-range]",
    "normalised-boxes": "[box-covers-mask]",
    "box-off-image": "[box-inside-image]",
    "mask-size": "mask",
}


@pytest.fixture(scope="module")
def fakes() -> Iterator[dict[str, str]]:
    """One process per fault plus the correct service (fault ""), started at once."""
    procs: dict[str, tuple[subprocess.Popen[bytes], int]] = {}
    try:
        for fault in ["", *FAULTS]:
            port = free_port()
            cmd = [sys.executable, "-m", "tests.services.faulty_detector", str(port)] + (
                ["--fault", fault] if fault else []
            )
            procs[fault] = (subprocess.Popen(cmd, cwd=REPO, start_new_session=True), port)
        urls = {fault: f"http://127.0.0.1:{port}" for fault, (_, port) in procs.items()}
        for fault, url in urls.items():
            end = time.monotonic() + 30
            while True:
                try:
                    if httpx.get(f"{url}/livez", timeout=1.0, trust_env=False).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert procs[fault][0].poll() is None and time.monotonic() < end, f"fake {fault!r} did not start"
                time.sleep(0.05)
        yield urls
    finally:
        for proc, _ in procs.values():
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture(scope="module")
def photo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("photos") / "street.png"
    path.write_bytes(adapter.encode_png(render_scene([SceneObject("dog", (10, 10, 50, 40))], (48, 64))))
    return path


def test_the_correct_service_passes(fakes: dict[str, str], photo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["conformance", "detector", fakes[""], "--image", str(photo), "--expect", "dog"]
    assert main(args) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    assert "photo street.png" in out and "--expect dog" in out and "the service conforms" in out


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_each_violation_is_caught(fakes: dict[str, str], photo: Path, fault: str) -> None:
    # a missing operating point is refused only with strict stages on (docs/stage-contract.md, "Compatibility
    # within v1"); without, GET /info passes with the warning
    strict = fault == "no-operating-point"
    if strict:
        loose = {c.name: c for c in run_checks("detector", fakes[fault], timeout=10, strict=False)}
        assert loose["GET /info"].passed and "WARNING: it states no operating point" in loose["GET /info"].detail
    checks = run_checks("detector", fakes[fault], images=[photo], expect=["dog"], timeout=10, strict=strict)
    failed = {c.name: c.detail for c in checks if not c.passed}
    hits = {name: detail for name, detail in failed.items() if CAUGHT_BY[fault] in name}
    assert hits, f"{fault} ({FAULTS[fault]}) passed every check; failed only: {failed}"
    if fault in RULE_IN_DETAIL:
        assert any(RULE_IN_DETAIL[fault] in d for d in hits.values()), hits


def test_expect_fails_when_the_class_is_not_found(fakes: dict[str, str], photo: Path) -> None:
    checks = run_checks("detector", fakes[""], images=[photo], expect=["giraffe"], timeout=10)
    assert [c.name for c in checks if not c.passed] == ["--expect giraffe"]


def test_expect_needs_an_image(fakes: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["conformance", "detector", fakes[""], "--expect", "dog"]) == 2
    assert "--expect needs at least one --image" in capsys.readouterr().err
