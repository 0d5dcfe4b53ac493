"""The agreement study on hand-built images, checked against scikit-learn / scipy and brute-force references."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import stats as sps
from sklearn.metrics import cohen_kappa_score

from negt2i.cli import main
from negt2i.core.results import ok_record
from negt2i.metrics.agreement import (
    OURS,
    AgreementInputError,
    JudgeRow,
    LabelRow,
    analyze,
    build_study,
    read_judges,
    read_labels,
)
from negt2i.metrics.records import ImageRow, parse_line
from negt2i.metrics.stats import fleiss_kappa
from negt2i.metrics.synthetic import make_judge, make_labels, make_prompts, make_results, make_verdict

from .conftest import write_jsonl

# Four images of one "a non-<color> <object>" prompt: elements object:0 and statement:0 (negated).
# Our verdicts: correct, negated statement violated, correct, object missing.
PATTERNS = [None, "negated_violated", None, "undetected_object"]
# Answers of annotators a, b, c to the affirmative questions ("is there a <object>?", "is it <color>?").
ANSWERS = {
    0: {"object:0": "yyy", "statement:0": "nny"},  # statement satisfied by 2 of 3 -> image label 1
    1: {"object:0": "yyy", "statement:0": "yyn"},  # color rendered -> 0
    2: {"object:0": "ynn", "statement:0": "nnn"},  # object judged missing -> 0 (our evaluator passes it: FP)
    3: {"object:0": "nnn", "statement:0": "nnn"},  # object missing -> 0
}


@pytest.fixture(scope="module")
def records() -> list[dict[str, Any]]:
    (prompt,) = make_prompts(1, cells=[("color", "pos0_neg1")], seed=3)
    return [
        ok_record(make_verdict(prompt, p), filename=f"img{i}.png", sample=i, models={}) for i, p in enumerate(PATTERNS)
    ]


@pytest.fixture(scope="module")
def rows(records: list[dict[str, Any]]) -> list[ImageRow]:
    return [parse_line(r) for r in records]


def _labels() -> list[LabelRow]:
    return [
        LabelRow(f"img{i}.png", el, who, ans == "y", None, f"labels:{i}")
        for i, per in ANSWERS.items()
        for el, answers in per.items()
        for who, ans in zip("abc", answers, strict=True)
    ]


def test_image_level_binary_and_rank_agreement_match_sklearn_and_scipy(rows: list[ImageRow]) -> None:
    out = analyze(build_study(_labels(), rows), n_resamples=50)
    human = [1, 0, 0, 0]
    ours = [1, 0, 1, 0]
    s = out["image_level"][OURS]
    assert (s["tp"], s["tn"], s["fp"], s["fn"]) == (1, 2, 1, 0)
    assert s["kappa"] == pytest.approx(cohen_kappa_score(human, ours))
    human_score = [1.0, 0.5, 0.5, 0.5]  # share of elements the majority marks satisfied
    our_score = [1.0, 0.5, 1.0, 0.0]  # share our verdict marks satisfied (object missing: statement unevaluable)
    assert s["kendall_tau"] == pytest.approx(sps.kendalltau(human_score, our_score).statistic)
    assert s["spearman_rho"] == pytest.approx(sps.spearmanr(human_score, our_score).statistic)
    # pairs with different human scores: (0,1), (0,2), (0,3); ours orders (0,1) and (0,3) right, ties (0,2)
    assert s["pair_accuracy"] == pytest.approx(2.5 / 3)
    assert out["human_accept_rate"] == 0.25 and out["annotators_per_image"] == 3


def _loo_reference(sat: np.ndarray, image_of: np.ndarray, n_images: int, tie_satisfied: bool = False) -> float:
    kappas = []
    for s in range(sat.shape[1]):
        held = sat[:, s]
        others = np.delete(sat, s, axis=1).sum(axis=1)
        ref = (others == 2) | ((others == 1) & tie_satisfied)  # m = 3: two others; 1-1 is the tie
        held_img = [all(held[image_of == i]) for i in range(n_images)]
        ref_img = [all(ref[image_of == i]) for i in range(n_images)]
        kappas.append(cohen_kappa_score(ref_img, held_img))
    return float(np.mean(kappas))


def test_leave_one_out_fleiss_and_unanimous_on_raw_answers(rows: list[ImageRow]) -> None:
    study = build_study(_labels(), rows)
    out = analyze(study, n_resamples=20)
    expected = _loo_reference(study.satisfied, study.element_image, 4)
    assert out["inter_annotator"]["image"]["kappa"] == pytest.approx(expected)
    stmt = out["element_level"]["negated"]["inter_annotator"]
    yes = np.array([1, 2, 0, 0])  # "is it <color>?" answered yes, per image
    assert stmt["fleiss_kappa"] == pytest.approx(fleiss_kappa(np.stack([yes, 3 - yes], axis=1)))
    assert stmt["unanimous"] == 0.5
    objects = out["element_level"]["objects"]
    assert objects["n"] == 4 and objects["evaluators"][OURS]["satisfied"] == 1.0  # 2 satisfied, both found
    assert objects["evaluators"][OURS]["unsatisfied"] == 0.5  # of 2 unsatisfied, ours rejects one


def test_the_leave_one_out_tie_rule_is_an_option(rows: list[ImageRow]) -> None:
    """A 1-1 split between the two other annotators: unsatisfied by default (strict majority), satisfied on request."""
    study = build_study(_labels(), rows)
    strict = analyze(study, n_resamples=20)
    lenient = analyze(study, n_resamples=20, loo_tie="satisfied")
    assert strict["leave_one_out_tie"] == "unsatisfied" and lenient["leave_one_out_tie"] == "satisfied"
    expected = _loo_reference(study.satisfied, study.element_image, 4, tie_satisfied=True)
    assert lenient["inter_annotator"]["image"]["kappa"] == pytest.approx(expected)
    assert lenient["inter_annotator"]["image"]["kappa"] != pytest.approx(strict["inter_annotator"]["image"]["kappa"])
    with pytest.raises(ValueError, match="loo_tie must be one of"):
        analyze(study, n_resamples=20, loo_tie="coin")


def test_judge_modes_map_answers_to_the_expected_answer(rows: list[ImageRow]) -> None:
    judges = []
    for i in range(4):
        img = f"img{i}.png"
        judges.append(JudgeRow("J", "pos", img, "object:0", 0.9, "j"))
        judges.append(JudgeRow("J", "pos", img, "statement:0", 0.2, "j"))  # "is it red?" no -> satisfied
        judges.append(JudgeRow("J", "neg", img, "object:0", 0.9, "j"))
        judges.append(JudgeRow("J", "neg", img, "statement:0", 0.8, "j"))  # "is it non-red?" yes -> satisfied
        judges.append(JudgeRow("J", "whole", img, "prompt", 0.3, "j"))
    study = build_study(_labels(), rows, judges)
    pos, neg, whole = study.evaluators["J (pos)"], study.evaluators["J (neg)"], study.evaluators["J (whole)"]
    assert pos.element_binary is not None and pos.element_binary.all() and pos.image_binary.all()
    assert np.array_equal(pos.image_score, neg.image_score) and np.allclose(pos.image_score, 0.85)
    assert whole.element_binary is None and not whole.image_binary.any()
    out = analyze(study, n_resamples=30)
    assert set(out["differences"]) == {
        f"J (neg) - {OURS}",
        f"J (pos) - {OURS}",
        f"J (whole) - {OURS}",
        "J (neg) - J (pos)",
    }
    assert out["differences"]["J (neg) - J (pos)"]["kappa"] == {"value": 0.0, "interval": [0.0, 0.0]}
    # every negated statement flips (0.2 -> 0.8) and the two answers are complementary
    assert out["negation_probe"] == {
        "J": {
            "n": 4,
            "flip": 1.0,
            "complementarity_error": pytest.approx(0.0),
            "called_correct_pos": 1.0,
            "called_correct_neg": 1.0,
        }
    }


def test_breakdowns_and_intervals_on_a_synthetic_study() -> None:
    prompts = make_prompts(2, seed=9)
    recs = list(make_results(prompts, lambda c, s: 0.5, images_per_prompt=1, seed=9))
    labels = make_labels(recs, seed=1)
    study = build_study(
        [LabelRow(r["image"], r["element"], r["annotator"], r["answer"] == "yes", None, "x") for r in labels],
        [parse_line(r) for r in recs],
        [
            JudgeRow(j["judge"], j["mode"], j["image"], j["element"], j["p_yes"], "y")
            for j in make_judge(recs, labels, seed=2)
        ],
    )
    out = analyze(study, n_resamples=200, seed=3)
    assert out["images"] == 96
    assert list(out["by_setting"])[:3] == ["pos1_neg0", "pos0_neg1", "pos2_neg0"]
    assert list(out["by_category"]) == ["color", "material", "comparative", "depth", "directional", "proximity"]
    assert sum(v["n"] for v in out["by_category"].values()) == 96
    for name, s in out["image_level"].items():
        lo, hi = s["interval"]["kappa"]
        assert lo <= s["kappa"] <= hi, name
    assert out["elements"]["statements"] == out["elements"]["affirmative"] + out["elements"]["negated"]
    assert 0.5 < out["negation_probe"]["synthetic-judge"]["flip"] < 0.9  # 30% of negated questions answered blindly
    assert json.dumps(out) == json.dumps(analyze(study, n_resamples=200, seed=3))  # seeded (NaN-safe comparison)


def _write_labels_csv(path: Path, labels: list[LabelRow]) -> None:
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["image", "element", "annotator", "answer"])
        for lab in labels:
            w.writerow([lab.image, lab.element, lab.annotator, "yes" if lab.answer else "no"])


def test_csv_and_jsonl_labels_read_the_same(tmp_path: Path) -> None:
    labels = _labels()
    _write_labels_csv(tmp_path / "l.csv", labels)
    write_jsonl(
        tmp_path / "l.jsonl",
        [{"image": x.image, "element": x.element, "annotator": x.annotator, "answer": x.answer} for x in labels],
    )
    a, b = read_labels(tmp_path / "l.csv"), read_labels(tmp_path / "l.jsonl")
    assert [(x.image, x.element, x.annotator, x.answer) for x in a] == [
        (x.image, x.element, x.annotator, x.answer) for x in b
    ]
    assert a[0].where == f"{tmp_path / 'l.csv'}:2"


@pytest.mark.parametrize(
    ("rows_json", "message"),
    [
        (
            [{"image": "i", "element": "object:0", "annotator": "a", "answer": "maybe"}],
            r"l.jsonl:1: answer must be yes or no, got 'maybe'",
        ),
        (
            [{"image": "i", "element": "obj0", "annotator": "a", "answer": "yes"}],
            r"element must be object:I or statement:K, got 'obj0'",
        ),
        ([{"image": "i", "element": "object:0", "answer": "yes"}], r"l.jsonl:1: missing field 'annotator'"),
        (
            [{"image": "i", "element": "object:0", "annotator": "a", "answer": "no"}] * 2,
            r"l.jsonl:2: annotator a labels i object:0 again \(first at .*l.jsonl:1\)",
        ),
    ],
)
def test_label_file_errors(tmp_path: Path, rows_json: list[dict[str, Any]], message: str) -> None:
    with pytest.raises(AgreementInputError, match=message):
        read_labels(write_jsonl(tmp_path / "l.jsonl", rows_json))


def test_judge_file_errors(tmp_path: Path) -> None:
    bad = [{"judge": "J", "mode": "whole", "image": "i", "element": "object:0", "p_yes": 0.5}]
    with pytest.raises(AgreementInputError, match="mode whole goes with element prompt, got 'object:0'"):
        read_judges(write_jsonl(tmp_path / "j.jsonl", bad))
    with pytest.raises(AgreementInputError, match=r"p_yes must be in \[0, 1\], got 1.5"):
        read_judges(
            write_jsonl(
                tmp_path / "j.jsonl", [{"judge": "J", "mode": "pos", "image": "i", "element": "object:0", "p_yes": 1.5}]
            )
        )
    with pytest.raises(AgreementInputError, match="mode must be one of whole, pos, neg"):
        read_judges(
            write_jsonl(
                tmp_path / "j.jsonl", [{"judge": "J", "mode": "yes", "image": "i", "element": "object:0", "p_yes": 1}]
            )
        )


def test_inconsistent_studies_are_rejected(rows: list[ImageRow]) -> None:
    labels = _labels()
    with pytest.raises(AgreementInputError, match=r"labels:0: image 'nope.png' is not in the results"):
        build_study([LabelRow("nope.png", "object:0", "a", True, None, "labels:0"), *labels], rows)
    with pytest.raises(
        AgreementInputError, match="annotators c did not label statement:0; every annotator labels every element"
    ):
        build_study(
            [x for x in labels if not (x.image == "img0.png" and x.element == "statement:0" and x.annotator == "c")],
            rows,
        )
    with pytest.raises(AgreementInputError, match="polarity positive but the verdict says statement:0 is negated"):
        build_study(
            [
                LabelRow(
                    x.image,
                    x.element,
                    x.annotator,
                    x.answer,
                    "positive" if x.element == "statement:0" else None,
                    x.where,
                )
                for x in labels
            ],
            rows,
        )
    with pytest.raises(AgreementInputError, match=r"img0.png has 1 statements, no statement:3"):
        build_study([*labels, *(LabelRow("img0.png", "statement:3", w, True, None, "l:99") for w in "abc")], rows)
    with pytest.raises(AgreementInputError, match=r"every image needs the same number of annotators, got \[2, 3\]"):
        build_study([x for x in labels if not (x.image == "img1.png" and x.annotator == "c")], rows)
    with pytest.raises(AgreementInputError, match=r"image 'img0.png' is also at"):
        build_study(labels, [*rows, rows[0]])
    extra = [JudgeRow("J", "whole", f"img{i}.png", "prompt", 1.0, "j") for i in range(4)]
    study = build_study([x for x in labels if x.image != "img3.png"], rows, extra)
    assert study.warnings == ["J (whole) answers 1 images that are not labelled (ignored)"]
    with pytest.raises(AgreementInputError, match=r"j:7: the judge file answers 1 images the results do not have"):
        build_study(labels, rows, [*extra, JudgeRow("J", "whole", "elsewhere.png", "prompt", 1.0, "j:7")])
    with pytest.raises(
        AgreementInputError, match=r"J \(pos\) has no answer for 7 labelled elements, e.g. img0.png statement:0"
    ):
        build_study(labels, rows, [JudgeRow("J", "pos", "img0.png", "object:0", 1.0, "j")])


def test_agreement_command_writes_json_markdown_and_csv(
    tmp_path: Path, records: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    results = write_jsonl(tmp_path / "r.jsonl", records)
    labels = write_jsonl(
        tmp_path / "l.jsonl",
        [
            {"image": x.image, "element": x.element, "annotator": x.annotator, "answer": "yes" if x.answer else "no"}
            for x in _labels()
        ],
    )
    code = main(
        [
            "agreement",
            "--labels",
            str(labels),
            "--results",
            str(results),
            "--out",
            str(tmp_path / "out"),
            "--bootstrap",
            "50",
        ]
    )
    assert code == 0
    data = json.loads((tmp_path / "out" / "agreement.json").read_text())
    assert data["inputs"]["labels"]["path"] == str(labels) and len(data["inputs"]["labels"]["sha256"]) == 64
    assert data["inputs"]["configs"][0]["name"] == "current"
    md = (tmp_path / "out" / "agreement.md").read_text()
    assert "| NegT2IBench | 4 |" in md and "Agreement between annotators (Table 5)" in md
    assert (
        (tmp_path / "out" / "agreement_images.csv")
        .read_text()
        .splitlines()[0]
        .startswith("evaluator,n,tp,tn,fp,fn,kappa_pct")
    )
    assert "NegT2IBench" in capsys.readouterr().out
    inputs = (tmp_path / "out" / "agreement_inputs.csv").read_text()
    assert f"labels,{labels},sha256:" in inputs and "rule_config,current,digest:" in inputs
    assert (
        main(
            [
                "agreement",
                "--labels",
                str(tmp_path / "missing.jsonl"),
                "--results",
                str(results),
                "--out",
                str(tmp_path / "o2"),
            ]
        )
        == 2
    )


def _bench_study(absent_objects: str) -> Any:
    """The paper's case: "a photo of a non-wooden bench"; the image has no bench. Annotators a, b, c say there
    is no bench and (asked "is the bench wooden?") no; the judge says the same: p_yes 0.1 and 0.05."""
    from negt2i.core.spec import parse_prompt

    prompt = parse_prompt(
        {
            "id": "material-pos0_neg1-000",
            "category": "material",
            "prompt": "a photo of a non-wooden bench",
            "include": [{"class": "bench", "count": 1}],
            "statements": [{"kind": "attribute", "object": 0, "value": "wooden", "polarity": "negated"}],
        }
    )
    rec = ok_record(make_verdict(prompt, "undetected_object"), filename="bench.png", sample=0, models={})
    labels = [
        LabelRow("bench.png", el, who, False, None, "labels") for el in ("object:0", "statement:0") for who in "abc"
    ]
    judges = [
        JudgeRow("J", "pos", "bench.png", "object:0", 0.1, "j"),
        JudgeRow("J", "pos", "bench.png", "statement:0", 0.05, "j"),  # "is the bench wooden?" -> no
        JudgeRow("J", "neg", "bench.png", "object:0", 0.1, "j"),
        JudgeRow("J", "neg", "bench.png", "statement:0", 0.95, "j"),  # "is the bench non-wooden?" -> yes
    ]
    return build_study(labels, [parse_line(rec)], judges, absent_objects=absent_objects)


def test_a_judge_cannot_satisfy_a_negated_attribute_by_omitting_the_object() -> None:
    """Appendix B.2: elements of an absent object count as unsatisfied (no success by omission)."""
    study = _bench_study("unsatisfied")
    assert study.element_objects == [(0,), (0,)]
    for mode in ("pos", "neg"):
        dec = study.evaluators[f"J ({mode})"]
        assert dec.element_binary is not None
        assert dec.element_binary.tolist() == [False, False]  # no bench, so "non-wooden" is not satisfied
        assert dec.image_score.tolist() == [pytest.approx(0.05)]  # mean of 0.1 (object) and 0 (statement)
        assert dec.image_binary.tolist() == [False]
        assert dec.element_p_yes is not None and dec.element_p_yes[1] in (0.05, 0.95)  # raw answer kept (Table 10)
    # NegT2IBench never had the problem: its statement of a missing object fails (cause undetected_object)
    ours = study.evaluators[OURS]
    assert ours.element_binary is not None and ours.element_binary.tolist() == [False, False]


def test_the_independent_rule_reproduces_success_by_omission() -> None:
    """The old rule, kept as an option: the statement alone is satisfied by the judge's "no"."""
    study = _bench_study("independent")
    dec = study.evaluators["J (pos)"]
    assert dec.element_binary is not None and dec.element_binary.tolist() == [False, True]
    assert dec.image_score.tolist() == [pytest.approx(0.525)]
    assert not study.warnings or all("could not be checked" not in w for w in study.warnings)
    with pytest.raises(ValueError, match="absent_objects must be one of"):
        _bench_study("lenient")


def test_a_judge_without_object_answers_is_scored_per_element_with_a_warning(rows: list[ImageRow]) -> None:
    judges = [JudgeRow("J", "pos", f"img{i}.png", "statement:0", 0.2, "j") for i in range(4)]
    judges += [JudgeRow("J", "pos", f"img{i}.png", "object:0", 0.9, "j") for i in range(3)]
    labels = [lab for lab in _labels() if lab.element == "statement:0" or lab.image != "img3.png"]
    with pytest.raises(AgreementInputError, match=r"img3.png: no labels for object:0 \(1 of its 2 elements\)"):
        build_study(labels, rows, judges)  # a labels file with a missing element
    study = build_study(labels, rows, judges, allow_partial=True)
    assert any("J (pos): 1 statements could not be checked" in w for w in study.warnings)


def test_the_paper_tables_with_judge_costs_and_the_pos_neg_delta(
    tmp_path: Path, records: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    """Tables 2, 5, 6, 7, 10-13 as HTML and CSV: a judge's three modes in one row, Δ = neg - pos, cost columns."""
    results = write_jsonl(tmp_path / "r.jsonl", records)
    labels = write_jsonl(
        tmp_path / "l.jsonl",
        [{"image": x.image, "element": x.element, "annotator": x.annotator, "answer": "yes" if x.answer else "no"}
         for x in _labels()],
    )  # fmt: skip
    judge = []
    for i in range(4):
        img = f"img{i}.png"
        cost = {"params": "8B", "gpu_gib": 16.0 + i, "seconds": 0.1}
        judge.append({"judge": "J", "mode": "pos", "image": img, "element": "object:0", "p_yes": 0.9, **cost})
        judge.append({"judge": "J", "mode": "pos", "image": img, "element": "statement:0", "p_yes": 0.2, **cost})
        judge.append({"judge": "J", "mode": "neg", "image": img, "element": "object:0", "p_yes": 0.9, **cost})
        judge.append({"judge": "J", "mode": "neg", "image": img, "element": "statement:0", "p_yes": 0.3, **cost})
        judge.append({"judge": "J", "mode": "whole", "image": img, "element": "prompt", "p_yes": 0.6})
    judges = write_jsonl(tmp_path / "j.jsonl", judge)
    out = tmp_path / "out"
    args = ["agreement", "--labels", str(labels), "--results", str(results), "--judges", str(judges)]
    assert main([*args, "--out", str(out), "--bootstrap", "40", "--ours-cost", "1.24B,6.3,0.78"]) == 0
    data = json.loads((out / "agreement.json").read_text())
    assert data["element_questions_per_image"] == 2.0
    assert data["costs"]["J"] == {"params": "8B", "gpu_gib": 19.0, "s_per_question": pytest.approx(0.1),
                                  "s_per_image": pytest.approx(0.2)}  # fmt: skip
    for n in (2, 5, 6, 7, 10, 11, 12, 13):
        assert (out / f"table{n}.csv").is_file()
    with (out / "table2.csv").open() as fh:
        rows = list(csv.reader(fh))
    assert rows[1] == ["Evaluator", "Params", "GiB", "s/img", "whole", "pos", "neg", "Δ", "Prec.", "Rec.",
                       "whole", "pos", "neg", "Δ"]  # fmt: skip
    j = next(r for r in rows if r[0] == "J")
    kappa_pos = data["image_level"]["J (pos)"]["kappa"]
    kappa_neg = data["image_level"]["J (neg)"]["kappa"]
    assert j[1:4] == ["8B", "19.0", "0.20"]
    assert j[5].startswith(f"{100 * kappa_pos:.1f} [") and j[6].startswith(f"{100 * kappa_neg:.1f} [")
    assert j[7].startswith(f"{100 * (kappa_neg - kappa_pos):+.1f} [")
    ours = next(r for r in rows if r[0] == "NegT2IBench (ours)")
    assert ours[1:4] == ["1.24B", "6.3", "0.78"] and ours[5:8] == ["-", "-", "-"]
    page = (out / "agreement.html").read_text()
    for title in ("Table 2:", "Table 5:", "Table 6:", "Table 7:", "Table 10:", "Table 11:", "Table 12:", "Table 13:"):
        assert title in page
    with (out / "table5.csv").open() as fh:
        t5 = list(csv.reader(fh))
    assert [r[:2] for r in t5[1:]] == [["All statements", "8"], ["Affirmative", "4"], ["Negated", "4"]]
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main([*args, "--out", str(out), "--ours-cost", "big"])
    assert exit_info.value.code == 2
    assert "expected PARAMS,GIB,S_IMG" in capsys.readouterr().err
