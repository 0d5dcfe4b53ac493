"""``negt2i judges list|run``: the judge table, and one judge asked the question file's questions about a folder
of images (the judge files ``negt2i agreement --judges`` reads; docs/agreement.md)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from negt2i.cli.common import EXIT_FAILED, EXIT_INPUT, parse_device, parse_shard


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "judges", help="VQA judges and score baselines: list them, or run one over images (judge files)"
    )
    jsub = p.add_subparsers(dest="judges_command", metavar="ACTION", required=True)
    lst = jsub.add_parser("list", help="the judge table: kind, model, size, weights status")
    lst.add_argument("--dir", default=None, help="weights cache [NEGT2I_WEIGHTS_DIR, default ~/.cache/negt2i/weights]")
    lst.set_defaults(func=_list)
    run = jsub.add_parser(
        "run",
        help="ask one judge the questions about the images; write a judge file (resumable)",
        description="Ask judge NAME, in one mode, every question of the question file (negt2i questions) about "
        "each image of IMAGES (GenEval layout or JSONL manifest, as negt2i evaluate reads), writing P(yes) per "
        "question (VQA judges) or one score per image (--mode score) with per-question seconds and peak memory. "
        "Resumes: answered questions in --out are skipped.",
    )
    run.add_argument("--judge", required=True, metavar="NAME", help="a judge of `negt2i judges list`")
    run.add_argument(
        "--mode",
        required=True,
        choices=("whole", "pos", "neg", "score"),
        help="whole prompt, per element affirmative (pos), per element negated wording (neg); score judges: score",
    )
    run.add_argument("--questions", required=True, metavar="Q.jsonl", help="question file (negt2i questions)")
    run.add_argument("--images", required=True, metavar="DIR", help="GenEval-layout folder or JSONL manifest")
    run.add_argument("--out", required=True, metavar="J.jsonl", help="judge file (appended to; one judge and mode)")
    run.add_argument("--batch-size", type=int, default=1, help="questions per forward pass (default 1, as the paper)")
    run.add_argument("--device", type=parse_device, default="auto", help="auto, cpu, cuda, cuda:N (default auto)")
    run.add_argument("--dtype", default="auto", help="auto (bf16 on CUDA, fp32 on CPU), fp32, bf16 or fp16")
    run.add_argument("--weights-dir", default=None, help="weights cache [NEGT2I_WEIGHTS_DIR]")
    run.add_argument(
        "--random-init",
        action="store_true",
        help="the judge's architecture from a tiny random configuration, offline (tests and the worked example; "
        "answers are meaningless)",
    )
    run.add_argument("--shard", type=parse_shard, default=None, help="only images i with i %% N == I (e.g. 0/4)")
    run.add_argument("--limit", type=int, default=None, help="only the first N images (after --shard)")
    run.add_argument(
        "--model",
        default="",
        metavar="MODEL",
        help="write image keys as MODEL:filename (when the study has several results files; default filename)",
    )
    run.add_argument("--name", default=None, help="the judge's name in the file (default: the paper's name)")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    run.set_defaults(func=_run)


def _list(args: argparse.Namespace) -> int:
    from negt2i import weights
    from negt2i.judges.registry import judges

    root = weights.weights_dir(args.dir)
    rows = [("judge", "kind", "name in files", "params", "model", "weights")]
    for r in judges():
        states = [weights.status(n, root) for n in r.weight_entries()]
        status = next((x for x in states if x != "ok"), "ok") if states else "none needed"
        rows.append((r.name, r.kind, r.label, r.params or "-", r.model or "-", status))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)) + "  " + row[-1])
    print(f"weights cache: {root}; fetch with `negt2i weights fetch NAME` (or --judges for all)")
    return 0


def _run(args: argparse.Namespace) -> int:
    from negt2i import weights
    from negt2i.judges.harness import JudgeRunError, OutFileRefused, run_judge

    if args.limit is not None and args.limit < 1:
        print("error: --limit must be at least 1", file=sys.stderr)
        return EXIT_INPUT
    for path, what in ((args.questions, "--questions"), (args.images, "--images")):
        from pathlib import Path

        if not Path(path).exists():
            print(f"error: {what} {path}: no such file or folder", file=sys.stderr)
            return EXIT_INPUT
    try:
        s = run_judge(
            args.judge,
            args.mode,
            args.questions,
            args.images,
            args.out,
            batch_size=args.batch_size,
            device=args.device,
            dtype=args.dtype,
            weights_dir=args.weights_dir,
            random_init=args.random_init,
            shard=args.shard,
            limit=args.limit,
            prefix=f"{args.model}:" if args.model else "",
            label=args.name,
            progress=not args.no_progress,
        )
    except OutFileRefused as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_INPUT
    except weights.WeightsMissingError as exc:
        print(f"error: {exc} To try the judge harness offline: add --random-init (a tiny random model of the same "
              "architecture; answers are meaningless).", file=sys.stderr)  # fmt: skip
        return EXIT_FAILED
    except weights.WeightsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except (JudgeRunError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if s.asked:
        gib = "-" if s.gpu_gib is None else f"{s.gpu_gib:.1f}"
        print(
            f"{s.judge} ({s.mode}): answered {s.asked} questions of {s.images} images "
            f"({s.skipped} already answered); {s.s_per_question:.4f} s/question, peak GPU GiB {gib}, "
            f"load {s.load_seconds:.1f} s; wrote {args.out}"
        )
    if s.failed_images:
        print(f"error: {len(s.failed_images)} images could not be read: {', '.join(s.failed_images[:5])}",
              file=sys.stderr)  # fmt: skip
        return EXIT_FAILED
    return 0
