"""Results files: one JSON line per image, written by ``negt2i evaluate`` and ``negt2i submit``.

A line is a verdict (``Verdict.to_json()``: GenEval's ``tag``, ``prompt``,
``correct``, ``reason`` plus per-object and per-statement details and the rule
config) with GenEval's ``filename`` and ours: ``sample`` (the image's index within
its prompt), ``status`` (``ok`` or ``error``) and ``models`` (stage -> ``ModelInfo``
as JSON). An image that could not be judged (corrupt file, missing metadata,
invalid metadata, a stage error) is a ``status: "error"`` line with ``error_kind``
(a ``negt2i.failures.FailureKind``) and ``error`` giving the reason; it is never ``correct``.

Lines are appended whole and flushed, so an interrupted run never leaves a
partial line; ``read_results`` skips a torn last line with a warning.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, TextIO

from negt2i.failures import kind_of
from negt2i.verdict import Verdict


def ok_record(verdict: Verdict, *, filename: str, sample: int | None, models: Mapping[str, Any]) -> dict[str, Any]:
    """The results line of a judged image."""
    return {"filename": filename, "sample": sample, "status": "ok", **verdict.to_json(), "models": dict(models)}


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
) -> dict[str, Any]:
    """The results line of an image that could not be judged (never correct)."""
    return {
        "filename": filename,
        "sample": sample,
        "status": "error",
        "error": error,
        "error_kind": error_kind or kind_of(error),
        "prompt_id": prompt_id,
        "tag": tag,
        "prompt": prompt,
        "category": category,
        "setting": setting,
        "correct": False,
        "reason": error,
        "config": dict(config or {}),
        "models": dict(models or {}),
    }


def write_line(fh: TextIO, record: Mapping[str, Any]) -> None:
    """Append one record as a whole line and flush it to disk."""
    fh.write(json.dumps(record, separators=(",", ":"), ensure_ascii=False) + "\n")
    fh.flush()
    os.fsync(fh.fileno())


def read_results(path: str | Path) -> Iterator[dict[str, Any]]:
    """Records of a results file; a torn (unterminated, unparsable) last line is skipped with a warning."""
    with Path(path).open(encoding="utf-8") as fh:
        lines = fh.readlines()
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            yield json.loads(line)
        except json.JSONDecodeError:
            if lineno == len(lines) and not line.endswith("\n"):
                print(f"warning: {path}: skipping a partial last line", file=sys.stderr)
                return
            raise ValueError(f"{path}: line {lineno} is not valid JSON") from None
