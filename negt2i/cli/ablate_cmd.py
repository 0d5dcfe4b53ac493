"""``negt2i ablate``: Table 17's eight evaluator configurations, re-judged from saved perception."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "ablate",
        help="the evaluator ablation (Table 17: detector x SAM x current/previous constants) against human labels",
        description="Models run once per detector (negt2i evaluate --save-perception on the labelled images); SAM "
        "on/off and the constants are re-judged. --main stands for RF-DETR-Seg-XL (C5-C8), --alt for Mask R-CNN "
        "(C1-C4); any registered detector can stand in for either. Writes ablation.csv, ablation.html and "
        "ablation.json to --out.",
    )
    p.add_argument("--labels", required=True, help="human element labels (JSONL / CSV, as negt2i agreement)")
    p.add_argument("--main", nargs="+", metavar="RESULTS", help="results files of the main detector (C5-C8)")
    p.add_argument("--alt", nargs="+", metavar="RESULTS", help="results files of the alternative detector (C1-C4)")
    p.add_argument(
        "--main-rules", default="current", help="the main detector's rules (preset or file; default current)"
    )
    p.add_argument("--alt-rules", default="current", help="the alternative detector's rules (default current)")
    p.add_argument("--current", default="current", help="the 'current' relation constants (default the preset)")
    p.add_argument("--previous", default="previous", help="the 'previous' relation constants (default the preset)")
    p.add_argument("--out", required=True, metavar="DIR", help="output folder (created)")
    p.add_argument("--bootstrap", type=int, default=1000, metavar="N", help="bootstrap resamples (default 1000)")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    p.add_argument("--confidence", type=float, default=0.95, help="interval level (default 0.95)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from negt2i.ablate import ablate, meta_record, ordered, write_ablation
    from negt2i.core.config import load_config
    from negt2i.core.labels import read_human
    from negt2i.core.rejudge import load_saved

    if not args.main and not args.alt:
        print("error: give --main and / or --alt results files", file=sys.stderr)
        return 2
    try:
        runs = {d: load_saved(files) for d, files in (("main", args.main), ("alt", args.alt)) if files}
        labels = {d: read_human(args.labels, run) for d, run in runs.items()}
        rules = {d: (load_config(src), src) for d, src in (("main", args.main_rules), ("alt", args.alt_rules))}
        constants = {"current": load_config(args.current), "previous": load_config(args.previous)}
        rows = ablate(runs, labels, rules, constants, n_resamples=args.bootstrap, seed=args.seed,
                      confidence=args.confidence)  # fmt: skip
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    meta = meta_record(runs, next(iter(labels.values())), rules, resamples=args.bootstrap,
                       confidence=args.confidence, seed=args.seed)  # fmt: skip
    written = write_ablation(rows, args.out, meta)
    print(f"{'config':<6} {'detector':<28} {'SAM':<4} {'constants':<9} {'n':>4} {'agree%':>7} {'kappa':>7}")
    for r in ordered(rows):
        kappa = "n/a" if r.kappa != r.kappa else f"{r.kappa:.3f}"
        print(f"{r.variant.name:<6} {r.detector:<28} {'yes' if r.variant.sam else 'no':<4} {r.variant.constants:<9} "
              f"{r.n:>4} {100 * r.agreement:>7.1f} {kappa:>7}")  # fmt: skip
    print(f"wrote {', '.join(str(p) for p in written)}")
    return 0
