"""``negt2i evaluate IMAGES --out results.jsonl``: judge generated images in-process (the main job)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from negt2i.cli.common import EXIT_INPUT, add_results_args, parse_device, perception_path
from negt2i.core.stage_types import STAGES
from negt2i.stages.registry import DEFAULT_BACKENDS


def _env_backend(stage: str) -> str | None:
    return os.environ.get(f"NEGT2I_{stage.upper()}_BACKEND") or None


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "evaluate",
        help="judge a folder of generated images (GenEval layout) or a manifest, in-process",
        description=(
            "Judge every image of IMAGES against its prompt and append one JSON line per image to --out. "
            "IMAGES is a GenEval-layout folder (<prompt>/metadata.jsonl + <prompt>/samples/*.png) or a JSONL "
            "manifest ({'file': ..., 'metadata': {...}} or {'file': ..., 'prompt_id': ...} with --prompts). "
            "Re-running with the same --out resumes where the last run stopped."
        ),
    )
    p.add_argument("images", help="GenEval-layout folder or JSONL manifest")
    p.add_argument("--out", required=True, help="results JSONL (appended to; resumed when it exists)")
    p.add_argument("--prompts", default=None, help="prompt corpus JSONL resolving a manifest's prompt_id")
    p.add_argument(
        "--rules",
        default=os.environ.get("NEGT2I_RULES", "current"),
        help="rule preset (current, previous, geneval) or JSON file [NEGT2I_RULES, default current]",
    )
    p.add_argument(
        "--device",
        type=parse_device,
        default=os.environ.get("NEGT2I_DEVICE", "auto"),
        help="auto, cpu, cuda or cuda:N [NEGT2I_DEVICE, default auto]",
    )
    p.add_argument(
        "--dtype",
        default=os.environ.get("NEGT2I_DTYPE", "fp32"),
        help="model precision: fp32, bf16 or fp16 for every stage, or per stage as detector=fp32,segmenter=bf16 "
        "(others fp32); recorded in every results line's model info [NEGT2I_DTYPE, default fp32]",
    )
    p.add_argument("--weights-dir", default=None, help="weights cache [NEGT2I_WEIGHTS_DIR, ~/.cache/negt2i/weights]")
    p.add_argument("--batch-size", type=int, default=8, help="images per model call of each stage (default 8)")
    p.add_argument(
        "--strict-stages",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="refuse a stage backend whose info leaves its rule constants or operating point unstated (else it "
        "is used with a warning, as the orchestrator does) [NEGT2I_STRICT_STAGES, default off]",
    )
    p.add_argument(
        "--workers",
        type=_workers,
        default=os.environ.get("NEGT2I_WORKERS") or None,
        metavar="N",
        help="threads that read and decode images and apply the rules while the models run on the next batch; "
        "0: all on one thread, one step after the other (same results) [NEGT2I_WORKERS, default min(4, CPUs)]",
    )
    p.add_argument("--limit", type=int, default=None, help="evaluate only the first N images (in job order)")
    add_results_args(p)
    p.add_argument("--backend", default=None, help="backend name for all four stages (e.g. synthetic)")
    for stage in STAGES:
        p.add_argument(
            f"--{stage}",
            default=None,
            metavar="NAME",
            help=f"{stage} backend [NEGT2I_{stage.upper()}_BACKEND, default {DEFAULT_BACKENDS[stage]}]",
        )
    p.add_argument(
        "--fetch-weights",
        action="store_true",
        help="first download the missing weights of the backends this run uses (`make evaluate` does)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_run)


def _workers(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def backends_from_args(args: argparse.Namespace) -> dict[str, str]:
    """Stage -> backend name: ``--<stage>``, else ``--backend``, else ``NEGT2I_<STAGE>_BACKEND``, else the paper's."""
    return {
        stage: getattr(args, stage) or args.backend or _env_backend(stage) or DEFAULT_BACKENDS[stage]
        for stage in STAGES
    }


def _run(args: argparse.Namespace) -> int:
    from negt2i import weights
    from negt2i.core.config import load_config
    from negt2i.core.results import ResultsFileError
    from negt2i.core.spec import SpecError
    from negt2i.evaluate import evaluate
    from negt2i.pipeline import Stages
    from negt2i.run.jobs import EvaluateError, discover, select_shard
    from negt2i.stages.torch_support import parse_dtypes

    if args.batch_size < 1 or (args.limit is not None and args.limit < 0):
        print("error: --batch-size must be >= 1 and --limit >= 0", file=sys.stderr)
        return 2
    try:
        dtypes = parse_dtypes(args.dtype, STAGES)
        config = load_config(args.rules)
        jobs = select_shard(discover(args.images, args.prompts), args.shard)
        if not jobs:
            print(f"error: {args.images}: no images found", file=sys.stderr)
            return 2
        backends = backends_from_args(args)
        if args.fetch_weights:
            root = weights.weights_dir(args.weights_dir)
            todo = [n for n in weights.needed(backends.values()) if weights.missing_files(weights.WEIGHTS[n], root)]
            if todo:
                weights.fetch(todo, root)
        weights.require(backends.values(), args.weights_dir)
        stages = Stages.create(
            backends,
            {stage: {"dtype": d} for stage, d in dtypes.items()},
            device=args.device,
            weights_dir=args.weights_dir,
            config=config,
            strict=args.strict_stages,
        )
        summary = evaluate(
            jobs,
            args.out,
            stages,
            config=config,
            batch_size=args.batch_size,
            workers=args.workers,
            limit=args.limit,
            progress=not args.no_progress,
            retry_errors=args.retry_errors,
            replace_changed=args.replace_changed,
            save_perception=perception_path(args),
        )
    except (EvaluateError, ResultsFileError, SpecError, weights.WeightsError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_INPUT
    print(summary.text())
    print(f"results: {args.out}")
    if args.save_perception is not None:
        print(f"perception: {perception_path(args)}")
    return 0
