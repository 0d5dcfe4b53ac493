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


def test_an_external_detector_is_not_started_but_used(tmp_path: Path) -> None:
    fake_port = free_port()
    fake = subprocess.Popen([sys.executable, "-m", "tests.services.faulty_detector", str(fake_port)], cwd=REPO,
                            start_new_session=True)  # fmt: skip
    logs = tmp_path / "logs"
    port = free_port()
    bentoml = str(Path(sys.executable).parent / "bentoml")
    env = base_env(tmp_path, {"NEGT2I_DETECTOR_URL": f"http://127.0.0.1:{fake_port}", "NEGT2I_LOG_DIR": str(logs),
                              "NEGT2I_PORT_BASE": str(free_port()), "NEGT2I_PORT": str(port),
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
