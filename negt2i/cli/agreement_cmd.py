"""``negt2i agreement --labels L --results R... [--judges J...] --out DIR``: the evaluator-agreement study."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from negt2i.metrics.agreement import ABSENT_RULES, LOO_TIES


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "agreement",
        help="agreement of the evaluator (and VLM judges) with human labels: kappa, tau, Fleiss, per element",
        description="Compare verdicts (results JSONL) and optional judge answers with per-element human labels "
        "(JSONL or CSV: image, element, annotator, answer). See docs/report.md for the file formats.",
    )
    p.add_argument("--labels", required=True, help="human labels (JSONL or CSV)")
    p.add_argument("--results", required=True, nargs="+", help="results files with the verdicts of the labelled images")
    p.add_argument(
        "--judges", nargs="*", default=[], help="judge answers (JSONL or CSV: judge, mode, image, element, p_yes)"
    )
    p.add_argument("--out", required=True, metavar="DIR", help="output folder (created)")
    p.add_argument(
        "--bootstrap", type=int, default=1000, metavar="N", help="bootstrap resamples over images (default 1000)"
    )
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    p.add_argument("--confidence", type=float, default=0.95, help="interval level (default 0.95)")
    p.add_argument(
        "--absent-objects",
        choices=ABSENT_RULES,
        default="unsatisfied",
        help="a judge's statement about an object it calls absent: unsatisfied (Appendix B.2, default) or "
        "independent (each element on its own, success by omission)",
    )
    p.add_argument(
        "--ours-cost",
        type=_cost,
        default=None,
        metavar="PARAMS,GIB,S_IMG|FILE.json",
        help="NegT2IBench's cost columns of Tables 2 and 8: e.g. 1.24B,6.3,0.78, or the JSON file "
        "benchmarks/bench_cost.py writes (judges' come from their files' params, gpu_gib and seconds fields)",
    )
    p.add_argument(
        "--allow-partial",
        action="store_true",
        help="score images whose elements are only partly labelled (warned); without it that is an error",
    )
    p.add_argument(
        "--loo-tie",
        choices=LOO_TIES,
        default="unsatisfied",
        help="inter-annotator score: a tie among the other annotators (1-1 with m = 3) counts as unsatisfied "
        "(strict majority, default) or satisfied",
    )
    p.set_defaults(func=_run)


def _cost(text: str) -> dict[str, Any]:
    if text.endswith(".json"):
        return _cost_file(text)
    parts = text.split(",")
    if len(parts) != 3:
        raise argparse.ArgumentTypeError(f"expected PARAMS,GIB,S_IMG (e.g. 1.24B,6.3,0.78), got {text!r}")
    try:
        gib, s_img = float(parts[1]), float(parts[2])
    except ValueError:
        raise argparse.ArgumentTypeError(f"GIB and S_IMG must be numbers, got {text!r}") from None
    return {"params": parts[0].strip() or None, "gpu_gib": gib, "s_per_image": s_img, "s_per_question": None}


def _cost_file(path: str) -> dict[str, Any]:
    """The figures of ``benchmarks/bench_cost.py --out FILE``: params, gpu_gib, s_per_image, load_seconds."""
    import json
    import math

    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"{path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{path}: not JSON ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("s_per_image"), int | float):
        raise argparse.ArgumentTypeError(f"{path}: not a benchmarks/bench_cost.py file (no s_per_image)")
    out: dict[str, Any] = {"params": data.get("params") or None, "s_per_question": None}
    for key in ("gpu_gib", "s_per_image", "load_seconds"):
        v = data.get(key)
        if v is not None and (not isinstance(v, int | float) or not math.isfinite(v) or v < 0):
            raise argparse.ArgumentTypeError(f"{path}: {key} must be a number >= 0, got {v!r}")
        out[key] = v
    return out


def _run(args: argparse.Namespace) -> int:
    from negt2i.metrics.agreement_report import agreement_tables, run_agreement, write_agreement

    try:
        result = run_agreement(
            args.labels,
            args.results,
            args.judges,
            n_resamples=args.bootstrap,
            seed=args.seed,
            confidence=args.confidence,
            absent_objects=args.absent_objects,
            loo_tie=args.loo_tie,
            allow_partial=args.allow_partial,
            ours_cost=args.ours_cost,
        )
        written = write_agreement(result, args.out)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    main = agreement_tables(result)[0]
    print(main.title)
    for row in main.rows:
        print(f"  {row[0]:<28} kappa {row[2]:<22} tau {row[11]}")
    for w in result["warnings"]:
        print(f"warning: {w}", file=sys.stderr)
    from negt2i.metrics.totals import plural

    print(f"wrote {plural(len(written), 'file')} to {args.out}: " + ", ".join(p.name for p in written))
    return 0
