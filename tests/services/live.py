"""Real processes on 127.0.0.1 for the services tests: ``bentoml serve`` per stage and the orchestrator.

Every process is started in its own session (process group) and killed with its
group by the fixtures' finalizers; ports are free ephemeral ports.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
CLASSES = {"detector": "Detector", "segmenter": "Segmenter", "attributes": "Attributes", "depth": "Depth"}


_next_port: list[int] = []


def free_port() -> int:
    """A port that was free a moment ago, never handed out twice in a test run.

    Ports come from a range per pytest-xdist worker (20000 + 500 x worker index, below the kernel's
    ephemeral range 32768-60999), counting up: two workers (or two fixtures of one worker) never pick
    the same port, which kernel-chosen ephemeral ports (bind to port 0, then close) do not guarantee.
    Each process starts at its own place in its range (from its PID), so that test runs on one machine at
    the same time (the same worker names) rarely reach for the same port between the check and the bind.
    """
    if not _next_port:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
        index = int(worker[2:]) if worker[2:].isdigit() else 0
        _next_port.append(20000 + 500 * (index % 24) + (os.getpid() * 7919) % 500)
    while True:
        port = _next_port[0]
        _next_port[0] = port + 1 if (port + 1 - 20000) % 500 else port + 1 - 500
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port


@dataclass
class Proc:
    """A started process (group) and where it listens."""

    name: str
    popen: subprocess.Popen[bytes]
    port: int
    log: Path
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Kill the process, its group and every descendant (BentoML's workers run in their own session)."""
        import psutil

        try:
            family = [psutil.Process(self.popen.pid), *psutil.Process(self.popen.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            family = []
        for proc in family:
            try:
                proc.send_signal(sig)
            except psutil.NoSuchProcess:
                pass
        try:
            os.killpg(self.popen.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        self.popen.wait(timeout=20)
        psutil.wait_procs(family, timeout=20)

    def tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def base_env(tmp: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEGT2I_")}
    env.update(
        {
            "BENTOML_DO_NOT_TRACK": "true",
            "BENTOML_HOME": str(tmp / "bentoml"),
            "NEGT2I_GPUS": "0",
            "NEGT2I_DEVICE": "cpu",
            "PYTHONPATH": str(REPO),
            "OMP_NUM_THREADS": "1",
        }
    )
    env.update(extra or {})
    return env


def start_stage(stage: str, tmp: Path, *, port: int | None = None, backend: str = "synthetic",
                env: Mapping[str, str] | None = None) -> Proc:  # fmt: skip
    """``bentoml serve services.<stage>.service:<Class>`` with a synthetic backend."""
    port = port or free_port()
    log = tmp / f"{stage}-{port}.log"
    e = base_env(tmp, {f"NEGT2I_{stage.upper()}_BACKEND": backend, "NEGT2I_MAX_REQUEST_BYTES": str(8 << 20),
                       **dict(env or {})})  # fmt: skip
    # its own BentoML home: BentoML keeps (and wipes at start) its Prometheus files there
    e["BENTOML_HOME"] = str(tmp / f"bentoml-{stage}-{port}")
    cmd = [str(BIN / "bentoml"), "serve", f"services.{stage}.service:{CLASSES[stage]}", "--host", "127.0.0.1",
           "--port", str(port), "--working-dir", str(REPO)]  # fmt: skip
    with log.open("ab") as fh:
        popen = subprocess.Popen(cmd, cwd=REPO, env=e, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    return Proc(stage, popen, port, log)


def start_orchestrator(urls: Mapping[str, str], tmp: Path, *, env: Mapping[str, str] | None = None,
                       args: list[str] | None = None) -> Proc:  # fmt: skip
    """``python -m orchestrator`` on a free port."""
    port = free_port()
    log = tmp / f"orchestrator-{port}.log"
    e = base_env(tmp, {f"NEGT2I_{s.upper()}_URL": u for s, u in urls.items()})
    e.update({"NEGT2I_HEALTH_INTERVAL_S": "0.2", "NEGT2I_CORPUS": str(tmp / "no-corpus.jsonl"), **dict(env or {})})
    cmd = [sys.executable, "-m", "orchestrator", "--host", "127.0.0.1", "--port", str(port), *(args or [])]
    with log.open("ab") as fh:
        popen = subprocess.Popen(cmd, cwd=REPO, env=e, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    return Proc("orchestrator", popen, port, log)


def wait_ready(proc: Proc, timeout: float = 120.0) -> None:
    """Until ``GET /readyz`` answers 200; raises with the log tail if the process died or time ran out."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not proc.alive():
            raise RuntimeError(f"{proc.name} exited with {proc.popen.returncode}:\n{proc.tail()}")
        try:
            if httpx.get(f"{proc.url}/readyz", timeout=2.0, trust_env=False).status_code == 200:
                return
            if httpx.get(f"{proc.url}/livez", timeout=2.0, trust_env=False).status_code == 503:
                raise RuntimeError(f"{proc.name} failed to load its model:\n{proc.tail()}")
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{proc.name} not ready after {timeout:.0f} s:\n{proc.tail()}")


def wait_log(proc: Proc, needle: str, timeout: float = 30.0) -> None:
    """Until ``needle`` appears in the process's log (an event the process reports), or fail with the tail."""
    end = time.monotonic() + timeout
    while needle not in proc.log.read_text(errors="replace"):
        assert proc.alive() and time.monotonic() < end, f"{needle!r} never logged:\n{proc.tail()}"
        time.sleep(0.05)


def wait_health(target: str, want: str = "SERVING", timeout: float = 60.0) -> str:
    """Poll the orchestrator's health service until it reports ``want``; returns the last status."""
    from negt2i.client import EvaluatorClient

    last = "UNKNOWN"
    end = time.monotonic() + timeout
    with EvaluatorClient(target) as client:
        while time.monotonic() < end:
            try:
                last = client.health(timeout=2.0)
            except Exception:
                last = "UNREACHABLE"
            if last == want:
                return last
            time.sleep(0.1)
    return last
