"""Score while generating: each new image goes to the gRPC orchestrator as soon as it is on disk.

One ``EvaluateStream`` (``negt2i.client.EvaluatorClient``) carries the whole run.
At most ``in_flight`` images are sent and not yet answered: ``submit`` returns at
once below that bound and waits only when it is reached, so generation never
waits for scoring otherwise. Answers are written as they arrive, in the results
format of ``negt2i submit`` / ``negt2i evaluate`` (``negt2i.results``; the same
response -> line mapping as ``negt2i submit``), so ``negt2i evaluate OUT``
scores the folder to the same verdicts. Items that failed transiently (the
orchestrator's back-pressure: RESOURCE_EXHAUSTED, a stage UNAVAILABLE, ...) get
no line: re-running the same ``negt2i generate`` command sends exactly those
(done images without a results line are submitted again), as does
``negt2i submit OUT``.
"""

from __future__ import annotations

import fcntl
import queue
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from negt2i.generate.registry import GenerateError

if TYPE_CHECKING:
    from negt2i.client import EvaluatorClient, SubmitOutcome
    from negt2i.config import RuleConfig
    from negt2i.evaluate import Job
    from negt2i.wire.v1 import evaluator_pb2


class Scorer:
    """Streams images to the orchestrator at ``target`` and appends their verdicts to ``results``."""

    def __init__(self, target: str, results: str | Path, *, in_flight: int = 8, wait: float = 60.0) -> None:
        if in_flight < 1:
            raise ValueError(f"in_flight must be >= 1, got {in_flight}")
        self.target = target
        self.results = Path(results)
        self.in_flight = in_flight
        self.wait = wait
        self.done: set[str] = set()
        self.outcome: SubmitOutcome | None = None
        self._client: EvaluatorClient | None = None
        self._fh: TextIO | None = None
        self._slots = threading.BoundedSemaphore(in_flight)
        self._queue: queue.Queue[evaluator_pb2.EvaluateRequest | None] = queue.Queue()
        self._pending: dict[str, Job] = {}
        self._lock = threading.Lock()
        self._broken = threading.Event()
        self._thread: threading.Thread | None = None
        self._config: RuleConfig | None = None
        self._models: dict[str, Any] = {}
        self._services: dict[str, str] = {}
        self.max_in_flight = 0
        """The most images that were in flight at once (for tests and the summary)."""

    def start(self) -> None:
        """Connect, read the orchestrator's rules and models, open (and resume) the results file."""
        from negt2i.client import ClientError, EvaluatorClient, SubmitOutcome, _rules_from_info
        from negt2i.evaluate import EvaluateError, Summary, resume_state
        from negt2i.wire import adapter

        client = EvaluatorClient(self.target, timeout=None)
        self._client = client
        if not client.wait_ready(self.wait):
            raise GenerateError(f"the orchestrator at {self.target} is not SERVING after {self.wait:.0f} s")
        try:
            info = client.info()
            missing = [s.stage for s in info.stages if not s.model.model]
            if missing:
                raise GenerateError(f"the orchestrator has not reached {', '.join(missing)} yet; retry")
            self._config = _rules_from_info(info)
        except ClientError as exc:
            raise GenerateError(f"orchestrator {self.target}: {exc}") from None
        self._models = adapter.models_record(list(info.stages))
        self._services = adapter.services_record(list(info.stages))
        if self.results.parent != Path():
            self.results.parent.mkdir(parents=True, exist_ok=True)
        fh = self.results.open("a", encoding="utf-8")
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.close()
            raise GenerateError(f"{self.results} is being written by another run") from None
        self._fh = fh
        try:
            self.done = resume_state(self.results, self._config, self._models)
        except EvaluateError as exc:
            raise GenerateError(str(exc)) from None
        self.outcome = SubmitOutcome(Summary(total=len(self.done), skipped=len(self.done)))
        self._thread = threading.Thread(target=self._stream, name="negt2i-score", daemon=True)
        self._thread.start()

    def _requests(self) -> Any:
        while True:
            request = self._queue.get()
            if request is None:
                return
            yield request

    def _stream(self) -> None:
        from negt2i.client import ClientError, _record_of
        from negt2i.results import write_line

        assert self._client is not None and self.outcome is not None and self._config is not None
        summary = self.outcome.summary
        try:
            for resp in self._client.stream(self._requests()):
                with self._lock:
                    job = self._pending.pop(resp.request_id)
                record = _record_of(resp, job, config=self._config, models=self._models,
                                    services=self._services, outcome=self.outcome)  # fmt: skip
                if record is not None:
                    assert self._fh is not None
                    write_line(self._fh, record)
                    summary.evaluated += 1
                    if record["status"] == "error":
                        summary.errors[str(record["error"]).split(":", 1)[0]] += 1
                    else:
                        summary.correct += int(record["correct"])
                self._slots.release()
        except ClientError as exc:
            self.outcome.stream_error = str(exc)
            print(f"warning: scoring stopped: {exc}; the rest is left for a rerun", file=sys.stderr)
        finally:
            self._broken.set()
            with self._lock:
                left = list(self._pending.values())
                self._pending.clear()
            self.outcome.retry.extend(job.filename for job in left)

    def submit(self, job: Job, data: bytes) -> None:
        """Send ``job``'s image; waits only while ``in_flight`` images are unanswered."""
        from negt2i.client import make_request

        if job.filename in self.done:
            return
        assert self.outcome is not None
        while not self._slots.acquire(timeout=0.2):
            if self._broken.is_set():
                break
        if self._broken.is_set():
            self.outcome.retry.append(job.filename)
            return
        with self._lock:
            self._pending[job.filename] = job
            self.max_in_flight = max(self.max_in_flight, len(self._pending))
        self.outcome.summary.total += 1
        self._queue.put(make_request(data, prompt=job.prompt, request_id=job.filename))

    def status(self) -> str:
        """``scored N, in flight M`` for the progress bar."""
        scored = self.outcome.summary.evaluated if self.outcome is not None else 0
        with self._lock:
            pending = len(self._pending)
        return f"scored {scored}, in flight {pending}"

    def close(self) -> SubmitOutcome:
        """Wait for the answers still in flight, then close the stream, the results file and the channel."""
        self._queue.put(None)
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        if self._client is not None:
            self._client.close()
            self._client = None
        if self.outcome is None:
            from negt2i.client import SubmitOutcome
            from negt2i.evaluate import Summary

            self.outcome = SubmitOutcome(Summary())
        return self.outcome
