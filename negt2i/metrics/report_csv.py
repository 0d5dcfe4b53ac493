"""The report as CSV files (long format, percentages; blank where undefined) and ``report.json``."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from negt2i.metrics.records import CAUSES, ROW_CLASSES


def _clean(obj: Any) -> Any:
    """JSON-safe: NaN / inf -> null, tuples -> lists."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_clean(v) for v in obj]
    return obj


def write_json(data: dict[str, Any], path: Path) -> None:
    path.write_text(json.dumps(_clean(data), indent=2, ensure_ascii=False, allow_nan=False) + "\n", encoding="utf-8")


def write_csv(path: Path, header: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        for row in rows:
            w.writerow(["" if v is None else (round(100 * v, 4) if isinstance(v, float) else v) for v in row])


def write_csvs(report: dict[str, Any], out: Path) -> list[Path]:
    """The long-format CSVs (percentages rounded to 4 decimals, blank where undefined)."""
    cols = report["comparison"]["columns"]
    written: list[Path] = []

    def emit(name: str, header: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
        path = out / name
        write_csv(path, header, rows)
        written.append(path)

    def configs(name: str) -> str:
        return " ".join(f"{c['name']}@{c['digest']}" for c in report["inputs"][name]["configs"])

    emit(
        "table3.csv",
        ["model", *cols, "rule_configs"],
        ([n, *(r[c] for c in cols), configs(n)] for n, r in report["comparison"]["rows"].items()),
    )

    def input_rows() -> Iterable[list[Any]]:
        for name, inp in report["inputs"].items():
            for f in inp["files"]:
                yield [name, "results", f["path"], f"sha256:{f['sha256']}", f["lines"]]
            for c in inp["configs"]:
                yield [name, "rule_config", c["name"], f"digest:{c['digest']}", c["lines"]]
            for md in inp["models"]:
                yield [name, "stage_model", md["stage"], md["model"], md["lines"]]
            for v, n in inp["evaluator_versions"].items():
                yield [name, "evaluator", "negt2i", v, n]
        for w in report["warnings"]:
            yield ["", "warning", "", w, ""]

    emit("inputs.csv", ["model", "kind", "name", "detail", "lines"], input_rows())

    def acc_rows() -> Iterable[list[Any]]:
        for name, m in report["models"].items():
            for metric in ("image_accuracy", "prompt_accuracy"):
                agg, iv = m[metric], m["intervals"][metric]
                yield [name, metric, "overall", "", "", agg["overall"], *(iv["overall"] or [None, None])]
                for c, v in agg["by_category"].items():
                    yield [name, metric, "category", c, "", v, *iv["by_category"][c]]
                for s, v in agg["by_setting"].items():
                    yield [name, metric, "setting", "", s, v, *iv["by_setting"][s]]
                for key, v in agg["by_cell"].items():
                    c, s = key.split("/")
                    yield [name, metric, "cell", c, s, v, *iv["by_cell"][key]]

    emit(
        "accuracy.csv",
        ["model", "metric", "scope", "category", "setting", "value_pct", "ci_low_pct", "ci_high_pct"],
        acc_rows(),
    )

    def failure_rows() -> Iterable[list[Any]]:
        for name, m in report["models"].items():
            f = m["failures"]
            for group in ("by_setting", "by_category", "by_setting_polarity"):
                for key, b in f[group].items():
                    for c in CAUSES:
                        yield [name, group.removeprefix("by_"), key, c, b["counts"][c], b["shares"][c]]
            for c in CAUSES:
                yield [name, "overall", "all", c, f["overall"]["counts"][c], f["overall"]["shares"][c]]

    emit("failures.csv", ["model", "group", "key", "cause", "count", "share_pct"], failure_rows())

    def row_rows() -> Iterable[list[Any]]:
        for name, m in report["models"].items():
            r = m["row_failures"]
            for group in ("by_setting", "by_category"):
                for key, b in r[group].items():
                    for c in ROW_CLASSES:
                        yield [name, group.removeprefix("by_"), key, c, b["counts"][c], b["shares"][c]]
            for c in ROW_CLASSES:
                yield [name, "overall", "all", c, r["overall"]["counts"][c], r["overall"]["shares"][c]]

    emit("row_failures.csv", ["model", "group", "key", "class", "count", "share_pct"], row_rows())
    emit(
        "dead_zone.csv",
        [
            "model",
            "category",
            "negated",
            "evaluable",
            "passed",
            "dead_zone_passes",
            "share_of_passes_pct",
            "share_of_all_pct",
        ],
        (
            [
                name,
                k,
                v["total"],
                v["evaluable"],
                v["passed"],
                v["dead_zone_passes"],
                v["share_of_passes"],
                v["share_of_all"],
            ]
            for name, m in report["models"].items()
            for k, v in m["dead_zone"].items()
        ),
    )

    def paired_rows() -> Iterable[list[Any]]:
        for p in report["paired"].values():
            d, iv = p["difference"], p["interval"]
            yield [p["a"], p["b"], p["prompts"], "overall", "all", d["overall"], *(iv["overall"] or [None, None])]
            for scope in ("by_category", "by_setting"):
                for k, v in d[scope].items():
                    yield [p["a"], p["b"], p["prompts"], scope.removeprefix("by_"), k, v, *iv[scope][k]]

    emit(
        "paired.csv",
        ["model_a", "model_b", "prompts", "scope", "key", "difference_pts", "ci_low_pts", "ci_high_pts"],
        paired_rows(),
    )

    def matched_rows() -> Iterable[list[Any]]:
        for name, m in report["models"].items():
            for ml in m.get("matched_load", {}).values():
                for c, r in [*ml["by_category"].items(), ("mean", ml["mean"])]:
                    yield [
                        name, ml["positive_setting"], ml["negated_setting"], c, r["prompts_positive"],
                        r["prompts_negated"], r["positive"], *r["positive_ci"], r["negated"], *r["negated_ci"],
                        r["gap"], *r["gap_ci"],
                    ]  # fmt: skip

    emit(
        "matched_load.csv",
        [
            "model",
            "positive_setting",
            "negated_setting",
            "category",
            "prompts_positive",
            "prompts_negated",
            "positive_pct",
            "positive_ci_low_pct",
            "positive_ci_high_pct",
            "negated_pct",
            "negated_ci_low_pct",
            "negated_ci_high_pct",
            "gap_pts",
            "gap_ci_low_pts",
            "gap_ci_high_pts",
        ],
        matched_rows(),
    )
    written += write_probe_csvs(report, out)  # control / paraphrase tables (negt2i.metrics.probes), if any
    return written


def write_probe_csvs(report: dict[str, Any], out: Path) -> list[Path]:
    """``negation_following.csv`` and ``wording_robustness.csv`` from the report's probe section
    (``negt2i.metrics.probes.add_to_report``; percentages / points; none without probes)."""
    probes = report.get("probes")
    if not probes:
        return []
    written: list[Path] = []
    nf = [(n, r) for n, m in probes["models"].items() for r in m.get("negation_following", [])]
    if nf:
        path = out / "negation_following.csv"
        header = [
            "model",
            "category",
            "polarity",
            "source_prompts",
            "statements",
            "evaluated_prompt",
            "evaluated_control",
            "rate_prompt_pct",
            "rate_prompt_ci_low",
            "rate_prompt_ci_high",
            "rate_control_pct",
            "rate_control_ci_low",
            "rate_control_ci_high",
            "effect_pts",
            "effect_ci_low",
            "effect_ci_high",
        ]
        rows = (
            [
                name,
                r["category"],
                r["polarity"],
                r["prompts"],
                r["statements"],
                r["evaluated_prompt"],
                r["evaluated_control"],
                *_with_ci(r, "rate_prompt"),
                *_with_ci(r, "rate_control"),
                *_with_ci(r, "effect"),
            ]
            for name, r in nf
        )
        write_csv(path, header, rows)
        written.append(path)
    wr = [(n, r) for n, m in probes["models"].items() for r in m.get("wording_robustness", [])]
    if wr:
        path = out / "wording_robustness.csv"
        header = [
            "model",
            "form",
            "scope",
            "source_prompts",
            "images_form",
            "images_original",
            "accuracy_form_pct",
            "accuracy_form_ci_low",
            "accuracy_form_ci_high",
            "accuracy_original_pct",
            "accuracy_original_ci_low",
            "accuracy_original_ci_high",
            "difference_pts",
            "difference_ci_low",
            "difference_ci_high",
        ]
        rows = (
            [
                name,
                r["form"],
                r["scope"],
                r["prompts"],
                r["images_form"],
                r["images_original"],
                *_with_ci(r, "accuracy_form"),
                *_with_ci(r, "accuracy_original"),
                *_with_ci(r, "difference"),
            ]
            for name, r in wr
        )
        write_csv(path, header, rows)
        written.append(path)
    return written


def _with_ci(r: dict[str, Any], key: str) -> list[Any]:
    """``r[key]`` and its interval's bounds (None where undefined), as fractions for ``write_csv``."""
    ci = r["interval"][key]
    return [r[key], *(ci if ci is not None else (None, None))]
