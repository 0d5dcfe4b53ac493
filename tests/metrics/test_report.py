"""``negt2i report``: outputs, provenance and warnings, model comparison, shards, self-contained HTML."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from typing import Any

import pytest

from negt2i.cli import main
from negt2i.core.config import PREVIOUS
from negt2i.core.spec import Prompt
from negt2i.metrics.report import build_report, load_model, parse_inputs
from negt2i.metrics.synthetic import make_results

from .conftest import rate_a, write_jsonl


def rate_b(category: str, setting: str) -> float:
    return 0.5 if category == "depth" else rate_a(category, setting) - 0.125


@pytest.fixture(scope="module")
def files(
    tmp_path_factory: pytest.TempPathFactory, records_a: list[dict[str, Any]], prompts: list[Prompt]
) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("results")
    records_b = list(make_results(prompts, rate_b, seed=5, config=PREVIOUS))
    (d / "shards").mkdir()
    half = len(records_a) // 2
    return {
        "a": write_jsonl(d / "a.jsonl", records_a),
        "b": write_jsonl(d / "b.jsonl", records_b),
        "a0": write_jsonl(d / "shards" / "a-0.jsonl", records_a[half:]),
        "a1": write_jsonl(d / "shards" / "a-1.jsonl", records_a[:half]),
        "dir": d,
    }


@pytest.fixture(scope="module")
def report_dir(files: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("report")
    code = main(["report", f"A={files['a']}", f"B={files['b']}", "--out", str(out), "--bootstrap", "100"])
    assert code == 0
    return out


def test_every_output_is_written_and_names_its_inputs(report_dir: Path, files: dict[str, Path]) -> None:
    names = sorted(p.name for p in report_dir.iterdir())
    assert names == sorted(
        [
            "plots",
            "inputs.csv",
            "report.json",
            "table3.csv",
            "accuracy.csv",
            "failures.csv",
            "row_failures.csv",
            "dead_zone.csv",
            "paired.csv",
            "matched_load.csv",
            ".negt2i-report.json",
            "report.md",
            "report.html",
        ]
    )
    data = json.loads((report_dir / "report.json").read_text())
    assert (
        data["inputs"]["A"]["files"][0]["path"] == str(files["a"])
        and len(data["inputs"]["A"]["files"][0]["sha256"]) == 64
    )
    assert data["inputs"]["B"]["configs"] == [{"name": "previous", "digest": PREVIOUS.digest(), "lines": 384}]
    assert {m["stage"] for m in data["inputs"]["A"]["models"]} == {"detector", "segmenter", "attributes", "depth"}
    for text in ((report_dir / "report.md").read_text(), (report_dir / "report.html").read_text()):
        assert str(files["a"]) in text and PREVIOUS.digest() in text and "RFDETRSegXLarge" in text


def test_different_rule_configs_are_warned_about(report_dir: Path) -> None:
    data = json.loads((report_dir / "report.json").read_text())
    assert any(
        w.startswith("models were scored with different rule configs: A: current (") and "B: previous (" in w
        for w in data["warnings"]
    )
    assert any(w.startswith("A: ") and "error lines, counted as incorrect" in w for w in data["warnings"])
    assert "different rule configs" in (report_dir / "report.html").read_text()


def test_comparison_marks_the_best_model_per_column(report_dir: Path) -> None:
    data = json.loads((report_dir / "report.json").read_text())
    comp = data["comparison"]
    assert comp["rows"]["A"]["color"] == pytest.approx(sum(rate_a("color", s) for s in comp["columns"][:8]) / 8)
    assert comp["best"]["depth"] == ["B"] and comp["best"]["color"] == ["A"] and comp["best"]["overall"] == ["A"]
    md = (report_dir / "report.md").read_text()
    assert re.search(r"\| A \| .*\*\*", md) and "Columns: Load 1: 1:0, 0:1; Load 2: 2:0, 1:1, 0:2" in md
    with (report_dir / "table3.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert [r["model"] for r in rows] == ["A", "B"] and float(rows[1]["depth"]) == 50.0
    assert rows[1]["rule_configs"] == f"previous@{PREVIOUS.digest()}"
    with (report_dir / "inputs.csv").open() as fh:
        inputs = list(csv.DictReader(fh))
    assert {"results", "rule_config", "stage_model", "evaluator", "warning"} == {r["kind"] for r in inputs}
    assert any(r["model"] == "B" and r["kind"] == "rule_config" and r["name"] == "previous" for r in inputs)


def test_paired_differences_against_the_first_model(report_dir: Path) -> None:
    data = json.loads((report_dir / "report.json").read_text())
    p = data["paired"]["B - A"]
    assert p["prompts"] == 96
    assert p["difference"]["by_category"]["color"] == pytest.approx(-0.125)
    lo, hi = p["interval"]["by_category"]["color"]
    assert lo <= -0.125 <= hi


def test_html_is_self_contained(report_dir: Path) -> None:
    html = (report_dir / "report.html").read_text()
    # comparison, polarity gap, matched load, and a heatmap and a failure plot per model
    assert html.count("data:image/png;base64,") == 7
    assert not re.search(r"""(src|href)=["']?(https?:|//)""", html) and "<script" not in html and "<link" not in html


def test_shards_merge_to_the_same_numbers_as_one_file(files: dict[str, Path], tmp_path: Path) -> None:
    whole = build_report([load_model("A", [files["a"]])], n_resamples=50)
    ((name, paths),) = parse_inputs([f"A={files['dir']}/shards/a-*.jsonl"])
    assert name == "A" and [p.name for p in paths] == ["a-0.jsonl", "a-1.jsonl"]
    sharded = build_report([load_model(name, paths)], n_resamples=50)
    assert json.dumps(sharded["models"], sort_keys=True) == json.dumps(whole["models"], sort_keys=True)
    # repeating a NAME collects files too
    assert parse_inputs([f"A={files['a0']}", f"A={files['a1']}", str(files["b"])]) == [
        ("A", [files["a0"], files["a1"]]),
        ("b", [files["b"]]),
    ]


def test_strict_mode_and_input_errors(
    files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = str(tmp_path / "o")
    assert main(["report", str(files["a"]), "--out", out, "--bootstrap", "20", "--no-plots", "--strict"]) == 3
    assert "data:image/png" not in (tmp_path / "o" / "report.html").read_text()
    assert main(["report", f"A={files['dir']}/nothing-*.jsonl", "--out", out]) == 2  # a missing input
    assert "no file matches" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text(files["a"].read_text().splitlines()[0] + "\n" + '{"status": "ok", "filename": "x.png"}\n')
    assert main(["report", str(bad), "--out", out]) == 1
    assert f"{bad}:2: missing field 'prompt_id'" in capsys.readouterr().err
    assert (
        main(
            [
                "report",
                str(files["a"]),
                str(files["b"]),
                "--baseline",
                "C",
                "--out",
                out,
                "--bootstrap",
                "5",
                "--no-plots",
            ]
        )
        == 1
    )
    assert "baseline 'C' is not one of the models (a, b)" in capsys.readouterr().err
    with pytest.raises(ValueError, match="model 'A' lists the same file twice"):
        parse_inputs([f"A={files['a']}", f"A={files['a']}"])


def test_commands_are_registered() -> None:
    from negt2i.cli import build_parser

    help_text = build_parser().format_help()
    assert "report" in help_text and "agreement" in help_text
