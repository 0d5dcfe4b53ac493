"""The report's headline views and structure: matched-load polarity comparison with intervals, per-model
plots named after the model, a table of contents, added sections, and stale outputs removed on a rerun."""

from __future__ import annotations

import csv
import json
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import stats

from negt2i.cli import main
from negt2i.metrics.benchmark import BenchmarkState
from negt2i.metrics.bootstrap import bootstrap_state, matched_load
from negt2i.metrics.records import CATEGORY_ORDER, iter_rows
from negt2i.metrics.report import MANIFEST
from negt2i.metrics.report_html import render_html
from negt2i.metrics.report_markdown import render_markdown
from negt2i.metrics.report_tables import _EXTRA_SECTIONS, Section, Table, register_section, sections
from negt2i.metrics.synthetic import make_prompts, make_results

from .conftest import rate_a, write_jsonl


@pytest.fixture(scope="module")
def results_a(records_a: list[dict[str, Any]], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_jsonl(tmp_path_factory.mktemp("views") / "a.jsonl", records_a)


def test_matched_load_values_are_the_known_cell_rates(results_a: Path) -> None:
    state = BenchmarkState.from_rows(iter_rows(results_a))
    ml = matched_load(state, n_resamples=200, seed=4)
    assert set(ml) == {"load1", "load2"}
    load1 = ml["load1"]
    assert (load1["positive_setting"], load1["negated_setting"]) == ("pos1_neg0", "pos0_neg1")
    assert list(load1["by_category"]) == [c.value for c in CATEGORY_ORDER]
    for c, r in load1["by_category"].items():
        # 2 prompts x 4 images per cell, exactly round(rate x 8) correct (error lines included)
        assert r["positive"] == round(8 * rate_a(c, "pos1_neg0")) / 8
        assert r["negated"] == round(8 * rate_a(c, "pos0_neg1")) / 8
        assert r["gap"] == pytest.approx(r["positive"] - r["negated"])
        assert r["prompts_positive"] == r["prompts_negated"] == 2
    assert load1["mean"]["gap"] == pytest.approx(np.mean([r["gap"] for r in load1["by_category"].values()]))
    # same draws as the cell intervals of the ordinary bootstrap
    iv = bootstrap_state(state, n_resamples=200, seed=4)["image_accuracy"]["by_cell"]
    for c, r in load1["by_category"].items():
        assert r["positive_ci"] == iv[f"{c}/pos1_neg0"] and r["negated_ci"] == iv[f"{c}/pos0_neg1"]
    assert ml["load2"]["by_category"]["color"]["gap"] == pytest.approx(0.25)


def test_gap_interval_agrees_with_scipy_two_sample_bootstrap() -> None:
    """One category, two cells of 60 prompts x 4 images: the gap interval against scipy.stats.bootstrap."""
    prompts = make_prompts(60, seed=3, cells=[("color", "pos1_neg0"), ("color", "pos0_neg1")])
    rates = {("color", "pos1_neg0"): 0.8, ("color", "pos0_neg1"): 0.45}
    rows = list(make_results(prompts, rates, seed=1))
    state = BenchmarkState.from_rows(iter_rows(write_jsonl(Path(_tmp()) / "two.jsonl", rows)))
    r = matched_load(state, n_resamples=4000, seed=0)["load1"]["by_category"]["color"]
    per_prompt = {s: [] for s in ("pos1_neg0", "pos0_neg1")}
    for pid, t in state.prompts.items():
        per_prompt[t.setting].append(t.correct / t.images)
    ref = stats.bootstrap(
        (np.array(per_prompt["pos1_neg0"]), np.array(per_prompt["pos0_neg1"])),
        lambda a, b, axis=-1: a.mean(axis=axis) - b.mean(axis=axis),
        method="percentile",
        n_resamples=4000,
        random_state=np.random.default_rng(1),
    ).confidence_interval
    assert r["gap"] == pytest.approx(0.8 - 0.45)
    assert r["gap_ci"][0] == pytest.approx(ref.low, abs=0.02) and r["gap_ci"][1] == pytest.approx(ref.high, abs=0.02)


def _tmp() -> str:
    import tempfile

    return tempfile.mkdtemp(prefix="negt2i-views-")


@pytest.fixture(scope="module")
def two_models(records_a: list[dict[str, Any]], prompts: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("two")
    write_jsonl(d / "a.jsonl", records_a)
    write_jsonl(d / "b.jsonl", list(make_results(prompts, lambda c, s: 0.5, seed=9)))
    out = d / "report"
    assert main(["report", f"Model A={d / 'a.jsonl'}", f"B/v2={d / 'b.jsonl'}", "--out", str(out),
                 "--bootstrap", "50"]) == 0  # fmt: skip
    return out


def test_matched_load_table_csv_and_plot(two_models: Path) -> None:
    md = (two_models / "report.md").read_text()
    assert "Matched load 1:0 vs 0:1" in md and "Matched load 2:0 vs 0:2" in md
    assert re.search(r"\| Color \| Model A \| 87\.5 \[[\d.]+, [\d.]+\] \| 75\.0 \[[\d.]+, [\d.]+\] \| \+12\.5 \[", md)
    with (two_models / "matched_load.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    color = next(r for r in rows if r["model"] == "Model A" and r["category"] == "color" and r["negated_setting"]
                 == "pos0_neg1")  # fmt: skip
    assert float(color["positive_pct"]) == 87.5 and float(color["gap_pts"]) == 12.5
    assert {r["model"] for r in rows} == {"Model A", "B/v2"}
    assert (two_models / "plots" / "matched-load.png").stat().st_size > 0


def test_per_model_plots_are_named_and_titled_by_model(two_models: Path) -> None:
    names = sorted(p.name for p in (two_models / "plots").iterdir())
    assert names == sorted(
        [
            "comparison.png", "polarity-gap.png", "matched-load.png", "heatmap-model-a.png", "failures-model-a.png",
            "heatmap-b-v2.png", "failures-b-v2.png",
        ]
    )  # fmt: skip
    html = (two_models / "report.html").read_text()
    for caption in ("Model A: image accuracy by category x setting", "B/v2: failed statements by cause"):
        assert f"<figcaption>{caption}</figcaption>" in html


def test_table_of_contents_links_every_section_and_table(two_models: Path) -> None:
    html = (two_models / "report.html").read_text()
    toc = html[html.index("<nav class='toc'>") : html.index("</nav>")]
    targets = re.findall(r"href='#([^']+)'", toc)
    assert {"summary", "matched-load", "paired", "model-model-a", "model-b-v2", "inputs", "definitions"} <= set(targets)
    for t in targets:  # every link has its anchor, exactly once
        assert html.count(f"id='{t}'") == 1, t
    md = (two_models / "report.md").read_text()
    for t in re.findall(r"\]\(#([^)]+)\)", md):
        assert md.count(f'<a id="{t}"></a>') == 1, t


def test_an_added_section_appears_with_its_contents_entry(two_models: Path) -> None:
    report = json.loads((two_models / "report.json").read_text())

    def probes(rep: dict[str, Any]) -> list[Section]:
        return [Section("probes", "Negation following (probes)", [Table("Probe table", ["A"], [["1"]])])]

    register_section(probes)
    try:
        keys = [s.key for s in sections(report)]
        assert keys[-1] == "probes" and keys[0] == "summary"
        assert "<a href='#probes'>" in render_html(report) and "### Probe table" in render_markdown(report)
    finally:
        _EXTRA_SECTIONS.remove(probes)


def test_rerun_removes_only_its_own_stale_outputs(results_a: Path, tmp_path: Path) -> None:
    out = tmp_path / "r"
    argv = ["report", f"A={results_a}", "--out", str(out), "--bootstrap", "20"]
    assert main(argv) == 0
    manifest = json.loads((out / MANIFEST).read_text())
    assert "plots/heatmap-a.png" in manifest["files"] and "report.html" in manifest["files"]
    (out / "notes.txt").write_text("mine")  # user files, in the folder and in plots/
    (out / "plots" / "my-figure.png").write_bytes(b"mine")
    (out / "plots" / "failures-a.png").write_bytes(b"edited by hand")  # ours, but changed since: kept
    assert main([*argv, "--no-plots"]) == 0
    assert sorted(p.name for p in (out / "plots").iterdir()) == ["failures-a.png", "my-figure.png"]
    assert (out / "notes.txt").read_text() == "mine"
    assert "plots/heatmap-a.png" not in json.loads((out / MANIFEST).read_text())["files"]
    # a rerun with plots writes them again; a rerun renaming the model drops the old model's plots
    assert main(argv) == 0 and (out / "plots" / "heatmap-a.png").is_file()
    assert main(["report", f"B={results_a}", "--out", str(out), "--bootstrap", "20"]) == 0
    plots = sorted(p.name for p in (out / "plots").iterdir())
    assert "heatmap-a.png" not in plots and "heatmap-b.png" in plots and "my-figure.png" in plots


def _files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_a_report_that_cannot_be_made_leaves_nothing_behind(
    results_a: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No partial report (issue 45): without matplotlib the command says so before any work and writes nothing
    (a new --out is not even created); a failure half-way through the plots leaves the folder as it was, the
    user's files and the previous report included, and no staging folder."""
    out = tmp_path / "new" / "r"
    argv = ["report", f"A={results_a}", "--out", str(out), "--bootstrap", "20"]
    with monkeypatch.context() as m:
        m.setitem(sys.modules, "matplotlib", None)  # not installed (the core profile)
        assert main(argv) == 2
    err = capsys.readouterr().err
    assert "plots need matplotlib" in err and "pip install '.[reports]'" in err and "--no-plots" in err
    assert "nothing was written" in err
    assert not (tmp_path / "new").exists()
    assert main([*argv, "--no-plots"]) == 0  # a previous report, and a file of the user's beside it
    (out / "notes.txt").write_text("mine")
    before = _files(out)
    from negt2i.metrics import plots

    real = plots.report_figures

    def half_way(report: dict[str, Any]) -> Any:  # a plotting library that fails after three figures
        yield from list(real(report))[:3]
        raise ModuleNotFoundError("No module named 'kiwisolver'", name="kiwisolver")

    monkeypatch.setattr(plots, "report_figures", half_way)
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "kiwisolver" in err and "pip install '.[reports]'" in err and f"nothing was written to {out}" in err
    assert _files(out) == before
    assert not list(tmp_path.rglob(".negt2i-report-*"))
