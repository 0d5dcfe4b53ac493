"""The whole loop of docs/agreement.md on demo images: verdicts, labels, judge files written by the harness
(tiny random judges), ``negt2i agreement`` with a VQA judge and a score-only evaluator and their cost columns."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as sps

from negt2i.cli import main
from negt2i.metrics.agreement import AgreementInputError, read_judges
from negt2i.metrics.synthetic import make_labels


@pytest.fixture(scope="module")
def loop(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from negt2i.stages.demo_data import main as demo

    root = tmp_path_factory.mktemp("loop")
    images = root / "images"
    assert demo([str(images), "--prompts", "6", "--samples", "1", "--size", "64"]) == 0
    results = root / "demo.jsonl"
    assert main(["evaluate", str(images), "--backend", "synthetic", "--out", str(results), "--no-progress"]) == 0
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(p.read_text() for p in sorted(images.glob("*/metadata.jsonl"))))
    questions = root / "q.jsonl"
    assert main(["questions", str(prompts), "--out", str(questions)]) == 0
    records = [json.loads(x) for x in results.read_text().splitlines()]
    labels = root / "labels.jsonl"
    labels.write_text("".join(json.dumps(r) + "\n" for r in make_labels(records, seed=4)))
    common = ["--questions", str(questions), "--images", str(images), "--random-init", "--no-progress"]
    judges = []
    for judge, mode in (("qwen3-vl-8b", "pos"), ("qwen3-vl-8b", "neg"), ("qwen3-vl-8b", "whole"),
                        ("clipscore-vit-b-32", "score")):  # fmt: skip
        out = root / f"{judge}-{mode}.jsonl"
        assert main(["judges", "run", "--judge", judge, "--mode", mode, "--out", str(out), *common]) == 0
        judges.append(out)
    return {"root": root, "results": results, "labels": labels, "judges": judges[0], "all": judges}  # type: ignore[dict-item]


def test_agreement_scores_vqa_judges_and_score_only_evaluators(loop: dict[str, object]) -> None:
    root: Path = loop["root"]  # type: ignore[assignment]
    out = root / "agreement"
    judges = [str(p) for p in loop["all"]]  # type: ignore[attr-defined]
    args = ["agreement", "--labels", str(loop["labels"]), "--results", str(loop["results"]), "--judges", *judges]
    assert main([*args, "--out", str(out), "--bootstrap", "30", "--ours-cost", "1.24B,6.3,0.78"]) == 0
    data = json.loads((out / "agreement.json").read_text())
    clip = data["image_level"]["CLIPScore-random (score)"]
    assert clip["tp"] is None and clip["kappa"] is None and clip["accuracy"] is None  # NaN: no binary form
    # tau / rho against the human score, as scipy computes them
    rows = [json.loads(x) for x in loop["all"][3].read_text().splitlines()]  # type: ignore[index]
    score = {r["image"]: r["score"] for r in rows if "score" in r}
    labels = [json.loads(x) for x in Path(loop["labels"]).read_text().splitlines()]  # type: ignore[arg-type]
    records = {json.loads(x)["filename"]: json.loads(x) for x in Path(loop["results"]).read_text().splitlines()}  # type: ignore[arg-type]
    human = {}
    for image in sorted({lab["image"] for lab in labels}):
        negated = {f"statement:{s['index']}" for s in records[image]["statements"] if s["polarity"] == "negated"}
        per: dict[str, list[bool]] = {}
        for lab in (x for x in labels if x["image"] == image):
            per.setdefault(lab["element"], []).append((lab["answer"] == "yes") != (lab["element"] in negated))
        human[image] = np.mean([np.mean(v) > 0.5 for v in per.values()])
    images = sorted(human)
    x, y = [human[i] for i in images], [score[i] for i in images]
    assert clip["kendall_tau"] == pytest.approx(sps.kendalltau(x, y).statistic)
    assert clip["spearman_rho"] == pytest.approx(sps.spearmanr(x, y).statistic)
    # cost columns from the judge runs: s/img = mean s/question (element modes) x element questions per image
    qwen = [json.loads(x) for p in loop["all"][:2] for x in p.read_text().splitlines()]  # type: ignore[index]
    secs = [r["seconds"] for r in qwen if "seconds" in r and "negt2i" not in r]
    cost = data["costs"]["Qwen3-VL-8B-random"]
    assert cost["s_per_question"] == pytest.approx(np.mean(secs), rel=1e-6)
    assert cost["s_per_image"] == pytest.approx(np.mean(secs) * data["element_questions_per_image"], rel=1e-6)
    assert cost["params"] == "0.1M" and cost["load_seconds"] > 0
    with (out / "table7.csv").open() as fh:
        t7 = list(csv.reader(fh))
    names = [r[0] for r in t7]
    assert "Similarity and reward" in names and "CLIPScore-random" in names
    with (out / "table2.csv").open() as fh:
        t2 = list(csv.reader(fh))
    assert [r[0] for r in t2[2:]] == ["Qwen3-VL-8B-random", "NegT2IBench (ours)", "H. inter-annotator"]
    with (out / "table8.csv").open() as fh:
        t8 = list(csv.reader(fh))
    q = next(r for r in t8 if r[0] == "Qwen3-VL-8B-random")
    assert q[2] == f"{np.mean(secs):.3f}"


def test_a_judge_file_for_images_the_results_do_not_have_is_refused(
    loop: dict[str, object], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = tmp_path / "other.jsonl"
    lines = Path(loop["all"][3]).read_text().splitlines()  # type: ignore[index]
    rec = json.loads(lines[-1])
    rec["image"] = "99999/samples/0000.png"
    other.write_text("\n".join([*lines, json.dumps(rec)]) + "\n")
    args = ["agreement", "--labels", str(loop["labels"]), "--results", str(loop["results"]), "--judges", str(other)]
    assert main([*args, "--out", str(tmp_path / "out")]) == 1
    assert "answers 1 images the results do not have" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"element": "object:0", "score": 0.1}, "mode score goes with element prompt"),
        ({"element": "prompt"}, "a score-mode row needs a score"),
        ({"element": "prompt", "score": "high"}, "score must be a number"),
        ({"element": "prompt", "score": float("inf")}, "score must be finite"),
    ],
)
def test_score_rows_are_checked(tmp_path: Path, row: dict[str, object], message: str) -> None:
    path = tmp_path / "j.jsonl"
    header = {"negt2i": "judge-run/1", "judge": "S", "mode": "score"}
    path.write_text(json.dumps(header) + "\n" + json.dumps({"judge": "S", "mode": "score", "image": "i", **row}) + "\n")
    with pytest.raises(AgreementInputError, match=message):
        read_judges(path)


def test_judging_a_labelling_task_answers_exactly_its_images_under_the_labels_keys(
    loop: dict[str, object], tmp_path: Path
) -> None:
    root: Path = loop["root"]  # type: ignore[assignment]
    task = tmp_path / "task"
    questions = root / "q.jsonl"
    assert main(["labels", "export", str(loop["results"]), "--images", str(root / "images"), "--sample", "3",
                 "--questions", str(questions), "--out", str(task)]) == 0  # fmt: skip
    items = json.loads((task / "task.json").read_text())["items"]
    out = tmp_path / "clip.jsonl"
    assert main(["judges", "run", "--judge", "clipscore-vit-b-32", "--mode", "score", "--questions", str(questions),
                 "--images", str(task), "--out", str(out), "--random-init", "--no-progress"]) == 0  # fmt: skip
    rows = [json.loads(x) for x in out.read_text().splitlines() if "negt2i" not in x]
    assert sorted(r["image"] for r in rows) == sorted(it["image"] for it in items)
    by_key = {it["image"]: it for it in items}
    from negt2i.judges.harness import file_sha256

    for r in rows:  # the very file the annotators saw
        assert r["image_sha256"] == file_sha256(task / by_key[r["image"]]["file"])
    # a question file from another corpus version is refused for a task too
    lines = questions.read_text().splitlines()
    other = tmp_path / "q2.jsonl"
    other.write_text("\n".join(json.dumps({**json.loads(x), "prompt_sha256": "f" * 64}) for x in lines) + "\n")
    assert main(["judges", "run", "--judge", "clipscore-vit-b-32", "--mode", "score", "--questions", str(other),
                 "--images", str(task), "--out", str(tmp_path / "x.jsonl"), "--random-init"]) == 1  # fmt: skip
    assert not (tmp_path / "x.jsonl").exists()


def test_the_detectors_own_cost_comes_from_the_cost_benchmark(loop: dict[str, object], tmp_path: Path) -> None:
    """benchmarks/bench_cost.py (batch 1, load apart) writes the file `--ours-cost` reads into Tables 2 and 8."""
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    cost = tmp_path / "cost.json"
    subprocess.run([sys.executable, "benchmarks/bench_cost.py", "--backend", "synthetic", "--images",
                    str(Path(loop["root"]) / "images"), "--limit", "2", "--out", str(cost)],  # type: ignore[arg-type]
                   cwd=repo, env={**os.environ, "PYTHONPATH": str(repo)}, check=True, capture_output=True,
                   timeout=300)  # fmt: skip
    figures = json.loads(cost.read_text())
    assert figures["images"] == 2 and figures["s_per_image"] > 0 and figures["load_seconds"] > 0
    out = tmp_path / "agreement"
    args = ["agreement", "--labels", str(loop["labels"]), "--results", str(loop["results"]), "--judges",
            str(loop["judges"]), "--bootstrap", "10", "--out", str(out), "--ours-cost", str(cost)]  # fmt: skip
    assert main(args) == 0
    with (out / "table8.csv").open() as fh:
        ours = next(r for r in csv.reader(fh) if r[0] == "NegT2IBench (ours)")
    assert ours[3] == f"{figures['s_per_image']:.2f}" and ours[4] == f"{figures['load_seconds']:.1f}"
    bad = tmp_path / "bad.json"
    bad.write_text('{"seconds": 1}')
    with pytest.raises(SystemExit):
        main([*args[:-1], str(bad)])
