"""``negt2i calibrate``: planted thresholds recovered within the grid step, both label forms, the rules file and
its provenance, and bad input refused with nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from sklearn.metrics import cohen_kappa_score

from negt2i.calibrate import (
    CalibrationError,
    grid_values,
    kappa,
    parse_grid,
    split_images,
)
from negt2i.cli import main
from negt2i.core.config import CURRENT, load_config
from negt2i.core.spec import parse_prompt

from .helpers import perception, rect
from .saved_runs import DETECTOR, Item, write_coco, write_run

PRESENCE, COUNT = 0.12, 0.6
"""The planted thresholds."""


def planted_items(n: int = 240, seed: int = 3) -> list[Item]:
    """One cup per prompt. Absent images hold only a ghost scoring below PRESENCE; present ones a true cup scoring
    above it, plus a second detection: a real second cup (truth 2, an over-count) scoring above COUNT, or a
    spurious one (truth 1) scoring between PRESENCE and COUNT. So the best presence threshold is the smallest grid
    value >= PRESENCE and the best counting threshold the smallest grid value >= COUNT (up to the sample's gaps)."""
    rng = np.random.default_rng(seed)
    prompt = parse_prompt({"id": "cup", "prompt": "a photo of a cup", "include": [{"class": "cup"}]})
    items = []
    for k in range(n):
        kind = rng.choice(["absent", "one", "two"])
        masks, scores = [rect(5, 5, 10, 10)], []
        if kind == "absent":
            scores = [rng.uniform(0.006, PRESENCE - 0.002)]
            truth = 0
        else:
            masks.append(rect(50, 50, 10, 10))
            top = rng.uniform(COUNT + 0.01, 1.0)
            second = rng.uniform(COUNT + 0.002, top) if kind == "two" else rng.uniform(PRESENCE + 0.002, COUNT - 0.002)
            scores = [top, second]
            truth = 2 if kind == "two" else 1
        p = perception(["cup"] * len(masks), masks, scores, refined=False)
        items.append(Item(f"{k:05d}/samples/0000.png", prompt, p, {"cup": truth} if truth else {}))
    return items


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("planted")
    items = planted_items()
    return write_run(d, items), write_coco(d / "truth.json", items)


GRID = ["--grid", "detection.presence_threshold=0.05:0.20:0.01", "--grid", "detection.count_threshold=0.40:0.80:0.05"]


def test_planted_detection_thresholds_are_recovered_within_the_grid_step(planted: tuple[Path, Path], tmp_path: Path):
    results, truth = planted
    out = tmp_path / "rules.json"
    argv = ["calibrate", "--results", str(results), "--labels", str(truth), "--fit", "detection", "--out", str(out),
            "--bootstrap", "50", "--no-progress", *GRID]  # fmt: skip
    assert main(argv) == 0
    rules = json.loads(out.read_text())
    config = load_config(str(out))  # what --rules and NEGT2I_RULES read
    assert abs(config.detection.presence_threshold - PRESENCE) <= 0.01 + 1e-9
    assert abs(config.detection.count_threshold - COUNT) <= 0.05 + 1e-9
    prov = rules["provenance"]
    block = prov["blocks"]["detection"]
    assert prov["labels"]["form"] == "coco"
    assert prov["labels"]["sha256"] == __import__("hashlib").sha256(truth.read_bytes()).hexdigest()
    assert prov["detector"] == DETECTOR
    assert block["grid"]["detection.count_threshold"] == [0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8]
    assert block["candidates"] == 16 * 9
    assert block["fit_split"]["fitted"]["kappa"] == pytest.approx(1.0)
    held = block["heldout"]
    assert held["fitted"]["kappa"] > held["paper"]["kappa"]  # the paper's 0.03 / 0.5 are wrong for these scores
    lo, hi = held["fitted"]["kappa_interval"]
    assert lo <= held["fitted"]["kappa"] <= hi
    assert prov["split"]["fit_images"] + prov["split"]["heldout_images"] == 240
    assert rules["digest"] == config.digest()


def test_ties_go_to_the_papers_value(planted: tuple[Path, Path], tmp_path: Path) -> None:
    """A count grid where every point between the planted gaps ties: 0.5 is not among the tied values, the closest
    tied value to it is chosen; with all points tied (a one-point presence grid) the paper's count value wins."""
    results, truth = planted
    out = tmp_path / "r.json"
    argv = ["calibrate", "--results", str(results), "--labels", str(truth), "--fit", "detection", "--out", str(out),
            "--bootstrap", "0", "--holdout", "0", "--no-progress", "--grid", "detection.presence_threshold=0.15",
            "--grid", "detection.count_threshold=0.005,0.01,0.5,0.9"]  # fmt: skip
    assert main(argv) == 0
    # at presence 0.15 absent images are right; 0.005 / 0.01 count the spurious seconds (wrong), 0.5 and 0.9 differ
    config = load_config(str(out))
    assert config.detection.count_threshold in (0.5, 0.9)
    prov = json.loads(out.read_text())["provenance"]["blocks"]["detection"]
    assert prov["heldout"] is None


def test_human_labels_majority_per_element_fit_a_relation(tmp_path: Path) -> None:
    """Proximity: two annotators of three say 'near' exactly when g < 0.6 R (a planted gap factor); the third
    annotator always disagrees. The majority recovers 0.6 within the 0.05 step; the paper's 0.75 is worse."""
    rng = np.random.default_rng(0)
    prompt = parse_prompt({"id": "prox", "prompt": "a photo of a cup near a dog",
                           "include": [{"class": "cup"}, {"class": "dog"}], "category": "proximity",
                           "statements": [{"kind": "relation", "subject": 0, "target": 1, "predicate": "near",
                                           "polarity": "positive"}]})  # fmt: skip
    items, rows = [], []
    for k in range(120):
        gap = int(rng.integers(2, 20))  # two 20 x 20 squares: R = 11.28, 0.6 R = 6.8, 0.75 R = 8.5
        a, b = rect(40, 10, 20, 20), rect(40, 29 + gap, 20, 20)
        name = f"{k:05d}/samples/0000.png"
        items.append(Item(name, prompt, perception(["cup", "dog"], [a, b], [0.9, 0.9]), {}))
        near = gap < 0.6 * (400 / np.pi) ** 0.5
        for ann, answer in (("a1", near), ("a2", near), ("a3", not near)):
            rows.append(
                {"image": name, "element": "statement:0", "annotator": ann, "answer": "yes" if answer else "no"}
            )
            rows.append({"image": name, "element": "object:0", "annotator": ann, "answer": "yes"})
    results = write_run(tmp_path, items)
    labels = tmp_path / "labels.jsonl"
    labels.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "rules.json"
    argv = ["calibrate", "--results", str(results), "--labels", str(labels), "--fit", "relations", "--out", str(out),
            "--bootstrap", "20", "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    config = load_config(str(out))
    assert abs(config.proximity.gap_factor - 0.6) <= 0.05 + 1e-9
    assert config.directional == CURRENT.directional  # no labelled directional element: the base values stay
    block = json.loads(out.read_text())["provenance"]["blocks"]["proximity"]
    assert block["heldout"]["fitted"]["kappa"] >= block["heldout"]["paper"]["kappa"]
    assert set(json.loads(out.read_text())["provenance"]["blocks"]) == {"proximity"}


# --------------------------------------------------------------------- bad input: clear errors, nothing written


def _calibrate(results: Path, labels: Path, out: Path, *extra: str) -> int:
    return main(["calibrate", "--results", str(results), "--labels", str(labels), "--fit", "detection",
                 "--out", str(out), "--bootstrap", "0", "--no-progress", *GRID, *extra])  # fmt: skip


def test_labels_for_images_without_saved_perception(planted: tuple[Path, Path], tmp_path: Path, capsys) -> None:
    results, truth = planted
    data = json.loads(truth.read_text())
    data["images"].append({"id": 9999, "file_name": "99999/samples/0000.png"})
    bad = tmp_path / "truth.json"
    bad.write_text(json.dumps(data))
    out = tmp_path / "rules.json"
    assert _calibrate(results, bad, out) == 2
    assert "1 labelled image(s) have no saved perception" in capsys.readouterr().err
    assert "99999/samples/0000.png" in capsys.readouterr().err or not out.exists()
    assert not out.exists()


def test_coco_with_unknown_categories(planted: tuple[Path, Path], tmp_path: Path, capsys) -> None:
    results, truth = planted
    data = json.loads(truth.read_text())
    data["categories"].append({"id": 500, "name": "unicorn"})
    bad = tmp_path / "truth.json"
    bad.write_text(json.dumps(data))
    out = tmp_path / "rules.json"
    assert _calibrate(results, bad, out) == 2
    assert "'unicorn' is not a COCO class" in capsys.readouterr().err
    assert not out.exists()


def test_empty_grid(planted: tuple[Path, Path], tmp_path: Path, capsys) -> None:
    results, truth = planted
    out = tmp_path / "rules.json"
    assert _calibrate(results, truth, out, "--grid", "detection.count_threshold=0.9:0.1:0.1") == 2
    assert "the grid is empty" in capsys.readouterr().err
    assert not out.exists()
    with pytest.raises(CalibrationError, match="unknown parameter"):
        parse_grid("detection.nope=0.1")


def test_rules_file_of_another_detector(planted: tuple[Path, Path], tmp_path: Path, capsys) -> None:
    """A rules file fitted on one detector's perception, used as the base for another detector's: refused."""
    results, truth = planted
    fitted = tmp_path / "rules.json"
    assert _calibrate(results, truth, fitted) == 0
    other_dir = tmp_path / "other"
    items = planted_items(n=30, seed=5)
    other = write_run(other_dir, items, detector={"stage": "detector", "backend": "yolo", "model": "yolov8n-seg"})
    truth2 = write_coco(other_dir / "truth.json", items)
    out = tmp_path / "again.json"
    assert _calibrate(other, truth2, out, "--base", str(fitted)) == 2
    err = capsys.readouterr().err
    assert "was fitted for detector planted (planted-scores-v1)" in err and "yolo (yolov8n-seg)" in err
    assert not out.exists()


def test_a_file_not_written_by_calibrate_is_not_replaced(planted: tuple[Path, Path], tmp_path: Path, capsys) -> None:
    results, truth = planted
    out = tmp_path / "rules.json"
    out.write_text('{"name": "mine"}')
    assert _calibrate(results, truth, out) == 2
    assert "was not written by negt2i calibrate" in capsys.readouterr().err
    assert out.read_text() == '{"name": "mine"}'


def test_coco_labels_cannot_fit_relations(planted: tuple[Path, Path], tmp_path: Path, capsys) -> None:
    results, truth = planted
    argv = ["calibrate", "--results", str(results), "--labels", str(truth), "--fit", "relations",
            "--out", str(tmp_path / "r.json"), "--no-progress"]  # fmt: skip
    assert main(argv) == 2
    assert "labels objects only" in capsys.readouterr().err


# --------------------------------------------------------------------- the statistics


def test_kappa_is_sklearns_with_weights() -> None:
    rng = np.random.default_rng(1)
    ref, dec = rng.random(50) < 0.5, rng.random(50) < 0.5
    w = rng.integers(0, 3, 50).astype(float)
    assert kappa(ref, dec) == pytest.approx(cohen_kappa_score(ref, dec))
    expanded_ref, expanded_dec = np.repeat(ref, w.astype(int)), np.repeat(dec, w.astype(int))
    assert kappa(ref, dec, w) == pytest.approx(cohen_kappa_score(expanded_ref, expanded_dec))
    assert np.isnan(kappa(np.ones(4, bool), np.ones(4, bool)))


def test_grids_and_split() -> None:
    assert grid_values((0.05, 0.2, 0.05)) == (0.05, 0.1, 0.15, 0.2)
    assert grid_values((0.3, 0.1, 0.1)) == ()
    fit, held = split_images([f"i{k}" for k in range(10)], 0.3, 0)
    assert len(held) == 3 and not fit & held and len(fit | held) == 10
    assert split_images([f"i{k}" for k in range(10)], 0.3, 0) == (fit, held)  # seeded
    with pytest.raises(CalibrationError, match="each split needs an image"):
        split_images(["a"], 0.3, 0)
