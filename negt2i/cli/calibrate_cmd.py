"""``negt2i calibrate``: fit rule thresholds on labelled images from saved perception (no model runs)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from negt2i.calibrate import DEFAULT_GRID, FITS


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "calibrate",
        help="fit presence / counting thresholds, relation cut points or attribute buffers on labelled images",
        description="Re-judge saved perception (negt2i evaluate --save-perception) under a grid of rule values, keep "
        "the best Cohen's kappa against the labels on a fit split (ties toward the paper's values), report it on a "
        "held-out split with bootstrap intervals, and write a rules file for --rules / NEGT2I_RULES. See "
        "docs/stage-contract.md, 'Calibrating a detector'.",
    )
    p.add_argument("--results", required=True, nargs="+", help="results files of the labelled images (one detector)")
    p.add_argument(
        "--perception", nargs="+", help="their perception side files (default: X.perception.jsonl next to X.jsonl)"
    )
    p.add_argument(
        "--labels", required=True, help="human element labels (JSONL / CSV, as negt2i agreement) or COCO JSON"
    )
    p.add_argument("--labels-form", choices=("auto", "human", "coco"), default="auto", help="default: by content")
    p.add_argument("--fit", required=True, nargs="+", choices=FITS, help="what to fit")
    p.add_argument("--out", required=True, help="the rules file to write (JSON)")
    p.add_argument(
        "--base", default="current", help="rules the fitted values replace (preset or file; default current)"
    )
    p.add_argument("--name", help="the fitted rules' name (default fitted-<fit>-<detector>)")
    p.add_argument(
        "--grid",
        action="append",
        default=[],
        metavar="PATH=START:STOP:STEP",
        help=f"replace a parameter's grid (or PATH=V1,V2,...); parameters: {', '.join(DEFAULT_GRID)}",
    )
    p.add_argument("--holdout", type=float, default=0.3, help="share of labelled images held out (default 0.3)")
    p.add_argument("--seed", type=int, default=0, help="split and bootstrap seed (default 0)")
    p.add_argument("--bootstrap", type=int, default=1000, metavar="N", help="bootstrap resamples (default 1000)")
    p.add_argument("--confidence", type=float, default=0.95, help="interval level (default 0.95)")
    p.add_argument("--no-progress", action="store_true", help="no progress lines on stderr")
    p.set_defaults(func=_run)


def _fmt(v: Any) -> str:
    return "n/a" if v is None else f"{v:.3f}"


def _run(args: argparse.Namespace) -> int:
    from negt2i.calibrate import CalibrationError, calibrate, check_out, parse_grid, write_rules
    from negt2i.core.config import load_config
    from negt2i.core.labels import read
    from negt2i.core.rejudge import load_saved

    try:
        check_out(args.out)
        grid = dict(parse_grid(g) for g in args.grid)
        base = load_config(args.base)
        run = load_saved(args.results, args.perception)
        labels = read(args.labels, run, args.labels_form)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    shown: dict[str, int] = {}

    def progress(block: str, k: int, n: int) -> None:
        if args.no_progress:
            return
        if k == n or k - shown.get(block, 0) >= max(1, n // 10):
            shown[block] = k
            if sys.stderr.isatty():  # one line, rewritten in place
                print(f"\r{block}: {k}/{n} candidates", end="\n" if k == n else "", file=sys.stderr, flush=True)
            else:
                print(f"{block}: {k}/{n} candidates", file=sys.stderr, flush=True)

    try:
        result = calibrate(
            run, labels, args.fit, base=base, base_source=args.base, grid=grid, holdout=args.holdout,
            seed=args.seed, n_resamples=args.bootstrap, confidence=args.confidence, name=args.name, progress=progress,
        )  # fmt: skip
        path = write_rules(result, args.out)
    except CalibrationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:  # a saved perception that cannot be re-judged
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"detector {run.detector_name}; labels {labels.path} ({labels.form}, {len(labels.images)} images)")
    for r in result.results:
        fitted = ", ".join(f"{p} = {v:g}" for p, v in r.fitted.items())
        paper = ", ".join(f"{v:g}" for v in r.paper.values())
        print(f"  {r.block.name:<12} {fitted}  (paper {paper}; {r.candidates} candidates)")
        f = r.fit_scores
        print(f"    fit split     kappa {_fmt(f['fitted']['kappa'])} (paper {_fmt(f['paper']['kappa'])}), "
              f"{f['n_elements']} elements of {f['n_images']} images")  # fmt: skip
        if r.heldout is not None:
            for which in ("fitted", "paper"):
                h = r.heldout[which]
                iv = h.get("kappa_interval") or [None, None]
                print(f"    held-out {which:<6} kappa {_fmt(h['kappa'])} [{_fmt(iv[0])}, {_fmt(iv[1])}], agreement "
                      f"{_fmt(h['agreement'])}, {h['n_elements']} elements of {h['n_images']} images")  # fmt: skip
        else:
            print("    held-out      none (no labelled element in the held-out split)")
    print(f"wrote {path} (rules {result.config.name}, digest {result.config.digest()})")
    return 0
