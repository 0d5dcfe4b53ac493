"""Score while generating: each new image goes to the gRPC orchestrator as soon as it is on disk.

One ``EvaluateStream`` (``negt2i.client.EvaluatorClient``) carries the whole run.
At most ``in_flight`` images are sent and not yet answered: ``submit`` returns at
once below that bound and waits only when it is reached, so generation never
waits for scoring otherwise. Answers are written as they arrive, in the results
format of ``negt2i submit`` / ``negt2i evaluate`` (``negt2i.results``; the same
response -> line mapping as ``negt2i submit``), so ``negt2i evaluate OUT``
scores the folder to the same verdicts.

Transient failures are retried within the run, like ``negt2i submit`` does: an item
answered RESOURCE_EXHAUSTED / UNAVAILABLE / ... (the orchestrator's back-pressure, a
stage down) is sent again after a backoff (0.25 s doubling to 8 s, at most
``attempts`` sends), and a stream that ends with such a code (the orchestrator
closes connections after ~5 min so that clients reach new replicas; a restart)
is reopened and its unanswered items re-sent, at most ``attempts`` times in a
row without an answer in between. What still fails gets no line: re-running the
same ``negt2i generate`` command sends exactly those (done images without a
results line are submitted again), as does ``negt2i submit OUT``.

The results file is written by the one results writer (``negt2i.results.ResultsWriter``:
locked, refused unless new or ours) and resumed by content: an image is skipped only
when its line has the same SHA-256 and prompt; an image that changed on disk since
its line was written is judged again and its line replaced (a generation run
rewrites what it regenerates).
"""

from __future__ import annotations

import hashlib
import queue
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from negt2i.generate.registry import GenerateError

if TYPE_CHECKING:
    from negt2i.client import EvaluatorClient, SubmitOutcome
    from negt2i.config import RuleConfig
    from negt2i.evaluate import Job
    from negt2i.results import ResultsWriter
    from negt2i.wire.v1 import evaluator_pb2


class Scorer:
    """Streams images to the orchestrator at ``target`` and appends their verdicts to ``results``."""

    def __init__(self, target: str, results: str | Path, *, in_flight: int = 8, wait: float = 60.0,
                 attempts: int = 8) -> None:  # fmt: skip
        if in_flight < 1:
            raise ValueError(f"in_flight must be >= 1, got {in_flight}")
        if attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {attempts}")
        self.attempts = attempts
        self.target = target
        self.results = Path(results)
        self.in_flight = in_flight
        self.wait = wait
        self.done: set[str] = set()
        """File names that had a line when the run started (``submit`` still checks their content)."""
        self.outcome: SubmitOutcome | None = None
        self._client: EvaluatorClient | None = None
        self._writer: ResultsWriter | None = None
        self._file_lock = threading.Lock()
        self._hashes: dict[str, str] = {}
        self._slots = threading.BoundedSemaphore(in_flight)
        self._queue: queue.Queue[tuple[int, evaluator_pb2.EvaluateRequest] | None] = queue.Queue()
        """(stream number or -1 for a new item, request); a retry is dropped if its stream has since ended."""
        self._streams = 0
        self._pending: dict[str, Job] = {}
        self._sent: dict[str, evaluator_pb2.EvaluateRequest] = {}
        """The request of each pending item (re-sent after a transient failure)."""
        self._tries: dict[str, int] = {}
        self._closing = threading.Event()
        """Set once ``close`` was called and its end-of-stream marker read: no new items will come."""
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
        from negt2i.evaluate import Summary
        from negt2i.results import ResultsFileError, ResultsWriter
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
        try:
            self._writer = ResultsWriter(self.results)
            self._writer.check_compatible(self._config.digest(), self._config.name, self._models)
        except ResultsFileError as exc:
            if self._writer is not None:
                self._writer.close()
                self._writer = None
            raise GenerateError(str(exc)) from None
        self.done = set(self._writer.lines)
        self.outcome = SubmitOutcome(Summary())
        self._thread = threading.Thread(target=self._stream, name="negt2i-score", daemon=True)
        self._thread.start()

    def _requests(self, resend: list[evaluator_pb2.EvaluateRequest]) -> Any:
        yield from resend
        while not self._closing.is_set():
            item = self._queue.get()
            if item is None:
                self._closing.set()
                return
            stream, request = item
            # a retry queued for a stream that has ended was re-sent with the new stream's opening
            if stream in (-1, self._streams) and request.request_id in self._pending:
                yield request

    def _again(self, name: str, delay: float) -> None:
        """Send ``name`` again after ``delay`` s (while the stream is open; else the next stream re-sends it)."""

        stream = self._streams

        def put() -> None:
            if not self._closing.is_set():
                with self._lock:
                    request = self._sent.get(name)
                if request is not None:
                    self._queue.put((stream, request))

        timer = threading.Timer(delay, put)
        timer.daemon = True
        timer.start()

    def _answer(self, resp: evaluator_pb2.EvaluateStreamResponse) -> None:
        from negt2i.client import _record_of, item_transient

        assert self.outcome is not None and self._config is not None
        with self._lock:
            job = self._pending.get(resp.request_id)
            if job is None:  # a duplicate answer to a re-sent item
                return
            tries = self._tries.get(job.filename, 1)
            transient = resp.HasField("error") and item_transient(resp.error)
            if transient and tries < self.attempts:
                self._tries[job.filename] = tries + 1
                self.outcome.retried += 1
                retry = True
            else:
                del self._pending[resp.request_id]
                self._sent.pop(resp.request_id, None)
                retry = False
        if retry:
            self._again(job.filename, min(0.25 * 2 ** (tries - 1), 8.0))
            return
        record = _record_of(resp, job, config=self._config, models=self._models, services=self._services,
                            outcome=self.outcome, sha256=self._hashes.get(job.filename))  # fmt: skip
        summary = self.outcome.summary
        if record is not None:
            assert self._writer is not None
            with self._file_lock:
                self._writer.write(record)
            summary.evaluated += 1
            if record["status"] == "error":
                summary.errors[str(record["error_kind"])] += 1
            else:
                summary.correct += int(record["correct"])
        self._slots.release()

    def _stream(self) -> None:
        from negt2i.client import TRANSIENT, ClientError
        from negt2i.results import ResultsFileError

        assert self._client is not None and self.outcome is not None
        failures = 0  # streams in a row that ended transiently without an answer
        try:
            while True:
                with self._lock:
                    resend = [self._sent[name] for name in self._pending]
                    self._streams += 1
                answered = self.outcome.answers
                try:
                    for resp in self._client.stream(self._requests(resend)):
                        self.outcome.answers += 1
                        self._answer(resp)
                except ResultsFileError as exc:  # the results file cannot be written (full disk): stop scoring
                    self.outcome.stream_error = str(exc)
                    print(f"error: {exc}", file=sys.stderr)
                    return
                except ClientError as exc:
                    failures = 0 if self.outcome.answers > answered else failures + 1
                    if exc.code not in TRANSIENT or failures >= self.attempts:
                        self.outcome.stream_error = str(exc)
                        print(f"warning: scoring stopped: {exc}; the rest is left for a rerun", file=sys.stderr)
                        return
                    with self._lock:
                        self.outcome.retried += len(self._pending)
                    time.sleep(min(0.25 * 2**failures, 8.0))
                    continue
                with self._lock:
                    if self._closing.is_set() and not self._pending:
                        return
                # the stream ended with items unanswered (closed by the server): reopen it
                failures += 1
                if failures >= self.attempts:
                    self.outcome.stream_error = "the orchestrator closed the stream with items unanswered"
                    return
        finally:
            self._broken.set()
            with self._lock:
                left = list(self._pending.values())
                self._pending.clear()
                self._sent.clear()
            self.outcome.retry.extend(job.filename for job in left)

    def submit(self, job: Job, data: bytes) -> None:
        """Send ``job``'s image; waits only while ``in_flight`` images are unanswered."""
        from negt2i.client import make_request
        from negt2i.results import ResultsFileError, ResumeKey, prompt_metadata

        assert self.outcome is not None and self._writer is not None
        sha256 = hashlib.sha256(data).hexdigest()
        key = ResumeKey(job.filename, sha256, prompt_metadata(job.prompt, job.prompt_id))
        try:
            with self._file_lock:  # same image and prompt already judged: skip; changed: its line is replaced
                plan = self._writer.plan([key], replace_changed=True)
        except ResultsFileError as exc:  # the file cannot be rewritten (full disk)
            raise GenerateError(str(exc)) from None
        if not plan.todo:
            self.outcome.summary.total += 1
            self.outcome.summary.skipped += 1
            return
        self._hashes[job.filename] = sha256
        while not self._slots.acquire(timeout=0.2):
            if self._broken.is_set():
                break
        if self._broken.is_set():
            self.outcome.retry.append(job.filename)
            return
        request = make_request(data, prompt=job.prompt, request_id=job.filename)
        with self._lock:
            self._pending[job.filename] = job
            self._sent[job.filename] = request
            self.max_in_flight = max(self.max_in_flight, len(self._pending))
        self.outcome.summary.total += 1
        self._queue.put((-1, request))

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
        if self._writer is not None:
            self._writer.close()
            self._writer = None
            if self.outcome is not None:
                from negt2i.evaluate import finish_summary

                finish_summary(self.outcome.summary, self.results)
        if self._client is not None:
            self._client.close()
            self._client = None
        if self.outcome is None:
            from negt2i.client import SubmitOutcome
            from negt2i.evaluate import Summary

            self.outcome = SubmitOutcome(Summary())
        return self.outcome
