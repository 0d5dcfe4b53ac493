"""docs/weights.md matches the weights table, and its by-hand recipe works: files placed by hand, then
``negt2i weights record``, give a cache that ``negt2i weights list`` calls ok."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from negt2i import weights
from negt2i.cli import main

DOC = Path(__file__).resolve().parents[2] / "docs" / "weights.md"


def test_the_page_names_every_url_file_and_published_hash():
    text = DOC.read_text()
    for e in weights.WEIGHTS.values():
        assert f"`{e.name}`" in text
        for f in (*e.files, *e.extra_patterns):
            assert f"{e.name}/{f}" in text or f"`{f}`" in text, (e.name, f)
        if e.source == "url":
            assert e.repo in text and f"{e.name}/{e.main_file}" in text
        else:
            assert f"https://huggingface.co/{e.repo}/resolve/{e.revision}/" in text
        for published in (e.md5, e.sha256, e.sha256_prefix):
            assert published in text


def test_recording_hand_fetched_files_makes_them_verified(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    folder = tmp_path / "sam2.1-hiera-small"
    folder.mkdir()
    (folder / "sam2.1_hiera_small.pt").write_bytes(b"weights by hand")
    assert weights.status("sam2.1-hiera-small", tmp_path).startswith("unverified")
    assert main(["weights", "record", "sam2.1-hiera-small", "--dir", str(tmp_path), "--revision", "abc"]) == 0
    lock = json.loads((folder / weights.LOCK_NAME).read_text())
    digest = hashlib.sha256(b"weights by hand").hexdigest()
    assert lock["revision"] == "abc" and lock["files"] == {"sam2.1_hiera_small.pt": {"sha256": digest, "size": 15}}
    assert weights.status("sam2.1-hiera-small", tmp_path) == "ok"
    (folder / "sam2.1_hiera_small.pt").write_bytes(b"weights by hand, changed")
    assert weights.status("sam2.1-hiera-small", tmp_path).startswith("mismatch")
    # RF-DETR's published MD5 is checked before anything is recorded: a wrong file is refused.
    (tmp_path / "rfdetr-seg-xl").mkdir()
    (tmp_path / "rfdetr-seg-xl" / "rf-detr-seg-xlarge.pt").write_bytes(b"not the model")
    capsys.readouterr()
    assert main(["weights", "record", "rfdetr-seg-xl", "--dir", str(tmp_path)]) == 1
    assert "does not match the published MD5" in capsys.readouterr().err
    assert not (tmp_path / "rfdetr-seg-xl" / weights.LOCK_NAME).exists()
    assert main(["weights", "record", "depth-anything-v2-small", "--dir", str(tmp_path)]) == 1
    assert "lacks config.json" in capsys.readouterr().err
