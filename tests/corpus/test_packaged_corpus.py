"""An installed negt2i finds its own data: the benchmark corpus is package data (``negt2i/data/``), the same bytes
as the repository's ``data/negt2ibench.jsonl``, inside the wheel, and read from there whatever the working folder
(``python -m negt2i.stages.demo_data DIR --full`` run from an empty folder against the unpacked wheel)."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from negt2i.corpus import DEFAULT_CORPUS, corpus_path, packaged_corpus

REPO = Path(__file__).resolve().parents[2]
IN_WHEEL = "negt2i/data/negt2ibench.jsonl"


def test_the_packaged_corpus_is_the_repository_corpus_byte_for_byte():
    packaged = packaged_corpus()
    assert packaged.is_file() and packaged.relative_to(REPO).as_posix() == IN_WHEEL
    assert packaged.read_bytes() == (REPO / DEFAULT_CORPUS).read_bytes(), (
        f"{IN_WHEEL} differs from {DEFAULT_CORPUS}: the package must carry the corpus as built; after rebuilding "
        f"it run `cp {DEFAULT_CORPUS} {IN_WHEEL}`"
    )
    assert corpus_path() == packaged and corpus_path("x.jsonl") == Path("x.jsonl")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel ``pip install .`` builds, from a copy of what the images copy (README, pyproject, negt2i/)."""
    pytest.importorskip("setuptools")
    root = tmp_path_factory.mktemp("wheel")
    src = root / "src"
    src.mkdir()
    for name in ("README.md", "pyproject.toml"):
        (src / name).write_bytes((REPO / name).read_bytes())
    _copy_package(REPO / "negt2i", src / "negt2i")
    dist = root / "dist"
    build = "import sys; from setuptools import build_meta; print(build_meta.build_wheel(sys.argv[1]))"
    done = subprocess.run([sys.executable, "-c", build, str(dist)], cwd=src, capture_output=True, text=True,
                          timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return dist / done.stdout.strip().splitlines()[-1]


def _copy_package(source: Path, target: Path) -> None:
    for path in source.rglob("*"):
        if "__pycache__" in path.parts or path.is_dir():
            continue
        dest = target / path.relative_to(source)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(path.read_bytes())


@pytest.mark.slow
def test_the_wheel_carries_the_corpus_and_the_full_demo_runs_outside_the_repository(wheel: Path, tmp_path: Path):
    with zipfile.ZipFile(wheel) as zf:
        assert zf.read(IN_WHEEL) == (REPO / DEFAULT_CORPUS).read_bytes()
        zf.extractall(tmp_path / "site")  # a pure-Python wheel unpacked is the package as installed
    elsewhere = tmp_path / "elsewhere"  # no data/ folder here: the corpus can only come from the package
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEGT2I_")}
    env["PYTHONPATH"] = str(tmp_path / "site")
    probe = subprocess.run([sys.executable, "-c", "import negt2i.corpus as c; print(c.packaged_corpus())"],
                           cwd=elsewhere, env=env, capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert probe.returncode == 0, probe.stderr
    assert Path(probe.stdout.strip()) == tmp_path / "site" / IN_WHEEL  # the installed copy, not the repository's
    done = subprocess.run([sys.executable, "-m", "negt2i.stages.demo_data", "demo", "--full", "--samples", "1",
                           "--size", "32"], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300,
                          check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert "48 images of 48 prompts" in done.stdout
    assert len([p for p in (elsewhere / "demo").iterdir() if p.is_dir()]) == 48
