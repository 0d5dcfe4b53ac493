"""The results run: the one place where a results line is made, and the one tally.

A run (``negt2i evaluate``, ``negt2i submit``, ``negt2i generate --score``) opens a ``ResultsRun``
on its ``--out``: the one results writer (``negt2i.core.results.ResultsWriter``: locked for the run,
refused unless new or ours) and, with ``--save-perception``, the side file
(``negt2i.core.perception_file``). ``ResultsRun.plan`` checks that the file was made with the run's rule
config and models and plans the run by content (``ResultsWriter.plan``: an image is skipped only
when its line has the same image SHA-256 and prompt). Each judged job then becomes one ``Line``:

- ``verdict_line`` / ``error_line``: the line of a verdict judged in-process, or of an image that
  could not be judged (its ``negt2i.core.failures.Failure``);
- ``response_line``: the line of an orchestrator's stream answer (its verdict, or its ``ItemError``),
  ``None`` when the answer is transient (``negt2i.run.stream.transient``): no line, a rerun judges it.

``ResultsRun.write`` writes a line (its side-file line first) and counts it in the run's ``Summary``:
the only tally. ``ResultsRun.leave`` records an image left for a rerun (``SubmitOutcome.retry``).
``ResultsRun.finish`` closes the files and fills the summary's totals from the whole results file
(the numbers ``negt2i report`` prints).
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from negt2i.core.config import RuleConfig
from negt2i.core.failures import Failure
from negt2i.core.results import ResultsWriter, ResumeKey, error_record, ok_record, prompt_metadata
from negt2i.core.verdict import Verdict
from negt2i.metrics.totals import Totals, plural
from negt2i.run.jobs import Job, resume_keys

if TYPE_CHECKING:
    from negt2i.core.perception_file import PerceptionWriter
    from negt2i.wire.v1 import evaluator_pb2


@dataclass
class Summary:
    """What a run did, and the totals of the whole results file after it (``negt2i.metrics.totals``)."""

    total: int = 0
    skipped: int = 0
    evaluated: int = 0
    correct: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    retried: int = 0
    """Error lines judged again (``--retry-errors``, or their image / prompt changed)."""
    replaced: int = 0
    """Verdicts of changed images judged again (``--replace-changed``)."""
    kept_errors: int = 0
    """Error lines left as they were (same image and prompt)."""
    totals: Totals | None = None
    totals_error: str | None = None
    """Why the file's totals could not be computed (``negt2i report`` would refuse the file too)."""

    @property
    def judged(self) -> int:
        return self.evaluated - sum(self.errors.values())

    def text(self) -> str:
        """The session line, then the file's totals line (identical to ``negt2i report``'s)."""
        session = f"{plural(self.evaluated, 'image')} evaluated ({self.skipped} already done, {self.total} in this run)"
        if self.retried or self.replaced:
            again = f"{plural(self.retried, 'error line')} and {plural(self.replaced, 'changed image')}"
            session += f"; {again} judged again"
        if self.kept_errors:
            them = "it" if self.kept_errors == 1 else "them"
            session += f"; {plural(self.kept_errors, 'error line')} kept (--retry-errors judges {them} again)"
        if self.totals is None:
            if self.totals_error:
                return f"{session}\nresults file: cannot be scored: {self.totals_error}"
            return session
        return f"{session}\nresults file: {self.totals.text()}"


@dataclass
class SubmitOutcome:
    """What a streaming run (``negt2i submit``, ``negt2i generate --score``) did: the evaluate-style summary
    plus the items left for a rerun and the stream's retry figures (``negt2i.run.stream.StreamStats``)."""

    summary: Summary
    retry: list[str] = field(default_factory=list)
    """Filenames that failed transiently or were never answered (no line written; a rerun judges them)."""
    stream_error: str | None = None
    """Why the stream itself ended early, if it did."""
    retried: int = 0
    """Sends repeated after a retryable answer (of an item, or of a failed stream's items)."""
    answers: int = 0
    """Responses received (retried ones included)."""


# --------------------------------------------------------------------------- lines


@dataclass(frozen=True)
class Line:
    """One job's results line and, with ``--save-perception``, its side-file line (written first)."""

    record: dict[str, Any]
    perception: dict[str, Any] | None = None


def error_line(
    job: Job, failure: Failure, config: RuleConfig, models: Mapping[str, Any], sha256: str | None = None
) -> dict[str, Any]:
    """The results line of an image that could not be judged (see ``negt2i.core.results.error_record``)."""
    p = job.prompt
    return error_record(
        filename=job.filename,
        error=failure.line(),
        error_kind=failure.kind.value,
        prompt_id=p.id if p else job.prompt_id,
        sample=job.sample,
        tag=p.tag if p else "",
        prompt=p.prompt if p else "",
        category=p.category.value if p and p.category else None,
        setting=p.setting if p else None,
        config=config.record(),
        models=models,
        sha256=sha256,
        metadata=prompt_metadata(p, job.prompt_id),
    )


def verdict_line(job: Job, verdict: Verdict, models: Mapping[str, Any], sha256: str | None) -> dict[str, Any]:
    """The results line of a judged image (see ``negt2i.core.results.ok_record``)."""
    return ok_record(
        verdict,
        filename=job.filename,
        sample=job.sample,
        models=models,
        sha256=sha256,
        metadata=prompt_metadata(job.prompt, job.prompt_id),
    )


@dataclass(frozen=True)
class Served:
    """What an orchestrator's ``ServiceInfo`` says about the lines it makes: the rule config and the models and
    services of the stages it has reached (``negt2i.run.remote.served``)."""

    config: RuleConfig
    models: dict[str, Any]
    services: dict[str, str]


def response_line(
    resp: evaluator_pb2.EvaluateStreamResponse,
    job: Job,
    served: Served,
    *,
    sha256: str | None = None,
    perception: bool = False,
) -> Line | None:
    """The results line of one final stream answer; ``None`` when the answer is transient (no line: a rerun
    judges it; ``negt2i.run.stream.transient``). ``perception``: make the side-file line too when the answer
    carries the perception."""
    from negt2i.run.stream import transient
    from negt2i.wire import adapter

    if resp.HasField("result"):
        verdict = adapter.verdict_from_proto(resp.result.verdict)
        models = adapter.models_record(list(resp.result.stages))  # the models that actually served this item
        record = verdict_line(job, verdict, {**served.models, **models}, sha256)
        record["services"] = adapter.services_record(list(resp.result.stages)) or served.services
        side = None
        if perception and resp.result.HasField("perception"):
            from negt2i.core.perception_file import perception_record

            seen = resp.result.perception
            side = perception_record(job.filename, job.sample, verdict, adapter.perception_from_proto(seen),
                                     used_depth=seen.used_depth)  # fmt: skip
        return Line(record, side)
    if transient(resp.error):
        return None
    return Line(error_line(job, adapter.failure_from_proto(resp.error), served.config, served.models, sha256))


# --------------------------------------------------------------------------- the run


class ResultsRun:
    """One run's results file (and side file): resume plan, lines in job order, the one tally.

    Opening it locks ``out`` (``ResultsWriter``) before anything is judged or sent; use it as a context
    manager, or call ``finish`` (which also closes)."""

    def __init__(self, out: str | Path, *, save_perception: str | Path | None = None) -> None:
        self.out = Path(out)
        self.writer = ResultsWriter(out)
        self.side: PerceptionWriter | None = None
        try:
            if save_perception is not None:
                from negt2i.core.perception_file import PerceptionWriter

                self.side = PerceptionWriter(save_perception)
        except BaseException:
            self.writer.close()
            raise
        self._lock = threading.Lock()
        """``write`` and ``resume`` may run on different threads (``negt2i generate --score``)."""
        self.summary = Summary()
        self.outcome = SubmitOutcome(self.summary)
        """The streaming drivers' outcome (``summary`` is this run's summary)."""

    def __enter__(self) -> ResultsRun:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def check(self, config: RuleConfig, models: Mapping[str, Any]) -> None:
        """Refuse a results file made with another rule config or other models (``ResultsFileError``)."""
        self.writer.check_compatible(config.digest(), config.name, models)

    def plan(
        self,
        jobs: Sequence[Job],
        config: RuleConfig,
        models: Mapping[str, Any],
        *,
        retry_errors: bool = False,
        replace_changed: bool = False,
    ) -> list[Job]:
        """Check the file (``check``) and plan the run by content (``ResultsWriter.plan``): the jobs to judge,
        in order; the summary counts the rest."""
        self.check(config, models)
        todo = self.resume(resume_keys(jobs), retry_errors=retry_errors, replace_changed=replace_changed)
        return [jobs[i] for i in todo]

    def resume(
        self, keys: Sequence[ResumeKey], *, retry_errors: bool = False, replace_changed: bool = False
    ) -> list[int]:
        """Plan ``keys`` by content (``ResultsWriter.plan``) and count them: the positions to judge. A run that
        learns its jobs one by one (``negt2i generate --score``) calls this per job, after ``check``."""
        with self._lock:
            plan = self.writer.plan(keys, retry_errors=retry_errors, replace_changed=replace_changed)
            s = self.summary
            s.total += len(keys)
            s.skipped += plan.skipped
            s.retried += len(plan.retried)
            s.replaced += len(plan.changed)
            s.kept_errors += plan.kept_errors
            return list(plan.todo)

    def write(self, line: Line) -> None:
        """Write one line (its side-file line first) and count it."""
        record = line.record
        with self._lock:
            if self.side is not None and line.perception is not None:
                self.side.write_record(line.perception)
            self.writer.write(record)
            if record["status"] == "error":
                self.summary.errors[str(record["error_kind"])] += 1
            else:
                self.summary.correct += int(record["correct"])
            self.summary.evaluated += 1

    def leave(self, filename: str, why: str | None = None) -> None:
        """Record an image left for a rerun (no line); ``why``: warn with the reason (a transient answer)."""
        self.outcome.retry.append(filename)
        if why:
            import sys

            print(f"warning: {filename}: {why} (left for a rerun)", file=sys.stderr)

    def close(self) -> None:
        with contextlib.ExitStack() as stack:
            if self.side is not None:
                stack.callback(self.side.close)
            stack.callback(self.writer.close)

    def finish(self) -> Summary:
        """Close the files and fill ``summary.totals`` from the whole results file (``finish_summary``)."""
        self.close()
        return finish_summary(self.summary, self.out)


def finish_summary(summary: Summary, out: str | Path) -> Summary:
    """Fill ``summary.totals`` from the whole results file (the same numbers as ``negt2i report``)."""
    from negt2i.metrics.totals import file_totals

    try:
        summary.totals = file_totals(out)
    except ValueError as exc:  # ResultsFormatError, an image seen twice: what negt2i report would say
        summary.totals_error = str(exc)
    return summary
