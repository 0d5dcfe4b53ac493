"""A stage never hangs while it says it is healthy (issue 26), with real ``bentoml serve`` processes:

- requests cancelled by BentoML's request timeout (``NEGT2I_STAGE_TIMEOUT_S``), one while it waits for
  company in the micro-batcher and two while a batch runs, then the next request is answered and the
  stage stays live and ready (before the fix the model thread died on ``InvalidStateError`` and the stage
  never answered again while ``/livez`` and ``/readyz`` said 200);
- a model thread killed by an injected error (``SystemExit`` in the model call,
  ``tests/services/stall_backend.py``) turns ``/livez`` and ``/readyz`` to 503 and every request to 503.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from negt2i.stages.synthetic import SceneObject, render_scene
from negt2i.wire import adapter
from negt2i.wire.stage_table import STAGE_TABLE
from tests.services.live import Proc, start_stage, wait_ready
from tests.services.stall_backend import FATAL, SLOW

pytestmark = pytest.mark.xdist_group("services")

ENV = {"NEGT2I_BACKEND_MODULES": "tests.services.stall_backend"}


def _item(mark: tuple[int, int, int] | None = None, shift: int = 0) -> dict[str, Any]:
    """A JSON DetectItem: a red cup on white, its top-left pixel set to ``mark`` (slow or fatal) if given."""
    image = render_scene([SceneObject("cup", (10 + shift, 8, 50 + shift, 40), value="red")], (64, 80))
    if mark is not None:
        image[0, 0] = mark
    spec = STAGE_TABLE["detector"]
    return adapter.to_json(
        spec.probe(adapter.encode_png(image), np.zeros((0, 64, 80), bool), np.zeros((0, 4), np.float32), [])
    )


def _post(url: str, items: list[dict[str, Any]], timeout: float = 30.0) -> httpx.Response:
    return httpx.post(f"{url}/detect", json={"items": items}, trust_env=False, timeout=timeout)


def _status(url: str) -> int:
    try:
        return httpx.get(url, trust_env=False, timeout=2).status_code
    except httpx.HTTPError:
        return 0


def _in_thread(url: str, items: list[dict[str, Any]], out: list[int]) -> threading.Thread:
    def go() -> None:
        try:
            out.append(_post(url, items).status_code)
        except httpx.HTTPError:
            out.append(0)

    thread = threading.Thread(target=go)
    thread.start()
    return thread


@pytest.fixture
def stalling_detector(live_tmp: Path):
    """Request timeout 2 s; batches of 2; an idle model waits 3 s for company; a slow image takes 4 s."""
    env = {**ENV, "NEGT2I_STAGE_TIMEOUT_S": "2", "NEGT2I_MAX_WAIT_MS": "3000", "NEGT2I_MAX_BATCH_SIZE": "2",
           "NEGT2I_TEST_STALL_S": "4"}  # fmt: skip
    proc = start_stage("detector", live_tmp, backend="stall-test", env=env)
    try:
        wait_ready(proc)
        yield proc
    finally:
        proc.kill()


def test_requests_cancelled_by_the_timeout_are_dropped_and_the_next_request_is_answered(stalling_detector: Proc):
    url = stalling_detector.url
    full = [_item(shift=0), _item(shift=4)]  # a full batch: runs at once
    before = _post(url, full)
    assert before.status_code == 200, stalling_detector.tail()

    # 1. alone, it waits 3 s for company: BentoML's 2 s timeout cancels it before the model takes it
    t0 = time.monotonic()
    assert _post(url, [_item()]).status_code != 200
    assert time.monotonic() - t0 < 2.9  # answered by the timeout, not by the model
    time.sleep(1.5)  # the model thread takes (and must drop) the cancelled item at 3 s

    # 2. a slow full batch (4 s) is cancelled by the timeout mid-batch, and a request queued behind it too
    statuses: list[int] = []
    slow = _in_thread(url, [_item(SLOW), _item()], statuses)
    time.sleep(0.5)
    queued = _in_thread(url, full, statuses)
    slow.join(30)
    queued.join(30)
    assert len(statuses) == 2 and 200 not in statuses, statuses  # both timed out
    time.sleep(2.0)  # the slow batch ends (about 4 s after it started); its cancelled requests get nothing

    # 3. the next request is answered, with the same results as before; the stage is live and ready
    after = _post(url, full)
    assert after.status_code == 200, stalling_detector.tail()
    assert after.json() == before.json()
    assert _status(f"{url}/livez") == 200 and _status(f"{url}/readyz") == 200
    assert "InvalidStateError" not in stalling_detector.tail(400)
    assert "died" not in stalling_detector.tail(400)


def test_a_model_thread_killed_by_an_injected_error_turns_livez_503(live_tmp: Path):
    proc = start_stage("detector", live_tmp, backend="stall-test", env={**ENV, "NEGT2I_MAX_WAIT_MS": "0"})
    try:
        wait_ready(proc)
        url = proc.url
        assert _post(url, [_item()]).status_code == 200
        assert _status(f"{url}/livez") == 200
        t0 = time.monotonic()
        dead = _post(url, [_item(FATAL)])
        assert dead.status_code == 503, dead.text  # (BentoML words the JSON route's 503 itself)
        assert time.monotonic() - t0 < 10  # told at once, not after the request timeout
        assert _status(f"{url}/livez") == 503  # the kubelet restarts the pod
        assert _status(f"{url}/readyz") == 503  # and no traffic is sent to it meanwhile
        assert _post(url, [_item()]).status_code == 503  # refused at once
        body = STAGE_TABLE["detector"].request(items=[adapter.from_json(_item(), STAGE_TABLE["detector"].item)])
        binary = httpx.post(f"{url}/detect", content=body.SerializeToString(), trust_env=False, timeout=10,
                            headers={"content-type": adapter.PROTOBUF_TYPE})  # fmt: skip
        assert binary.status_code == 503 and "must be restarted" in binary.text  # the binary route too
        assert "model thread model-detector died" in proc.tail(200)
        assert "ServiceUnavailable: the model thread has died (SystemExit('injected" in proc.tail(200)
    finally:
        proc.kill()
