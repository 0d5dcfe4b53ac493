"""Perception saved once, judged many times: re-judging the demo from the side file reproduces every verdict,
covers other thresholds and both depth rules, and ``negt2i ablate`` writes Table 17's eight rows from it."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest

from negt2i.cli import main
from negt2i.core.config import CURRENT, PREVIOUS, load_config
from negt2i.core.rejudge import RejudgeError, load_saved
from negt2i.core.results import read_results
from negt2i.stages.demo_data import write_demo


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    d = tmp_path_factory.mktemp("ablate")
    coco = d / "truth.json"
    write_demo(d / "demo", prompts=36, samples=2, seed=5, coco=coco)
    out: dict[str, Any] = {"root": d, "truth": coco}
    for name, detector in (("main", "synthetic"), ("alt", "synthetic-noisy")):
        res = d / f"{name}.jsonl"
        argv = ["evaluate", str(d / "demo"), "--out", str(res), "--backend", "synthetic", "--detector", detector,
                "--no-progress", "--save-perception"]  # fmt: skip
        assert main(argv) == 0
        out[name] = res
    return out


def _key(line: dict[str, Any]) -> Any:
    return (line["correct"], [(s["passed"], s["fired"], s["cause"]) for s in line["statements"]],
            [(o["present"], o["counted"]) for o in line["objects"]])  # fmt: skip


@pytest.mark.parametrize("which", ["main", "alt"])
def test_rejudging_with_the_saved_rules_reproduces_every_verdict(runs: dict[str, Any], which: str) -> None:
    run = load_saved([runs[which]])
    lines = {r["filename"]: r for r in read_results(runs[which]) if r.get("status") == "ok"}
    assert len(run.images) == len(lines) == 72
    for im in run.images:
        assert _key(im.judge(CURRENT).to_json()) == _key(lines[im.filename])
    assert any(im.perception.disparity is not None for im in run.images)  # depth maps are stored in process


def test_other_rules_need_no_model(runs: dict[str, Any]) -> None:
    """The previous preset (contact-band depth) and other thresholds judge every saved image: a statement left
    unevaluable by the run's thresholds still finds its masks (the side file is planned complete)."""
    run = load_saved([runs["alt"]])
    loose = CURRENT.model_copy(update={"detection": CURRENT.detection.model_copy(update={"count_threshold": 0.99})})
    evaluable = 0
    for im in run.images:
        im.judge(PREVIOUS)
        evaluable += sum(s.evaluated for s in im.judge(loose).statements)
    assert evaluable > sum(sum(s.evaluated for s in im.judge(CURRENT).statements) for im in run.images)


def _labels_from(run_path: Path, out: Path, flip: int = 0) -> Path:
    """Element labels (three annotators agreeing) equal to the C6 verdicts of the main run, ``flip`` images flipped."""
    run = load_saved([run_path])
    rows = []
    for k, im in enumerate(run.images):
        v = im.judge(CURRENT)
        elements = [(f"object:{o.index}", o.ok) for o in v.objects]
        elements += [(f"statement:{s.index}", s.passed != (s.polarity.value == "negated")) for s in v.statements]
        for e, ok in elements:
            yes = ok != (k < flip and e == "object:0")
            rows += [{"image": im.filename, "element": e, "annotator": a, "answer": "yes" if yes else "no"}
                     for a in ("a1", "a2", "a3")]  # fmt: skip
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


def test_ablate_writes_table_17(runs: dict[str, Any], tmp_path: Path) -> None:
    labels = _labels_from(runs["main"], tmp_path / "labels.jsonl")
    out = tmp_path / "ablation"
    argv = ["ablate", "--labels", str(labels), "--main", str(runs["main"]), "--alt", str(runs["alt"]),
            "--out", str(out), "--bootstrap", "50"]  # fmt: skip
    assert main(argv) == 0
    rows = list(csv.DictReader((out / "ablation.csv").open()))
    assert sorted(r["config"] for r in rows) == [f"C{k}" for k in range(1, 9)]
    by = {r["config"]: r for r in rows}
    assert by["C6"]["kappa"] == "1.000" and by["C6"]["agreement_pct"] == "100.0"  # labels = C6's verdicts
    assert rows[0]["config"] == "C6"  # Table 17's order: kappa, highest first
    assert {r["n"] for r in rows} == {"72"}
    assert by["C6"]["detector"] == "synthetic (synthetic-palette-v1)"
    assert by["C2"]["detector"] == "synthetic-noisy (synthetic-noisy-palette-v1)"
    assert (by["C5"]["sam"], by["C5"]["constants"], by["C3"]["sam"]) == ("yes", "previous", "no")
    page = (out / "ablation.html").read_text()
    assert page.count("<tr><td>C") == 8 and "κ" in page
    meta = json.loads((out / "ablation.json").read_text())
    records = {r["config"]: r["rules"] for r in meta["rows"]}
    assert records["C5"]["depth"]["rule"] == "contact_band" and records["C7"]["masks"]["refine"] is False
    assert meta["detectors"]["alt"]["model"]["backend"] == "synthetic-noisy"
    assert meta["labels"]["sha256"]
    float(by["C1"]["kappa_lo"]) <= float(by["C1"]["kappa"]) <= float(by["C1"]["kappa_hi"])


def test_ablate_refuses_rules_fitted_for_another_detector(runs: dict[str, Any], tmp_path: Path, capsys) -> None:
    """A rules file calibrated on the noisy detector's perception cannot stand in for the main detector's."""
    fitted = tmp_path / "noisy.json"
    argv = [
        "calibrate",
        "--results",
        str(runs["alt"]),
        "--labels",
        str(runs["truth"]),
        "--fit",
        "detection",
        "--out",
        str(fitted),
        "--bootstrap",
        "0",
        "--no-progress",
        "--grid",
        "detection.presence_threshold=0.1,0.3",
        "--grid",
        "detection.count_threshold=0.3,0.5",
    ]
    assert main(argv) == 0
    labels = _labels_from(runs["main"], tmp_path / "labels.jsonl")
    out = tmp_path / "ablation"
    argv = ["ablate", "--labels", str(labels), "--main", str(runs["main"]), "--main-rules", str(fitted),
            "--out", str(out), "--bootstrap", "0"]  # fmt: skip
    assert main(argv) == 2
    assert "was fitted for detector synthetic-noisy" in capsys.readouterr().err
    assert not out.exists()
    assert load_config(str(fitted)).name.startswith("fitted-detection-synthetic-noisy")


def test_results_without_perception_are_refused(tmp_path: Path) -> None:
    res = tmp_path / "r.jsonl"
    res.write_text("")
    with pytest.raises(RejudgeError, match="perception file not found"):
        load_saved([res])
