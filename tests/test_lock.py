"""requirements.lock: the one lock of exact versions (docs/dependencies.md).

It must be made from this pyproject.toml (a dependency added, removed or re-ranged without `make lock` fails
here and in `make setup`), satisfy every requirement of every extra, pin every entry with hashes, and be what
`make setup` installed: .venv holds exactly the lock's versions, nothing missing, nothing else.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement

from tests.lockfile import LOCK, REPO, lock_entries, requirements_module

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
SCRIPT = [sys.executable, str(REPO / "docker" / "requirements.py")]


def _marker(entry: str) -> Marker | None:
    first = entry.splitlines()[0].rstrip(" \\")
    return Marker(first.split(";", 1)[1]) if ";" in first else None


def _applies_here(entry: str) -> bool:
    marker = _marker(entry)
    return marker is None or marker.evaluate()


def test_the_lock_was_made_from_this_pyproject() -> None:
    result = subprocess.run([*SCRIPT, "--check-lock", str(LOCK)], cwd=REPO, capture_output=True, text=True,
                            check=False, timeout=60)  # fmt: skip
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    "edit",
    [
        lambda text: text.replace('"tqdm>=4.66",', '"tqdm>=4.66",\n    "rich>=13",'),  # a dependency added
        lambda text: text.replace('    "tqdm>=4.66",\n', ""),  # removed
        lambda text: text.replace('"scipy>=1.11"', '"scipy>=1.12"'),  # re-ranged
        lambda text: text.replace('fetch = [\n    "huggingface_hub>=0.30",\n]', 'fetch = ["huggingface_hub>=0.31"]'),
    ],
    ids=["added", "removed", "re-ranged", "extra re-ranged"],
)
def test_a_lock_made_from_another_pyproject_is_refused(tmp_path: Path, edit: object) -> None:
    text = (REPO / "pyproject.toml").read_text()
    changed = edit(text)  # type: ignore[operator]
    assert changed != text, "the edit no longer matches pyproject.toml"
    (tmp_path / "pyproject.toml").write_text(changed)
    result = subprocess.run([*SCRIPT, "--pyproject", str(tmp_path / "pyproject.toml"), "--check-lock", str(LOCK)],
                            capture_output=True, text=True, check=False, timeout=60)  # fmt: skip
    assert result.returncode == 1
    assert "make lock" in result.stderr and "requirements.lock" in result.stderr


def test_a_change_outside_the_dependency_tables_keeps_the_lock(tmp_path: Path) -> None:
    text = (REPO / "pyproject.toml").read_text().replace("line-length = 120", "line-length = 100")
    (tmp_path / "pyproject.toml").write_text(text)
    module = requirements_module()
    assert module.digest(tmp_path / "pyproject.toml") == module.digest(REPO / "pyproject.toml")


def test_every_requirement_of_every_extra_is_satisfied_by_the_lock() -> None:
    entries = lock_entries()
    requirements = list(PYPROJECT["dependencies"])
    for extra, group in PYPROJECT["optional-dependencies"].items():
        requirements += [f"{r} ; extra == '{extra}'" if ";" not in r else r for r in group]
    for text in requirements:
        req = Requirement(text.split(" ; extra")[0])
        name = requirements_module()._name(req.name)
        assert name in entries, f"{req.name} is not in requirements.lock: run `make lock`"
        version = entries[name][0]
        assert req.specifier.contains(version, prereleases=True), f"{req}: the lock has {version}"


def test_every_entry_is_pinned_with_hashes() -> None:
    entries = lock_entries()
    assert len(entries) > 100  # every extra: torch, the model libraries, serving, the dev tools
    for name, (version, entry) in entries.items():
        assert entry.splitlines()[0].startswith(f"{name}==") or "==" in entry.splitlines()[0], name
        assert "--hash=sha256:" in entry, f"{name}=={version} has no hash"
    # one version per distribution: the universal lock needs no per-Python forks today
    assert len(set(entries)) == len(entries)


def test_lock_entries_prints_an_entry_with_its_hashes_and_can_leave_some_out() -> None:
    run = lambda names: subprocess.run([*SCRIPT, "--lock-entries", names, str(LOCK)], capture_output=True,  # noqa: E731
                                       text=True, check=True, timeout=60).stdout  # fmt: skip
    uv = run("uv")
    assert uv.startswith("uv==") and uv.count("--hash=sha256:") >= 1 and "torch" not in uv
    without = run("!sam2")
    assert "\nsam2==" not in without and "\ntorch==" in without
    assert without.count("==") >= len(lock_entries()) - 1
    missing = subprocess.run([*SCRIPT, "--lock-entries", "no-such-dist", str(LOCK)], capture_output=True, text=True,
                             check=False, timeout=60)  # fmt: skip
    assert missing.returncode != 0 and "no-such-dist" in missing.stderr


def test_the_test_environment_is_exactly_the_lock() -> None:
    """`make setup`'s .venv: every entry that applies to this platform at its locked version, nothing else but
    the project itself and the venv's own pip."""
    if Path(sys.prefix).resolve() != (REPO / ".venv").resolve():
        pytest.skip(f"not running in this checkout's .venv (make setup) but in {sys.prefix}")
    norm = requirements_module()._name
    # the venv's own site-packages only: setuptools puts its vendored copies (jaraco, zipp, packaging ...) on
    # sys.path once anything imports it
    site = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    installed = {norm(d.metadata["Name"]): d.version for d in metadata.distributions(path=site)}
    wanted = {name: version for name, (version, entry) in lock_entries().items() if _applies_here(entry)}
    missing = {n: v for n, v in wanted.items() if n not in installed}
    other = {n: (installed[n], v) for n, v in wanted.items() if n in installed and installed[n] != v}
    extra = set(installed) - set(wanted) - {"pip", "negt2ibench"}
    assert not missing and not other and not extra, (missing, other, extra)


def test_the_images_install_from_the_lock() -> None:
    """No second hand-kept list: every image installs with -c requirements.lock (tests/k8s/test_dockerfiles.py
    checks each install line) and the old constraints file is gone."""
    assert not (REPO / "docker" / "constraints.txt").exists()
    for dockerfile in ("services/Dockerfile", "orchestrator/Dockerfile", "docker/generate.Dockerfile"):
        text = (REPO / dockerfile).read_text()
        assert "COPY" in text and "requirements.lock" in text, dockerfile
    assert "!requirements.lock" in (REPO / ".dockerignore").read_text().splitlines()


def test_make_setup_refuses_a_stale_lock_before_installing_anything(tmp_path: Path) -> None:
    for rel in ("scripts/setup.sh", "scripts/uv.sh", "docker/requirements.py", "requirements.lock"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, tmp_path / rel)
    text = (REPO / "pyproject.toml").read_text().replace('"scipy>=1.11"', '"scipy>=1.12"')
    (tmp_path / "pyproject.toml").write_text(text)
    env = {"PATH": "/usr/bin:/bin", "PYTHON": sys.executable}
    result = subprocess.run(["bash", "scripts/setup.sh"], cwd=tmp_path, env=env, capture_output=True, text=True,
                            check=False, timeout=120)  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    assert "run `make lock`" in result.stderr
    assert not (tmp_path / ".venv").exists() and not (tmp_path / "build").exists()
