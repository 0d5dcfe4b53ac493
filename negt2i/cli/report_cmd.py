"""``negt2i report RESULTS... --out DIR``: benchmark metrics, intervals, comparison tables and an HTML report."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from typing import Any

PLOTS_HELP = "pip install '.[reports]' (from the repository root; '.[demo]' has it too), or pass --no-plots"


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "report",
        help="score results files: accuracy tables, failure causes, dead zones, intervals, HTML report",
        description="Score one or more models' results files (JSONL from `negt2i evaluate` / `negt2i submit`). "
        "Each RESULTS is PATH (the model is named after the file) or NAME=PATH; repeating a NAME, or a glob "
        "in PATH, merges shards of one model. Writes report.json, CSV tables, report.md and a self-contained "
        "report.html into --out.",
    )
    p.add_argument("results", nargs="+", metavar="RESULTS", help="PATH or NAME=PATH (PATH may be a glob)")
    p.add_argument("--out", required=True, metavar="DIR", help="output folder (created)")
    p.add_argument("--bootstrap", type=int, default=1000, metavar="N", help="bootstrap resamples (default 1000)")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    p.add_argument("--confidence", type=float, default=0.95, help="interval level (default 0.95)")
    p.add_argument(
        "--baseline", metavar="NAME", help="model the paired differences are taken against (default: the first)"
    )
    p.add_argument("--control", action="append", default=[], metavar="NAME=PATH",
                   help="results of model NAME on the control set (data/negt2ibench-control.jsonl): adds the "
                   "negation-following section; repeat for shards or models")  # fmt: skip
    p.add_argument("--paraphrase", action="append", default=[], metavar="NAME=PATH",
                   help="results of model NAME on the paraphrase set (data/negt2ibench-paraphrase.jsonl): adds the "
                   "wording-robustness section; repeat for shards or models")  # fmt: skip
    p.add_argument("--no-plots", action="store_true", help="skip the plots (no matplotlib needed)")
    p.add_argument("--strict", action="store_true", help="exit with status 3 when the report has warnings")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from negt2i.metrics import probes
    from negt2i.metrics.records import ResultsFormatError
    from negt2i.metrics.report import build_report, load_model, parse_inputs, table3, write_report
    from negt2i.metrics.totals import plural, state_totals

    if not args.no_plots and importlib.util.find_spec("matplotlib") is None:  # before any work, before any file
        print(f"error: the report's plots need matplotlib, which this environment lacks: {PLOTS_HELP}; "
              "nothing was written", file=sys.stderr)  # fmt: skip
        return 2
    try:
        inputs = parse_inputs(args.results)
        models = [load_model(name, paths) for name, paths in inputs]
        report = build_report(
            models, n_resamples=args.bootstrap, seed=args.seed, confidence=args.confidence, baseline=args.baseline
        )
        probes.add_to_report(
            report,
            dict(inputs),
            _probe_inputs(args.control, "control"),
            _probe_inputs(args.paraphrase, "paraphrase"),
            n_resamples=args.bootstrap,
            seed=args.seed,
            confidence=args.confidence,
        )
        written = write_report(report, args.out, plots=not args.no_plots)
    except (ResultsFormatError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:  # a plotting library's own dependency: the same advice
        print(f"error: {exc}: {PLOTS_HELP}; nothing was written to {args.out}", file=sys.stderr)
        return 2
    t = table3(report)
    print(t.title)
    width = max(len(r[0]) for r in t.rows)
    print(f"{'Model':<{width}}  " + " ".join(f"{c:>7}" for c in t.columns[1:]))
    for row in t.rows:
        print(f"{row[0]:<{width}}  " + " ".join(f"{v:>7}" for v in row[1:]))
    for m in models:  # the same totals line as the end of negt2i evaluate / submit (negt2i.metrics.totals)
        print(f"{m.name}: {state_totals(m.state).text()}")
    for w in report["warnings"]:
        print(f"warning: {w}", file=sys.stderr)
    files = ", ".join(str(p.relative_to(args.out)) for p in written)
    print(f"wrote {plural(len(written), 'file')} to {args.out}: {files}")
    return 3 if args.strict and report["warnings"] else 0


def _probe_inputs(specs: list[str], kind: str) -> list[tuple[str, Any]]:
    """``--control`` / ``--paraphrase`` values: NAME=PATH (NAME must be a model of the main results)."""
    from negt2i.metrics.report import parse_inputs

    for spec in specs:
        if "=" not in spec:
            raise ValueError(f"--{kind} {spec!r}: expected NAME=PATH, NAME being the model the results belong to")
    return list(parse_inputs(specs)) if specs else []
