"""``orchestrator.guard``: client text in logs and ids (log injection, issue 31)."""

from __future__ import annotations

import logging

from hypothesis import given
from hypothesis import strategies as st

from orchestrator import guard


def test_control_characters_are_found() -> None:
    assert guard.control_char("img-001.png") == -1
    assert guard.control_char("ünïcödé 图像 ✓") == -1
    for bad, at in (("a\r\nb", 1), ("\x00", 0), ("x\x1b[31m", 1), ("a\u2028", 1), ("ok\x7f", 2), ("\x85", 0)):
        assert guard.control_char(bad) == at, repr(bad)


@given(st.text(max_size=300))
def test_loggable_text_is_one_printable_line(text: str) -> None:
    out = guard.loggable(text)
    assert out.isprintable() and "\n" not in out and "\r" not in out
    assert len(out) <= guard.MAX_ID_CHARS * 10 + 40


def test_a_forged_log_line_stays_on_its_line() -> None:
    record = logging.LogRecord(
        "x", logging.ERROR, __file__, 1, "item %s failed", (guard.loggable("a\r\n2026 INFO x"),), None
    )
    assert record.getMessage() == "item a\\r\\n2026 INFO x failed"
