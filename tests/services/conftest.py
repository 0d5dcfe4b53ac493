"""Session fixtures: the four stage services (synthetic backends) and an orchestrator, as real processes.

All tests using them carry ``xdist_group("services")`` so that ``pytest -n 2 --dist loadgroup`` starts one set.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.services.live import Proc, start_orchestrator, start_stage, wait_health, wait_ready

STAGES = ("detector", "segmenter", "attributes", "depth")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Make ``--dist loadgroup`` group again: pytest-xdist 3.8 appends ``@group`` to ``item._nodeid``, which
    pytest 9 no longer reads (``nodeid`` comes from ``_id``), so grouped tests were spread over the workers
    and each worker started its own services. Only items marked ``xdist_group`` are touched."""
    if not getattr(config.option, "loadgroup", False):
        return
    for item in items:
        names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                        for m in item.iter_markers("xdist_group")})  # fmt: skip
        if names and "@" not in item.nodeid and hasattr(item, "_id"):
            item._id = f"{item.nodeid}@{'_'.join(names)}"  # type: ignore[attr-defined]


@pytest.fixture(scope="session")
def live_tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("live")


@pytest.fixture(scope="session")
def stage_procs(live_tmp: Path) -> Iterator[dict[str, Proc]]:
    procs: dict[str, Proc] = {}
    try:
        for stage in STAGES:
            procs[stage] = start_stage(stage, live_tmp)
        for proc in procs.values():
            wait_ready(proc)
        yield procs
    finally:
        for proc in procs.values():
            proc.kill()


@pytest.fixture(scope="session")
def stage_urls(stage_procs: dict[str, Proc]) -> dict[str, str]:
    return {stage: proc.url for stage, proc in stage_procs.items()}


@pytest.fixture(scope="session")
def orchestrator(stage_urls: dict[str, str], live_tmp: Path) -> Iterator[Proc]:
    proc = start_orchestrator(stage_urls, live_tmp, env={"NEGT2I_MAX_MESSAGE_BYTES": str(4 << 20),
                                                          "NEGT2I_MAX_IMAGE_BYTES": str(2 << 20),
                                                          "NEGT2I_REFLECTION": "1"})  # fmt: skip
    try:
        status = wait_health(proc.target, "SERVING", timeout=60)
        assert status == "SERVING", f"orchestrator health {status}:\n{proc.tail()}"
        yield proc
    finally:
        proc.kill()
