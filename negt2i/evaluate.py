"""``negt2i evaluate``: score a folder of generated images in-process (the embedded main job), a driver of the
run loop (``negt2i.run``).

The jobs (a GenEval-layout folder or a JSONL manifest, in a stable order) are ``negt2i.run.jobs``'s; the
results run (``negt2i.run.output``: the one results writer, locked for the run; resume by content, where
an image is skipped only when its line has the same image SHA-256 and prompt, a changed verdict image
refuses the run unless ``replace_changed`` and error lines are judged again when their input changed or
with ``retry_errors``; the lines and the tally) is shared with ``negt2i submit`` and ``negt2i generate
--score``. This module runs the in-process pipeline (``negt2i.pipeline``) over the jobs, batch by batch.

An image that cannot be judged gives an error line whose ``error_kind`` is a
``negt2i.core.failures.FailureKind`` (``unreadable_image``, ``missing_metadata``,
``invalid_metadata``, ``stage_error``: a stage or the judge failed for that
image) and whose ``error`` is ``"<kind>: <details>"``.
"""

from __future__ import annotations

import contextlib
import os
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any, Final, TypeVar

from negt2i.core.config import CURRENT, RuleConfig
from negt2i.core.failures import Failure, FailureKind
from negt2i.pipeline import ImageResult, Perceived, Pipeline, Stages
from negt2i.run.jobs import Job, Loaded, read_job
from negt2i.run.output import Line, ResultsRun, Summary, error_line, verdict_line

R = TypeVar("R")


# --------------------------------------------------------------------------- the run


def _batches(jobs: Sequence[Job], size: int) -> Iterator[Sequence[Job]]:
    for start in range(0, len(jobs), size):
        yield jobs[start : start + size]


def default_workers() -> int:
    """``--workers`` default: ``min(4, CPUs)`` (``os.cpu_count``); at least 1."""
    return max(1, min(4, os.cpu_count() or 1))


AHEAD: Final = 2
"""Batches read and decoded ahead of the one the models run on (``evaluate`` with workers)."""


class _Inline(Executor):
    """``workers=0``: every task runs at once on the calling thread (no overlap; the baseline)."""

    def submit(self, fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> Future[R]:
        future: Future[R] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except Exception as exc:
            future.set_exception(exc)
        return future


def _outcome(
    job: Job,
    item: Loaded,
    judge: Callable[[], ImageResult] | None,
    *,
    config: RuleConfig,
    models: Mapping[str, Any],
    side: bool,
) -> Line:
    """Judge one job (``judge``: ``Pipeline.judge`` of its image; None when it was not run) and make its line
    (and, when ``side``, its ``--save-perception`` line)."""
    res = judge() if judge is not None else None
    if item.error is not None or res is None:
        reason = item.error or Failure(FailureKind.STAGE_ERROR, "not run")
        return Line(error_line(job, reason, config, models, item.sha256))
    if res.verdict is not None:
        record = verdict_line(job, res.verdict, models, item.sha256)
        if side and res.perception is not None:
            from negt2i.core.perception_file import perception_record

            return Line(record, perception_record(job.filename, job.sample, res.verdict, res.perception))
        return Line(record)
    assert res.failure is not None  # an ImageResult has a verdict or a failure
    return Line(error_line(job, res.failure, config, models, item.sha256))


def evaluate(
    jobs: Sequence[Job],
    out: str | Path,
    stages: Stages,
    *,
    config: RuleConfig = CURRENT,
    batch_size: int = 8,
    workers: int | None = None,
    limit: int | None = None,
    progress: bool = True,
    retry_errors: bool = False,
    replace_changed: bool = False,
    save_perception: str | Path | None = None,
) -> Summary:
    """Judge ``jobs`` (the first ``limit``) into ``out``, resuming by content; returns the run's summary.

    The run is a pipeline over batches of ``batch_size`` images. The calling thread runs the models:
    the detector on batch k (``Pipeline.detect``), then the segmenter, attribute scorer and depth
    estimator on batch k-1 (``Pipeline.answer``). ``workers`` threads (default ``default_workers()``)
    meanwhile read, hash and decode the images of the next ``AHEAD`` batches, plan batch k
    (``Pipeline.plan``: the detector's answers checked, the other stages' requests made) and judge the
    batches before (``Pipeline.judge``: the rules, and making the results lines); one writer thread
    writes the lines batch after batch, in job order, through the one results writer (each line
    flushed to disk). ``workers=0`` does everything on the calling thread, one step after the other.
    The results file is the same, byte for byte, for every ``workers`` and ``batch_size``. At most
    ``AHEAD + 4`` batches are in memory at once: ``AHEAD`` decoded ahead, one on the detector, one on
    the other stages, at most two being judged or written (the calling thread waits for the older one).

    An exception on the calling thread (Ctrl-C) or from a worker first writes the lines of the batches
    whose models had all run, so an interrupted run keeps every image it judged and resumes from
    there; the batch on the detector and the one planned after it are judged again by the next run.

    ``save_perception``: also append each judged image's detections and refined masks to this
    side file (``negt2i.core.perception_file``), written before the image's results line.
    """
    if batch_size < 1:
        raise ValueError(f"batch size must be >= 1, got {batch_size}")
    workers = default_workers() if workers is None else workers
    if workers < 0:
        raise ValueError(f"workers must be >= 0, got {workers}")
    selected = list(jobs[:limit] if limit is not None else jobs)
    models = stages.models()
    pipeline = Pipeline(stages, config, complete=save_perception is not None)
    from tqdm import tqdm

    pool: Executor = _Inline() if workers == 0 else ThreadPoolExecutor(workers, thread_name_prefix="negt2i-worker")
    lines: Executor = _Inline() if workers == 0 else ThreadPoolExecutor(1, thread_name_prefix="negt2i-writer")
    try:
        with ResultsRun(out, save_perception=save_perception) as run:
            todo = run.plan(selected, config, models, retry_errors=retry_errors, replace_changed=replace_changed)
            bar = tqdm(total=len(todo), unit="img", disable=not progress, dynamic_ncols=True, desc="evaluate")
            batches = list(_batches(todo, batch_size))
            reading: deque[list[Future[Loaded]]] = deque()
            writing: deque[Future[None]] = deque()

            broken: list[BaseException] = []

            def write(outcomes: list[Future[Line]]) -> None:
                """On the writer thread, one batch after the other: the batch's lines in job order. After a
                failure nothing more is written, so the file's lines stay a prefix of the job order."""
                if broken:
                    return
                try:
                    write_lines(outcomes)
                except BaseException as exc:
                    broken.append(exc)
                    raise

            def write_lines(outcomes: list[Future[Line]]) -> None:
                for future in outcomes:
                    run.write(future.result())
                bar.update(len(outcomes))

            def answer_and_judge(batch: Sequence[Job], loaded: list[Loaded], perceived: Perceived) -> None:
                """The batch's other stages on this thread, then its rules on the workers, its lines on the
                writer; waits for the oldest batch's lines when two are being written."""
                pipeline.answer(perceived)
                ready = [i for i, item in enumerate(loaded) if item.pixels is not None]
                judges = dict(zip(ready, range(len(ready)), strict=True))
                outcomes = [
                    pool.submit(
                        _outcome,
                        job,
                        loaded[i],
                        None if i not in judges else partial(pipeline.judge, perceived, judges[i]),
                        config=config,
                        models=models,
                        side=save_perception is not None,
                    )
                    for i, job in enumerate(batch)
                ]
                writing.append(lines.submit(write, outcomes))
                while len(writing) > 1 and (writing[0].done() or len(writing) > 2):
                    writing.popleft().result()

            try:
                previous: tuple[Sequence[Job], list[Loaded], Perceived, Future[None]] | None = None
                for k, batch in enumerate(batches):
                    for ahead in batches[k + len(reading) : k + 1 + AHEAD]:
                        reading.append([pool.submit(read_job, job, prepare=pipeline.prepare_image) for job in ahead])
                    loaded = [future.result() for future in reading.popleft()]
                    ready = [i for i, item in enumerate(loaded) if item.pixels is not None]
                    prompts = [batch[i].prompt for i in ready]
                    pixels = [loaded[i].pixels for i in ready]
                    prepared = [loaded[i].prepared for i in ready]
                    perceived = pipeline.detect(prompts, pixels, prepared)  # type: ignore[arg-type]  # both filtered
                    planning = pool.submit(pipeline.plan, perceived)
                    if previous is not None:  # the batch before: planned on a worker meanwhile
                        previous[3].result()
                        answer_and_judge(*previous[:3])
                    previous = (batch, loaded, perceived, planning)
                if previous is not None:
                    previous[3].result()
                    answer_and_judge(*previous[:3])
                while writing:
                    writing.popleft().result()
            except BaseException:
                with contextlib.suppress(Exception):  # keep what the models finished; the first error wins
                    while writing:
                        writing.popleft().result()
                raise
            finally:
                bar.close()
    finally:
        lines.shutdown(wait=True, cancel_futures=True)
        pool.shutdown(wait=True, cancel_futures=True)
    return run.finish()
