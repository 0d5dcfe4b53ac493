"""``negt2i audit RESULTS --images DIR --out DIR``: an HTML page showing why each verdict came out as it did.

``negt2i audit --grid NAME=RESULTS ... --images NAME=DIR ... --out DIR``: the same prompts across several
models, one image per model with its verdict mark (the paper's Figure 8; ``negt2i.audit_grid``)."""

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
    p.add_argument(
        "results", nargs="+", metavar="RESULTS",
        help="results JSONL of negt2i evaluate / submit (with --grid: several, each NAME=PATH or PATH)",
    )  # fmt: skip
    p.add_argument(
        "--images", required=True, action="append", metavar="DIR",
        help="the folder the results' filenames are under (with --grid: one per results file, in order, or NAME=DIR)",
    )  # fmt: skip
    p.add_argument("--out", required=True, metavar="DIR", help="output folder (created)")
    p.add_argument(
        "--perception", metavar="PATH", help="perception side file (default: RESULTS with .perception.jsonl)"
    )
    p.add_argument("--filename", action="append", default=[], metavar="NAME", help="audit this image (repeatable)")
    p.add_argument("--failed", action="store_true", help="only incorrect images")
    p.add_argument("--category", action="append", default=[], metavar="C", help="only this category (repeatable)")
    p.add_argument("--limit", type=int, default=50, metavar="N", help="at most N images, sampled (default 50)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    grid = p.add_argument_group("cross-model grid (Figure 8)")
    grid.add_argument("--grid", action="store_true", help="one row per prompt, one column per results file")
    grid.add_argument(
        "--prompt",
        action="append",
        default=[],
        metavar="ID",
        help="a row of the grid (repeatable; default: one prompt per category, drawn with --seed)",
    )
    grid.add_argument("--sample", type=int, default=0, metavar="K", help="which image of each prompt (default 0)")
    p.set_defaults(func=_run)


def _named(specs: list[str], what: str) -> list[tuple[str | None, str]]:
    out: list[tuple[str | None, str]] = []
    for spec in specs:
        name, sep, path = spec.partition("=")
        out.append((name, path) if sep and name and path else (None, spec))
    if any(n is None for n, _ in out) and any(n is not None for n, _ in out):
        raise ValueError(f"{what}: name all of them (NAME=PATH) or none")
    return out


def _run_grid(args: argparse.Namespace) -> int:
    from pathlib import Path

    from negt2i.audit import AuditError
    from negt2i.audit_grid import grid_model, write_grid
    from negt2i.core.results import read_results

    try:
        results = [(n or Path(p).stem, p) for n, p in _named(args.results, "results")]
        images = _named(args.images, "--images")
        if images[0][0] is None:
            if len(images) != len(results):
                raise ValueError(f"--images: {len(images)} folders for {len(results)} results files (one each)")
            folders = {name: path for (name, _), (_, path) in zip(results, images, strict=True)}
        else:
            folders = {str(n): p for n, p in images}
            missing = [name for name, _ in results if name not in folders]
            if missing:
                raise ValueError(f"--images: no folder for {', '.join(missing)}")
        if args.sample < 0:
            raise ValueError("--sample must be >= 0")
        models = [grid_model(name, list(read_results(path)), folders[name]) for name, path in results]
        page = write_grid(models, args.out, prompt_ids=args.prompt, sample=args.sample, seed=args.seed)
    except (AuditError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"grid of {len(page.prompts)} prompts x {len(models)} models: {page.html}")
    return 0


def _run(args: argparse.Namespace) -> int:
    from pathlib import Path

    if args.grid:
        return _run_grid(args)
    if len(args.results) != 1 or len(args.images) != 1:
        print("error: one RESULTS and one --images (several only with --grid)", file=sys.stderr)
        return 2
    args.results, args.images = args.results[0], args.images[0]
    from negt2i.audit import AuditError, select, write_audit
    from negt2i.core.perception_file import default_path, read_perception
    from negt2i.core.results import read_results
    from negt2i.core.vocab import Category

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
