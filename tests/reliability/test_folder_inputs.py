"""Bad files in an image folder (issue 31, item 3), through both CLIs as real processes: ``negt2i evaluate``
(in-process stages) and ``negt2i submit`` (a real orchestrator and stage services). A FIFO named ``*.png``,
an image whose file name is not UTF-8, a ``metadata.jsonl`` with a number of 5,000 digits and an image with
odd EXIF each become one results line (an error line, or a verdict when the image is fine) and the rest of
the folder is judged, on the first run and on the rerun; nothing hangs (each run is bounded)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.fuzz_decoder import ISSUE_31_EXIF
from negt2i.stages.demo_data import write_demo
from tests.services.live import REPO, Proc

pytestmark = pytest.mark.xdist_group("reliability")

RUN_TIMEOUT_S = 120
NON_UTF8 = os.fsdecode(b"00000/samples/caf\xe9-\xff.png")
"""An image's results name whose file name is Latin-1, not UTF-8 (a surrogate-escaped str)."""


def _folder(tmp: Path) -> Path:
    """The demo folder (4 prompts x 2 images) with the bad inputs of issue 31 added."""
    from PIL import Image as PILImage

    root = tmp / "images"
    write_demo(root, prompts=4, samples=2, seed=5, size=64)
    samples = root / "00000" / "samples"
    os.mkfifo(samples / "0009.png")  # a FIFO named like an image: never opened
    shutil.copyfile(samples / "0000.png", os.fsencode(root / NON_UTF8))  # a fine image under a Latin-1 name
    with PILImage.open(samples / "0001.png") as img:  # a fine image with the EXIF block of issue 31
        img.convert("RGB").save(root / "00001" / "samples" / "0002.png", exif=b"Exif\x00\x00" + ISSUE_31_EXIF)
    meta = root / "00002" / "metadata.jsonl"
    record = json.loads(meta.read_text())
    text = json.dumps({**record, "seed": 0}).replace('"seed": 0', '"seed": ' + "7" * 5000)
    meta.write_text(text + "\n")  # a number Python refuses to convert (over 4,300 digits)
    return root


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "negt2i", *args, "--no-progress"]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False)


def _lines(out: Path) -> dict[str, dict[str, Any]]:
    rows = {}
    for raw in out.read_bytes().splitlines():
        assert raw.decode("utf-8")  # the file stays UTF-8 text whatever the file names
        row = json.loads(raw)
        rows[row["filename"]] = row
    return rows


def _check(rows: dict[str, dict[str, Any]]) -> None:
    fifo = rows["00000/samples/0009.png"]
    assert fifo["status"] == "error" and fifo["error_kind"] == "unreadable_image", fifo
    assert "a FIFO, not a regular file" in fifo["error"]
    latin = rows[NON_UTF8]
    assert latin["status"] == "ok", latin  # judged like any image
    assert os.fsencode(latin["filename"]) == b"00000/samples/caf\xe9-\xff.png"
    exif = rows["00001/samples/0002.png"]
    assert exif["status"] == "ok", exif
    huge = [r for name, r in rows.items() if name.startswith("00002/")]
    assert len(huge) == 2 and all(r["error_kind"] == "invalid_metadata" for r in huge), huge
    assert all("a number of more than 4300 digits" in r["error"] for r in huge)
    rest = [r for name, r in rows.items() if name.startswith(("00001/", "00003/")) and name != "00001/samples/0002.png"]
    assert len(rest) == 4 and all(r["status"] == "ok" for r in rest), rest
    assert len(rows) == 4 * 2 + 3  # every image and every bad input has exactly one line


def test_evaluate_judges_the_rest_of_a_folder_with_bad_files(tmp_path: Path) -> None:
    root = _folder(tmp_path)
    out = tmp_path / "evaluate.jsonl"
    for run in (1, 2):
        done = _run("evaluate", str(root), "--out", str(out), "--backend", "synthetic")
        assert done.returncode == 0, f"run {run}: {done.stderr}"
        _check(_lines(out))
    # the rerun judged again only the line whose image cannot be hashed (the FIFO): one line per image still
    assert "1 error line and 0 changed images judged again" in done.stdout, done.stdout


def test_submit_judges_the_rest_of_a_folder_with_bad_files(rel_orchestrator: Proc, tmp_path: Path) -> None:
    root = _folder(tmp_path)
    out = tmp_path / "submit.jsonl"
    for run in (1, 2):
        done = _run("submit", str(root), "--orchestrator", rel_orchestrator.target, "--out", str(out))
        assert done.returncode == 0, f"run {run}: {done.stderr}"
        _check(_lines(out))
    assert "1 error line and 0 changed images judged again" in done.stdout, done.stdout
