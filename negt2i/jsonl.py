"""Reading JSONL files line by line, keeping line numbers for error messages."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class JsonLine:
    """One non-blank line: its 1-based number and its value, or why it is not JSON."""

    lineno: int
    value: Any = None
    error: str | None = None


def iter_json_lines(path: str | Path) -> Iterator[JsonLine]:
    """Every non-blank line of a UTF-8 JSONL file, parsed; a line that is not JSON is yielded with
    ``error`` set (e.g. ``not valid JSON: Expecting value (column 1)``) so that callers decide whether
    to stop or to go on."""
    with Path(path).open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                yield JsonLine(lineno, json.loads(line))
            except json.JSONDecodeError as exc:
                yield JsonLine(lineno, error=f"not valid JSON: {exc.msg} (column {exc.colno})")
