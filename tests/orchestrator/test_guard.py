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


@given(
    st.text(max_size=300),
    st.binary(max_size=2000),
    st.one_of(st.none(), st.text(max_size=40)),
    st.booleans(),
    st.text(max_size=20),
)
def test_scan_request_reads_what_a_parse_reads(rid: str, data: bytes, prompt_id: str | None, perception: bool,
                                               media: str) -> None:  # fmt: skip
    """The wire-format scan of an oversized message (never parsed: a parse copies its image) finds the same
    ``request_id`` (cut to MAX_REQUEST_ID_CHARS) and image length as the protobuf parser."""
    from negt2i.wire.v1 import evaluator_pb2

    req = evaluator_pb2.EvaluateRequest(request_id=rid, include_perception=perception)
    if prompt_id is not None:
        req.prompt_id = prompt_id
    req.image.data = data
    req.image.media_type = media
    encoded = req.SerializeToString()
    assert guard.scan_request(encoded) == (rid[: guard.MAX_REQUEST_ID_CHARS], len(data))


def test_scan_request_refuses_what_is_not_a_message() -> None:
    import pytest

    from negt2i.wire.v1 import evaluator_pb2

    good = evaluator_pb2.EvaluateRequest(request_id="r1", prompt_id="p").SerializeToString()
    for bad in (good[:-1], b"\x0a\xff", b"\x00\x01", b"\x0b", b"\x0a" + b"\xff" * 11, b"\x0f"):
        with pytest.raises(ValueError):
            guard.scan_request(bad)
    assert guard.scan_request(b"") == ("", 0)


def test_an_oversized_message_is_answered_without_being_parsed() -> None:
    """Over ``max_message_bytes`` the tolerant deserializer answers MESSAGE_TOO_LARGE with the request_id and
    the image field, from the scan; a message it cannot scan is malformed."""
    from negt2i.wire.v1 import evaluator_pb2

    parse = guard._tolerant(evaluator_pb2.EvaluateRequest, 1000)
    req = evaluator_pb2.EvaluateRequest(request_id="big-1", prompt_id="p")
    req.image.data = b"\x89PNG" * 1000
    bad = parse(req.SerializeToString())
    assert isinstance(bad, guard.BadMessage) and bad.too_large and bad.request_id == "big-1"
    assert (bad.field, bad.image) == ("image.data", True)
    small = parse(evaluator_pb2.EvaluateRequest(request_id="s", prompt_id="p").SerializeToString())
    assert isinstance(small, evaluator_pb2.EvaluateRequest) and small.request_id == "s"
    broken = parse(b"\x0a\xff" + b"x" * 2000)
    assert isinstance(broken, guard.BadMessage) and not broken.too_large and "not a valid" in broken.reason


def test_heap_trim_trims_when_calls_stop_or_when_the_free_heap_is_over_its_bound() -> None:
    """``HeapTrim``: while calls keep ending, a trim only when the free heap is over ``max_free``; once none has
    ended for the interval, one trim whatever the free heap."""
    import asyncio

    async def scenario(free_bytes: int) -> tuple[int, int]:
        loop = asyncio.get_running_loop()
        trims: list[int] = []
        heap = guard.HeapTrim(0.05, max_free=100)

        def trim(pad: int) -> int:
            trims.append(pad)
            return 1

        heap._trim, heap._free = trim, lambda: free_bytes
        end = loop.time() + 0.4
        while loop.time() < end:  # a call ends every 10 ms
            heap.poke()
            await asyncio.sleep(0.01)
        busy = len(trims)
        await asyncio.sleep(0.3)
        return busy, len(trims) - busy

    assert asyncio.run(scenario(10)) == (0, 1)
    busy, after = asyncio.run(scenario(1000))
    assert busy >= 2 and after >= 1, (busy, after)
