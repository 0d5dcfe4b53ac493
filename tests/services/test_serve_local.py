"""``scripts/serve_local.sh`` starts only the stages whose URL is not given: a swapped (external) detector is
used as it is, and the results name its model."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from negt2i.client import EvaluatorClient
from tests.services.live import REPO, base_env, free_port

pytestmark = pytest.mark.xdist_group("services")


def stage_port_base() -> int:
    """A NEGT2I_PORT_BASE whose stage ports (base+1..base+4) were all free a moment ago and are reserved for
    this test: on a shared machine other runs' services sit in the same range, and the script (rightly)
    refuses a busy port."""
    while True:
        ports = [free_port() for _ in range(4)]
        if ports == list(range(ports[0], ports[0] + 4)):
            return ports[0] - 1


def test_an_external_detector_is_not_started_but_used(tmp_path: Path) -> None:
    fake_port = free_port()
    fake = subprocess.Popen([sys.executable, "-m", "tests.services.faulty_detector", str(fake_port)], cwd=REPO,
                            start_new_session=True)  # fmt: skip
    logs = tmp_path / "logs"
    port = free_port()
    bentoml = str(Path(sys.executable).parent / "bentoml")
    env = base_env(tmp_path, {"NEGT2I_DETECTOR_URL": f"http://127.0.0.1:{fake_port}", "NEGT2I_LOG_DIR": str(logs),
                              "NEGT2I_PORT_BASE": str(stage_port_base()), "NEGT2I_PORT": str(port),
                              "PYTHON": sys.executable, "BENTOML": bentoml})  # fmt: skip
    script = subprocess.Popen(["bash", "scripts/serve_local.sh"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, start_new_session=True)  # fmt: skip
    try:
        lines: list[str] = []
        assert script.stdout is not None
        end = time.monotonic() + 240
        for line in script.stdout:  # event-driven: the script prints SERVING once the orchestrator is
            lines.append(line)
            if line.startswith("SERVING") or time.monotonic() > end:
                break
        assert lines and lines[-1].startswith("SERVING"), "".join(lines)
        assert f"detector: external at http://127.0.0.1:{fake_port}\n" in lines
        assert not (logs / "detector.log").exists() and (logs / "segmenter.log").exists()
        with EvaluatorClient(f"127.0.0.1:{port}") as client:
            info = client.info()
        assert {s.stage: s.model.model for s in info.stages}["detector"] == "fake-yolo-seg"
    finally:
        os.killpg(script.pid, signal.SIGTERM)
        script.wait(timeout=30)
        fake.kill()
        fake.wait(timeout=10)


def test_help_lists_every_variable_the_script_reads() -> None:
    out = subprocess.run(["bash", "scripts/serve_local.sh", "--help"], check=False, cwd=REPO,
                         capture_output=True, text=True, timeout=30)  # fmt: skip
    assert out.returncode == 0
    script = (REPO / "scripts" / "serve_local.sh").read_text()
    import re

    read = set(re.findall(r"\$\{(NEGT2I_[A-Z_]+|PYTHON|BENTOML):-", script)) - {"NEGT2I_GPUS"}
    assert read <= set(re.findall(r"[A-Z][A-Z0-9_]+", out.stdout)), read
    for var in ("NEGT2I_<STAGE>_URL", "NEGT2I_<STAGE>_BACKEND", "NEGT2I_PORT_BASE", "NEGT2I_SERVE_TIMEOUT"):
        assert var in out.stdout
    readme = (REPO / "README.md").read_text()
    assert all(var in readme for var in ("NEGT2I_PORT_BASE", "NEGT2I_PORT", "NEGT2I_LOG_DIR", "NEGT2I_SERVE_TIMEOUT"))


def test_a_busy_port_is_named_and_nothing_starts(tmp_path: Path) -> None:
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        busy = held.getsockname()[1]
        env = base_env(tmp_path, {"NEGT2I_LOG_DIR": str(tmp_path / "logs"), "NEGT2I_PORT_BASE": str(stage_port_base()),
                                  "NEGT2I_PORT": str(busy), "PYTHON": sys.executable})  # fmt: skip
        out = subprocess.run(["bash", "scripts/serve_local.sh"], check=False, cwd=REPO, env=env,
                             capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 1
    assert f"port {busy} for the orchestrator (NEGT2I_PORT) is already in use" in out.stderr
    assert not list((tmp_path / "logs").glob("*.log"))


def test_no_serving_within_the_timeout_is_an_error(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    # Every stage external (nowhere): only the orchestrator starts, and it cannot be SERVING within 0 s.
    stages = ("DETECTOR", "SEGMENTER", "ATTRIBUTES", "DEPTH")
    nowhere = {f"NEGT2I_{stage}_URL": "http://127.0.0.1:9" for stage in stages}
    env = base_env(tmp_path, {**nowhere, "NEGT2I_LOG_DIR": str(logs), "NEGT2I_PORT": str(free_port()),
                              "NEGT2I_SERVE_TIMEOUT": "0", "PYTHON": sys.executable})  # fmt: skip
    out = subprocess.run(["bash", "scripts/serve_local.sh"], check=False, cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=120, start_new_session=True)  # fmt: skip
    assert out.returncode == 1, out.stdout + out.stderr
    assert "did not report SERVING within 0 s (NEGT2I_SERVE_TIMEOUT)" in out.stderr
    assert "SERVING:" not in out.stdout


def test_the_timeout_error_says_why_each_stage_is_not_serving(tmp_path: Path) -> None:
    """Health details (issue 28): the error names each stage the orchestrator cannot use, and why."""
    stages = ("DETECTOR", "SEGMENTER", "ATTRIBUTES", "DEPTH")
    nowhere = {f"NEGT2I_{stage}_URL": "http://127.0.0.1:9" for stage in stages}
    env = base_env(tmp_path, {**nowhere, "NEGT2I_LOG_DIR": str(tmp_path / "logs"), "NEGT2I_PORT": str(free_port()),
                              "NEGT2I_SERVE_TIMEOUT": "20", "PYTHON": sys.executable})  # fmt: skip
    out = subprocess.run(["bash", "scripts/serve_local.sh"], check=False, cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=120, start_new_session=True)  # fmt: skip
    assert out.returncode == 1, out.stdout + out.stderr
    assert "did not report SERVING within 20 s (NEGT2I_SERVE_TIMEOUT): the detector is down: no answer at" in out.stderr
    assert "SERVING:" not in out.stdout
