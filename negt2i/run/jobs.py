"""Jobs: what a run judges, found in a GenEval-layout folder or a JSONL manifest, and each job's image read once.

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
line order). ``resume_keys`` says what identifies each job's judgement in a results
file (``negt2i.run.output`` plans a run from them); ``read_job`` reads a job's file
once: bytes, SHA-256, the one decoder (``negt2i.core.images``). A job that cannot be judged
carries its ``negt2i.core.failures.Failure`` (``missing_metadata``, ``invalid_metadata``,
``unreadable_image``) and becomes an error line.
"""

from __future__ import annotations

import hashlib
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from negt2i.core.failures import Failure, FailureKind
from negt2i.core.files import open_regular, read_regular
from negt2i.core.images import ImageError, decode_image
from negt2i.core.jsonl import JsonError, iter_json_lines, parse_json
from negt2i.core.results import ResumeKey, prompt_metadata
from negt2i.core.spec import Prompt, SpecError, parse_prompt, read_prompts
from negt2i.core.stage_types import Image

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


def file_sha256(path: Path) -> str | None:
    """SHA-256 (hex) of a file's bytes; ``None`` when it cannot be read or is not a regular file (a FIFO is
    never opened: ``negt2i.core.files``); the job becomes an error line."""
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


@dataclass(frozen=True)
class Loaded:
    """A job's image as read for judging: its file's SHA-256 and pixels, or the error line's reason."""

    sha256: str | None
    data: bytes = b""
    pixels: Image | None = None
    error: Failure | None = None
    prepared: Any = None
    """The detector's preprocessing of the pixels (``negt2i.pipeline.Pipeline.prepare_image``), when asked for."""


def read_job(job: Job, *, decode: bool = True, prepare: Callable[[Image], Any] | None = None) -> Loaded:
    """Read ``job``'s file once: hash the bytes and decode them with the one decoder (``negt2i.core.images``);
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
