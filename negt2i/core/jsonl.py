"""Reading JSON and JSONL that comes from outside (metadata files, manifests, a request's ``extra_json``),
line by line, keeping line numbers for error messages.

``parse_json`` is the one place such text is parsed: every way ``json.loads`` can refuse it becomes one
``JsonError`` (a ``ValueError``) with a short reason, never another exception. ``json.loads`` raises
``JSONDecodeError`` for text that is not JSON, but a plain ``ValueError`` for an integer of more than
``sys.get_int_max_str_digits()`` (4,300) digits and ``RecursionError`` for arrays or objects nested
thousands deep; a caller that caught only the first let one metadata line stop a whole folder.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class JsonError(ValueError):
    """Text that is not usable JSON; ``str()`` is the reason, e.g. ``Expecting value (column 1)``."""


class JsonTooDeep(JsonError):
    """Arrays or objects nested deeper than ``json.loads`` can recurse."""


def parse_json(text: str | bytes) -> Any:
    """``json.loads(text)``, with every refusal as one ``JsonError`` (see the module docstring)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise JsonError(f"{exc.msg} (column {exc.colno})") from None
    except RecursionError:
        raise JsonTooDeep("arrays or objects nested too deep") from None
    except UnicodeDecodeError as exc:
        raise JsonError(f"not UTF-8 (byte 0x{exc.object[exc.start]:02x} at {exc.start})") from None
    except ValueError as exc:  # int("9" * 5000): Python's limit on integer digits
        if "digits" in str(exc):
            raise JsonError(f"a number of more than {sys.get_int_max_str_digits()} digits") from None
        raise JsonError(str(exc)) from None


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
                yield JsonLine(lineno, parse_json(line))
            except JsonError as exc:
                yield JsonLine(lineno, error=f"not valid JSON: {exc}")
