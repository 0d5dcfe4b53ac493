"""The orchestrator's stage health poller (issue 26): health never freezes at SERVING because the poller hit
an error. A poll that raises counts that stage as down and polling goes on; a poller that ends anyway stops
the server (the process exits non-zero, so the platform restarts it)."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from negt2i.core.config import CURRENT
from negt2i.stages.registry import STAGES
from orchestrator import discovery
from tests.services.live import REPO, free_port


class FlakyStages:
    """Every stage ready, except that polling ``broken`` raises an unexpected error while ``raising`` is set."""

    def __init__(self, broken: str) -> None:
        self.broken = broken
        self.raising = True
        self.polls = 0

    async def ready(self, stage: str) -> bool:
        self.polls += 1
        if stage == self.broken and self.raising:
            raise KeyError("an error the poller did not expect")
        return True


def _status(health: discovery.Health, name: str) -> int:
    return int(health._server_status[name])


async def _until(predicate: Any, timeout: float = 5.0) -> None:
    end = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < end, "condition never met"
        await asyncio.sleep(0.01)


def test_a_poll_that_raises_counts_the_stage_as_down_and_polling_goes_on(caplog: pytest.LogCaptureFixture):
    async def scenario() -> None:
        stages, health = FlakyStages("depth"), discovery.Health()
        await discovery.set_all(health, discovery.health_statuses(dict.fromkeys(STAGES, True), CURRENT))
        task = asyncio.create_task(discovery.watch_health(stages, health, 0.01, CURRENT))
        try:
            await _until(lambda: stages.polls > 4 * len(STAGES))
            assert not task.done()  # the poller lives on
            assert _status(health, discovery.stage_name("depth")) == discovery.NOT_SERVING
            assert _status(health, "") == discovery.NOT_SERVING  # was SERVING: not frozen there
            assert _status(health, discovery.stage_name("detector")) == discovery.SERVING
            stages.raising = False
            await _until(lambda: _status(health, "") == discovery.SERVING)
        finally:
            task.cancel()

    with caplog.at_level(logging.INFO, logger="negt2i.orchestrator"):
        asyncio.run(scenario())
    failures = [r for r in caplog.records if "polling the depth stage failed" in r.getMessage()]
    assert len(failures) == 1  # logged once per failure spell, not at every poll


BROKEN_POLLER = """
import asyncio, sys
from orchestrator import discovery, server

async def broken_poller(*args):
    await asyncio.sleep(0.5)
    raise RuntimeError("injected poller failure")

discovery.watch_health = broken_poller
sys.exit(server.main(sys.argv[1:]))
"""


def test_a_health_poller_that_ends_stops_the_server(tmp_path: Path):
    """A real orchestrator process whose poller dies (an injected error): the server stops and the process
    exits non-zero, naming why, instead of serving with a frozen health status."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEGT2I_")}
    env["NEGT2I_CORPUS"] = str(tmp_path / "none.jsonl")
    port = free_port()
    proc = subprocess.run([sys.executable, "-c", BROKEN_POLLER, "--host", "127.0.0.1", "--port", str(port)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert proc.returncode != 0
    assert f"listening on 127.0.0.1:{port}" in proc.stdout  # it had started
    assert "the stage health poller ended" in proc.stderr and "injected poller failure" in proc.stderr
