"""Benchmark metrics: the paper's definitions, exact merging of shards, failure decomposition, dead zones."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from negt2i.core.config import CURRENT
from negt2i.core.results import error_record, ok_record
from negt2i.core.spec import Prompt
from negt2i.metrics.benchmark import BenchmarkState, aggregate, missing_cells
from negt2i.metrics.records import ResultsFormatError, parse_line
from negt2i.metrics.synthetic import make_prompts, make_verdict

from .conftest import rate_a

# Table 3: the six category columns (Color, Material, Compar., Depth, Direct., Proxim.) and Overall.
TABLE3_CATEGORIES = {
    "SD 1.5": ([27.7, 22.8, 8.9, 8.8, 9.6, 9.1], 14.5),
    "SD 1.5 + NegationCLIP": ([28.3, 23.9, 8.4, 9.4, 10.0, 9.2], 14.9),
    "HiDream-I1 (4-bit)": ([31.2, 28.4, 18.9, 21.7, 23.9, 20.0], 24.0),
    "Z-Image-Turbo": ([24.9, 25.8, 21.4, 23.0, 28.6, 24.0], 24.6),
    "SD 3.5 Large": ([31.4, 36.4, 18.5, 19.7, 22.5, 19.3], 24.6),
    "Qwen-Image": ([24.2, 28.1, 24.3, 25.5, 30.3, 23.8], 26.0),
    "FLUX.2-klein-9B": ([24.8, 36.8, 23.7, 21.5, 29.2, 23.8], 26.6),
    "HunyuanImage-2.1 (distilled)": ([29.3, 36.7, 25.2, 27.6, 36.6, 26.6], 30.3),
    "FLUX.2-dev (4-bit)": ([27.9, 44.2, 25.4, 26.6, 37.2, 26.3], 31.3),
    "Janus-Pro-7B": ([39.8, 38.0, 19.5, 20.6, 22.4, 19.3], 26.6),
    "BLIP3-o NEXT SFT 3B": ([34.7, 37.1, 24.5, 26.6, 38.1, 27.1], 31.4),
}


@pytest.mark.parametrize(("model", "row"), TABLE3_CATEGORIES.items())
def test_table3_overall_is_the_mean_of_the_six_categories(model: str, row: tuple[list[float], float]) -> None:
    categories, overall = row
    cells = {
        (c, "pos1_neg0"): v
        for c, v in zip(
            ("color", "material", "comparative", "depth", "directional", "proximity"), categories, strict=True
        )
    }
    # aggregate() is the function the report uses; one setting per category makes the category value the cell.
    assert abs(aggregate(cells)["overall"] - overall) <= 0.05 + 1e-9, model


def test_aggregates_follow_table3_definitions() -> None:
    cells = {
        ("color", "pos1_neg0"): 0.8,
        ("color", "pos0_neg1"): 0.4,
        ("depth", "pos1_neg0"): 0.6,
        ("depth", "pos0_neg1"): 0.2,
    }
    agg = aggregate(cells)
    assert agg["by_category"] == {"color": pytest.approx(0.6), "depth": pytest.approx(0.4)}
    assert agg["by_setting"] == {"pos1_neg0": pytest.approx(0.7), "pos0_neg1": pytest.approx(0.3)}
    assert agg["overall"] == pytest.approx(0.5)
    assert list(agg["by_cell"]) == ["color/pos1_neg0", "color/pos0_neg1", "depth/pos1_neg0", "depth/pos0_neg1"]


def _state(records: list[dict[str, Any]]) -> BenchmarkState:
    return BenchmarkState.from_rows(parse_line(r, source="mem", line=i) for i, r in enumerate(records, 1))


def test_known_rates_are_reproduced_exactly(records_a: list[dict[str, Any]]) -> None:
    m = _state(records_a).compute()
    for key, cell in m["cells"].items():
        assert cell["image_accuracy"] == rate_a(cell["category"], cell["setting"]), key
        assert cell["images"] == 8 and cell["prompts"] == 2
    expected_color = np.mean([rate_a("color", s) for s in {c["setting"] for c in m["cells"].values()}])
    assert m["image_accuracy"]["by_category"]["color"] == pytest.approx(expected_color)
    assert m["image_accuracy"]["overall"] == pytest.approx(np.mean(list(m["image_accuracy"]["by_category"].values())))
    assert m["images"] == len(records_a) == 384 and m["prompts"] == 96
    assert m["errors"]["lines"] == sum(r["status"] == "error" for r in records_a) > 0


def test_error_lines_are_incorrect_images_of_their_prompt_and_reported_separately() -> None:
    (prompt,) = make_prompts(1, cells=[("color", "pos1_neg0")])
    ok = ok_record(make_verdict(prompt, None), filename="0/0.png", sample=0, models={})
    err = error_record(
        filename="0/1.png", error="unreadable_image: 0/1.png: corrupt image", prompt_id=prompt.id, sample=1
    )  # no category / setting
    orphan = error_record(
        filename="9/9.png", error="missing_metadata: no metadata.jsonl", error_kind="missing_metadata"
    )
    other = error_record(filename="9/8.png", error="some tool's free text")
    m = _state([ok, err, orphan, other]).compute()
    cell = m["cells"]["color/pos1_neg0"]
    assert (cell["images"], cell["correct"], cell["errors"]) == (2, 1, 1)
    assert cell["image_accuracy"] == 0.5 and cell["prompt_accuracy"] == 1.0
    # counted by kind, never by message text
    assert m["errors"] == {
        "lines": 3,
        "unplaced": 2,
        "kinds": {"missing_metadata": 1, "other": 1, "unreadable_image": 1},
    }
    assert m["images"] == 4 and m["scored_images"] == 2
    assert m["row_failures"]["error_lines"] == 3 and m["row_failures"]["incorrect_judged"] == 0


def test_prompt_accuracy_needs_one_correct_image_of_k() -> None:
    p1, p2 = make_prompts(2, cells=[("material", "pos0_neg1")])
    recs = []
    for prompt, pattern_per_sample in (
        (p1, [None, "negated_violated", "negated_violated", "negated_violated"]),
        (p2, ["negated_violated"] * 4),
    ):
        for s, pattern in enumerate(pattern_per_sample):
            recs.append(ok_record(make_verdict(prompt, pattern), filename=f"{prompt.id}/{s}.png", sample=s, models={}))
    m = _state(recs).compute()
    assert m["cells"]["material/pos0_neg1"]["image_accuracy"] == 1 / 8
    assert m["cells"]["material/pos0_neg1"]["prompt_accuracy"] == 1 / 2


def _split(records: list[dict[str, Any]], owner: list[int], k: int) -> list[list[dict[str, Any]]]:
    shards: list[list[dict[str, Any]]] = [[] for _ in range(k)]
    for rec, o in zip(records, owner, strict=True):
        shards[o % k].append(rec)
    return shards


@settings(max_examples=15, deadline=None)
@given(st.data())
def test_merged_shards_equal_the_concatenation_exactly(records_a: list[dict[str, Any]], data: st.DataObject) -> None:
    k = data.draw(st.integers(1, 5))
    owner = data.draw(st.lists(st.integers(0, 4), min_size=len(records_a), max_size=len(records_a)))
    order = data.draw(st.permutations(list(range(k))))
    shards = _split(records_a, owner, k)
    merged = BenchmarkState()
    for i in order:
        merged.merge(_state(shards[i]))
    whole = _state(records_a).compute()
    got = merged.compute()
    assert json.dumps(got, sort_keys=True) == json.dumps(whole, sort_keys=True)  # exact, not approximate


def test_an_image_seen_twice_is_an_error(records_a: list[dict[str, Any]]) -> None:
    a = _state(records_a[:10])
    with pytest.raises(ValueError, match=r"image .*#\d appears in two shards: mem:\d+ and mem:\d+"):
        a.merge(_state(records_a[5:12]))
    with pytest.raises(ValueError, match=r"appears twice: mem:1 and mem:2"):
        _state([records_a[0], records_a[0]])


def test_inconsistent_prompt_metadata_is_an_error(records_a: list[dict[str, Any]]) -> None:
    bad = dict(records_a[1], setting="pos2_neg2", sample=99, filename="x.png")
    with pytest.raises(ValueError, match=r"mem:2: prompt .* has setting 'pos2_neg2', earlier lines say 'pos1_neg0'"):
        _state([records_a[0], bad])


def _prompt(category: str, setting: str) -> Prompt:
    (p,) = make_prompts(1, cells=[(category, setting)], seed=5)
    return p


@pytest.mark.parametrize(
    ("category", "setting", "pattern", "causes", "row_class"),
    [
        # one negated statement rendered anyway
        ("color", "pos1_neg1", "negated_violated", {("negated", "negated_violated"): 1}, "negated_violated"),
        # the positive statement's predicate did not fire
        ("directional", "pos1_neg1", "positive_violated", {("positive", "positive_violated"): 1}, "positive_violated"),
        # nothing fired for the positive statement: a dead-zone failure, positive at the row level
        ("depth", "pos2_neg0", "dead_zone", {("positive", "dead_zone"): 1}, "positive_violated"),
        (
            "comparative",
            "pos1_neg2",
            "both_polarities",
            {("positive", "positive_violated"): 1, ("negated", "negated_violated"): 1},
            "both_polarities",
        ),
        # relation prompts link the subject (object 0) to every target: every statement is unevaluable
        (
            "proximity",
            "pos1_neg1",
            "undetected_object",
            {("positive", "undetected_object"): 1, ("negated", "undetected_object"): 1},
            "undetected_object",
        ),
        # attribute prompts: only the statement on object 0
        ("material", "pos2_neg0", "over_count", {("positive", "over_count"): 1}, "over_count"),
    ],
)
def test_failure_decomposition_counts_each_failed_statement_once(
    category: str, setting: str, pattern: str, causes: dict[tuple[str, str], int], row_class: str
) -> None:
    p = _prompt(category, setting)
    state = _state([ok_record(make_verdict(p, pattern), filename="a.png", sample=0, models={})])
    m = state.compute()
    got = {(pol, cause): n for (_, _, pol, cause), n in state.failed_statements.items()}
    assert got == causes
    assert m["failures"]["failed_statements"] == sum(causes.values())
    assert m["failures"]["by_setting"][setting]["counts"] == {
        c: sum(n for (_, cc), n in causes.items() if cc == c) for c in m["failures"]["overall"]["counts"]
    }
    assert m["row_failures"]["overall"]["counts"][row_class] == 1
    assert sum(m["row_failures"]["overall"]["counts"].values()) == 1


def test_negated_violation_share_and_figure3_shares() -> None:
    p = _prompt("color", "pos1_neg1")
    recs = [
        ok_record(make_verdict(p, pat), filename=f"{i}.png", sample=i, models={})
        for i, pat in enumerate(["negated_violated", "negated_violated", "positive_violated", "over_count"])
    ]
    f = _state(recs).compute()["failures"]
    assert f["overall"]["counts"] == {
        "undetected_object": 0,
        "over_count": 1,
        "positive_violated": 1,
        "negated_violated": 2,
        "dead_zone": 0,
    }
    assert f["negated_violation_share"] == 0.5
    assert f["by_category"]["color"]["shares"]["negated_violated"] == 0.5
    assert f["statements"] == 8


def test_dead_zone_exposure_counts_passed_negated_relations_with_nothing_fired() -> None:
    depth = _prompt("depth", "pos0_neg2")
    prox = _prompt("proximity", "pos0_neg1")
    recs = [
        ok_record(
            make_verdict(depth, None, dead_zone_pass=True), filename="d0.png", sample=0, models={}
        ),  # 2 dead-zone passes
        ok_record(make_verdict(depth, None), filename="d1.png", sample=1, models={}),  # 2 clear passes
        ok_record(make_verdict(depth, "negated_violated"), filename="d2.png", sample=2, models={}),  # 1 fail + 1 pass
        ok_record(make_verdict(depth, "undetected_object"), filename="d3.png", sample=3, models={}),  # 2 unevaluable
        ok_record(
            make_verdict(prox, None, dead_zone_pass=True), filename="p0.png", sample=0, models={}
        ),  # no dead zone
    ]
    dz = _state(recs).compute()["dead_zone"]
    assert dz["depth"] == {
        "total": 8,
        "evaluable": 6,
        "passed": 5,
        "dead_zone_passes": 2,
        "unevaluable": 2,
        "share_of_passes": 0.4,
        "share_of_all": 0.25,
    }
    assert dz["proximity"]["dead_zone_passes"] == 0 and dz["proximity"]["passed"] == 1
    assert dz["total"]["passed"] == 6 and dz["total"]["dead_zone_passes"] == 2


def test_table19_shares_from_its_counts() -> None:
    """Table 19: evaluable, passed and dead-zone passes per category give its shares (and 19.0% / 7.5% overall)."""
    table19 = {
        "depth": (30335, 17947, 9963, 55.5),
        "directional": (29777, 17117, 1567, 9.2),
        "comparative": (29883, 12962, 374, 2.9),
        "proximity": (30620, 14764, 3, 0.0),
    }
    state = BenchmarkState()
    unevaluable = 37785 // 4
    for cat, (evaluable, passed, dz, _) in table19.items():
        state.negated_relations.update(
            {
                (cat, "evaluable"): evaluable,
                (cat, "passed"): passed,
                (cat, "dead_zone_passes"): dz,
                (cat, "total"): evaluable + unevaluable,
            }
        )
    state.negated_relations[("depth", "total")] += 37785 - 4 * unevaluable
    out = state.dead_zone_exposure()
    for cat, (_, _, _, share) in table19.items():
        assert round(100 * out[cat]["share_of_passes"], 1) == share
    assert (out["total"]["evaluable"], out["total"]["passed"], out["total"]["dead_zone_passes"]) == (
        120615,
        62790,
        11907,
    )
    assert out["total"]["total"] == 158400 and out["total"]["unevaluable"] == 37785
    assert round(100 * out["total"]["share_of_passes"], 1) == 19.0
    assert round(100 * out["total"]["share_of_all"], 1) == 7.5


def test_provenance_records_configs_and_models_and_warns_on_mixtures(records_a: list[dict[str, Any]]) -> None:
    prev = dict(records_a[0], config={"name": "previous", "digest": "abc"}, filename="z.png", sample=77)
    other = dict(
        records_a[1], models={"detector": {"model": "MaskRCNN", "revision": "r1"}}, filename="y.png", sample=78
    )
    state = _state([*records_a[:5], prev, other])
    warnings = state.provenance.warnings("m")
    assert any(
        w.startswith("m: images were scored with different rule configs: current (" + CURRENT.digest())
        for w in warnings
    )
    assert any("stage detector used different models: MaskRCNN@r1, RFDETRSegXLarge@v1.3" in w for w in warnings)
    assert Counter(state.provenance.configs)[("previous", "abc")] == 1


def test_missing_cells_are_named(records_a: list[dict[str, Any]]) -> None:
    only_color = [r for r in records_a if r.get("category") == "color"]
    missing = missing_cells(_state(only_color))
    assert len(missing) == 40 and "material/pos1_neg0" in missing and not any(m.startswith("color/") for m in missing)


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"status": "done"}, r"mem:1: field 'status' must be 'ok' or 'error', got 'done'"),
        ({"correct": "yes"}, r"mem:1: field 'correct' has type str"),
        ({"category": "texture"}, r"mem:1: unknown category 'texture'"),
        ({"failure_class": None, "correct": False}, r"mem:1: an incorrect image needs a failure_class"),
        ({"sample": -1}, r"mem:1: field 'sample' must be a non-negative integer or null"),
    ],
)
def test_malformed_lines_name_file_line_and_field(
    records_a: list[dict[str, Any]], patch: dict[str, Any], message: str
) -> None:
    with pytest.raises(ResultsFormatError, match=message):
        parse_line({**records_a[0], **patch}, source="mem", line=1)
    with pytest.raises(ResultsFormatError, match=r"mem:3: missing field 'prompt_id'"):
        parse_line({k: v for k, v in records_a[0].items() if k != "prompt_id"}, source="mem", line=3)
