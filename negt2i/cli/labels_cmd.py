"""``negt2i labels export`` (a static HTML labelling task) and ``negt2i labels import`` (validate answers)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from negt2i.cli.common import EXIT_FAILED, EXIT_INPUT


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "labels", help="collect human element labels: export a labelling task, import the answers"
    )
    lsub = p.add_subparsers(dest="labels_command", metavar="ACTION", required=True)
    ex = lsub.add_parser(
        "export",
        help="a stratified sample of judged images as a static HTML labelling task (+ a crowd-platform CSV)",
        description="Write TASK_DIR with index.html (open it in a browser; no server), images/, task.json and "
        "crowd.csv. See docs/agreement.md.",
    )
    ex.add_argument("results", nargs="+", help="results files (one per generator: the file name is the model)")
    ex.add_argument("--images", required=True, nargs="+", help="image folder(s) the results' filenames are relative to")
    ex.add_argument("--sample", type=int, required=True, metavar="N", help="number of images to label")
    ex.add_argument(
        "--stratify",
        default="category,setting,model",
        help="comma-separated strata to spread the sample over: category, setting, model (default: all three)",
    )
    ex.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    ex.add_argument(
        "--questions", default=None, help="question file from `negt2i questions` (checked against the results)"
    )
    ex.add_argument("--out", required=True, metavar="TASK_DIR", help="task folder to write (new, or an old task)")
    ex.set_defaults(func=_export)
    im = lsub.add_parser(
        "import",
        help="validate returned answers against the task and write the labels file `negt2i agreement` reads",
    )
    im.add_argument("answers", nargs="+", help="page exports (JSONL / CSV) and / or crowd-platform CSVs")
    im.add_argument("--task", required=True, help="the task folder (or its task.json)")
    im.add_argument(
        "--annotators", type=int, default=None, metavar="M", help="annotators per image (default: most seen)"
    )
    im.add_argument("--out", required=True, help="labels file to write (.jsonl or .csv)")
    im.set_defaults(func=_import)


def _export(args: argparse.Namespace) -> int:
    from negt2i.annotation.questions import QuestionsError, read_questions
    from negt2i.annotation.task import TaskError, export_task

    strata = [s.strip() for s in args.stratify.split(",") if s.strip()]
    try:
        questions = read_questions(args.questions) if args.questions else None
        manifest = export_task(
            args.results,
            args.images,
            args.out,
            sample=args.sample,
            strata=strata,
            seed=args.seed,
            questions=questions,
            questions_source=args.questions or "",
        )
    except (OSError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_INPUT
    except (TaskError, QuestionsError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    items = manifest["items"]
    print(f"{len(items)} images sampled (of {args.sample} asked), stratified by {', '.join(strata) or 'nothing'}")
    print(f"mean element questions per image: {manifest['mean_element_questions']:.2f}")
    print(f"task {manifest['task_id']}: open {Path(args.out) / 'index.html'} in a browser; crowd CSV: "
          f"{Path(args.out) / 'crowd.csv'}")  # fmt: skip
    return 0


def _import(args: argparse.Namespace) -> int:
    from negt2i.annotation.task import TaskError, import_labels

    try:
        summary = import_labels(args.answers, args.task, args.out, annotators=args.annotators)
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_INPUT
    except TaskError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print(
        f"{summary['labels']} labels of {summary['images']} images, {summary['annotators_per_image']} annotators "
        f"each: wrote {args.out}"
    )
    return 0
