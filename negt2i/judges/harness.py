"""The one judge run loop: ask a judge the question file's questions about a folder of images, write a judge
file (``negt2i judges run``; format in ``docs/agreement.md``).

Inputs: a question file (``negt2i questions``), the images, a judge and a mode. The images are a labelling
task folder (``negt2i labels export``: exactly the sampled images, under the keys the labels use, the way to
judge a study's images) or any folder in the GenEval layout (or a JSONL manifest) as ``negt2i evaluate``
reads them: the prompt of each image comes from its ``metadata.jsonl``. Every image's prompt must be in the
question file with the same ``prompt_sha256`` (a question file made from another corpus version is refused
before the model loads).

Output, JSONL, appended to (never rewritten):

- one run header per run, ``{"negt2i": "judge-run/1", "run": ID, "judge", "mode", "model", "revision",
  "load_seconds", "batch_size", "device", "dtype", "params", "questions": {"path", "sha256"}, ...}``;
- one row per answered question: ``{"judge", "mode", "image", "element", "p_yes", "p_no", "seconds",
  "gpu_gib", "rss_gib", "params", "image_sha256", "run"}`` (VQA judges) or ``... "element": "prompt",
  "score": S ...`` (score judges, ``--mode score``).

Cost protocol (Appendix B.4): ``seconds`` is the wall time of the forward pass that answered the question
(CUDA synchronised), divided by the batch size (default batch 1, as the paper); model loading is timed
apart (``load_seconds``); ``gpu_gib`` is ``torch.cuda.max_memory_allocated`` so far in GiB (weights
included; null off CUDA); ``rss_gib`` the peak resident set size of the process.

Resume: rows already in ``--out`` are kept and their (image, element) pairs skipped; a torn last line (a run
killed mid-write) is cut. A file with rows of another judge or mode, or that is not a judge file, is refused
and never modified. An image whose bytes changed since it was judged (``image_sha256``) is an error: its
old answers would mix with new ones.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from negt2i import __version__
from negt2i.judges.base import SCORE_MODE, VQA_MODES, JudgeInfo, ScoreJudge, VQAJudge, params_label

if TYPE_CHECKING:
    from PIL import Image as PILImage

RUN_FORMAT: Final = "judge-run/1"


class JudgeRunError(ValueError):
    """The run cannot start or continue; the message names the file and what to do."""


class OutFileRefused(JudgeRunError):
    """``--out`` exists and is not this judge's file in this mode: it is left untouched."""


@dataclass(frozen=True)
class Task:
    """One question to ask: image key, element, text (the prompt for score judges)."""

    image: str
    element: str
    text: str
    path: Path
    sha256: str


@dataclass
class RunSummary:
    judge: str
    mode: str
    images: int = 0
    asked: int = 0
    skipped: int = 0
    """Questions already answered in ``--out`` (resume)."""
    failed_images: list[str] = field(default_factory=list)
    load_seconds: float | None = None
    seconds: list[float] = field(default_factory=list)
    gpu_gib: float | None = None

    @property
    def s_per_question(self) -> float | None:
        return sum(self.seconds) / len(self.seconds) if self.seconds else None


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def plan_tasks(
    questions_path: str | Path,
    images: str | Path,
    mode: str,
    *,
    shard: tuple[int, int] | None = None,
    limit: int | None = None,
    prefix: str = "",
    warn: Callable[[str], None] | None = None,
) -> tuple[list[Task], int]:
    """The questions to ask in ``mode`` about the images (in image order, an image's questions together),
    and the number of images. Raises ``JudgeRunError`` for a question file that lacks an image's prompt or
    was made from another corpus version."""
    from negt2i.annotation.questions import QuestionsError, check_questions, read_questions
    from negt2i.run.jobs import EvaluateError, discover, select_shard

    warn = warn or (lambda m: print(f"warning: {m}", file=sys.stderr))
    if mode not in (*VQA_MODES, SCORE_MODE):
        raise JudgeRunError(f"--mode must be one of {', '.join((*VQA_MODES, SCORE_MODE))}, got {mode!r}")
    if (Path(images) / "task.json").is_file():
        return _task_tasks(questions_path, Path(images), mode, shard=shard, limit=limit)
    try:
        questions = read_questions(questions_path)
        jobs = select_shard(discover(images), shard)
    except (QuestionsError, EvaluateError) as exc:
        raise JudgeRunError(str(exc)) from None
    without = [j for j in jobs if j.prompt is None]
    if without:
        reason = without[0].error.message if without[0].error else "no prompt"
        warn(f"{len(without)} images have no prompt and are skipped, e.g. {without[0].filename} ({reason})")
    jobs = [j for j in jobs if j.prompt is not None]
    if limit is not None:
        jobs = jobs[:limit]
    if not jobs:
        raise JudgeRunError(f"{images}: no images with a prompt to judge")
    try:
        check_questions(questions, [j.prompt for j in jobs if j.prompt is not None], str(images))
    except QuestionsError as exc:
        raise JudgeRunError(str(exc)) from None
    tasks: list[Task] = []
    for job in jobs:
        assert job.prompt is not None
        pq = questions[job.prompt.id]
        key = f"{prefix}{job.filename}"
        try:
            digest = file_sha256(job.path)
        except OSError as exc:
            raise JudgeRunError(f"{job.path}: cannot read ({exc.strerror or exc})") from None
        tasks += _questions_of(pq, mode, key, job.path, digest)
    return tasks, len(jobs)


def _questions_of(pq: Any, mode: str, image: str, path: Path, digest: str) -> list[Task]:
    if mode == SCORE_MODE:
        return [Task(image, "prompt", pq.prompt, path, digest)]
    return [Task(image, q.element, q.modes[mode][0], path, digest) for q in pq.questions if mode in q.modes]


def _task_tasks(
    questions_path: str | Path, task_dir: Path, mode: str, *, shard: tuple[int, int] | None, limit: int | None
) -> tuple[list[Task], int]:
    """The questions about a labelling task's images (``negt2i labels export``), keyed as its labels are."""
    from negt2i.annotation.questions import QuestionsError, read_questions
    from negt2i.annotation.task import TaskError, read_task

    try:
        task = read_task(task_dir)
        questions = read_questions(questions_path)
    except (TaskError, QuestionsError) as exc:
        raise JudgeRunError(str(exc)) from None
    items = list(task["items"])
    if shard is not None:
        items = [it for i, it in enumerate(items) if i % shard[1] == shard[0]]
    items = items[:limit] if limit is not None else items
    if not items:
        raise JudgeRunError(f"{task_dir}: no task images to judge")
    tasks: list[Task] = []
    for item in items:
        pq = questions.get(str(item["prompt_id"]))
        if pq is None:
            raise JudgeRunError(f"the question file has no questions for prompt {item['prompt_id']} (from {task_dir})")
        if pq.prompt_sha256 != item["prompt_sha256"]:
            raise JudgeRunError(
                f"{pq.where}: prompt {item['prompt_id']} differs from the one in {task_dir} (prompt_sha256 "
                f"{pq.prompt_sha256[:12]} vs {str(item['prompt_sha256'])[:12]}): the question file was made from "
                "another corpus version; run `negt2i questions` on the prompts the images were generated from"
            )
        path = task_dir / str(item["file"])
        try:
            digest = file_sha256(path)
        except OSError as exc:
            raise JudgeRunError(f"{path}: cannot read ({exc.strerror or exc})") from None
        tasks += _questions_of(pq, mode, str(item["image"]), path, digest)
    return tasks, len(items)


# --------------------------------------------------------------------------- the judge file


class JudgeFile:
    """``--out``: the rows already there (for resume), then appending; refuses files that are not ours."""

    def __init__(self, path: str | Path, judge: str, mode: str) -> None:
        self.path = Path(path)
        self.judge, self.mode = judge, mode
        self.done: dict[tuple[str, str], str] = {}
        """(image, element) -> image_sha256 of the rows already written."""
        self.rows = 0
        if self.path.exists():
            self._load()

    def _load(self) -> None:
        if not self.path.is_file():
            raise OutFileRefused(f"--out {self.path}: not a regular file")
        data = self.path.read_bytes()
        lines = data.split(b"\n")
        torn = b""
        if lines and lines[-1] == b"":
            lines.pop()
        elif lines:  # no final newline: the last line may be cut short by a killed run
            torn = lines.pop()
        for n, raw in enumerate(lines, start=1):
            if not raw.strip():
                continue
            self._take(raw, n)
        if torn:
            try:
                self._take(torn, len(lines) + 1)
                with self.path.open("ab") as fh:
                    fh.write(b"\n")
            except OutFileRefused:
                if self.rows == 0:
                    raise
                print(f"warning: {self.path}: cut a torn last line (a killed run)", file=sys.stderr)
                with self.path.open("r+b") as fh:
                    fh.truncate(len(data) - len(torn))

    def _take(self, raw: bytes, n: int) -> None:
        where = f"{self.path}:{n}"
        try:
            rec = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise OutFileRefused(
                f"--out {self.path} is not a judge file (line {n} is not JSON); it is left as it is: choose another "
                "--out"
            ) from None
        if not isinstance(rec, dict):
            raise OutFileRefused(f"--out {where}: not a judge file line; it is left as it is: choose another --out")
        if rec.get("negt2i") == RUN_FORMAT or {"judge", "mode", "image", "element"} <= rec.keys():
            if rec.get("judge") != self.judge or rec.get("mode") != self.mode:
                raise OutFileRefused(
                    f"--out {where} holds answers of {rec.get('judge')} in mode {rec.get('mode')}, not of "
                    f"{self.judge} in mode {self.mode}: one file per judge and mode (choose another --out)"
                )
            if rec.get("negt2i") != RUN_FORMAT:
                self.done[(str(rec["image"]), str(rec["element"]))] = str(rec.get("image_sha256", ""))
                self.rows += 1
            return
        raise OutFileRefused(f"--out {where}: not a judge file line; it is left as it is: choose another --out")

    def check_unchanged(self, tasks: Sequence[Task]) -> None:
        for t in tasks:
            old = self.done.get((t.image, t.element))
            if old and old != t.sha256:
                raise JudgeRunError(
                    f"{t.path}: the image changed since {self.path} answered it "
                    f"(sha256 {old[:12]} -> {t.sha256[:12]}); its old answers would mix with new ones: "
                    "write to another --out"
                )

    def append(self, records: Sequence[dict[str, Any]]) -> None:
        with self.path.open("a", encoding="utf-8") as fh:
            for rec in records:
                fh.write(json.dumps(rec, ensure_ascii=False, allow_nan=False) + "\n")
            fh.flush()
            os.fsync(fh.fileno())


# --------------------------------------------------------------------------- the run


def _batches(tasks: Sequence[Task], size: int) -> Iterator[Sequence[Task]]:
    for start in range(0, len(tasks), size):
        yield tasks[start : start + size]


class _Images:
    """Decoded images by path, the last ``keep`` kept (an image's questions are consecutive; a 4096 px image
    decodes to 48 MiB, so the cache stays under ~0.4 GiB)."""

    def __init__(self, keep: int = 8) -> None:
        self.keep = keep
        self.cache: dict[Path, PILImage.Image] = {}

    def get(self, path: Path) -> PILImage.Image:
        from PIL import Image as PILImage

        from negt2i.core.images import load_image

        if path not in self.cache:
            if len(self.cache) >= self.keep:
                self.cache.pop(next(iter(self.cache)))
            self.cache[path] = PILImage.fromarray(load_image(path))
        return self.cache[path]


def run_judge(
    judge_name: str,
    mode: str,
    questions: str | Path,
    images: str | Path,
    out: str | Path,
    *,
    batch_size: int = 1,
    device: str = "auto",
    dtype: str = "auto",
    weights_dir: str | Path | None = None,
    random_init: bool = False,
    shard: tuple[int, int] | None = None,
    limit: int | None = None,
    prefix: str = "",
    label: str | None = None,
    progress: bool = True,
    build: Callable[..., VQAJudge | ScoreJudge] | None = None,
    log: Callable[[str], None] = print,
) -> RunSummary:
    """Run one judge in one mode over the images (see the module docstring); returns what it did."""
    from negt2i.core.images import ImageError
    from negt2i.judges import registry
    from negt2i.judges._torch import peak_gpu_gib, peak_rss_gib, synchronize

    if batch_size < 1:
        raise JudgeRunError(f"--batch-size must be at least 1, got {batch_size}")
    row = registry.backend(judge_name)
    if (row.kind == "score") != (mode == SCORE_MODE):
        want = "--mode score" if row.kind == "score" else f"--mode {' | '.join(VQA_MODES)}"
        raise JudgeRunError(f"{judge_name} is a {row.kind} judge: use {want}, not --mode {mode}")
    name = label or (row.label + ("-random" if random_init else ""))
    tasks, n_images = plan_tasks(questions, images, mode, shard=shard, limit=limit, prefix=prefix)
    jf = JudgeFile(out, name, mode)
    jf.check_unchanged(tasks)
    todo = [t for t in tasks if (t.image, t.element) not in jf.done]
    summary = RunSummary(name, mode, images=n_images, skipped=len(tasks) - len(todo))
    if not todo:
        log(f"{name} ({mode}): all {len(tasks)} questions of {n_images} images already answered in {out}")
        return summary
    if not random_init and row.weights:
        from negt2i import weights

        weights.require(row.weight_entries(), weights_dir)  # one clear message before anything loads
    t0 = time.perf_counter()
    judge = (build or registry.create)(
        judge_name, device=device, weights_dir=weights_dir, dtype=dtype, random_init=random_init
    )
    info: JudgeInfo = judge.info
    import torch

    dev = torch.device(info.device)
    synchronize(dev)
    summary.load_seconds = time.perf_counter() - t0
    run_id = uuid.uuid4().hex[:12]
    header = {
        "negt2i": RUN_FORMAT,
        "run": run_id,
        "judge": name,
        "mode": mode,
        "backend": judge_name,
        **{k: v for k, v in info.to_json().items() if k != "judge"},
        "params_label": params_label(info.params),
        "load_seconds": round(summary.load_seconds, 4),
        "batch_size": batch_size,
        "questions": {"path": str(questions), "sha256": file_sha256(Path(questions))},
        "images": str(images),
        "shard": list(shard) if shard else None,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "negt2i_version": __version__,
    }
    jf.append([header])
    log(
        f"{name} ({mode}): {info.model} {info.revision} on {info.device} ({info.dtype}), loaded in "
        f"{summary.load_seconds:.1f} s; {len(todo)} questions to ask ({summary.skipped} already answered)"
    )
    from tqdm import tqdm

    cache = _Images()
    bar = tqdm(total=len(todo), unit="q", desc=name, disable=not progress, file=sys.stderr)
    failed: set[str] = set()
    with bar:
        for batch in _batches(todo, batch_size):
            items: list[tuple[PILImage.Image, str]] = []
            kept: list[Task] = []
            for t in batch:
                if t.image in failed:
                    continue
                try:
                    items.append((cache.get(t.path), t.text))
                    kept.append(t)
                except (ImageError, OSError) as exc:
                    failed.add(t.image)
                    print(f"warning: {t.image}: cannot be read, skipped ({exc})", file=sys.stderr)
            bar.update(len(batch) - len(kept))
            if not kept:
                continue
            synchronize(dev)
            start = time.perf_counter()
            if info.kind == "vqa":
                answers: list[dict[str, Any]] = [
                    {"p_yes": round(y, 6), "p_no": round(n, 6)}
                    for y, n in judge.answer_batch(items)  # type: ignore[union-attr]
                ]
            else:
                answers = [{"score": s} for s in judge.score_batch(items)]  # type: ignore[union-attr]
            synchronize(dev)
            per_q = (time.perf_counter() - start) / len(kept)
            gib = peak_gpu_gib(dev)
            rss = peak_rss_gib()
            summary.seconds += [per_q] * len(kept)
            summary.gpu_gib = gib
            jf.append(
                [
                    {
                        "judge": name,
                        "mode": mode,
                        "image": t.image,
                        "element": t.element,
                        **ans,
                        "seconds": round(per_q, 6),
                        "gpu_gib": None if gib is None else round(gib, 4),
                        "rss_gib": round(rss, 4),
                        "params": params_label(info.params),
                        "image_sha256": t.sha256,
                        "run": run_id,
                    }
                    for t, ans in zip(kept, answers, strict=True)
                ]
            )
            summary.asked += len(kept)
            bar.update(len(kept))
    summary.failed_images = sorted(failed)
    return summary
