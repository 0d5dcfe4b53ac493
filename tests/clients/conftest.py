"""Real processes for the other-language client tests: the four stage services (synthetic backends), an
orchestrator in front of them, and the Node.js client (clients/node) run as a subprocess.

Every test here carries ``xdist_group("clients")``: ``pytest -n 2 --dist loadgroup`` starts one set. The
orchestrator's stream window is small (``STREAM_WINDOW``) so that a few hundred items go through it many
times over.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from negt2i.stages.demo_data import write_demo
from tests.services.conftest import pytest_collection_modifyitems  # noqa: F401 - the loadgroup fix, also here
from tests.services.live import REPO, Proc, start_orchestrator, start_stage, wait_health, wait_ready

STAGES = ("detector", "segmenter", "attributes", "depth")
STREAM_WINDOW = 8
NODE_CLIENT = REPO / "clients" / "node"
NODE_CLI = NODE_CLIENT / "bin" / "negt2i-node.js"


def _node() -> str:
    """The ``node`` binary with the client's dependencies installed (``npm ci`` by scripts/setup.sh).

    In CI (``CI`` set) a missing node or missing dependencies fail the tests; elsewhere they are skipped with
    what to run."""
    node = shutil.which("node")
    why = ""
    if node is None:
        why = "node is not installed (Node.js 18 or later: the Node.js client tests need it)"
    elif not (NODE_CLIENT / "node_modules" / "@grpc" / "grpc-js").is_dir():
        why = f"the Node.js client's dependencies are missing: run `npm ci` in {NODE_CLIENT} (scripts/setup.sh does)"
    if why:
        if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
            pytest.fail(why, pytrace=False)
        pytest.skip(why)
    assert node is not None
    return node


@dataclass
class NodeClient:
    """Runs ``clients/node/bin/negt2i-node.js`` against one orchestrator and parses its JSON output."""

    node: str
    target: str

    def run(self, *args: str, timeout: float = 60.0) -> tuple[int, list[Any]]:
        """Exit status and the JSON values printed (one per line)."""
        cmd = [self.node, str(NODE_CLI), "--target", self.target, *args]
        env = {k: v for k, v in os.environ.items() if not k.startswith("NEGT2I_")}
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, check=False)
        assert proc.returncode in (0, 1), f"{cmd} exited {proc.returncode}:\n{proc.stderr}"
        return proc.returncode, [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


@pytest.fixture(scope="session")
def clients_tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("clients")


@pytest.fixture(scope="session")
def node_bin() -> str:
    return _node()


def _started(start: Callable[[], Proc], ready: Callable[[Proc], None], attempts: int = 3) -> Proc:
    """``start()`` until ``ready(proc)`` passes; a start that lost its port to another process (``free_port``
    checks a port, the server binds it a moment later; other test runs on the machine pick from the same
    range) is retried on a new port, any other failure raised."""
    for attempt in range(attempts):
        proc = start()
        try:
            ready(proc)
            return proc
        except (RuntimeError, AssertionError) as exc:
            proc.kill()
            lost_port = "in use" in f"{exc}{proc.tail(60)}"
            if not lost_port or attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


def _serving(proc: Proc) -> None:
    status = wait_health(proc.target, "SERVING", timeout=60)
    assert status == "SERVING", f"orchestrator health {status}:\n{proc.tail()}"


@pytest.fixture(scope="session")
def clients_stages(clients_tmp: Path, node_bin: str) -> Iterator[dict[str, Proc]]:
    procs: dict[str, Proc] = {}
    try:
        for stage in STAGES:
            procs[stage] = _started(functools.partial(start_stage, stage, clients_tmp), wait_ready)
        yield procs
    finally:
        for proc in procs.values():
            proc.kill()


@pytest.fixture(scope="session")
def clients_orchestrator(clients_stages: dict[str, Proc], clients_tmp: Path, demo_folder: Path) -> Iterator[Proc]:
    """The orchestrator, its corpus the demo's prompts (so that they can also be named by prompt_id)."""
    corpus = clients_tmp / "corpus.jsonl"
    corpus.write_text("".join(p.read_text() for p in sorted(demo_folder.glob("*/metadata.jsonl"))))
    urls = {stage: proc.url for stage, proc in clients_stages.items()}
    env = {"NEGT2I_STREAM_WINDOW": str(STREAM_WINDOW), "NEGT2I_CORPUS": str(corpus)}
    proc = _started(functools.partial(start_orchestrator, urls, clients_tmp, env=env), _serving)
    try:
        yield proc
    finally:
        proc.kill()


@pytest.fixture(scope="session")
def node_client(node_bin: str, clients_orchestrator: Proc) -> NodeClient:
    return NodeClient(node_bin, clients_orchestrator.target)


@pytest.fixture(scope="session")
def demo_folder(clients_tmp: Path) -> Path:
    """The demo data (``python -m negt2i.stages.demo_data``): 12 prompts x 4 images over all six categories."""
    root = clients_tmp / "demo"
    write_demo(root)
    return root
