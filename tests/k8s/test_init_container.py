"""The wait-for-weights init container of every stage pod, run as a real process the way a container runs
it: its shell as PID 1 of a new PID namespace (``unshare --pid --fork``), where a signal with no handler is
ignored. It must wait while the weights are missing, end at once on SIGTERM (a waiting pod is deleted
without waiting out its grace period), and pass once the weights-fetch Job's marker exists."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import psutil

from tests.k8s.helpers import STAGES, by_kind, rendered


def _command() -> list[str]:
    commands = set()
    for name, deployment in by_kind(rendered("overlays/gpu"), "Deployment").items():
        if name not in STAGES:
            continue
        (init,) = deployment["spec"]["template"]["spec"]["initContainers"]
        assert init["name"] == "wait-for-weights"
        commands.add(tuple(init["command"]))
    (command,) = commands  # one definition for the four stages
    return list(command)


def _start(weights: Path) -> subprocess.Popen[str]:
    unshare = shutil.which("unshare")
    assert unshare, "unshare (util-linux) is needed to run the command as PID 1"
    env = {"PATH": os.environ["PATH"], "NEGT2I_WEIGHTS_DIR": str(weights)}
    return subprocess.Popen([unshare, "--pid", "--fork", "--kill-child", *_command()], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip


def test_the_waiting_init_container_exits_on_sigterm_as_pid_1(tmp_path: Path):
    proc = _start(tmp_path)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "waiting for weights in" in line and "weights-fetch Job" in line, line
        (shell,) = psutil.Process(proc.pid).children()  # PID 1 of its namespace
        time.sleep(0.3)  # inside its sleep
        t0 = time.monotonic()
        shell.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=5) == 143  # 128 + SIGTERM, at once (not after the 15 s sleep)
        assert time.monotonic() - t0 < 3
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_the_init_container_passes_once_the_weights_are_complete(tmp_path: Path):
    (tmp_path / ".negt2i-complete").touch()
    proc = _start(tmp_path)
    try:
        assert proc.wait(timeout=10) == 0
        assert proc.stdout is not None and "waiting" not in proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
