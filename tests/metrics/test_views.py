"""The paper's remaining views (issue 30): GenEval's six tasks, per-statement polarity imbalance, and the
rank correlation of positive accuracy and polarity drop across categories."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from scipy import stats

from negt2i.cli import main
from negt2i.metrics.benchmark import BenchmarkState
from negt2i.metrics.records import parse_line
from negt2i.metrics.report import build_report, load_model
from negt2i.metrics.views import GENEVAL_TASKS, polarity_imbalance, positive_vs_drop
from negt2i.stages.synthetic import SceneObject, render_scene, write_geneval_layout

# GenEval's own prompt records (its evaluation_metadata.jsonl schema), one per task
GENEVAL_PROMPTS: list[tuple[dict[str, Any], list[list[SceneObject]]]] = [
    ({"tag": "single_object", "prompt": "a photo of a dog", "include": [{"class": "dog", "count": 1}]},
     [[SceneObject("dog", (10, 10, 40, 40))], [SceneObject("cow", (10, 10, 40, 40))]]),
    ({"tag": "two_object", "prompt": "a photo of a dog and a cow",
      "include": [{"class": "dog", "count": 1}, {"class": "cow", "count": 1}]},
     [[SceneObject("dog", (4, 4, 24, 24)), SceneObject("cow", (40, 40, 60, 60))],
      [SceneObject("dog", (4, 4, 24, 24))]]),
    ({"tag": "counting", "prompt": "a photo of two dogs", "include": [{"class": "dog", "count": 2}],
      "exclude": [{"class": "dog", "count": 3}]},
     [[SceneObject("dog", (4, 4, 24, 24)), SceneObject("dog", (40, 40, 60, 60))],
      [SceneObject("dog", (4, 4, 24, 24))]]),
    ({"tag": "colors", "prompt": "a photo of a red dog", "include": [{"class": "dog", "count": 1, "color": "red"}]},
     [[SceneObject("dog", (8, 8, 56, 56), value="red")], [SceneObject("dog", (8, 8, 56, 56), value="blue")]]),
    ({"tag": "position", "prompt": "a photo of a cow right of a dog",
      "include": [{"class": "dog", "count": 1}, {"class": "cow", "count": 1, "position": ["right of", 0]}]},
     [[SceneObject("dog", (2, 20, 22, 44)), SceneObject("cow", (42, 20, 62, 44))],
      [SceneObject("cow", (2, 20, 22, 44)), SceneObject("dog", (42, 20, 62, 44))]]),
    ({"tag": "color_attr", "prompt": "a photo of a red dog and a blue cow",
      "include": [{"class": "dog", "count": 1, "color": "red"}, {"class": "cow", "count": 1, "color": "blue"}]},
     [[SceneObject("dog", (2, 2, 30, 30), value="red"), SceneObject("cow", (34, 34, 62, 62), value="blue")],
      [SceneObject("dog", (2, 2, 30, 30), value="red"), SceneObject("cow", (34, 34, 62, 62), value="red")]]),
]  # fmt: skip


def test_geneval_tasks_are_reported_as_its_summary_script_computes(tmp_path: Path) -> None:
    """All six tasks are scored; per task and overall equal GenEval's summary_scores.py on the same file
    (pandas: group by ``tag`` with ``sort=False``, mean of ``correct``; overall = mean of the task means)."""
    pd = pytest.importorskip("pandas")
    root = tmp_path / "geneval"
    write_geneval_layout(root, [(rec, [render_scene(s, (64, 64)) for s in scenes]) for rec, scenes in GENEVAL_PROMPTS])
    out = tmp_path / "r.jsonl"
    assert main(["evaluate", str(root), "--out", str(out), "--backend", "synthetic", "--no-progress"]) == 0
    df = pd.read_json(out, orient="records", lines=True)
    task_means = df.groupby("tag", sort=False)["correct"].mean()
    report = build_report([load_model("m", [out])], n_resamples=20)
    m = report["models"]["m"]
    geneval = m["geneval"]
    assert list(geneval["tasks"]) == list(GENEVAL_TASKS) and geneval["missing_tasks"] == []
    for tag, mean in task_means.items():
        assert geneval["tasks"][tag]["accuracy"] == pytest.approx(mean)
        assert geneval["tasks"][tag]["images"] == 2
    assert geneval["overall"] == pytest.approx(float(task_means.mean()))
    # the scenes were drawn so that the first image of every prompt is right and the second wrong
    assert all(t["correct"] == 1 for t in geneval["tasks"].values()), geneval
    assert m["unscorable_prompts"] == []
    assert not any("not scored" in w for w in report["warnings"])
    assert main(["report", str(out), "--out", str(tmp_path / "rep"), "--no-plots", "--bootstrap", "20"]) == 0
    text = (tmp_path / "rep" / "report.md").read_text()
    assert "GenEval's tasks" in text and "| counting | 50.0 (1/2) |" in text


def _line(cat: str, setting: str, pid: str, sample: int, statements: list[tuple[str, bool, str | None]]) -> Any:
    correct = all(passed for _, passed, _ in statements)
    return parse_line({
        "status": "ok", "filename": f"{pid}/{sample}.png", "prompt_id": pid, "sample": sample, "category": cat,
        "setting": setting, "tag": cat, "correct": correct,
        "failure_class": None if correct else "negated_violated", "objects": [],
        "statements": [{"polarity": pol, "passed": ok, "cause": None if ok else cause, "evaluated": True,
                        "fired": []} for pol, ok, cause in statements],
    })  # fmt: skip


def test_polarity_imbalance_is_the_ratio_of_failure_rates_per_statement() -> None:
    """The paper's 1:2 example: two negated statements cause 56% of failures, the positive one 14% ->
    twice as much per statement. Built here with exact counts on both sides of 1.0."""
    rows = []
    # 1:2 (pos1_neg2), 10 images: positive fails 2 times (of 10), negated 8 times (of 20): (8/20)/(2/10) = 2.0
    for i in range(10):
        rows.append(_line("color", "pos1_neg2", f"a{i}", 0, [
            ("positive", i >= 2, "positive_violated"),
            ("negated", i >= 4, "negated_violated"), ("negated", i >= 4, "negated_violated")]))  # fmt: skip
    # 1:1, 10 images: positive fails 5 times, negated 4 times (one undetected object): 0.8
    for i in range(10):
        rows.append(_line("color", "pos1_neg1", f"b{i}", 0, [
            ("positive", i >= 5, "positive_violated"),
            ("negated", i >= 4, "undetected_object" if i == 0 else "negated_violated")]))  # fmt: skip
    state = BenchmarkState.from_rows(rows)
    imb = polarity_imbalance(state)["by_setting"]
    assert imb["pos1_neg2"]["factor"] == pytest.approx(2.0)
    assert imb["pos1_neg2"]["failed"] == {"positive": 2, "negated": 8}
    assert imb["pos1_neg2"]["statements"] == {"positive": 10, "negated": 20}
    assert imb["pos1_neg1"]["factor"] == pytest.approx(0.8)
    assert polarity_imbalance(state)["range"] == [pytest.approx(0.8), pytest.approx(2.0)]
    assert set(imb) == {"pos1_neg1", "pos1_neg2"}  # single-polarity settings have no factor


def test_positive_vs_drop_uses_scipy_spearman() -> None:
    pos = {"color": 0.85, "material": 0.6, "comparative": 0.5, "depth": 0.42, "directional": 0.55, "proximity": 0.46}
    neg = {"color": 0.31, "material": 0.43, "comparative": 0.33, "depth": 0.44, "directional": 0.40, "proximity": 0.43}
    cells = {**{(c, "pos1_neg0"): v for c, v in pos.items()}, **{(c, "pos0_neg1"): v for c, v in neg.items()}}
    view = positive_vs_drop(cells)
    drops = [pos[c] - neg[c] for c in pos]
    expected = stats.spearmanr(list(pos.values()), drops)
    assert view["spearman_rho"] == pytest.approx(float(expected.statistic))
    assert view["by_category"]["color"]["drop"] == pytest.approx(0.54)
    assert view["n"] == 6
    # undefined cases say so rather than inventing a number
    two = {k: v for k, v in cells.items() if k[0] in ("color", "depth")}
    assert positive_vs_drop(two)["spearman_rho"] is None


def test_report_json_carries_the_views(tmp_path: Path) -> None:
    rows = [_line(c, s, f"{c}-{s}-{i}", 0, [("positive" if s == "pos1_neg0" else "negated", i < k, "positive_violated"
                                            if s == "pos1_neg0" else "negated_violated")])
            for c, k in (("color", 3), ("material", 2), ("depth", 1)) for s in ("pos1_neg0", "pos0_neg1")
            for i in range(4)]  # fmt: skip
    path = tmp_path / "r.jsonl"
    # the same statements as a results file on disk, through the reader the report uses
    raw = []
    for r in rows:
        raw.append({"status": "ok", "filename": r.filename, "prompt_id": r.prompt_id, "sample": 0,
                    "category": r.category, "setting": r.setting, "tag": r.category, "correct": r.correct,
                    "failure_class": r.failure_class, "objects": [],
                    "statements": [{"polarity": s.polarity, "passed": s.passed, "cause": s.cause, "evaluated": True,
                                    "fired": []} for s in r.statements]})  # fmt: skip
    path.write_text("".join(json.dumps(x) + "\n" for x in raw))
    report = build_report([load_model("a", [path]), load_model("b", [path])], n_resamples=10)
    m = report["models"]["a"]
    assert m["positive_vs_drop"]["by_category"]["color"] == {"positive": 0.75, "negated": 0.75, "drop": 0.0}
    assert report["cross_model"]["positive_vs_drop"]["by_category"]["depth"]["models"] == 2
    assert m["geneval"] is None  # no GenEval prompts: no task table
