"""``negt2i weights fetch|list|record``: download the real models' weights, show what the cache holds, and
record the hashes of weights fetched by hand (docs/weights.md)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from negt2i.core.stage_types import STAGES


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser("weights", help="fetch or list the perception models' weights")
    wsub = p.add_subparsers(dest="weights_command", metavar="ACTION", required=True)
    dir_help = "weights cache [NEGT2I_WEIGHTS_DIR, default ~/.cache/negt2i/weights]"
    fetch = wsub.add_parser(
        "fetch",
        help="download weights and record their hashes",
        description="Download the weights of the backends a run will use: NAMES, or the backends chosen by "
        "--backend / --detector / --segmenter / --attributes / --depth and NEGT2I_<STAGE>_BACKEND exactly as "
        "`negt2i evaluate` chooses them (default: the paper's four models; the Mask R-CNN ablation only when "
        "asked for), or --all.",
    )
    fetch.add_argument("names", nargs="*", help="backends to fetch (default: those the run uses, see above)")
    fetch.add_argument("--all", action="store_true", help="every backend of the weights table")
    fetch.add_argument(
        "--judges", action="store_true", help="the agreement study's judges (negt2i judges list; ~260 GB)"
    )
    fetch.add_argument("--backend", default=None, help="backend name for all four stages, as for evaluate")
    for stage in STAGES:
        fetch.add_argument(f"--{stage}", default=None, metavar="NAME", help=f"{stage} backend, as for evaluate")
    fetch.add_argument("--dir", default=None, help=dir_help)
    fetch.add_argument("--force", action="store_true", help="download again even when present and verified")
    fetch.set_defaults(func=_fetch)
    rec = wsub.add_parser(
        "record",
        help="check weights fetched by hand and write their negt2i-weights.json",
        description="For weights copied into DIR/NAME by hand (docs/weights.md): check every expected file is "
        "there and matches the hashes the table knows, then write NAME/negt2i-weights.json with the SHA-256 and "
        "size of each file, so that loading verifies them from then on.",
    )
    rec.add_argument("names", nargs="+", help="backends whose folders to record (negt2i weights list)")
    rec.add_argument("--dir", default=None, help=dir_help)
    rec.add_argument("--revision", default=None, help="the revision you fetched (default: the table's)")
    rec.set_defaults(func=_record)
    lst = wsub.add_parser("list", help="the weights table and what the cache holds")
    lst.add_argument("--dir", default=None, help=dir_help)
    lst.set_defaults(func=_list)


def fetch_names(args: argparse.Namespace) -> list[str]:
    """The backends ``weights fetch`` downloads: NAMES, ``--all``, or those ``evaluate`` would use."""
    from negt2i import weights
    from negt2i.cli.evaluate_cmd import backends_from_args

    if args.names:
        return list(args.names)
    if args.all or args.judges:
        return [*(weights.WEIGHTS if args.all else ()), *(weights.fetchable_judges() if args.judges else ())]
    return weights.needed(backends_from_args(args).values())


def _fetch(args: argparse.Namespace) -> int:
    from negt2i import weights

    names = fetch_names(args)
    if not names:
        print("nothing to fetch: the chosen backends need no weights")
        return 0
    try:
        weights.fetch(names, args.dir, force=args.force)
    except (weights.WeightsError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # network / hub errors come in many types
        print(f"error: fetching failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


def _list(args: argparse.Namespace) -> int:
    from negt2i import weights

    root = weights.weights_dir(args.dir)
    print(f"weights cache: {root}")
    rows = [("backend", "stage", "model", "source", "size", "status")]
    for name, e in weights.WEIGHTS.items():
        rows.append(
            (
                name,
                e.stage,
                e.model,
                f"{e.source}:{e.repo}@{e.revision}",
                f"~{e.size_mb} MB",
                weights.status(name, root),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)) + "  " + row[-1])
    return 0


def _record(args: argparse.Namespace) -> int:
    from negt2i import weights

    root = weights.weights_dir(args.dir)
    try:
        for name in args.names:
            e = weights.entry(name)
            main = weights.record_lock(e, root / e.name, args.revision or e.revision)
            print(f"{name}: recorded {root / e.name / weights.LOCK_NAME} (sha256 {main[:16]}...)")
    except (weights.WeightsError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0
