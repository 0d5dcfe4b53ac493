"""The weights table, cache, fetch (with a fake downloader: no network) and verification."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from negt2i import weights
from negt2i.weights import LOCK_NAME, WEIGHTS, WeightsError, WeightsMissingError


@pytest.fixture
def fake_table(monkeypatch):
    """The real table without the published MD5 (our fake files cannot match it)."""
    table = {k: dataclasses.replace(v, md5="", sha256="") for k, v in WEIGHTS.items()}
    monkeypatch.setattr(weights, "WEIGHTS", table)
    return table


def fake_downloader(e, folder: Path) -> str:
    for rel in e.files:
        (folder / rel).write_bytes(f"{e.name}:{rel}".encode())
    return "0123abcd"


def test_table_covers_the_default_backends_and_the_ablation_detector():
    from negt2i.stages.registry import DEFAULT_BACKENDS

    assert set(WEIGHTS) == set(DEFAULT_BACKENDS.values()) | {"maskrcnn-r50"}
    for name, e in WEIGHTS.items():
        assert DEFAULT_BACKENDS[e.stage] == name or name == "maskrcnn-r50"
        assert e.main_file in e.files
    assert WEIGHTS["maskrcnn-r50"].stage == "detector"
    assert WEIGHTS["rfdetr-seg-xl"].md5 == "3693b35d0eea86ebb3e0444f4a611fba"  # rfdetr's published hash


def test_weights_dir_resolution(monkeypatch, tmp_path):
    monkeypatch.setenv("NEGT2I_WEIGHTS_DIR", str(tmp_path / "env"))
    assert weights.weights_dir() == tmp_path / "env"
    assert weights.weights_dir(tmp_path / "flag") == tmp_path / "flag"
    monkeypatch.delenv("NEGT2I_WEIGHTS_DIR")
    assert weights.weights_dir() == Path.home() / ".cache" / "negt2i" / "weights"


def test_require_names_everything_missing_in_one_error(tmp_path):
    weights.require(["synthetic"], tmp_path)  # nothing needed
    with pytest.raises(WeightsMissingError) as info:
        weights.require(["synthetic", "rfdetr-seg-xl", "depth-anything-v2-small"], tmp_path)
    msg = str(info.value)
    assert "rfdetr-seg-xl (rf-detr-seg-xlarge.pt)" in msg
    assert "depth-anything-v2-small (config.json, model.safetensors, preprocessor_config.json)" in msg
    assert f"negt2i weights fetch --dir {tmp_path} rfdetr-seg-xl depth-anything-v2-small" in msg


def test_fetch_records_hashes_and_verify_checks_them(tmp_path, fake_table):
    logs: list[str] = []
    weights.fetch(["depth-anything-v2-small"], tmp_path, downloader=fake_downloader, log=logs.append)
    folder = tmp_path / "depth-anything-v2-small"
    lock = json.loads((folder / LOCK_NAME).read_text())
    assert lock["revision"] == "0123abcd"
    assert set(lock["files"]) == {"config.json", "model.safetensors", "preprocessor_config.json"}
    sha = weights.file_digest(folder / "model.safetensors")
    assert lock["files"]["model.safetensors"] == {
        "sha256": sha,
        "size": len(b"depth-anything-v2-small:model.safetensors"),
    }
    v = weights.verify("depth-anything-v2-small", tmp_path)
    assert (v.revision, v.sha256, v.verified) == ("0123abcd", sha, True)
    assert weights.status("depth-anything-v2-small", tmp_path) == "ok"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folders left
    # a second fetch keeps verified weights
    weights.fetch(
        ["depth-anything-v2-small"], tmp_path, downloader=lambda e, f: pytest.fail("downloaded"), log=logs.append
    )
    assert "present and verified" in logs[-1]
    # tampering is caught
    (folder / "model.safetensors").write_bytes(b"tampered")
    with pytest.raises(WeightsError, match=r"does not match .* recorded when it was fetched"):
        weights.verify("depth-anything-v2-small", tmp_path)
    assert weights.status("depth-anything-v2-small", tmp_path).startswith("mismatch")


def test_interrupted_fetch_leaves_nothing(tmp_path, fake_table):
    def broken(e, folder):
        (folder / e.files[0]).write_bytes(b"partial")
        raise ConnectionError("network down")

    with pytest.raises(weights.WeightsFetchError, match=r"could not download .*network down.*NEGT2I_WEIGHTS_DIR"):
        weights.fetch(["sam2.1-hiera-small"], tmp_path, downloader=broken, log=lambda m: None)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(WeightsError, match="lacks"):
        weights.fetch(["siglip2-so400m-378"], tmp_path, downloader=lambda e, f: "x", log=lambda m: None)


def test_a_module_missing_mid_download_says_what_to_install(tmp_path, fake_table):
    def needs_a_module(e, folder):
        raise ModuleNotFoundError("No module named 'huggingface_hub'", name="huggingface_hub")

    with pytest.raises(weights.WeightsFetchError) as info:
        weights.fetch(["sam2.1-hiera-small"], tmp_path, downloader=needs_a_module, log=lambda m: None)
    message = str(info.value)
    assert "needs the Python package 'huggingface_hub'" in message and "pip install '.[fetch]'" in message
    assert "could not download" not in message and "Without network" not in message
    assert list(tmp_path.iterdir()) == []


def test_published_md5_is_checked(tmp_path):
    with pytest.raises(WeightsError, match="MD5"):
        weights.fetch(["rfdetr-seg-xl"], tmp_path, downloader=fake_downloader, log=lambda m: None)


def test_weights_without_lock_are_unverified(tmp_path, fake_table, capsys):
    folder = tmp_path / "sam2.1-hiera-small"
    folder.mkdir()
    (folder / "sam2.1_hiera_small.pt").write_bytes(b"placed by hand")
    v = weights.verify("sam2.1-hiera-small", tmp_path)
    assert not v.verified and v.sha256 == weights.file_digest(folder / "sam2.1_hiera_small.pt")
    assert "unverified" in capsys.readouterr().err
    assert weights.status("sam2.1-hiera-small", tmp_path).startswith("unverified")


def test_weights_cli_list(tmp_path, capsys):
    import argparse

    from negt2i.cli import weights_cmd

    parser = argparse.ArgumentParser()
    weights_cmd.register(parser.add_subparsers())
    args = parser.parse_args(["weights", "list", "--dir", str(tmp_path)])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert f"weights cache: {tmp_path}" in out
    assert out.count("missing") == len(WEIGHTS) == 5
    args = parser.parse_args(["weights", "fetch", "--dir", str(tmp_path), "nope"])
    assert args.func(args) == 1
    assert "no weights for 'nope'" in capsys.readouterr().err
