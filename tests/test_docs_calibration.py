"""The detector-calibration walk-through of docs/stage-contract.md, followed literally: its commands run in a
fresh folder and print exactly the output the page shows; the Kubernetes overlay of docs/deployment.md renders
with the fitted rules in the ConfigMap every stage and the orchestrator mount."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shlex
from pathlib import Path

import pytest

from negt2i.cli import main
from negt2i.core.config import load_config
from negt2i.stages import demo_data
from tests.k8s.helpers import kustomize

REPO = Path(__file__).resolve().parents[1]
SECTION = "## Calibrating a swapped detector, end to end"


def _blocks(text: str, lang: str) -> list[str]:
    """The fenced code blocks of ``text`` whose info string is ``lang`` ("" for plain blocks), in order."""
    out: list[str] = []
    body: list[str] | None = None
    kind = ""
    for line in text.splitlines(keepends=True):
        if line.startswith("```"):
            if body is None:
                body, kind = [], line[3:].strip()
            else:
                if kind == lang:
                    out.append("".join(body))
                body = None
        elif body is not None:
            body.append(line)
    return out


def _section() -> str:
    page = (REPO / "docs" / "stage-contract.md").read_text()
    start = page.index(SECTION)
    return page[start : page.index("\n## ", start + len(SECTION))]


def _run(line: str) -> str:
    """One documented command (comments dropped), run in process; its stdout."""
    argv = shlex.split(line.split("  #", maxsplit=1)[0])
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        if argv[:3] == ["python", "-m", "negt2i.stages.demo_data"]:
            code = demo_data.main(argv[3:])
        else:
            assert argv[0] == "negt2i", line
            code = main([*argv[1:], *(["--no-progress"] if argv[1] in ("evaluate", "calibrate") else [])])
    assert code == 0, line
    return out.getvalue()


@pytest.fixture(scope="module")
def walked(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    d = tmp_path_factory.mktemp("walk")
    cwd = Path.cwd()
    os.chdir(d)
    try:
        section = _section()
        bash = _blocks(section, "bash")
        commands = [ln for b in bash[:2] for ln in b.splitlines() if ln and not ln.startswith("#")]
        printed = [_run(c) for c in commands]
    finally:
        os.chdir(cwd)
    return d, printed[-1]


def test_the_calibration_prints_what_the_page_shows(walked: tuple[Path, str]) -> None:
    _, printed = walked
    shown = _blocks(_section(), "")[0]
    assert printed == shown


def test_the_fitted_rules_load_and_name_their_detector(walked: tuple[Path, str]) -> None:
    d, _ = walked
    config = load_config(str(d / "rules-fitted.json"))
    prov = json.loads((d / "rules-fitted.json").read_text())["provenance"]
    assert config.detection.presence_threshold != 0.03
    assert prov["detector"]["backend"] == "synthetic-noisy"
    assert prov["labels"]["form"] == "coco"


def test_the_deployment_overlay_mounts_the_fitted_rules(walked: tuple[Path, str], tmp_path: Path) -> None:
    """docs/deployment.md's overlay, with its base path pointed at this checkout's k8s/overlays."""
    d, _ = walked
    page = (REPO / "docs" / "deployment.md").read_text()
    start = page.index("### Serving a calibrated detector")
    block = _blocks(page[start:], "bash")[0]
    body = block.split("<<'YAML'\n")[1].split("YAML\n")[0]
    overlay = tmp_path / "my-detector"
    overlay.mkdir()
    base = os.path.relpath(REPO / "k8s" / "overlays" / "detector-external", overlay)
    (overlay / "kustomization.yaml").write_text(body.replace("../detector-external", base))
    (overlay / "rules-fitted.json").write_text((d / "rules-fitted.json").read_text())
    objects = kustomize(overlay)
    maps = [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("negt2i-rules-")]
    assert len(maps) == 1
    rules = json.loads(maps[0]["data"]["rules.json"])
    assert rules["name"] == "fitted-detection-synthetic-noisy"
    name = maps[0]["metadata"]["name"]
    mounting = {
        o["metadata"]["name"]
        for o in objects
        if o["kind"] == "Deployment"
        and any((v.get("configMap") or {}).get("name") == name for v in o["spec"]["template"]["spec"]["volumes"])
    }
    assert {"detector", "orchestrator"} <= mounting
