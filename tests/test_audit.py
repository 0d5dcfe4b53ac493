"""``negt2i audit`` on the synthetic demo: masks and boxes drawn from the side file, evidence in words, selection."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from negt2i.audit import explain_statement, select
from negt2i.cli import main
from negt2i.core.images import load_image
from negt2i.core.perception_file import decode, read_perception
from negt2i.core.results import read_results
from negt2i.stages.demo_data import write_demo


@pytest.fixture(scope="module")
def judged(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[dict[str, Any]]]:
    d = tmp_path_factory.mktemp("audit")
    write_demo(d / "demo", prompts=48, samples=4, seed=0)
    out = d / "r.jsonl"
    argv = ["evaluate", str(d / "demo"), "--out", str(out), "--backend", "synthetic", "--no-progress"]
    assert main([*argv, "--save-perception"]) == 0
    return d / "demo", out, list(read_results(out))


def _dead_zone_files(lines: list[dict[str, Any]]) -> list[str]:
    return [r["filename"] for r in lines if any(s["dead_zone"] or s["cause"] == "dead_zone" for s in r["statements"])]


def test_page_shows_masks_boxes_verdicts_and_evidence(judged: tuple[Path, Path, list[dict[str, Any]]], tmp_path: Path):
    root, results, lines = judged
    dz = _dead_zone_files(lines)
    assert len(dz) >= 2  # the demo has dead-zone passes and failures
    depth = next(r for r in lines if r["category"] == "depth" and r["statements"][0]["evaluated"])
    chosen = [*dz, depth["filename"]]
    argv = ["audit", str(results), "--images", str(root), "--out", str(tmp_path)]
    assert main([*argv, *(a for f in chosen for a in ("--filename", f))]) == 0
    page = (tmp_path / "audit.html").read_text()
    # self-contained: images inline, no scripts, no links out of the page
    assert page.count("src='data:image/png;base64,") == len(chosen)
    assert "<script" not in page and not re.search(r"(src|href)=['\"](?!data:|#)", page)
    by_name = {r["filename"]: r for r in lines}
    for f in chosen:
        line = by_name[f]
        assert f in page and line["prompt"] in page
        for s in line["statements"]:
            assert s["text"] in page
            assert explain_statement(s, line["objects"]).replace("'", "&#x27;") in page
    assert page.count("<span class='badge dz'>dead zone</span>") >= 2 * len(dz)  # card badge + statement badge
    # evidence in words carries the recorded numbers
    m = depth["statements"][0]["measurements"]
    assert f"{m['required_margin']:.3f}" in page and f"{m['normalized_difference']:.3f}" in page
    # the PNGs: the counted instances' masks are tinted with their object's colour
    side = read_perception(results.with_name("r.perception.jsonl"))
    f = depth["filename"]
    png = tmp_path / "images" / (f.removesuffix(".png").replace("/", "_") + ".png")
    original = load_image(root / f)
    with Image.open(png) as im:
        drawn = np.asarray(im.convert("RGB").resize(original.shape[1::-1], Image.Resampling.NEAREST))
    seen = decode(side[f])
    det = depth["objects"][0]["detections"][0]
    mask = seen.mask(det)
    assert mask is not None and mask.any()
    changed = np.abs(drawn.astype(int) - original.astype(int)).sum(axis=2) > 30
    assert changed[mask].mean() > 0.9 and changed[~mask].mean() < 0.2


def test_words_for_every_rule_name_the_constants(judged: tuple[Path, Path, list[dict[str, Any]]]) -> None:
    _, _, lines = judged
    seen: set[str] = set()
    for line in lines:
        for s in line["statements"]:
            m = s["measurements"]
            text = explain_statement(s, line["objects"])
            rule = m["rule"]
            seen.add(rule)
            if rule == "directional":
                assert f"{abs(m['dx']):.2f}" in text and f"needs more than {m['axis_threshold']}" in text
            elif rule == "proximity":
                assert f"{m['gap']:.1f} px apart" in text and f"{m['threshold']:.1f} px" in text
            elif rule == "comparative":
                assert f"{m['area_ratio']:.3f}" in text and str(m["size_ratio"]) in text
            elif rule == "attribute":
                assert f"{m['value_score']:.2f}" in text and f"beta = {m['beta']}" in text
            elif rule == "unevaluated":
                assert text.startswith("Not evaluated:") and "the " in text
    assert seen >= {"directional", "proximity", "comparative", "depth", "attribute", "unevaluated"}


def test_selection_failed_category_limit(judged: tuple[Path, Path, list[dict[str, Any]]], tmp_path: Path) -> None:
    root, results, lines = judged
    failed = select(lines, failed=True, categories=["proximity"], limit=5, seed=1)
    assert len(failed) == 5 and all(not r["correct"] and r["category"] == "proximity" for r in failed)
    assert [r["filename"] for r in failed] == sorted(r["filename"] for r in failed)  # file order
    assert select(lines, failed=True, categories=["proximity"], limit=5, seed=1) == failed  # seeded
    argv = ["audit", str(results), "--images", str(root), "--out", str(tmp_path / "a")]
    assert main([*argv, "--failed", "--category", "color", "--limit", "3"]) == 0
    assert len(list((tmp_path / "a" / "images").iterdir())) == 3
    assert main([*argv, "--filename", "nope.png"]) == 2
    assert main([*argv, "--category", "colour"]) == 2


def test_without_a_side_file_the_page_still_explains(
    judged: tuple[Path, Path, list[dict[str, Any]]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, _, lines = judged
    copy = tmp_path / "only.jsonl"
    copy.write_text("".join(json.dumps(r) + "\n" for r in lines[:4]))
    assert main(["audit", str(copy), "--images", str(root), "--out", str(tmp_path / "o")]) == 0
    assert "not found: masks and boxes are not drawn" in capsys.readouterr().err
    page = (tmp_path / "o" / "audit.html").read_text()
    assert "4 images have no stored perception" in page and lines[0]["statements"][0]["text"] in page


def test_grid_shows_the_same_prompts_across_models_with_their_marks(
    judged: tuple[Path, Path, list[dict[str, Any]]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Figure 8: one row per prompt (one per category by default), one column per results file, each cell
    that model's image of the prompt with its own verdict mark."""
    root, first, lines = judged
    second = tmp_path / "geneval.jsonl"  # the same images judged with other rules: other verdicts
    argv = ["evaluate", str(root), "--out", str(second), "--backend", "synthetic", "--no-progress"]
    assert main([*argv, "--rules", "geneval"]) == 0
    out = tmp_path / "grid"
    args = ["audit", "--grid", f"current={first}", f"geneval={second}", "--images", str(root), "--images",
            str(root), "--out", str(out), "--sample", "1"]  # fmt: skip
    assert main(args) == 0
    assert "grid of 6 prompts x 2 models" in capsys.readouterr().out
    page = (out / "grid.html").read_text()
    rows = re.findall(r"<tr><th class='prompt'>.*?</tr>", page)
    assert len(rows) == 6
    by_key = {name: {(r["prompt_id"], r["sample"]): r for r in read_results(path)}
              for name, path in (("current", first), ("geneval", second))}  # fmt: skip
    categories = set()
    for row in rows:
        pid = re.search(r"prompt ([^<]+)</span></th>", row).group(1)  # type: ignore[union-attr]
        marks = re.findall(r"class='mark (pass|fail)'", row)
        assert marks == ["pass" if by_key[n][(pid, 1)]["correct"] else "fail" for n in ("current", "geneval")]
        categories.add(by_key["current"][(pid, 1)]["category"])
    assert len(categories) == 6  # one prompt per category
    assert len(list((out / "grid").glob("*.png"))) == 12
    # chosen prompts, a missing one, and inputs that do not pair up
    pid = lines[0]["prompt_id"]
    assert main([*args[:-2], "--sample", "0", "--prompt", pid]) == 0
    assert main([*args[:-2], "--prompt", "nope"]) == 2
    assert "prompt nope sample 0 is not judged in: current, geneval" in capsys.readouterr().err
    assert main(["audit", "--grid", str(first), str(second), "--images", str(root), "--out", str(out)]) == 2
    assert "1 folders for 2 results files" in capsys.readouterr().err
    assert main(["audit", str(first), str(second), "--images", str(root), "--out", str(out)]) == 2
