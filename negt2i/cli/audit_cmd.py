"""``negt2i audit RESULTS --images DIR --out DIR``: an HTML page showing why each verdict came out as it did."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "audit",
        help="HTML page of chosen verdicts: masks and boxes drawn on the images, evidence in words",
        description="For a chosen or sampled set of judged images of RESULTS, write a self-contained HTML page "
        "(and PNGs) into --out: each image with the prompt's objects' masks and boxes overlaid and labelled, "
        "every object's presence and count, every statement's verdict, failure cause and evidence in words, "
        "dead-zone cases marked. Masks come from the perception side file written by `negt2i evaluate "
        "--save-perception`; no model runs.",
    )
    p.add_argument("results", metavar="RESULTS", help="results JSONL of negt2i evaluate / submit")
    p.add_argument("--images", required=True, metavar="DIR", help="the folder the results' filenames are under")
    p.add_argument("--out", required=True, metavar="DIR", help="output folder (created)")
    p.add_argument(
        "--perception", metavar="PATH", help="perception side file (default: RESULTS with .perception.jsonl)"
    )
    p.add_argument("--filename", action="append", default=[], metavar="NAME", help="audit this image (repeatable)")
    p.add_argument("--failed", action="store_true", help="only incorrect images")
    p.add_argument("--category", action="append", default=[], metavar="C", help="only this category (repeatable)")
    p.add_argument("--limit", type=int, default=50, metavar="N", help="at most N images, sampled (default 50)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from negt2i.audit import AuditError, select, write_audit
    from negt2i.perception_file import default_path, read_perception
    from negt2i.results import read_results
    from negt2i.vocab import Category

    if args.limit < 1:
        print("error: --limit must be >= 1", file=sys.stderr)
        return 2
    bad = [c for c in args.category if c not in {c.value for c in Category}]
    if bad:
        print(f"error: unknown category {', '.join(bad)}", file=sys.stderr)
        return 2
    try:
        lines = list(read_results(args.results))
        chosen = select(
            lines, filenames=args.filename, failed=args.failed, categories=args.category, limit=args.limit,
            seed=args.seed,
        )  # fmt: skip
        side = Path(args.perception) if args.perception else default_path(args.results)
        perception = read_perception(side) if side.is_file() else {}
        if not side.is_file():
            print(f"warning: {side} not found: masks and boxes are not drawn (use --save-perception)", file=sys.stderr)
        if not chosen:
            print("error: no judged image matches the selection", file=sys.stderr)
            return 1
        parts = [f"{len(lines)} lines in {args.results}"]
        if args.filename:
            parts.append("chosen by filename")
        if args.failed:
            parts.append("incorrect only")
        if args.category:
            parts.append("categories " + ", ".join(args.category))
        parts.append(f"at most {args.limit} (seed {args.seed})")
        page = write_audit(chosen, args.images, args.out, perception=perception, selection_note="; ".join(parts) + ".")
    except (AuditError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"audited {page.audited} images: {page.html} (+ {len(page.images)} PNGs in {Path(args.out) / 'images'})")
    return 0
