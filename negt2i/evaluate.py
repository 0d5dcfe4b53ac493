"""``negt2i evaluate``: score a folder of generated images in-process (the embedded main job).

Inputs
------
- **GenEval layout** (a folder): ``ROOT/<prompt>/metadata.jsonl`` holds one prompt
  record (ours or GenEval's; a record without ``id`` takes the folder's name) and
  ``ROOT/<prompt>/samples/*`` the images. Every file under ``samples/`` is a job,
  images or not, so nothing is skipped silently; the sample index is the file
  stem when it is a number (``0003.png`` -> 3).
- **Manifest** (a ``.jsonl`` file): one line per image,
  ``{"file": "imgs/a.png", "metadata": {...prompt record...}}`` or
  ``{"file": "imgs/a.png", "prompt_id": "color-pos0_neg1-000"}`` with ``--prompts``
  giving the corpus; optional ``"sample": 0``. Relative paths are relative to the
  manifest's folder.

Jobs run in a stable order (folders, then samples, sorted by name; manifests in
line order). Output is one results line per image (``negt2i.results``), written
whole and flushed in job order. A run resumes: images already in the output file
are skipped, a torn last line left by a crash is cut off, and a file written with
another rule config or other models is refused rather than mixed.

An image that cannot be judged gives an error line whose ``error`` starts with
its kind: ``unreadable_image``, ``missing_metadata``, ``invalid_metadata``,
``stage_error`` (a stage or the judge failed for that image).
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TextIO

import numpy as np

from negt2i.config import CURRENT, RuleConfig
from negt2i.jsonl import iter_json_lines
from negt2i.pipeline import Pipeline, Stages
from negt2i.results import error_record, ok_record, write_line
from negt2i.spec import Prompt, SpecError, parse_prompt, read_prompts
from negt2i.stages.base import Image

ERROR_KINDS: Final[tuple[str, ...]] = ("unreadable_image", "missing_metadata", "invalid_metadata", "stage_error")
"""Kinds of error lines, the first word of their ``error`` field."""

_HIDDEN = re.compile(r"^\.")


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
    error: str | None = None
    """``kind: message`` when the image's metadata is missing or invalid."""
    prompt_id: str | None = None


# --------------------------------------------------------------------------- inputs


def _sample_index(path: Path, position: int) -> int:
    return int(path.stem) if path.stem.isdigit() else position


def _visible(path: Path) -> bool:
    return not _HIDDEN.match(path.name)


def _inside(path: Path, real_root: Path) -> bool:
    """Whether ``path`` (symlinks resolved) lies under ``real_root``: image folders are never followed out of
    their root through symlinks."""
    try:
        return path.resolve().is_relative_to(real_root)
    except (OSError, RuntimeError):  # a symlink loop
        return False


def _read_metadata(folder: Path, real_root: Path | None = None) -> tuple[Prompt | None, str | None, str | None]:
    """(prompt, error, prompt id) of a GenEval prompt folder."""
    meta = folder / "metadata.jsonl"
    if real_root is not None and meta.exists() and not _inside(meta, real_root):
        return None, f"missing_metadata: {folder.name}/metadata.jsonl is a link out of the image folder", None
    if not meta.is_file():
        return None, f"missing_metadata: {folder.name}/metadata.jsonl not found", None
    try:
        lines = [ln for ln in meta.read_text(encoding="utf-8").splitlines() if ln.strip()]
    except (OSError, UnicodeDecodeError) as exc:
        return None, f"invalid_metadata: {folder.name}/metadata.jsonl: cannot be read ({exc})", None
    if len(lines) != 1:
        return (
            None,
            f"invalid_metadata: {folder.name}/metadata.jsonl: expected one JSON record, found {len(lines)}",
            None,
        )
    try:
        record = json.loads(lines[0])
    except json.JSONDecodeError as exc:
        return None, f"invalid_metadata: {folder.name}/metadata.jsonl: not valid JSON ({exc.msg})", None
    pid = record.get("id") if isinstance(record, dict) else None
    try:
        prompt = parse_prompt(record, default_id=folder.name)
    except SpecError as exc:
        return None, f"invalid_metadata: {folder.name}/metadata.jsonl: {exc}", None if pid is None else str(pid)
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
    for folder in (p for p in entries if p.is_dir()):
        samples_dir = folder / "samples"
        samples = sorted(p for p in samples_dir.iterdir() if _visible(p)) if samples_dir.is_dir() else []
        linked = [p for p in samples if not _inside(p, real_root)]
        if linked:
            warn(f"{samples_dir}: ignoring {len(linked)} links out of the image folder (e.g. {linked[0].name})")
            samples = [p for p in samples if p not in set(linked)]
        if not samples:
            warn(f"{folder}: no images under samples/")
            continue
        prompt, error, pid = _read_metadata(folder, real_root)
        for position, path in enumerate(samples):
            filename = path.relative_to(root).as_posix()
            jobs.append(Job(filename, path, _sample_index(path, position), prompt, error, pid))
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
        error: str | None = None
        pid = entry.get("prompt_id")
        if "metadata" in entry:
            try:
                prompt = parse_prompt(entry["metadata"], default_id=str(pid) if pid is not None else None)
                pid = prompt.id
            except SpecError as exc:
                error = f"invalid_metadata: {manifest.name} line {lineno}: {exc}"
        elif pid is not None:
            if prompts is None:
                raise EvaluateError(f"{manifest}: line {lineno} names prompt_id {pid!r}; pass --prompts CORPUS")
            prompt = prompts.get(str(pid))
            if prompt is None:
                error = f"missing_metadata: prompt_id {pid!r} is not in the corpus"
        else:
            error = f"missing_metadata: {manifest.name} line {lineno} has neither metadata nor prompt_id"
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


def load_image(path: Path) -> Image:
    """RGB ``uint8`` (H, W, 3) pixels of an image file; raises ``ValueError`` saying why it is unreadable."""
    from PIL import Image as PILImage
    from PIL import UnidentifiedImageError

    try:
        if path.stat().st_size == 0:
            raise ValueError("empty file")
        with PILImage.open(path) as im:
            im.load()
            rgb = im.convert("RGB")
    except UnidentifiedImageError:
        raise ValueError("not an image file") from None
    except (OSError, SyntaxError) as exc:  # truncated or corrupt data
        raise ValueError(str(exc) or type(exc).__name__) from None
    arr = np.asarray(rgb, dtype=np.uint8)
    if arr.ndim != 3 or arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError(f"image has no pixels (shape {arr.shape})")
    return np.ascontiguousarray(arr)


# --------------------------------------------------------------------------- results file


def _identity(models: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
    return {
        stage: (str(info.get("backend", "")), str(info.get("model", "")), str(info.get("sha256", "")))
        for stage, info in models.items()
        if isinstance(info, Mapping)
    }


def resume_state(out: Path, config: RuleConfig, models: Mapping[str, Any]) -> set[str]:
    """Filenames already in ``out``; cuts a torn last line and refuses a file made differently."""
    if not out.exists():
        return set()
    with out.open("rb+") as fh:
        data = fh.read()
        if data and not data.endswith(b"\n"):
            keep = data.rfind(b"\n") + 1
            print(f"warning: {out}: removing a partial last line left by an interrupted run", file=sys.stderr)
            fh.truncate(keep)
            data = data[:keep]
    done: set[str] = set()
    want = _identity(models)
    for lineno, raw in enumerate(data.decode("utf-8").splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
        except json.JSONDecodeError:
            raise EvaluateError(f"{out}: line {lineno} is not valid JSON; not appending to it") from None
        digest = (record.get("config") or {}).get("digest")
        if digest and digest != config.digest():
            raise EvaluateError(
                f"{out} was written with rule config {digest} (line {lineno}), this run uses {config.digest()} "
                f"({config.name}); write to another --out file"
            )
        got = _identity(record.get("models") or {})
        if got and got != want:
            raise EvaluateError(
                f"{out} was written by other models (line {lineno}: {got}); this run uses {want}; "
                "write to another --out file"
            )
        done.add(str(record.get("filename")))
    return done


# --------------------------------------------------------------------------- the run


@dataclass
class Summary:
    """What a run did."""

    total: int = 0
    skipped: int = 0
    evaluated: int = 0
    correct: int = 0
    errors: Counter[str] = field(default_factory=Counter)

    @property
    def judged(self) -> int:
        return self.evaluated - sum(self.errors.values())

    def text(self) -> str:
        parts = [f"{self.evaluated} images evaluated ({self.skipped} already done, {self.total} in total)"]
        if self.judged:
            parts.append(f"{self.correct}/{self.judged} correct ({100.0 * self.correct / self.judged:.1f}%)")
        n_err = sum(self.errors.values())
        if n_err:
            kinds = ", ".join(f"{k} {v}" for k, v in sorted(self.errors.items()))
            parts.append(f"{n_err} error lines ({kinds})")
        return "; ".join(parts)


def error_line(job: Job, error: str, config: RuleConfig, models: Mapping[str, Any]) -> dict[str, Any]:
    """The results line of an image that could not be judged (see ``negt2i.results.error_record``)."""
    p = job.prompt
    return error_record(
        filename=job.filename,
        error=error,
        prompt_id=p.id if p else job.prompt_id,
        sample=job.sample,
        tag=p.tag if p else "",
        prompt=p.prompt if p else "",
        category=p.category.value if p and p.category else None,
        setting=p.setting if p else None,
        config=config.record(),
        models=models,
    )


def _load_batch(batch: Sequence[Job]) -> list[Image | str]:
    out: list[Image | str] = []
    for job in batch:
        if job.error is not None:
            out.append(job.error)
            continue
        try:
            out.append(load_image(job.path))
        except (ValueError, OSError) as exc:
            out.append(f"unreadable_image: {job.filename}: {exc}")
    return out


def _lock_exclusively(fh: TextIO, path: Path) -> None:
    """Hold an exclusive lock on the results file so two runs never append to it at once."""
    import fcntl

    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise EvaluateError(f"{path} is being written by another negt2i evaluate run") from None


def _batches(jobs: Sequence[Job], size: int) -> Iterator[Sequence[Job]]:
    for start in range(0, len(jobs), size):
        yield jobs[start : start + size]


def evaluate(
    jobs: Sequence[Job],
    out: str | Path,
    stages: Stages,
    *,
    config: RuleConfig = CURRENT,
    batch_size: int = 8,
    limit: int | None = None,
    progress: bool = True,
    save_perception: str | Path | None = None,
) -> Summary:
    """Judge ``jobs`` (the first ``limit``) into ``out``, resuming; returns the run's summary.

    ``save_perception``: also append each judged image's detections and refined masks to this
    side file (``negt2i.perception_file``), written before the image's results line.
    """
    if batch_size < 1:
        raise ValueError(f"batch size must be >= 1, got {batch_size}")
    selected = list(jobs[:limit] if limit is not None else jobs)
    models = stages.models()
    out_path = Path(out)
    if out_path.parent != Path():
        out_path.parent.mkdir(parents=True, exist_ok=True)
    pipeline = Pipeline(stages, config)
    from tqdm import tqdm

    from negt2i.perception_file import PerceptionWriter

    with (
        out_path.open("a", encoding="utf-8") as fh,
        ThreadPoolExecutor(max_workers=1) as pool,
        contextlib.nullcontext(None) if save_perception is None else PerceptionWriter(save_perception) as side,
    ):
        _lock_exclusively(fh, out_path)
        done = resume_state(out_path, config, models)
        todo = [job for job in selected if job.filename not in done]
        summary = Summary(total=len(selected), skipped=len(selected) - len(todo))
        bar = tqdm(total=len(todo), unit="img", disable=not progress, dynamic_ncols=True, desc="evaluate")
        batches = list(_batches(todo, batch_size))
        pending: Future[list[Image | str]] | None = pool.submit(_load_batch, batches[0]) if batches else None
        for k, batch in enumerate(batches):
            assert pending is not None  # submitted for every batch
            loaded = pending.result()
            pending = pool.submit(_load_batch, batches[k + 1]) if k + 1 < len(batches) else None
            ready: list[int] = []
            prompts: list[Prompt] = []
            pixels: list[Image] = []
            for i, item in enumerate(loaded):
                prompt = batch[i].prompt
                if not isinstance(item, str) and prompt is not None:
                    ready.append(i)
                    prompts.append(prompt)
                    pixels.append(item)
            results = pipeline.run(prompts, pixels)
            by_index = dict(zip(ready, results, strict=True))
            for i, job in enumerate(batch):
                item = loaded[i]
                res = by_index.get(i)
                if isinstance(item, str) or res is None:
                    reason = item if isinstance(item, str) else "missing_metadata: no prompt for this image"
                    record = error_line(job, reason, config, models)
                elif res.verdict is not None:
                    record = ok_record(res.verdict, filename=job.filename, sample=job.sample, models=models)
                    if side is not None and res.perception is not None:
                        side.write(job.filename, job.sample, res.verdict, res.perception)
                    summary.correct += int(res.verdict.correct)
                else:
                    record = error_line(job, f"stage_error: {res.error}", config, models)
                if record["status"] == "error":
                    summary.errors[str(record["error"]).split(":", 1)[0]] += 1
                write_line(fh, record)
                summary.evaluated += 1
            bar.update(len(batch))
        bar.close()
    return summary
