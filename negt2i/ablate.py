"""The evaluator ablation of Appendix D (Table 17), re-judged from saved perception.

Three binary axes: the detector (the paper's Mask R-CNN vs RF-DETR-Seg-XL; any registered detector can stand
in for either, an outside one included), SAM refinement (on: relation rules measure refined masks; off: the
detector's masks, ``masks.refine = false``) and the relation constants (current: Table 15; previous: Table
16's constants and contact-band depth rule). The models run once per detector (``negt2i evaluate
--save-perception``); the other two axes are re-judging (``negt2i.core.rejudge``).

=====  ============  ===  =========
name   detector      SAM  constants
=====  ============  ===  =========
C1     alternative   yes  previous
C2     alternative   yes  current
C3     alternative   no   previous
C4     alternative   no   current
C5     main          yes  previous
C6     main          yes  current
C7     main          no   previous
C8     main          no   current
=====  ============  ===  =========

Each detector's own rules file (``--main-rules`` / ``--alt-rules``; default the ``current`` preset) gives its
detection thresholds, attribute buffers and mask settings; the constants axis then replaces the directional,
proximity, comparative and depth blocks with those of ``--current`` / ``--previous`` (default the presets).
A rules file fitted for another detector than the one whose perception it is applied to is refused.

Scores are image-level, as in Table 17: an image's reference is the human majority label of every labelled
element (``negt2i.core.labels``), the decision is the verdict's ``correct``; n, agreement (%) and Cohen's kappa,
with percentile bootstrap intervals over images, one set of draws shared by all configurations (paired).
"""

from __future__ import annotations

import csv
import html
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from negt2i import __version__
from negt2i.calibrate import agreement, check_detector, kappa
from negt2i.core.config import RuleConfig
from negt2i.core.labels import Labels
from negt2i.core.rejudge import SavedRun, check_config
from negt2i.metrics.bootstrap import percentile_interval
from negt2i.metrics.report_html import CSS
from negt2i.metrics.stats import resample_weights

RELATION_BLOCKS: tuple[str, ...] = ("directional", "proximity", "comparative", "depth")


class AblationError(ValueError):
    """Ablation inputs that cannot be used (nothing is written)."""


@dataclass(frozen=True)
class Variant:
    """One configuration of Table 17."""

    name: str
    detector: str
    """``main`` or ``alt``."""
    sam: bool
    constants: str
    """``current`` or ``previous``."""


VARIANTS: tuple[Variant, ...] = tuple(
    Variant(f"C{k}", det, sam, const)
    for k, (det, sam, const) in enumerate(
        ((d, s, c) for d in ("alt", "main") for s in (True, False) for c in ("previous", "current")), start=1
    )
)


def variant_config(detector_rules: RuleConfig, constants: RuleConfig, sam: bool, name: str) -> RuleConfig:
    """The detector's own rules with the relation blocks of ``constants`` and SAM refinement on or off."""
    data = detector_rules.model_dump()
    for block in RELATION_BLOCKS:
        data[block] = constants.model_dump()[block]
    data["masks"]["refine"] = sam
    data["name"] = name
    return RuleConfig.model_validate(data)


@dataclass(frozen=True)
class Row:
    variant: Variant
    detector: str
    config: RuleConfig
    n: int
    agreement: float
    agreement_interval: list[float]
    kappa: float
    kappa_interval: list[float]


def ablate(
    runs: Mapping[str, SavedRun],
    labels: Mapping[str, Labels],
    rules: Mapping[str, tuple[RuleConfig, str]],
    constants: Mapping[str, RuleConfig],
    *,
    n_resamples: int = 1000,
    seed: int = 0,
    confidence: float = 0.95,
    progress: Callable[[str], None] | None = None,
) -> list[Row]:
    """Table 17's rows for the detectors in ``runs`` (``main`` and / or ``alt``).

    ``labels[d]``: the labels read against run ``d`` (the same file); ``rules[d]``: (config, source) of the
    detector's own rules; ``constants``: ``current`` and ``previous`` relation constants."""
    if not runs:
        raise AblationError("no detector runs given")
    for d, run in runs.items():
        check_detector(run, rules[d][1])
        check_config(run, rules[d][0])
    common = sorted(set.intersection(*(set(labels[d].images) for d in runs)))
    if not common:
        raise AblationError("the labelled images of the detectors' runs have no image in common")
    _, weights = (
        resample_weights(len(common), n_resamples, np.random.default_rng(seed)) if n_resamples else (None, None)
    )
    rows: list[Row] = []
    for v in VARIANTS:
        if v.detector not in runs:
            continue
        run, lab = runs[v.detector], labels[v.detector]
        config = variant_config(rules[v.detector][0], constants[v.constants], v.sam, v.name)
        by_name = {im.filename: im for im in run.images}
        ref = np.array([lab.image_label(f) for f in common], dtype=bool)
        dec = np.array([by_name[f].judge(config).correct for f in common], dtype=bool)
        ka_iv = ag_iv = [math.nan, math.nan]
        if weights is not None:
            ka_iv = percentile_interval(np.asarray(kappa(ref, dec, weights), dtype=np.float64), confidence)
            ag_iv = percentile_interval(np.asarray(agreement(ref, dec, weights), dtype=np.float64), confidence)
        ag, ka = float(agreement(ref, dec)), float(kappa(ref, dec))
        rows.append(Row(v, run.detector_name, config, len(common), ag, ag_iv, ka, ka_iv))
        if progress is not None:
            progress(v.name)
    return rows


def _pct(v: float) -> str:
    return "" if not math.isfinite(v) else f"{100 * v:.1f}"


def _k(v: float) -> str:
    return "" if not math.isfinite(v) else f"{v:.3f}"


def _iv(iv: Sequence[float], fmt: Callable[[float], str]) -> str:
    return "" if not all(math.isfinite(x) for x in iv) else f"[{fmt(iv[0])}, {fmt(iv[1])}]"


def ordered(rows: Sequence[Row]) -> list[Row]:
    """Table 17's order: kappa, highest first (undefined last), then configuration name."""
    return sorted(rows, key=lambda r: (-(r.kappa if math.isfinite(r.kappa) else -math.inf), r.variant.name))


def write_ablation(rows: Sequence[Row], out: str | Path, meta: Mapping[str, Any]) -> list[Path]:
    """``ablation.csv``, ``ablation.html`` and ``ablation.json`` (every config record and the inputs) in ``out``."""
    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    table = ordered(rows)
    header = ["config", "detector", "sam", "constants", "n", "agreement_pct", "agreement_lo", "agreement_hi",
              "kappa", "kappa_lo", "kappa_hi", "rules_digest"]  # fmt: skip
    csv_path = d / "ablation.csv"
    with csv_path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        for r in table:
            w.writerow([r.variant.name, r.detector, "yes" if r.variant.sam else "no", r.variant.constants, r.n,
                        _pct(r.agreement), _pct(r.agreement_interval[0]), _pct(r.agreement_interval[1]),
                        _k(r.kappa), _k(r.kappa_interval[0]), _k(r.kappa_interval[1]), r.config.digest()])  # fmt: skip
    e = html.escape
    labels = meta.get("labels", {})
    body = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>NegT2IBench evaluator ablation</title><style>{CSS}</style></head><body>",
        "<h1>Evaluator ablation against human annotations (Table 17)</h1>",
        f"<p class='note'>Generated by negt2i {e(__version__)} at {e(str(meta.get('created')))}; labels "
        f"{e(str(labels.get('path')))} (sha256 {e(str(labels.get('sha256', ''))[:16])}); "
        f"intervals: {meta.get('confidence', 0.95):.0%} percentile bootstrap over images, "
        f"{meta.get('resamples')} resamples, paired across configurations.</p>",
        "<table><thead><tr><th>Config.</th><th>Detector</th><th>SAM</th><th>Constants</th><th>n</th>"
        "<th>Agreement (%)</th><th>interval</th><th>κ</th><th>interval</th></tr></thead><tbody>",
    ]
    for r in table:
        body.append(
            f"<tr><td>{e(r.variant.name)}</td><td>{e(r.detector)}</td><td>{'✓' if r.variant.sam else '–'}</td>"
            f"<td>{e(r.variant.constants.capitalize())}</td><td>{r.n}</td><td>{_pct(r.agreement)}</td>"
            f"<td>{_iv(r.agreement_interval, _pct)}</td><td>{_k(r.kappa)}</td><td>{_iv(r.kappa_interval, _k)}</td></tr>"
        )
    body.append("</tbody></table>")
    body.append("<h2>Configurations</h2><ul>")
    for r in sorted(rows, key=lambda r: r.variant.name):
        body.append(f"<li><code>{e(r.variant.name)}</code>: rules digest <code>{e(r.config.digest())}</code>, "
                    f"depth rule {e(r.config.depth.rule)}, refine {r.config.masks.refine}</li>")  # fmt: skip
    body.append("</ul></body></html>")
    html_path = d / "ablation.html"
    html_path.write_text("\n".join(body), encoding="utf-8")
    json_path = d / "ablation.json"
    data = {
        **meta,
        "rows": [
            {"config": r.variant.name, "detector": r.detector, "sam": r.variant.sam, "constants": r.variant.constants,
             "n": r.n, "agreement": _f(r.agreement), "agreement_interval": [_f(x) for x in r.agreement_interval],
             "kappa": _f(r.kappa), "kappa_interval": [_f(x) for x in r.kappa_interval], "rules": r.config.record()}
            for r in table
        ],
    }  # fmt: skip
    json_path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return [csv_path, html_path, json_path]


def _f(v: float) -> float | None:
    return round(v, 6) if math.isfinite(v) else None


def meta_record(
    runs: Mapping[str, SavedRun], labels: Labels, rules: Mapping[str, tuple[RuleConfig, str]], *, resamples: int,
    confidence: float, seed: int,
) -> dict[str, Any]:  # fmt: skip
    """What produced an ablation: the detectors' model infos and files, the labels, the rules, the bootstrap."""
    return {
        "tool": "negt2i ablate",
        "evaluator_version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "labels": labels.record(),
        "detectors": {
            d: {"model": dict(r.detector), "files": r.sources, "rules": rules[d][1]} for d, r in runs.items()
        },
        "resamples": resamples,
        "confidence": confidence,
        "seed": seed,
    }
