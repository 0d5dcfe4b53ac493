"""Results files: one JSON line per image, written by ``negt2i evaluate`` and ``negt2i submit``.

A line is a verdict (``Verdict.to_json()``: GenEval's ``tag``, ``prompt``,
``correct``, ``reason`` plus per-object and per-statement details and the rule
config) with GenEval's ``filename`` and ours: ``sample`` (the image's index within
its prompt), ``status`` (``ok`` or ``error``), ``sha256`` (of the image file's
bytes) and ``models`` (stage -> ``ModelInfo`` as JSON). An image that could not be
judged (corrupt file, missing metadata, invalid metadata, a stage error) is a
``status: "error"`` line with ``error_kind`` (a ``negt2i.core.failures.FailureKind``) and
``error`` giving the reason; it is never ``correct``.

Every line starts with the marker ``"negt2i": "results/1"`` (``MARKER``): it is
how a writer recognises a file of ours; anything else is refused and left
byte-identical (``ResultsWriter``).

GenEval interop: every line also carries GenEval's ``metadata`` (the prompt
record, JSON-encoded into a string, identical for every image of a prompt;
``null`` when the image has no prompt) and ``details`` (JSON-encoded string: per
named class, the counted detections), so GenEval's ``evaluation/summary_scores.py``
(which groups rows by ``metadata`` and ``tag`` and averages ``correct``) runs on
our files unchanged.

Lines are appended whole and flushed, so an interrupted run never leaves a
partial line; ``read_results`` skips a torn last line with a warning.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TextIO

from negt2i.core.failures import kind_of
from negt2i.core.spec import Prompt
from negt2i.core.verdict import Verdict

MARKER_KEY: Final = "negt2i"
MARKER: Final = "results/1"
"""``{"negt2i": "results/1", ...}``: the first key of every line of a results file."""

_MARKER_PREFIX: Final = b'{"negt2i":"results/'


def prompt_metadata(prompt: Prompt | None, prompt_id: str | None = None) -> str | None:
    """GenEval's ``metadata``: the prompt record JSON-encoded (the same string for every image of a prompt)."""
    if prompt is not None:
        return json.dumps(prompt.to_json(), ensure_ascii=False)
    if prompt_id is not None:
        return json.dumps({"id": prompt_id})
    return None


def verdict_details(verdict: Verdict) -> str:
    """GenEval's ``details`` (JSON-encoded): per named class, the counted detections (indices into the
    detector's output), how many were counted and the best score."""
    return json.dumps(
        {
            o.class_name: {"detections": o.detections, "counted": o.counted, "top_score": o.top_score}
            for o in verdict.objects
        },
        ensure_ascii=False,
    )


def ok_record(
    verdict: Verdict,
    *,
    filename: str,
    sample: int | None,
    models: Mapping[str, Any],
    sha256: str | None = None,
    metadata: str | None = None,
) -> dict[str, Any]:
    """The results line of a judged image (``metadata``: ``prompt_metadata`` of the judged prompt)."""
    body = verdict.to_json()
    return {
        MARKER_KEY: MARKER,
        "filename": filename,
        "sample": sample,
        "status": "ok",
        "sha256": sha256,
        **body,
        "metadata": metadata if metadata is not None else json.dumps({"id": verdict.prompt_id}),
        "details": verdict_details(verdict),
        "models": dict(models),
    }


def error_record(
    *,
    filename: str,
    error: str,
    error_kind: str = "",
    prompt_id: str | None = None,
    sample: int | None = None,
    tag: str = "",
    prompt: str = "",
    category: str | None = None,
    setting: str | None = None,
    config: Mapping[str, Any] | None = None,
    models: Mapping[str, Any] | None = None,
    sha256: str | None = None,
    metadata: str | None = None,
) -> dict[str, Any]:
    """The results line of an image that could not be judged (never correct).

    Without a prompt (``prompt_id`` None: a folder with a missing or invalid ``metadata.jsonl``) the line
    cannot be placed in any cell: ``tag``, ``correct`` and ``metadata`` are ``null``, so that GenEval's
    ``summary_scores.py`` leaves it out of its tasks, images and prompts exactly as ``negt2i report`` does
    (pandas drops null group keys and skips nulls in ``mean``)."""
    placed = prompt_id is not None
    return {
        MARKER_KEY: MARKER,
        "filename": filename,
        "sample": sample,
        "status": "error",
        "sha256": sha256,
        "error": error,
        "error_kind": error_kind or kind_of(error),
        "prompt_id": prompt_id,
        "tag": tag if placed or tag else None,
        "prompt": prompt,
        "category": category,
        "setting": setting,
        "correct": False if placed else None,
        "reason": error,
        "metadata": metadata if metadata is not None else prompt_metadata(None, prompt_id),
        "details": json.dumps({}),
        "config": dict(config or {}),
        "models": dict(models or {}),
    }


def write_line(fh: TextIO, record: Mapping[str, Any]) -> None:
    """Append one record as a whole line and flush it to disk."""
    fh.write(dumps_line(record) + "\n")
    fh.flush()
    os.fsync(fh.fileno())


def read_results(path: str | Path) -> Iterator[dict[str, Any]]:
    """Records of a results file; a torn last line (unterminated and not JSON, or NUL-filled by a power loss:
    ``torn_line``) is skipped with a warning (reading never changes the file; the writer cuts such a line)."""
    with Path(path).open(encoding="utf-8", errors="surrogateescape") as fh:
        lines = fh.readlines()
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            yield json.loads(line)
        except ValueError:  # not JSON, or a number Python refuses to convert (over 4,300 digits)
            raw = line.encode("utf-8", "surrogateescape")
            if lineno == len(lines) and (not line.endswith("\n") or torn_line(raw, owned=lineno > 1)):
                print(f"warning: {path}: skipping a partial last line", file=sys.stderr)
                return
            raise ValueError(f"{path}: line {lineno} is not valid JSON") from None


def torn_line(raw: bytes, *, owned: bool) -> bool:
    """Whether ``raw``, the last line of a file (with or without its newline), is what an interrupted write
    of ours leaves: a line the results writer began and never finished.

    Such a line is a prefix of a results line cut by a crash (it starts with the marker, or is shorter than
    the marker and a prefix of it), or holds NUL bytes (a power loss leaves the blocks it had not written as
    zeros; a results line never holds a raw NUL, JSON escapes it). ``owned``: the file has whole lines of ours
    before it; without them only a line that starts with the whole marker proves it is ours (a short prefix
    such as ``{`` or a run of zeros may be anybody's file)."""
    body = raw.removesuffix(b"\n")
    if b"\n" in body:
        return False
    text = body.strip(b"\x00")
    if text.startswith(_MARKER_PREFIX):
        return True
    if not owned:
        return False
    return b"\x00" in body or _MARKER_PREFIX.startswith(text)


# --------------------------------------------------------------------------- the one writer


class ResultsFileError(RuntimeError):
    """``--out`` cannot be written: not a results file of ours, locked by another run, or made differently."""


def _is_ours(record: Any) -> bool:
    return isinstance(record, dict) and str(record.get(MARKER_KEY, "")).startswith("results/")


def model_identity(models: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
    """Stage -> (backend, model, weights SHA-256, operating point): what must match for two runs to share a
    file (a detector at another floor, suppression or input size is another operating point)."""
    return {
        stage: (
            str(info.get("backend", "")),
            str(info.get("model", "")),
            str(info.get("sha256", "")),
            json.dumps(info.get("operating_point"), sort_keys=True),
        )
        for stage, info in models.items()
        if isinstance(info, Mapping)
    }


@dataclass(frozen=True)
class ResumePlan:
    """What a run does with each of its images given the file's lines (see ``ResultsWriter.plan``)."""

    todo: list[int]
    """Positions (into the keys given to ``plan``) to judge, in order."""
    skipped: int
    retried: list[str] = field(default_factory=list)
    """Filenames of error lines that will be judged again (their old line is superseded)."""
    changed: list[str] = field(default_factory=list)
    """Filenames whose image (SHA-256) or prompt differ from their line (re-judged or refused)."""
    kept_errors: int = 0
    """Error lines left as they are (same image and prompt; ``--retry-errors`` judges them again)."""


@dataclass(frozen=True)
class ResumeKey:
    """What identifies an image's judgement: its file name, the image's SHA-256 and its prompt."""

    filename: str
    sha256: str | None
    metadata: str | None


class ResultsWriter:
    """The one writer of results files (``negt2i evaluate``, ``negt2i submit``, any future writer).

    ``ResultsWriter(path)`` opens ``path`` for appending and holds an exclusive, non-blocking
    ``flock`` on it until ``close()``, so a second writer of the same file is refused
    (``ResultsFileError``), never interleaved. The path must be a new file, an empty file, or a
    results file of ours (every line carries ``MARKER``); anything else is refused before a single
    byte changes. A torn last line of our own (a crash mid-write) is cut off.

    Superseding lines (an error line judged again, a changed image with ``replace_changed``)
    rewrites the file without them into a temporary file next to it and renames it over the
    original, so every line exists exactly once in what ``negt2i report`` and GenEval read.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.fh: TextIO | None = None
        self.lines: dict[str, dict[str, Any]] = {}
        """Filename -> its line (one per filename)."""
        self._failed = ""
        """Why a write failed (every later write is refused with it: no line after a gap)."""
        self._open()

    # ------------------------------------------------------------------ open, check, lock

    def _open(self) -> None:
        try:
            self._open_locked()
        except OSError as exc:  # read-only file system or file, no permission, full disk
            raise ResultsFileError(self._cannot(exc)) from None

    def _open_locked(self) -> None:
        import fcntl

        path = self.path
        if path.exists() and not path.is_file():
            raise ResultsFileError(f"{path} is not a regular file; --out must be a results file (.jsonl)")
        if path.parent != Path():
            path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(10):
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise ResultsFileError(
                    f"{path} is being written by another negt2i run (evaluate or submit); wait for it to finish "
                    "or write to another --out"
                ) from None
            try:
                same = os.fstat(fd).st_ino == os.stat(path).st_ino
            except FileNotFoundError:
                same = False
            if same:  # not replaced by another writer between open and lock
                break
            os.close(fd)
        else:  # pragma: no cover - a file replaced ten times in a row while we open it
            raise ResultsFileError(f"{path} keeps being replaced by another process")
        try:
            self._load(fd)
        except BaseException:
            os.close(fd)
            raise
        self.fh = os.fdopen(fd, "a", encoding="utf-8")

    def _load(self, fd: int) -> None:
        """Read the file's lines; cut a torn last line of ours (``torn_line``); refuse anything else."""
        size = os.fstat(fd).st_size
        data = _pread_all(fd, size)
        if not data:
            return
        lines = data.split(b"\n")
        if lines[-1] == b"":
            lines.pop()  # the file ends with a newline
        records: list[dict[str, Any]] = []
        offset = 0
        for lineno, raw in enumerate(lines, start=1):
            last = lineno == len(lines)
            if raw.strip():
                try:
                    record = json.loads(raw)
                except ValueError:  # not JSON or not UTF-8, or a number over 4,300 digits
                    record = None
                if not _is_ours(record):
                    if last and torn_line(data[offset:], owned=bool(records)):
                        self._cut(fd, offset, data[offset:])
                        break
                    raise ResultsFileError(self._not_ours(lineno, record, last=last, ours=len(records), raw=raw))
                records.append(record)
            offset += len(raw) + 1
        for record in records:
            self.lines[str(record.get("filename"))] = record

    def _cut(self, fd: int, offset: int, tail: bytes) -> None:
        """Truncate the file at ``offset``: ``tail`` is a line of ours that a crash or power loss tore."""
        zeros = tail.count(0)
        what = "all NUL bytes" if zeros == len(tail.rstrip(b"\n")) else f"{zeros} NUL bytes" if zeros else "cut short"
        print(
            f"warning: {self.path}: removing a partial last line ({len(tail)} bytes, {what}) left by an "
            "interrupted run or a power loss; its image is judged again",
            file=sys.stderr,
        )
        os.ftruncate(fd, offset)
        os.fsync(fd)

    def _not_ours(self, lineno: int, record: Any, *, last: bool = False, ours: int = 0, raw: bytes = b"") -> str:
        why = "is not JSON" if record is None else f'has no "{MARKER_KEY}": "{MARKER}" marker'
        if b"\x00" in raw:
            why = f"holds NUL bytes{'' if last else ' and more lines follow it'}"
        if ours and last:
            return (
                f"{self.path}: its last line (line {lineno}) {why} and is not a line that negt2i began and an "
                f"interrupted run left torn; the {ours} lines before it are results lines. Refusing to write to "
                "it, it is left unchanged: remove that line if it is damage, or choose a new --out file"
            )
        if not ours and last and (b"\x00" in raw or _MARKER_PREFIX.startswith(raw.strip(b"\x00"))):
            return (
                f"{self.path} is not a negt2i results file (line {lineno} {why}); refusing to write to it, it is "
                "left unchanged. It holds no whole results line: if it is a results file whose first line a crash "
                "or power loss tore, delete it; else choose a new --out file"
            )
        return (
            f"{self.path} is not a negt2i results file (line {lineno} {why}); refusing to write to it, "
            "it is left unchanged. Choose a new --out file (results files written before the marker was "
            "introduced cannot be appended to either)"
        )

    def check_compatible(self, config_digest: str, config_name: str, models: Mapping[str, Any]) -> None:
        """Refuse a file whose lines were written with another rule config or other models (of a stage both
        name: a line made while a stage its prompt did not need was unreachable does not record that stage)."""
        want = model_identity(models)
        for record in self.lines.values():
            digest = (record.get("config") or {}).get("digest")
            if digest and digest != config_digest:
                raise ResultsFileError(
                    f"{self.path} was written with rule config {digest} ({record.get('filename')}), this run uses "
                    f"{config_digest} ({config_name}); write to another --out file"
                )
            got = model_identity(record.get("models") or {})
            if any(got[stage] != want[stage] for stage in got.keys() & want.keys()):
                raise ResultsFileError(
                    f"{self.path} was written by other models ({record.get('filename')}: {got}); this run uses "
                    f"{want}; write to another --out file"
                )

    # ------------------------------------------------------------------ resume by content

    def plan(
        self, keys: Sequence[ResumeKey], *, retry_errors: bool = False, replace_changed: bool = False
    ) -> ResumePlan:
        """Which images to judge, and supersede the lines they replace.

        An image is skipped only when its file name has a line with the same SHA-256 and the same
        prompt (``metadata``) and that line is a verdict, or an error line without ``retry_errors``.
        An error line whose image or prompt changed is judged again. A verdict whose image or prompt
        changed refuses the run (``ResultsFileError`` naming the images) unless ``replace_changed``.
        """
        todo: list[int] = []
        retried: list[str] = []
        changed: list[str] = []
        kept_errors = 0
        for i, key in enumerate(keys):
            line = self.lines.get(key.filename)
            if line is None:
                todo.append(i)
                continue
            same = line.get("sha256") == key.sha256 and key.sha256 is not None and line.get("metadata") == key.metadata
            if line.get("status") == "error":
                if same and not retry_errors:
                    kept_errors += 1
                    continue
                retried.append(key.filename)
            elif same:
                continue
            else:
                changed.append(key.filename)
            todo.append(i)
        if changed and not replace_changed:
            names = ", ".join(changed[:10]) + (f" and {len(changed) - 10} more" if len(changed) > 10 else "")
            raise ResultsFileError(
                f"{len(changed)} images differ from what {self.path} judged (another image file or another prompt "
                f"under the same name): {names}. Write to a new --out file, or pass --replace-changed to judge "
                "them again and replace their lines"
            )
        self.supersede([*retried, *changed])
        return ResumePlan(todo, len(keys) - len(todo), retried, changed, kept_errors)

    def supersede(self, filenames: Sequence[str]) -> None:
        """Remove the lines of ``filenames`` (atomically: temporary file + rename, lock kept)."""
        import fcntl

        drop = set(filenames) & self.lines.keys()
        if not drop:
            return
        assert self.fh is not None
        keep = [rec for name, rec in self.lines.items() if name not in drop]
        tmp = self.path.with_name(f".{self.path.name}.negt2i-{os.getpid()}.tmp")
        try:
            with tmp.open("w", encoding="utf-8") as out:
                for rec in keep:
                    out.write(dumps_line(rec) + "\n")
                out.flush()
                os.fsync(out.fileno())
            fd = os.open(tmp, os.O_RDWR | os.O_APPEND)
        except OSError as exc:  # a full disk: the original is untouched
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise ResultsFileError(self._cannot(exc)) from None
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # nobody else can know this inode yet
        os.replace(tmp, self.path)
        old, self.fh = self.fh, os.fdopen(fd, "a", encoding="utf-8")
        old.close()  # releases the lock of the replaced inode; late openers of it re-open the path
        self.lines = {name: rec for name, rec in self.lines.items() if name not in drop}

    # ------------------------------------------------------------------ writing

    def write(self, record: Mapping[str, Any]) -> None:
        """Append one record (marker first) as a whole line, flushed to disk."""
        assert self.fh is not None, "writer is closed"
        if self._failed:
            raise ResultsFileError(self._failed)
        if record.get(MARKER_KEY) != MARKER:
            record = {MARKER_KEY: MARKER, **{k: v for k, v in record.items() if k != MARKER_KEY}}
        data = (dumps_line(record) + "\n").encode("utf-8")
        fd = self.fh.fileno()
        start = os.fstat(fd).st_size
        try:
            view = memoryview(data)
            while view:  # unbuffered: a failed write leaves nothing queued to reach the file later
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        except OSError as exc:  # a full disk, an I/O error: take back the part written, write nothing more
            self._failed = self._cannot(exc)
            with contextlib.suppress(OSError):
                os.ftruncate(fd, start)
            raise ResultsFileError(self._failed) from None
        self.lines[str(record.get("filename"))] = dict(record)

    def _cannot(self, exc: OSError) -> str:
        """The one line both CLIs print when the results file cannot be written (read-only, full disk ...)."""
        why = exc.strerror or str(exc)
        return f"cannot write the results file {self.path}: {why}; the lines written so far are kept, rerun to resume"

    def records(self) -> list[dict[str, Any]]:
        """The file's lines (one per filename), in file order."""
        return list(self.lines.values())

    def close(self) -> None:
        """Flush, release the lock and close."""
        if self.fh is not None:
            with contextlib.suppress(OSError):
                self.fh.close()
            self.fh = None

    def __enter__(self) -> ResultsWriter:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def _pread_all(fd: int, size: int) -> bytes:
    """The first ``size`` bytes of ``fd`` (``os.pread`` may return fewer than asked)."""
    parts: list[bytes] = []
    done = 0
    while done < size:
        chunk = os.pread(fd, size - done, done)
        if not chunk:
            break
        parts.append(chunk)
        done += len(chunk)
    return b"".join(parts)


_SURROGATE: Final = re.compile("[\ud800-\udfff]")


def dumps_line(record: Mapping[str, Any]) -> str:
    """One results line (without its newline): compact JSON, UTF-8 text as is, except lone surrogates.

    A file name that is not valid UTF-8 reaches Python as a str with each undecodable byte 0xNN turned into
    the lone surrogate U+DCNN (``os.fsdecode``'s ``surrogateescape``); UTF-8 cannot encode those, so they
    are written as the JSON escape ``\\udcNN``. Reading the line back (``json.loads``) gives the same str,
    so the run resumes by that name, and ``os.fsencode(name)`` gives the file name's original bytes."""
    text = json.dumps(record, separators=(",", ":"), ensure_ascii=False)
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
