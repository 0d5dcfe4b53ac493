"""``NEGT2I_BACKEND_MODULES`` plug-ins work for ``negt2i evaluate`` (a real CLI process) and are listed by
``negt2i backends``; the example backend module follows the contract."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from negt2i.core import flow
from negt2i.core.config import CURRENT
from negt2i.stages.synthetic import SceneObject, render_scene, write_geneval_layout

REPO = Path(__file__).resolve().parents[2]

RED_CUP = {
    "id": "color-x", "category": "color", "prompt": "a photo of a red cup",
    "include": [{"class": "cup"}], "statements": [{"kind": "attribute", "object": 0, "value": "red"}],
}  # fmt: skip


def _cli(*args: str, modules: str = "examples.plugin_detector") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "NEGT2I_BACKEND_MODULES": modules}
    return subprocess.run([sys.executable, "-m", "negt2i", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120, check=False)  # fmt: skip


def test_evaluate_runs_a_plugin_detector(tmp_path: Path) -> None:
    image = render_scene([SceneObject("cup", (8, 8, 40, 40), value="red")], (48, 48))
    write_geneval_layout(tmp_path / "images", [(RED_CUP, [image])])
    out = tmp_path / "r.jsonl"
    done = _cli("evaluate", str(tmp_path / "images"), "--out", str(out), "--backend", "synthetic",
                "--detector", "example-colour", "--no-progress")  # fmt: skip
    assert done.returncode == 0, done.stderr
    (line,) = [json.loads(x) for x in out.read_text().splitlines()]
    assert line["status"] == "ok" and line["correct"] is True
    assert line["models"]["detector"]["backend"] == "example-colour"
    assert line["models"]["detector"]["operating_point"]["prediction_floor"] == CURRENT.detection.prediction_floor


def test_backends_lists_plugins_and_a_bad_module_is_one_clear_error() -> None:
    listed = _cli("backends")
    assert listed.returncode == 0, listed.stderr
    assert "example-colour" in listed.stdout and "rfdetr-seg-xl *" in listed.stdout
    bad = _cli("backends", modules="no_such_module_xyz")
    assert bad.returncode == 2 and "NEGT2I_BACKEND_MODULES: cannot import 'no_such_module_xyz'" in bad.stderr


def test_the_example_backend_follows_the_contract() -> None:
    from examples.plugin_detector import ColourDetector

    det = ColourDetector(config=CURRENT)
    image = render_scene([SceneObject("cup", (8, 8, 40, 40)), SceneObject("dog", (30, 30, 60, 50))], (64, 64))
    (found,) = det.detect([image])
    assert flow.check_detections(found, (64, 64), CURRENT) is found
    assert set(found.class_names) == {"cup", "dog"} and (found.scores >= CURRENT.detection.prediction_floor).all()
    assert det.info.rules == {"detection.prediction_floor": CURRENT.detection.prediction_floor}
    assert not ColourDetector(config=CURRENT.model_copy(update={"detection": CURRENT.detection.model_copy(
        update={"prediction_floor": 0.9})})).detect([image])[0].class_names  # fmt: skip
    assert np.asarray(found.masks).dtype == bool


def test_the_registry_is_one_typed_table() -> None:
    import pytest

    from negt2i.stages import registry
    from negt2i.stages.base import Detector
    from negt2i.weights import WEIGHTS

    rows = registry.backends()
    assert {(b.stage, b.name) for b in rows} >= {("detector", "rfdetr-seg-xl"), ("depth", "synthetic")}
    for b in rows:  # the weights entry of a row is the weights table's entry of that model
        if b.weights is not None:
            assert WEIGHTS[b.weights].stage == b.stage and WEIGHTS[b.weights].model == b.model
    assert isinstance(registry.create("detector", "synthetic", device="cpu"), Detector)
    with pytest.raises(TypeError, match="devcie"):
        registry.create("detector", "synthetic", devcie="cpu")  # type: ignore[call-overload]
    registry.register("detector", "test-not-a-detector", lambda **_: object(), replace=True)
    with pytest.raises(TypeError, match="not a Detector"):
        registry.create("detector", "test-not-a-detector")
    with pytest.raises(ValueError, match=r"registered: .*synthetic"):
        registry.create("segmenter", "nope")
