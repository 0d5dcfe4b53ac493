"""The guard of the one run loop (issue 27), the client-side twin of the embedded-vs-served parity test:
``negt2i submit`` and ``negt2i generate --score`` (its ``Scorer``) against the same real orchestrator, through
the same injected faults, write byte-identical results files and retry the same way.

The faults (``tests.services.fault_proxy``, in front of the session's orchestrator), by image:

- one image answered ``RESOURCE_EXHAUSTED`` (``SERVER_OVERLOADED``, which the API marks retryable) on its first
  two sends: sent again twice within the run, then judged;
- one answered ``DEADLINE_EXCEEDED`` (transient, but not marked retryable): not sent again, no line, left for
  a rerun;
- one never answered (a stall): the stall watchdog stops the run after ``item_timeout``; no line, left for a
  rerun; every other image has its line.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from negt2i.generate.scoring import Scorer
from negt2i.run.jobs import Job, discover
from negt2i.run.output import SubmitOutcome
from negt2i.stages.demo_data import write_demo
from negt2i.submit import submit
from tests.services.fault_proxy import FaultProxy
from tests.services.live import Proc

ITEM_TIMEOUT_S = 1.5


def _sha(job: Job) -> str:
    return hashlib.sha256(job.path.read_bytes()).hexdigest()


def _submit(jobs: list[Job], out: Path, target: str) -> SubmitOutcome:
    return submit(jobs, out, target, item_timeout=ITEM_TIMEOUT_S, progress=False)


def _score(jobs: list[Job], out: Path, target: str) -> SubmitOutcome:
    scorer = Scorer(target, out, in_flight=32, item_timeout=ITEM_TIMEOUT_S)
    scorer.start()
    for job in jobs:  # as generate's runner does: each image as soon as it is on disk
        scorer.submit(job, job.path.read_bytes())
    return scorer.close()


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> list[Job]:
    root = tmp_path_factory.mktemp("parity") / "demo"
    write_demo(root, prompts=6, samples=2, seed=5, size=64)
    return discover(root)


def test_submit_and_generate_score_write_the_same_file_through_the_same_faults(
    orchestrator: Proc, demo: list[Job], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    overloaded, late, stalled = demo[1], demo[4], demo[7]
    faults = {_sha(overloaded): ["overloaded", "overloaded"], _sha(late): ["deadline"], _sha(stalled): ["stall"]}
    runs: dict[str, tuple[bytes, SubmitOutcome, dict[str, int]]] = {}
    for name, drive in (("submit", _submit), ("generate --score", _score)):
        out = tmp_path / f"{name.split()[0]}.jsonl"
        with FaultProxy(orchestrator.target, faults) as proxy:
            outcome = drive(demo, out, proxy.target)
            runs[name] = (out.read_bytes(), outcome, dict(proxy.sends))
    (sub_bytes, sub, sub_sends), (gen_bytes, gen, gen_sends) = runs["submit"], runs["generate --score"]
    assert sub_bytes == gen_bytes
    left = [late.filename, stalled.filename]
    written = [job.filename for job in demo if job.filename not in left]
    assert [line.split(b'"filename":"', 1)[1].split(b'"', 1)[0].decode() for line in sub_bytes.splitlines()] == written
    for outcome in (sub, gen):
        assert outcome.retry == left  # in job order
        assert outcome.retried == 2  # the overloaded image, twice; never the DEADLINE_EXCEEDED one
        assert outcome.answers == len(demo) - 1 + 2  # every image but the stalled one, and the two refusals
        assert outcome.stream_error is not None and "stopped answering" in outcome.stream_error
        assert outcome.summary.evaluated == len(written)
    assert sub_sends == gen_sends
    assert sub_sends[_sha(overloaded)] == 3 and sub_sends[_sha(late)] == 1 and sub_sends[_sha(stalled)] == 1
    assert set(sub_sends.values()) <= {1, 3}
    err = capsys.readouterr().err
    assert err.count(f"{late.filename}: DEADLINE_EXCEEDED") == 2  # each driver says why it left the image
