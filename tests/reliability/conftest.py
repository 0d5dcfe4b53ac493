"""Real processes for the reliability suite: the four stage services (synthetic backends, small per-item
limits so that they can be reached with small requests) and an orchestrator in front of them.

Every test here carries ``xdist_group("reliability")``: ``pytest -n 2 --dist loadgroup`` starts one set,
on the other worker than the ``services`` group's.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.services.conftest import pytest_collection_modifyitems  # noqa: F401 - the loadgroup fix, also here
from tests.services.live import Proc, start_orchestrator, start_stage, wait_health, wait_ready

STAGES = ("detector", "segmenter", "attributes", "depth")
STAGE_ENV = {
    "NEGT2I_MAX_MASKS": "8",
    "NEGT2I_MAX_MASK_PIXELS": str(5 * 64 * 64 - 1),  # 4 masks of 64 x 64 fit, 5 do not
    "NEGT2I_MAX_ANSWERS": "16",
    "NEGT2I_MAX_TEXT_CHARS": "64",
    "NEGT2I_BODY_TIMEOUT_S": "1",
    "NEGT2I_HEADER_TIMEOUT_S": "1",
    "NEGT2I_MAX_PIXELS": str(1024 * 1024),
}
ORCHESTRATOR_ENV = {
    "NEGT2I_MAX_MESSAGE_BYTES": str(2 << 20),
    "NEGT2I_MAX_IMAGE_BYTES": str(1 << 20),
    "NEGT2I_MAX_PIXELS": str(1024 * 1024),
}


@pytest.fixture(scope="session")
def rel_tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("reliability")


@pytest.fixture(scope="session")
def rel_stages(rel_tmp: Path) -> Iterator[dict[str, Proc]]:
    procs: dict[str, Proc] = {}
    try:
        for stage in STAGES:
            procs[stage] = start_stage(stage, rel_tmp, env=STAGE_ENV)
        for proc in procs.values():
            wait_ready(proc)
        yield procs
    finally:
        for proc in procs.values():
            proc.kill()


@pytest.fixture(scope="session")
def rel_urls(rel_stages: dict[str, Proc]) -> dict[str, str]:
    return {stage: proc.url for stage, proc in rel_stages.items()}


@pytest.fixture(scope="session")
def rel_orchestrator(rel_urls: dict[str, str], rel_tmp: Path) -> Iterator[Proc]:
    proc = start_orchestrator(rel_urls, rel_tmp, env=ORCHESTRATOR_ENV)
    try:
        status = wait_health(proc.target, "SERVING", timeout=60)
        assert status == "SERVING", f"orchestrator health {status}:\n{proc.tail()}"
        yield proc
    finally:
        proc.kill()
