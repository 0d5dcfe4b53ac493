"""Report sections of the probe sets: statistics against hand-computed values, outputs, and end to end."""

from __future__ import annotations

import argparse
import csv
import json
import re
from pathlib import Path
from typing import Any

import pytest

from negt2i.cli import evaluate_cmd, report_cmd
from negt2i.metrics.probes import ProbeInputError, load, negation_following, paired_rates, wording_robustness
from negt2i.stages.synthetic import SceneObject, render_scene, write_geneval_layout

from .conftest import write_jsonl


def _stmt(polarity: str, outcome: str | None, requested: str = "red") -> dict[str, Any]:
    """A statement verdict with the given outcome (``None``: not evaluated, the object is missing)."""
    fired = None if outcome is None else ([requested] if outcome == "holds" else ["blue"])
    passed = outcome is not None and ((outcome == "holds") == (polarity == "positive"))
    cause = None
    if not passed:
        cause = "undetected_object" if outcome is None else f"{polarity}_violated"
    return {
        "index": 0,
        "kind": "attribute",
        "polarity": polarity,
        "requested": requested,
        "evaluated": fired is not None,
        "fired": fired,
        "passed": passed,
        "cause": cause,
        "dead_zone": False,
        "outcome": outcome,
    }


def _line(
    pid: str,
    sample: int,
    statements: list[dict[str, Any]],
    *,
    probes=None,
    source=None,
    form=None,
    setting: str = "pos0_neg1",
    category: str = "color",
    present: bool = True,
) -> dict[str, Any]:
    correct = present and all(s["passed"] for s in statements)
    rec: dict[str, Any] = {
        "filename": f"{pid}/{sample}.png",
        "sample": sample,
        "status": "ok",
        "prompt_id": pid,
        "tag": category,
        "prompt": pid,
        "category": category,
        "setting": setting,
        "correct": correct,
        "reason": "",
        "failure_class": None if correct else ("undetected_object" if not present else "negated_violated"),
        "objects": [{"present": present, "over_count": False, "under_count": False}],
        "statements": statements,
        "config": {"name": "paper", "digest": "d"},
        "models": {},
    }
    if probes is not None:
        rec["probes"] = probes
    if source is not None:
        rec["source_id"] = source
    if form is not None:
        rec["form"] = form
    return rec


def _error(pid: str, sample: int) -> dict[str, Any]:
    return {
        "filename": f"{pid}/{sample}.png",
        "sample": sample,
        "status": "error",
        "error": "unreadable_image: x",
        "prompt_id": pid,
        "category": None,
        "setting": None,
        "correct": False,
        "reason": "x",
    }


P1, P2 = "color-pos0_neg1-000", "color-pos0_neg1-001"
Q1 = "material-pos1_neg0-000"


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    """Hand-made results; the expected numbers are worked out in the tests' comments."""
    main = [
        # P1 (negated red): 4 images evaluated, 1 shows red
        *(_line(P1, i, [_stmt("negated", o)]) for i, o in enumerate(["holds", "not", "not", "not"])),
        # P2 (negated red): 1 image without the object (not evaluated), 3 evaluated, none shows red
        *(
            _line(P2, i, [_stmt("negated", o)], present=o is not None)
            for i, o in enumerate([None, "not", "not", "not"])
        ),
        # Q1 (positive wooden): 2 of 4 show it
        *(
            _line(Q1, i, [_stmt("positive", o, "wooden")], setting="pos1_neg0", category="material")
            for i, o in enumerate(["holds", "holds", "not", "not"])
        ),
        _line("color-pos0_neg1-099", 0, [_stmt("negated", "not")]),  # no control: left out of the pairing
    ]
    control = [
        # control of P1: red in 3 of 4; of P2: red in 2 of 4; of Q1: wooden in 1 of 4
        *(
            _line(f"control-{P1}", i, [], probes=[_stmt("negated", o)], source=P1, setting="pos0_neg0")
            for i, o in enumerate(["holds", "holds", "holds", "not"])
        ),
        *(
            _line(f"control-{P2}", i, [], probes=[_stmt("negated", o)], source=P2, setting="pos0_neg0")
            for i, o in enumerate(["holds", "holds", "not", "not"])
        ),
        *(
            _line(
                f"control-{Q1}",
                i,
                [],
                probes=[_stmt("positive", o, "wooden")],
                source=Q1,
                setting="pos0_neg0",
                category="material",
            )
            for i, o in enumerate(["holds", "not", "not", "not"])
        ),
    ]
    para = [
        # form which_isnt: P1 3 of 4 correct (original 3 of 4), P2 1 of 4 with one error line (original 3 of 4)
        *(
            _line(f"paraphrase-which_isnt-{P1}", i, [_stmt("negated", o)], source=P1, form="which_isnt")
            for i, o in enumerate(["not", "not", "not", "holds"])
        ),
        *(
            _line(f"paraphrase-which_isnt-{P2}", i, [_stmt("negated", o)], source=P2, form="which_isnt")
            for i, o in enumerate(["not", "holds", "holds"])
        ),
        _error(f"paraphrase-which_isnt-{P2}", 3),
    ]
    return {
        "main": write_jsonl(tmp_path / "main.jsonl", main),
        "control": write_jsonl(tmp_path / "control.jsonl", control),
        "paraphrase": write_jsonl(tmp_path / "para.jsonl", para),
    }


def test_negation_following_against_hand_computed_values(files: dict[str, Path]) -> None:
    data = load([files["main"]], [files["control"]])
    rows = {(r["category"], r["polarity"]): r for r in negation_following(data, n_resamples=2000, seed=0)}
    color = rows[("color", "negated")]
    # prompt: (1 + 0) shows / (4 + 3) evaluated; control: (3 + 2) / (4 + 4); effect = control - prompt
    assert color["prompts"] == 2 and (color["evaluated_prompt"], color["evaluated_control"]) == (7, 8)
    assert color["rate_prompt"] == pytest.approx(1 / 7) and color["rate_control"] == pytest.approx(5 / 8)
    assert color["effect"] == pytest.approx(5 / 8 - 1 / 7)
    # two source prompts: a replicate draws {P1, P1} (effect 3/4 - 1/4 = 0.5), {P2, P2} (2/4 - 0/3 = 0.5)
    # or one of each (the point, 0.4821...), each with probability >= 1/4: the 95% interval is [0.4821, 0.5]
    assert color["interval"]["effect"] == pytest.approx([5 / 8 - 1 / 7, 0.5])
    # rate under the prompt: {P1,P1} 2/8 = 0.25, {P2,P2} 0/6 = 0, mixed 1/7
    assert color["interval"]["rate_prompt"] == pytest.approx([0.0, 0.25])
    material = rows[("material", "positive")]
    # one source prompt: prompt 2/4, control 1/4, effect = prompt - control; nothing to resample
    assert (material["rate_prompt"], material["rate_control"], material["effect"]) == (0.5, 0.25, 0.25)
    assert material["interval"] == {"rate_prompt": None, "rate_control": None, "effect": None}
    # pooled rows: the negated ones are color's; the positive ones material's
    assert rows[("all", "negated")]["effect"] == pytest.approx(color["effect"])
    assert rows[("all", "positive")]["effect"] == 0.25
    assert list(rows) == [("color", "negated"), ("material", "positive"), ("all", "negated"), ("all", "positive")]


def test_wording_robustness_against_hand_computed_values(files: dict[str, Path]) -> None:
    data = load([files["main"]], paraphrase=[files["paraphrase"]])
    rows = {(r["form"], r["scope"]): r for r in wording_robustness(data, n_resamples=2000, seed=0)}
    overall = rows[("which_isnt", "overall")]
    # form: (3 + 1) correct of (4 + 4) images (the error line is an incorrect image); original: (3 + 3) of 8
    assert (overall["images_form"], overall["images_original"]) == (8, 8)
    assert overall["accuracy_form"] == 0.5 and overall["accuracy_original"] == 0.75
    assert overall["difference"] == -0.25
    # replicates: {P1,P1} 3/4 - 3/4 = 0, {P2,P2} 1/4 - 3/4 = -0.5, mixed -0.25: interval [-0.5, 0]
    assert overall["interval"]["difference"] == pytest.approx([-0.5, 0.0])
    assert set(rows) == {("which_isnt", s) for s in ("overall", "color", "with negation")}
    assert rows[("which_isnt", "color")]["difference"] == -0.25


def test_paired_rates_edge_cases() -> None:
    same = paired_rates([1, 1, 1], [2, 2, 2], [2, 2, 2], [2, 2, 2], n_resamples=300)
    assert same["r1"] == 0.5 and same["difference"] == -0.5
    assert same["interval"] == {"r1": [0.5, 0.5], "r2": [1.0, 1.0], "difference": [-0.5, -0.5]}
    none = paired_rates([0], [0], [1], [2])
    assert none["r1"] is None and none["difference"] is None and none["interval"]["r2"] is None
    a = paired_rates([1, 0, 3, 2], [4, 4, 4, 4], [2, 2, 4, 1], [4, 4, 4, 4], n_resamples=500, seed=3)
    assert a == paired_rates([1, 0, 3, 2], [4, 4, 4, 4], [2, 2, 4, 1], [4, 4, 4, 4], n_resamples=500, seed=3)
    assert a != paired_rates([1, 0, 3, 2], [4, 4, 4, 4], [2, 2, 4, 1], [4, 4, 4, 4], n_resamples=500, seed=4)
    with pytest.raises(ValueError, match="one entry per source prompt"):
        paired_rates([1], [1, 2], [1], [1])


def _report(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="negt2i")
    report_cmd.register(parser.add_subparsers())
    args = parser.parse_args(argv)
    return int(args.func(args))


def test_report_writes_every_format(files: dict[str, Path], tmp_path: Path, capsys) -> None:
    out = tmp_path / "rep"
    code = _report(
        [
            "report",
            f"m={files['main']}",
            "--control",
            f"m={files['control']}",
            "--paraphrase",
            f"m={files['paraphrase']}",
            "--out",
            str(out),
            "--bootstrap",
            "200",
        ]
    )
    assert code == 0, capsys.readouterr().err
    report = json.loads((out / "report.json").read_text())
    probes = report["probes"]["models"]["m"]
    assert probes["files"] == {"control": [str(files["control"])], "paraphrase": [str(files["paraphrase"])]}
    nf = {(r["category"], r["polarity"]): r for r in probes["negation_following"]}
    assert nf[("color", "negated")]["effect"] == pytest.approx(5 / 8 - 1 / 7)
    with (out / "negation_following.csv").open() as fh:
        first = next(csv.DictReader(fh))
    assert first["category"] == "color" and float(first["effect_pts"]) == pytest.approx(100 * (5 / 8 - 1 / 7), abs=1e-3)
    with (out / "wording_robustness.csv").open() as fh:
        assert float(next(csv.DictReader(fh))["difference_pts"]) == -25.0
    md = (out / "report.md").read_text()
    assert "How to read negation following" in md and "How to read wording robustness" in md
    assert "| Color | negated | 2 | 14.3" in md
    page = (out / "report.html").read_text()
    assert "Negation following: prompt vs control" in page and "Wording robustness: accuracy difference" in page
    assert (out / "plots" / "negation-following.png").stat().st_size > 1000
    assert not any("error lines whose prompt has no judged image" in w for w in report["warnings"])


def _documented_columns(name: str) -> list[str]:
    """The column list ``docs/report.md`` gives for the probe CSV ``name`` (a published format)."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "report.md").read_text()
    match = re.search(rf"- `{re.escape(name)}`: `([^`]+)`", doc)
    assert match, f"docs/report.md lists no columns for {name}"
    return [c.strip() for c in match.group(1).split(",")]


def test_probe_csv_headers_are_the_documented_ones(files: dict[str, Path], tmp_path: Path, capsys) -> None:
    """The CSV headers are a published format: renaming or reordering a column must fail here."""
    out = tmp_path / "rep"
    argv = ["report", f"m={files['main']}", "--control", f"m={files['control']}"]
    code = _report([*argv, "--paraphrase", f"m={files['paraphrase']}", "--out", str(out), "--bootstrap", "50"])
    assert code == 0, capsys.readouterr().err
    for name in ("negation_following.csv", "wording_robustness.csv"):
        with (out / name).open() as fh:
            header = next(csv.reader(fh))
        assert header == _documented_columns(name)
    assert _documented_columns("negation_following.csv")[:3] == ["model", "category", "polarity"]
    last = ["difference_pts", "difference_ci_low", "difference_ci_high"]
    assert _documented_columns("wording_robustness.csv")[-3:] == last


def test_report_refuses_unpaired_or_misnamed_probe_results(files: dict[str, Path], tmp_path: Path, capsys) -> None:
    base = ["report", f"m={files['main']}", "--out", str(tmp_path / "r"), "--no-plots", "--bootstrap", "50"]
    assert _report([*base, "--control", f"other={files['control']}"]) == 1
    assert "no model 'other' among the main results" in capsys.readouterr().err
    assert _report([*base, "--control", str(files["control"])]) == 1
    assert "expected NAME=PATH" in capsys.readouterr().err
    assert _report([*base, "--control", f"m={files['main']}"]) == 1  # main results are no control results
    assert "without source_id" in capsys.readouterr().err
    swapped = ["report", f"m={files['control']}", "--control", f"m={files['control']}", "--out", str(tmp_path / "s"),
               "--no-plots", "--bootstrap", "50"]  # fmt: skip
    assert _report(swapped) == 1
    assert "among the main results; pass those with --control" in capsys.readouterr().err
    assert _report([*base, "--paraphrase", f"m={files['control']}"]) == 1
    assert "without form" in capsys.readouterr().err
    with pytest.raises(ProbeInputError, match="has statements"):
        load([files["main"]], [files["paraphrase"]])
    assert _report(base) == 0 and "probes" not in json.loads((tmp_path / "r" / "report.json").read_text())


# --------------------------------------------------------------------------- end to end


def _evaluate(images: Path, out: Path) -> None:
    parser = argparse.ArgumentParser(prog="negt2i")
    evaluate_cmd.register(parser.add_subparsers())
    args = parser.parse_args(["evaluate", str(images), "--out", str(out), "--backend", "synthetic", "--no-progress"])
    assert int(args.func(args)) == 0


def _cup(color: str) -> Any:
    return render_scene([SceneObject("cup", (16, 16, 48, 48), value=color)], (64, 64))


def test_synthetic_images_through_evaluate_and_report(tmp_path: Path, capsys) -> None:
    neg = [{"kind": "attribute", "object": 0, "value": "red", "polarity": "negated"}]
    source = {
        "id": P1,
        "category": "color",
        "prompt": "a photo of a non-red cup",
        "include": [{"class": "cup"}],
        "statements": neg,
    }
    control = {
        "id": f"control-{P1}",
        "category": "color",
        "prompt": "a photo of a cup",
        "include": [{"class": "cup"}],
        "statements": [],
        "probes": neg,
        "source_id": P1,
    }
    para = {
        **source,
        "id": f"paraphrase-which_isnt-{P1}",
        "prompt": "a photo of a cup which isn't red",
        "source_id": P1,
        "form": "which_isnt",
    }
    runs = {
        "main": (source, ["red", "blue"]),  # the forbidden red shows in 1 of 2; 1 of 2 correct
        "control": (control, ["red", "red"]),  # without the negation the cup is red in 2 of 2
        "para": (para, ["blue", "blue"]),  # the paraphrase is followed: 2 of 2 correct
    }
    for name, (record, colors) in runs.items():
        write_geneval_layout(tmp_path / name, [(record, [_cup(c) for c in colors])])
        _evaluate(tmp_path / name, tmp_path / f"{name}.jsonl")
    out = tmp_path / "rep"
    assert (
        _report(
            [
                "report",
                f"m={tmp_path / 'main.jsonl'}",
                "--control",
                f"m={tmp_path / 'control.jsonl'}",
                "--paraphrase",
                f"m={tmp_path / 'para.jsonl'}",
                "--out",
                str(out),
                "--no-plots",
            ]
        )
        == 0
    )
    probes = json.loads((out / "report.json").read_text())["probes"]["models"]["m"]
    color = probes["negation_following"][0]
    assert (color["rate_prompt"], color["rate_control"], color["effect"]) == (0.5, 1.0, 0.5)
    wording = probes["wording_robustness"][0]
    assert (wording["accuracy_form"], wording["accuracy_original"], wording["difference"]) == (1.0, 0.5, 0.5)
