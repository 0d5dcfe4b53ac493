"""Score while generating: each new image goes to the gRPC orchestrator as soon as it is on disk.

``Scorer`` is a thin driver of the run loop (``negt2i.run``), like ``negt2i submit``: one
``EvaluateStream`` carries the whole run through the one stream submitter
(``negt2i.run.stream.StreamSubmitter``: back-pressure, the one retry policy, the stall watchdog),
and each answer becomes its results line through the one results run (``negt2i.run.output``), in
the order the images were submitted, so the file is the one ``negt2i submit`` writes for the same
images. At most ``in_flight`` images are in flight: ``submit`` returns at once below that bound and
waits only when it is reached, so generation never waits for scoring otherwise.

Transient failures are retried within the run exactly as ``negt2i submit`` retries them (see
``negt2i.run.stream``). What still fails, or is not answered when the stall watchdog stops the run,
gets no line: re-running the same ``negt2i generate`` command sends exactly those (done images
without a results line are submitted again), as does ``negt2i submit OUT``.

An interrupt stops scoring as it stops ``negt2i submit``, through the stream submitter's one stop
(``StreamSubmitter.stop``): ``generate`` calls ``stop`` when Ctrl-C reaches it (and ``close`` when Ctrl-C
comes while it waits for the last answers), so the run ends within seconds, every answered image keeps its
line, and the images still in flight are left for the rerun.

The results file is locked, refused unless new or ours, and resumed by content: an image is skipped only
when its line has the same SHA-256 and prompt; an image that changed on disk since its line was written is
judged again and its line replaced (a generation run rewrites what it regenerates).
"""

from __future__ import annotations

import hashlib
import queue
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from negt2i.generate.registry import GenerateError
from negt2i.run.stream import DEFAULT_ITEM_TIMEOUT_S, INTERRUPTED
from negt2i.transport import DEFAULT_ATTEMPTS

if TYPE_CHECKING:
    from negt2i.client import EvaluatorClient
    from negt2i.run.jobs import Job
    from negt2i.run.output import ResultsRun, Served, SubmitOutcome
    from negt2i.run.stream import Answer, StreamSubmitter
    from negt2i.wire.v1 import evaluator_pb2

_Item = tuple["Job", bytes, str]
"""A submitted image: its job, its bytes and their SHA-256."""


class Scorer:
    """Streams images to the orchestrator at ``target`` and appends their verdicts to ``results``."""

    def __init__(self, target: str, results: str | Path, *, in_flight: int = 8, wait: float = 60.0,
                 attempts: int = DEFAULT_ATTEMPTS, item_timeout: float = DEFAULT_ITEM_TIMEOUT_S) -> None:  # fmt: skip
        if in_flight < 1:
            raise ValueError(f"in_flight must be >= 1, got {in_flight}")
        if attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {attempts}")
        self.attempts = attempts
        self.item_timeout = item_timeout
        self.target = target
        self.results = Path(results)
        self.in_flight = in_flight
        self.wait = wait
        self.done: set[str] = set()
        """File names that had a line when the run started (``submit`` still checks their content)."""
        self.outcome: SubmitOutcome | None = None
        self.submitter: StreamSubmitter[_Item] | None = None
        self._client: EvaluatorClient | None = None
        self._run: ResultsRun | None = None
        self._served: Served | None = None
        self._slots = threading.BoundedSemaphore(in_flight)
        self._queue: queue.Queue[_Item | None] = queue.Queue()
        self._pending: dict[str, Job] = {}
        """Submitted images without their final answer yet."""
        self._lock = threading.Lock()
        self._broken = threading.Event()
        self._thread: threading.Thread | None = None
        self.max_in_flight = 0
        """The most images that were in flight at once (for tests and the summary)."""

    def start(self) -> None:
        """Connect, read the orchestrator's rules and models, open (and resume) the results file."""
        from negt2i.client import ClientError, EvaluatorClient
        from negt2i.core.results import ResultsFileError
        from negt2i.run.output import ResultsRun
        from negt2i.run.remote import served
        from negt2i.run.stream import RetryPolicy, StreamSubmitter

        client = EvaluatorClient(self.target, timeout=None)
        self._client = client
        if not client.wait_ready(self.wait):
            raise GenerateError(f"the orchestrator at {self.target} is not SERVING after {self.wait:.0f} s")
        try:
            info = client.info()
            missing = [s.stage for s in info.stages if not s.model.model]
            if missing:
                raise GenerateError(f"the orchestrator has not reached {', '.join(missing)} yet; retry")
            self._served = served(info)
        except ClientError as exc:
            raise GenerateError(f"orchestrator {self.target}: {exc}") from None
        try:
            self._run = ResultsRun(self.results)
            self._run.check(self._served.config, self._served.models)
        except ResultsFileError as exc:
            if self._run is not None:
                self._run.close()
                self._run = None
            raise GenerateError(str(exc)) from None
        self.done = set(self._run.writer.lines)
        self.outcome = self._run.outcome
        window = min(self.in_flight, int(info.limits.max_in_flight_per_stream) or self.in_flight)
        policy = RetryPolicy(attempts=self.attempts, item_timeout=self.item_timeout)
        self.submitter = StreamSubmitter(client, _prepare, window=window, policy=policy)
        self._thread = threading.Thread(target=self._score, name="negt2i-score", daemon=True)
        self._thread.start()

    def _source(self) -> Iterator[_Item]:
        while (item := self._queue.get()) is not None:
            yield item

    def _score(self) -> None:
        """The scoring thread: the submitter's answers, in submission order, into the results file."""
        from negt2i.core.results import ResultsFileError

        assert self.submitter is not None and self.outcome is not None
        try:
            for answer in self.submitter.run(self._source()):
                self._record(answer)
                self._slots.release()
        except ResultsFileError as exc:  # the results file cannot be written (full disk): stop scoring
            self.outcome.stream_error = str(exc)
            print(f"error: {exc}", file=sys.stderr)
        finally:
            self._broken.set()
            stats = self.submitter.stats
            self.outcome.retried, self.outcome.answers = stats.retried, stats.answers
            if stats.stream_error is not None and self.outcome.stream_error is None:
                self.outcome.stream_error = stats.stream_error
                print(f"warning: scoring stopped: {stats.stream_error}; the rest is left for a rerun", file=sys.stderr)
            with self._lock:
                left = list(self._pending)
                self._pending.clear()
            self.outcome.retry.extend(left)

    def _record(self, answer: Answer[_Item]) -> None:
        from negt2i.run.output import Line, error_line, response_line

        assert self._run is not None and self._served is not None
        job, _, sha256 = answer.item
        if answer.failure is not None:
            self._run.write(Line(error_line(job, answer.failure, self._served.config, self._served.models, sha256)))
        elif answer.left or answer.response is None:
            self._run.leave(job.filename, answer.left if answer.response is not None else None)
        else:
            line = response_line(answer.response, job, self._served, sha256=sha256)
            assert line is not None  # a transient answer is left
            self._run.write(line)
        with self._lock:
            self._pending.pop(job.filename, None)

    def submit(self, job: Job, data: bytes) -> None:
        """Send ``job``'s image; waits only while ``in_flight`` images are unanswered."""
        from negt2i.core.results import ResultsFileError, ResumeKey, prompt_metadata

        assert self.outcome is not None and self._run is not None
        sha256 = hashlib.sha256(data).hexdigest()
        key = ResumeKey(job.filename, sha256, prompt_metadata(job.prompt, job.prompt_id))
        try:  # same image and prompt already judged: skip; changed: its line is replaced
            if not self._run.resume([key], replace_changed=True):
                return
        except ResultsFileError as exc:  # the file cannot be rewritten (full disk)
            raise GenerateError(str(exc)) from None
        while not self._slots.acquire(timeout=0.2):
            if self._broken.is_set():
                break
        if self._broken.is_set():
            self.outcome.retry.append(job.filename)
            return
        with self._lock:
            self._pending[job.filename] = job
            self.max_in_flight = max(self.max_in_flight, len(self._pending))
        self._queue.put((job, data, sha256))

    def pending(self) -> int:
        """Images submitted and not finally answered yet."""
        with self._lock:
            return len(self._pending)

    def status(self) -> str:
        """``scored N, in flight M`` for the progress bar."""
        scored = self.outcome.summary.evaluated if self.outcome is not None else 0
        return f"scored {scored}, in flight {self.pending()}"

    def stop(self, reason: str = INTERRUPTED) -> None:
        """Stop scoring now (an interrupt): nothing more is sent, the images in flight get no line and are left
        for the rerun (``StreamSubmitter.stop``, the stop ``negt2i submit`` uses); ``close`` then returns at once."""
        if self.submitter is not None:
            self.submitter.stop(reason)

    def close(self) -> SubmitOutcome:
        """Wait for the answers still in flight, then close the stream, the results file and the channel.
        Interrupted while it waits (Ctrl-C), it stops scoring (``stop``), closes everything and re-raises."""
        self._queue.put(None)
        try:
            self._join()
        except BaseException:
            self.stop()
            self._join()
            raise
        finally:
            if self._run is not None:
                self._run.finish()
                self._run = None
            if self._client is not None:
                self._client.close()
                self._client = None
        if self.outcome is None:
            from negt2i.run.output import SubmitOutcome, Summary

            self.outcome = SubmitOutcome(Summary())
        return self.outcome

    def _join(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None


def _prepare(item: _Item) -> evaluator_pb2.EvaluateRequest:
    from negt2i.client import make_request

    job, data, _ = item
    return make_request(data, prompt=job.prompt)
