"""``negt2i evaluate``: score a folder of generated images in-process (the embedded main job).

Inputs
------
- **GenEval layout** (a folder): ``ROOT/<prompt>/metadata.jsonl`` holds one prompt
  record (ours or GenEval's; a record without ``id`` takes the folder's name) and
  ``ROOT/<prompt>/samples/*`` the images. Every file under ``samples/`` is a job,
  images or not, so nothing is skipped silently; the sample index is the file
  stem when it is a number (``0003.png`` -> 3; see ``_sample_indices``).
- **Manifest** (a ``.jsonl`` file): one line per image,
  ``{"file": "imgs/a.png", "metadata": {...prompt record...}}`` or
  ``{"file": "imgs/a.png", "prompt_id": "color-pos0_neg1-000"}`` with ``--prompts``
  giving the corpus; optional ``"sample": 0``. Relative paths are relative to the
  manifest's folder.

Jobs run in a stable order (folders, then samples, sorted by name; manifests in
line order). Output is one results line per image, written whole and flushed in
job order by the one results writer (``negt2i.results.ResultsWriter``, also used by
``negt2i submit``): ``--out`` must be new or a results file of ours, and is locked
for the run. A run resumes by content (``ResultsWriter.plan``): an image is skipped
only when its line has the same image SHA-256 and prompt; a changed verdict image
refuses the run unless ``replace_changed``; error lines are judged again when
their input changed or with ``retry_errors``. Images are read once per job
(``read_job``: bytes, SHA-256, the one decoder ``negt2i.images``).

An image that cannot be judged gives an error line whose ``error_kind`` is a
``negt2i.failures.FailureKind`` (``unreadable_image``, ``missing_metadata``,
``invalid_metadata``, ``stage_error``: a stage or the judge failed for that
image) and whose ``error`` is ``"<kind>: <details>"``.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import sys
from collections import Counter, deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Final, TypeVar

from negt2i.config import CURRENT, RuleConfig
from negt2i.failures import Failure, FailureKind
from negt2i.files import open_regular, read_regular
from negt2i.images import ImageError, decode_image
from negt2i.jsonl import JsonError, iter_json_lines, parse_json
from negt2i.metrics.totals import Totals
from negt2i.pipeline import ImageResult, Perceived, Pipeline, Stages
from negt2i.results import ResultsWriter, ResumeKey, error_record, ok_record, prompt_metadata
from negt2i.spec import Prompt, SpecError, parse_prompt, read_prompts
from negt2i.stage_types import Image
from negt2i.verdict import Verdict

_HIDDEN = re.compile(r"^\.")
R = TypeVar("R")


class EvaluateError(RuntimeError):
    """The run cannot start or continue (bad input root, incompatible results file, ...)."""


@dataclass(frozen=True)
class Job:
    """One image to judge: where it is, its results key and its prompt (or why it has none)."""

    filename: str
    """Results key: the path relative to the input root (POSIX separators)."""
    path: Path
    sample: int | None
    prompt: Prompt | None = None
    error: Failure | None = None
    """Why the image has no prompt (metadata missing or invalid)."""
    prompt_id: str | None = None


# --------------------------------------------------------------------------- inputs


def _sample_indices(paths: Sequence[Path]) -> list[int | None]:
    """Sample index of each file of a ``samples/`` folder: the stem when it is a number (``0003.png`` -> 3);
    in a folder without numbered files, the position; otherwise ``None`` (never a number another file has)."""
    numbered = [p.stem.isdigit() for p in paths]
    if not any(numbered):
        return list(range(len(paths)))
    return [int(p.stem) if ok else None for p, ok in zip(paths, numbered, strict=True)]


def _visible(path: Path) -> bool:
    return not _HIDDEN.match(path.name)


def _missing(message: str) -> Failure:
    return Failure(FailureKind.MISSING_METADATA, message)


def _invalid(message: str) -> Failure:
    return Failure(FailureKind.INVALID_METADATA, message)


def _inside(path: Path, real_root: Path) -> bool:
    """Whether ``path`` (symlinks resolved) lies under ``real_root``: image folders are never followed out of
    their root through symlinks."""
    try:
        return path.resolve().is_relative_to(real_root)
    except (OSError, RuntimeError):  # a symlink loop
        return False


def _read_metadata(folder: Path, real_root: Path | None = None) -> tuple[Prompt | None, Failure | None, str | None]:
    """(prompt, error, prompt id) of a GenEval prompt folder."""
    meta = folder / "metadata.jsonl"
    if real_root is not None and meta.exists() and not _inside(meta, real_root):
        return None, _missing(f"{folder.name}/metadata.jsonl is a link out of the image folder"), None
    if not meta.exists():
        return None, _missing(f"{folder.name}/metadata.jsonl not found"), None
    try:
        text = read_regular(meta).decode("utf-8")  # a FIFO is never opened
    except OSError as exc:
        return None, _invalid(f"{folder.name}/metadata.jsonl: cannot be read ({exc.strerror or exc})"), None
    except UnicodeDecodeError as exc:
        return None, _invalid(f"{folder.name}/metadata.jsonl: cannot be read ({exc})"), None
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if len(lines) != 1:
        return (
            None,
            _invalid(f"{folder.name}/metadata.jsonl: expected one JSON record, found {len(lines)}"),
            None,
        )
    try:
        record = parse_json(lines[0])
    except JsonError as exc:  # not JSON, nested too deep, a number of more than 4,300 digits
        return None, _invalid(f"{folder.name}/metadata.jsonl: not valid JSON ({exc})"), None
    pid = record.get("id") if isinstance(record, dict) else None
    try:
        prompt = parse_prompt(record, default_id=folder.name)
    except SpecError as exc:
        return None, _invalid(f"{folder.name}/metadata.jsonl: {exc}"), None if pid is None else str(pid)
    return prompt, None, prompt.id


def geneval_jobs(root: Path, warn: Callable[[str], None] | None = None) -> list[Job]:
    """Jobs of a GenEval-layout folder, in stable order (see the module docstring)."""
    warn = warn or (lambda msg: print(f"warning: {msg}", file=sys.stderr))
    jobs: list[Job] = []
    real_root = root.resolve()
    entries = sorted(p for p in root.iterdir() if _visible(p))
    outside = [p.name for p in entries if not _inside(p, real_root)]
    if outside:
        warn(f"{root}: ignoring links out of the folder: {', '.join(outside[:5])}{' ...' if len(outside) > 5 else ''}")
        entries = [p for p in entries if p.name not in set(outside)]
    stray = [p.name for p in entries if not p.is_dir()]
    if stray:
        warn(f"{root}: ignoring files outside prompt folders: {', '.join(stray[:5])}{' ...' if len(stray) > 5 else ''}")
    empty: list[str] = []
    for folder in (p for p in entries if p.is_dir()):
        samples_dir = folder / "samples"
        samples = sorted(p for p in samples_dir.iterdir() if _visible(p)) if samples_dir.is_dir() else []
        linked = [p for p in samples if not _inside(p, real_root)]
        if linked:
            warn(f"{samples_dir}: ignoring {len(linked)} links out of the image folder (e.g. {linked[0].name})")
            samples = [p for p in samples if p not in set(linked)]
        if not samples:
            empty.append(folder.name)
            continue
        prompt, error, pid = _read_metadata(folder, real_root)
        for path, sample in zip(samples, _sample_indices(samples), strict=True):
            filename = path.relative_to(root).as_posix()
            jobs.append(Job(filename, path, sample, prompt, error, pid))
    folders = len(empty) + len({j.filename.split("/", 1)[0] for j in jobs})
    if not jobs:  # said once, not once per folder (an interrupted generate leaves thousands)
        what = f"none of its {folders} prompt folders has" if folders else "it has no prompt folders with"
        raise EvaluateError(
            f"{root}: no images to evaluate: {what} images under samples/ (GenEval layout: "
            "NNNNN/metadata.jsonl + NNNNN/samples/*.png)"
        )
    if empty:
        shown = ", ".join(empty[:3]) + (" ..." if len(empty) > 3 else "")
        warn(f"{root}: {len(empty)} of {folders} prompt folders have no images under samples/ ({shown})")
    return jobs


def manifest_jobs(manifest: Path, prompts: Mapping[str, Prompt] | None = None) -> list[Job]:
    """Jobs of a JSONL manifest, in line order; a line without ``file`` is a hard error."""
    jobs: list[Job] = []
    base = manifest.parent
    seen: dict[str, int] = {}
    for line in iter_json_lines(manifest):
        lineno, entry = line.lineno, line.value
        if line.error is not None:
            raise EvaluateError(f"{manifest}: line {lineno} is {line.error}")
        if not isinstance(entry, dict) or not isinstance(entry.get("file"), str):
            raise EvaluateError(f'{manifest}: line {lineno} needs a "file" string')
        rel = entry["file"]
        if rel in seen:
            raise EvaluateError(f"{manifest}: line {lineno} repeats file {rel!r} (first on line {seen[rel]})")
        seen[rel] = lineno
        path = Path(rel) if Path(rel).is_absolute() else base / rel
        sample = entry.get("sample")
        if sample is not None and (not isinstance(sample, int) or isinstance(sample, bool)):
            raise EvaluateError(f"{manifest}: line {lineno}: sample must be an integer, got {sample!r}")
        prompt: Prompt | None = None
        error: Failure | None = None
        pid = entry.get("prompt_id")
        if "metadata" in entry:
            try:
                prompt = parse_prompt(entry["metadata"], default_id=str(pid) if pid is not None else None)
                pid = prompt.id
            except SpecError as exc:
                error = _invalid(f"{manifest.name} line {lineno}: {exc}")
        elif pid is not None:
            if prompts is None:
                raise EvaluateError(f"{manifest}: line {lineno} names prompt_id {pid!r}; pass --prompts CORPUS")
            prompt = prompts.get(str(pid))
            if prompt is None:
                error = _missing(f"prompt_id {pid!r} is not in the corpus")
        else:
            error = _missing(f"{manifest.name} line {lineno} has neither metadata nor prompt_id")
        jobs.append(Job(rel, path, sample, prompt, error, None if pid is None else str(pid)))
    return jobs


def discover(images: str | Path, prompts_file: str | Path | None = None) -> list[Job]:
    """Jobs of a GenEval folder or a ``.jsonl`` manifest."""
    root = Path(images)
    prompts = {p.id: p for p in read_prompts(prompts_file)} if prompts_file else None
    if root.is_dir():
        return geneval_jobs(root)
    if root.is_file():
        return manifest_jobs(root, prompts)
    raise EvaluateError(f"{root}: no such folder or manifest file")


# --------------------------------------------------------------------------- results file


def file_sha256(path: Path) -> str | None:
    """SHA-256 (hex) of a file's bytes; ``None`` when it cannot be read or is not a regular file (a FIFO is
    never opened: ``negt2i.files``); the job becomes an error line."""
    h = hashlib.sha256()
    try:
        with open_regular(path) as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    except OSError:
        return None
    return h.hexdigest()


def resume_keys(jobs: Sequence[Job]) -> list[ResumeKey]:
    """What identifies each job's judgement in a results file: file name, image SHA-256, prompt record."""
    return [ResumeKey(job.filename, file_sha256(job.path), prompt_metadata(job.prompt, job.prompt_id)) for job in jobs]


def select_shard(jobs: Sequence[Job], shard: tuple[int, int] | None) -> list[Job]:
    """Jobs ``i`` with ``i % N == I`` for shard ``(I, N)`` (``negt2i evaluate`` and ``negt2i submit``)."""
    if shard is None:
        return list(jobs)
    index, count = shard
    if not 0 <= index < count:
        raise ValueError(f"shard {index}/{count}: need 0 <= I < N")
    return [job for i, job in enumerate(jobs) if i % count == index]


# --------------------------------------------------------------------------- the run


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
        session = f"{self.evaluated} images evaluated ({self.skipped} already done, {self.total} in this run)"
        if self.retried or self.replaced:
            session += f"; {self.retried} error lines and {self.replaced} changed images judged again"
        if self.kept_errors:
            session += f"; {self.kept_errors} error lines kept (--retry-errors judges them again)"
        if self.totals is None:
            if self.totals_error:
                return f"{session}\nresults file: cannot be scored: {self.totals_error}"
            return session
        return f"{session}\nresults file: {self.totals.text()}"


def error_line(
    job: Job, failure: Failure, config: RuleConfig, models: Mapping[str, Any], sha256: str | None = None
) -> dict[str, Any]:
    """The results line of an image that could not be judged (see ``negt2i.results.error_record``)."""
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
    """The results line of a judged image (see ``negt2i.results.ok_record``)."""
    return ok_record(
        verdict,
        filename=job.filename,
        sample=job.sample,
        models=models,
        sha256=sha256,
        metadata=prompt_metadata(job.prompt, job.prompt_id),
    )


@dataclass(frozen=True)
class Loaded:
    """A job's image as read for judging: its file's SHA-256 and pixels, or the error line's reason."""

    sha256: str | None
    data: bytes = b""
    pixels: Image | None = None
    error: Failure | None = None
    prepared: Any = None
    """The detector's preprocessing of the pixels (``Pipeline.prepare_image``), when asked for."""


def read_job(job: Job, *, decode: bool = True, prepare: Callable[[Image], Any] | None = None) -> Loaded:
    """Read ``job``'s file once: hash the bytes and decode them with the one decoder (``negt2i.images``);
    ``prepare`` (``Pipeline.prepare_image``) is applied to the pixels, on the same thread."""
    try:
        data = read_regular(job.path)  # a FIFO, socket or device is an error line, never opened
    except OSError as exc:
        why = f"{job.filename}: cannot read ({exc.strerror or exc})"
        return Loaded(None, error=job.error or Failure(FailureKind.UNREADABLE_IMAGE, why))
    digest = hashlib.sha256(data).hexdigest()
    if job.error is not None:
        return Loaded(digest, error=job.error)
    if job.prompt is None:
        return Loaded(digest, error=_missing("no prompt for this image"))
    try:
        pixels = decode_image(data) if decode else None
    except ImageError as exc:
        return Loaded(digest, error=Failure(FailureKind.UNREADABLE_IMAGE, f"{job.filename}: {exc}"))
    return Loaded(digest, data, pixels, prepared=None if prepare is None or pixels is None else prepare(pixels))


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


@dataclass(frozen=True)
class _Outcome:
    """One job's results line and, with ``--save-perception``, its side-file line; made on a worker thread."""

    record: dict[str, Any]
    perception: dict[str, Any] | None = None


def plan_run(
    writer: ResultsWriter,
    jobs: Sequence[Job],
    config: RuleConfig,
    models: Mapping[str, Any],
    *,
    retry_errors: bool = False,
    replace_changed: bool = False,
) -> tuple[list[Job], Summary]:
    """Check that ``writer``'s file was made with ``config`` and ``models`` and plan the run by content
    (``ResultsWriter.plan``): the jobs to judge, in order, and the run's ``Summary`` so far."""
    writer.check_compatible(config.digest(), config.name, models)
    plan = writer.plan(resume_keys(jobs), retry_errors=retry_errors, replace_changed=replace_changed)
    summary = Summary(
        total=len(jobs),
        skipped=plan.skipped,
        retried=len(plan.retried),
        replaced=len(plan.changed),
        kept_errors=plan.kept_errors,
    )
    return [jobs[i] for i in plan.todo], summary


def finish_summary(summary: Summary, out: str | Path) -> Summary:
    """Fill ``summary.totals`` from the whole results file (the same numbers as ``negt2i report``)."""
    from negt2i.metrics.totals import file_totals

    try:
        summary.totals = file_totals(out)
    except ValueError as exc:  # ResultsFormatError, an image seen twice: what negt2i report would say
        summary.totals_error = str(exc)
    return summary


def _outcome(
    job: Job,
    item: Loaded,
    judge: Callable[[], ImageResult] | None,
    *,
    config: RuleConfig,
    models: Mapping[str, Any],
    side: bool,
) -> _Outcome:
    """Judge one job (``judge``: ``Pipeline.judge`` of its image; None when it was not run) and make its line
    (and, when ``side``, its ``--save-perception`` line)."""
    res = judge() if judge is not None else None
    if item.error is not None or res is None:
        reason = item.error or Failure(FailureKind.STAGE_ERROR, "not run")
        return _Outcome(error_line(job, reason, config, models, item.sha256))
    if res.verdict is not None:
        record = verdict_line(job, res.verdict, models, item.sha256)
        if side and res.perception is not None:
            from negt2i.perception_file import perception_record

            return _Outcome(record, perception_record(job.filename, job.sample, res.verdict, res.perception))
        return _Outcome(record)
    assert res.failure is not None  # an ImageResult has a verdict or a failure
    return _Outcome(error_line(job, res.failure, config, models, item.sha256))


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
    side file (``negt2i.perception_file``), written before the image's results line.
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

    from negt2i.perception_file import PerceptionWriter

    pool: Executor = _Inline() if workers == 0 else ThreadPoolExecutor(workers, thread_name_prefix="negt2i-worker")
    lines: Executor = _Inline() if workers == 0 else ThreadPoolExecutor(1, thread_name_prefix="negt2i-writer")
    try:
        with (
            ResultsWriter(out) as writer,
            contextlib.nullcontext(None) if save_perception is None else PerceptionWriter(save_perception) as side,
        ):
            todo, summary = plan_run(
                writer, selected, config, models, retry_errors=retry_errors, replace_changed=replace_changed
            )
            bar = tqdm(total=len(todo), unit="img", disable=not progress, dynamic_ncols=True, desc="evaluate")
            batches = list(_batches(todo, batch_size))
            reading: deque[list[Future[Loaded]]] = deque()
            writing: deque[Future[None]] = deque()

            broken: list[BaseException] = []

            def write(outcomes: list[Future[_Outcome]]) -> None:
                """On the writer thread, one batch after the other: the batch's lines in job order. After a
                failure nothing more is written, so the file's lines stay a prefix of the job order."""
                if broken:
                    return
                try:
                    write_lines(outcomes)
                except BaseException as exc:
                    broken.append(exc)
                    raise

            def write_lines(outcomes: list[Future[_Outcome]]) -> None:
                for future in outcomes:
                    done = future.result()
                    if side is not None and done.perception is not None:
                        side.write_record(done.perception)
                    record = done.record
                    if record["status"] == "error":
                        summary.errors[str(record["error_kind"])] += 1
                    else:
                        summary.correct += int(record["correct"])
                    writer.write(record)
                    summary.evaluated += 1
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
                        side=side is not None,
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
    return finish_summary(summary, out)
