"""The results file under faults (issue 31, items 8 and 10): what a crash or a power loss leaves at its end is
recovered when it is provably a torn line of ours (cut short, shorter than the marker, NUL-filled) and
refused with an accurate message otherwise; a read-only or full ``--out`` gives the same one line from
``negt2i evaluate`` and ``negt2i submit`` (a real orchestrator), no traceback, and nothing half-written."""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from negt2i.cli import main
from negt2i.metrics.totals import file_totals
from negt2i.stages.demo_data import write_demo
from tests.services.live import Proc

pytestmark = pytest.mark.xdist_group("reliability")


@pytest.fixture
def demo(tmp_path: Path) -> Path:
    root = tmp_path / "demo"
    write_demo(root, prompts=3, samples=2, seed=4, size=64)
    return root


def _evaluate(images: Path, out: Path, *extra: str) -> int:
    return main(["evaluate", str(images), "--out", str(out), "--backend", "synthetic", "--no-progress", *extra])


def _valid_lines(out: Path) -> list[dict[str, Any]]:
    raw = out.read_bytes()
    assert raw.endswith(b"\n") and b"\x00" not in raw
    return [json.loads(line) for line in raw.splitlines()]


# --------------------------------------------------------------------------- 10. torn tails


LINE = b'{"negt2i":"results/1","filename":"00001/samples/0001.png","sample":1,"status":"ok"}\n'


@pytest.mark.parametrize(
    ("tail", "says"),
    [
        (b'{"ne', "cut short"),  # shorter than the marker
        (b"{", "cut short"),
        (b"\x00" * 300, "all NUL bytes"),  # a power loss: the line's blocks never written
        (b'{"negt2i":"results/1","filename":"00001/sam' + b"\x00" * 120, "120 NUL bytes"),
        (b"\x00" * 40 + LINE[40:], "40 NUL bytes"),  # the line's first block lost, its end (and newline) kept
        (LINE[:-2] + b"\x00\n", "1 NUL bytes"),
    ],
    ids=["shorter-than-the-marker", "one-brace", "all-nul", "marker-then-nul", "nul-then-the-end", "nul-at-the-end"],
)
def test_a_torn_or_nul_filled_tail_of_ours_is_recovered(demo: Path, tmp_path: Path, capsys, tail: bytes, says: str):
    out = tmp_path / "r.jsonl"
    assert _evaluate(demo, out, "--limit", "3") == 0
    whole = out.read_bytes()
    out.write_bytes(whole + tail)
    capsys.readouterr()
    assert _evaluate(demo, out) == 0
    err = capsys.readouterr().err
    assert f"removing a partial last line ({len(tail)} bytes, {says})" in err, err
    rows = _valid_lines(out)
    assert out.read_bytes().startswith(whole)  # only the torn line went
    assert len(rows) == 6 and len({r["filename"] for r in rows}) == 6


def test_the_report_reads_a_file_with_a_nul_filled_tail(demo: Path, tmp_path: Path, capsys):
    out = tmp_path / "r.jsonl"
    assert _evaluate(demo, out) == 0
    want = file_totals(out)
    with out.open("ab") as fh:
        fh.write(b"\x00" * 500)
    assert file_totals(out) == want
    assert "skipping a partial last line" in capsys.readouterr().err


def _refused(demo: Path, out: Path, capsys) -> str:
    before = out.read_bytes()
    capsys.readouterr()
    assert _evaluate(demo, out) == 2
    assert out.read_bytes() == before  # left byte-identical
    return capsys.readouterr().err


def test_what_is_not_provably_ours_is_refused_with_an_accurate_message(demo: Path, tmp_path: Path, capsys):
    out = tmp_path / "r.jsonl"
    assert _evaluate(demo, out, "--limit", "2") == 0
    whole = out.read_bytes()
    out.write_bytes(whole + b'{"filename": "mine"')  # someone else's text after our lines
    err = _refused(demo, out, capsys)
    assert "its last line (line 3) is not JSON and is not a line that negt2i began" in err, err
    assert "the 2 lines before it are results lines" in err
    out.write_bytes(whole + b"\x00" * 64 + b"\n" + whole.splitlines(keepends=True)[0])  # a hole, then more lines
    err = _refused(demo, out, capsys)
    assert "line 3 holds NUL bytes and more lines follow it" in err, err
    zeros = tmp_path / "zeros.img"  # no line of ours at all: a run of zeros may be anybody's file
    zeros.write_bytes(b"\x00" * 4096)
    err = _refused(demo, zeros, capsys)
    assert "is not a negt2i results file (line 1 holds NUL bytes)" in err, err
    assert "delete it" in err
    short = tmp_path / "short.jsonl"
    short.write_bytes(b'{"neg')  # a prefix of the marker, but no line of ours proves the file is ours
    assert "is not a negt2i results file" in _refused(demo, short, capsys)


# --------------------------------------------------------------------------- 8. read-only or full --out


def _fault_on(out: Path, monkeypatch: pytest.MonkeyPatch, *, after_lines: int | None, code: int) -> None:
    """Make writes to ``out`` fail like a read-only (``after_lines`` None: at open) or full file system (after
    ``after_lines`` whole lines, the next one half-written before the error)."""
    real_open, real_write = os.open, os.write
    target = os.path.realpath(out)
    written = [0]

    def fake_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if after_lines is None and os.path.realpath(path) == target and flags & (os.O_RDWR | os.O_WRONLY):
            raise OSError(code, os.strerror(code), str(path))
        return real_open(path, flags, *args, **kwargs)

    def fake_write(fd: int, data: Any) -> int:
        try:
            ours = os.readlink(f"/proc/self/fd/{fd}") == target
        except OSError:
            ours = False
        if ours and after_lines is not None:
            if written[0] >= after_lines:
                real_write(fd, bytes(data[: len(data) // 2]))  # the disk fills mid-line
                raise OSError(code, os.strerror(code))
            written[0] += 1
        return real_write(fd, data)

    monkeypatch.setattr(os, "open", fake_open)
    monkeypatch.setattr(os, "write", fake_write)


def _both(demo: Path, out: Path, orchestrator: str) -> list[Callable[[], int]]:
    return [
        lambda: _evaluate(demo, out),
        lambda: main(["submit", str(demo), "--orchestrator", orchestrator, "--out", str(out), "--no-progress"]),
    ]


@pytest.mark.parametrize(("after_lines", "code"), [(None, errno.EROFS), (None, errno.EACCES), (2, errno.ENOSPC)])
def test_a_read_only_or_full_out_is_one_line_from_both_clis(
    rel_orchestrator: Proc, demo: Path, tmp_path: Path, capsys, monkeypatch, after_lines: int | None, code: int
):
    said = []
    for k, run in enumerate(_both(demo, tmp_path / "out.jsonl", rel_orchestrator.target)):
        out = tmp_path / "out.jsonl"
        out.unlink(missing_ok=True)
        with monkeypatch.context() as patch:
            _fault_on(out, patch, after_lines=after_lines, code=code)
            capsys.readouterr()
            assert run() == 2, k
        err = capsys.readouterr().err
        assert "Traceback" not in err
        lines = [line for line in err.splitlines() if line.startswith("error:")]
        assert len(lines) == 1, err
        said.append(lines[0])
        if after_lines is not None:  # the lines before the fault are whole, the half line was taken back
            assert len(_valid_lines(out)) == after_lines
            assert run() == 0  # the disk has room again: the rerun resumes
            assert len(_valid_lines(out)) == 6
    assert said[0] == said[1], said
    assert said[0].startswith(f"error: cannot write the results file {tmp_path / 'out.jsonl'}: {os.strerror(code)}")


def test_generate_score_stops_with_the_same_line_on_a_full_disk(
    rel_orchestrator: Proc, demo: Path, tmp_path: Path, capsys, monkeypatch
):
    """``negt2i generate --orchestrator``'s scorer writes through the same writer: a full disk ends scoring with
    the same one line (no traceback from its stream thread), the lines before it whole, the rest left for a
    rerun."""
    from negt2i.generate.scoring import Scorer
    from negt2i.run.jobs import discover

    out = tmp_path / "scored.jsonl"
    scorer = Scorer(rel_orchestrator.target, out, in_flight=1)
    scorer.start()
    with monkeypatch.context() as patch:
        _fault_on(out, patch, after_lines=2, code=errno.ENOSPC)
        capsys.readouterr()
        for job in discover(demo):
            scorer.submit(job, job.path.read_bytes())
        outcome = scorer.close()
    err = capsys.readouterr().err
    assert "Traceback" not in err and "Exception in thread" not in err, err
    (line,) = [line for line in err.splitlines() if line.startswith("error:")]
    assert line.startswith(f"error: cannot write the results file {out}: {os.strerror(errno.ENOSPC)}"), line
    assert outcome.stream_error is not None and outcome.stream_error.startswith("cannot write the results file")
    assert len(_valid_lines(out)) == 2 and len(outcome.retry) + 2 + outcome.summary.skipped <= 6
    assert outcome.retry  # what was not written is left for a rerun
