"""``negt2i generate --model NAME --out DIR``: the benchmark's images (GenEval layout), optionally scored live."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from negt2i.cli.common import parse_shard


def _resolution(text: str) -> tuple[int, int]:
    try:
        w, _, h = text.lower().partition("x")
        width, height = int(w), int(h or w)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N or WxH, got {text!r}") from None
    if width < 8 or height < 8:
        raise argparse.ArgumentTypeError(f"resolution {text}: at least 8 pixels a side")
    return width, height


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "generate",
        help="generate the benchmark's images with a text-to-image model (GenEval layout), scoring them live",
        description=(
            "Generate len(seeds) images per prompt (seeds 42-45: the paper's protocol, Appendix E.1) into OUT in "
            "the GenEval layout (NNNNN/metadata.jsonl, NNNNN/samples/NNNN.png) with each sample's provenance in "
            "NNNNN/provenance/NNNN.json. Re-running resumes; a folder made with other settings is refused. With "
            "--orchestrator every new image is scored as soon as it exists; without, run "
            "`negt2i evaluate OUT` afterwards. See docs/generate.md."
        ),
    )
    p.add_argument("--model", help="a preset (--list-models), a local diffusers folder or a repository id")
    p.add_argument("--out", help="output folder (GenEval layout)")
    p.add_argument("--list-models", action="store_true", help="list the presets with their settings and exit")
    p.add_argument("--prompts", default=None,
                   help="prompt JSONL (default: the benchmark corpus, data/negt2ibench.jsonl, as the package "
                   "carries it)")  # fmt: skip
    p.add_argument("--seeds", default="42-45", help="seeds, one sample each: 42-45 or 42,43 (default 42-45)")
    p.add_argument("--shard", type=parse_shard, default=None, help="only prompts i with i %% N == I (e.g. 0/4)")
    p.add_argument("--limit", type=int, default=None, help="only the first N prompts (before sharding)")
    p.add_argument("--batch-size", type=int, default=4, help="images per pipeline call (default 4)")
    p.add_argument("--device", default=os.environ.get("NEGT2I_DEVICE", "auto"),
                   help="auto, cpu, cuda or cuda:N [NEGT2I_DEVICE, default auto]")  # fmt: skip
    p.add_argument("--dtype", default="auto", choices=("auto", "float32", "float16", "bfloat16"),
                   help="weights dtype (auto: the preset's on a GPU, float32 on CPU)")  # fmt: skip
    p.add_argument("--steps", type=int, default=None, help="denoising steps (required for a non-preset model)")
    p.add_argument("--guidance", type=float, default=None, help="guidance scale (default: the preset's)")
    p.add_argument("--resolution", type=_resolution, default=None,
                   help="N or WxH pixels (required for a non-preset model)")  # fmt: skip
    p.add_argument("--pipeline", default=None, help="diffusers pipeline class (default: from model_index.json)")
    p.add_argument("--revision", default=None, help="repository revision (branch, tag or commit)")
    p.add_argument("--generator", default=None,
                   help="generator backend for a non-preset model (default diffusers; plug-ins: "
                        "NEGT2I_GENERATOR_MODULES)")  # fmt: skip
    p.add_argument("--allow-download", action="store_true", help="let diffusers download missing weights")
    p.add_argument("--orchestrator", default=None, help="score live through the orchestrator at HOST:PORT")
    p.add_argument("--results", default=None,
                   help="results JSONL of live scoring (default OUT/results.jsonl, OUT/results-I-of-N.jsonl "
                        "with --shard)")  # fmt: skip
    p.add_argument("--in-flight", type=int, default=8, help="images sent and not yet answered, at most (default 8)")
    p.add_argument("--wait", type=float, default=60.0, help="seconds to wait for the orchestrator to be SERVING")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_run)


def list_models() -> str:
    """The presets as a table: name, the paper's label, steps, resolution, guidance, dtype, model id."""
    from negt2i.generate.presets import PRESETS

    rows = [("preset", "paper (Table 18)", "steps", "resolution", "guidance", "dtype", "generator", "model")]
    for spec in PRESETS.values():
        guidance = "pipeline" if spec.guidance is None else f"{spec.guidance:g}"
        if spec.guidance is not None and spec.guidance_arg != "guidance_scale":
            guidance += f" ({spec.guidance_arg})"
        quant = " 4-bit" if spec.quantize else ""
        rows.append((spec.name, spec.label, "-" if spec.steps is None else str(spec.steps),
                     f"{spec.width}x{spec.height}", guidance, spec.dtype + quant,
                     spec.generator if spec.pipeline is None else spec.pipeline, spec.model))  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.append("")
    lines.append("notes:")
    lines.extend(f"  {spec.name}: {spec.notes}" for spec in PRESETS.values() if spec.notes)
    return "\n".join(lines)


def _spec(args: argparse.Namespace, device: str) -> Any:
    from negt2i.generate.presets import PRESETS, ModelSpec

    overrides: dict[str, Any] = {
        "steps": args.steps, "guidance": args.guidance, "pipeline": args.pipeline, "revision": args.revision,
        "generator": args.generator,
        "width": args.resolution[0] if args.resolution else None,
        "height": args.resolution[1] if args.resolution else None,
    }  # fmt: skip
    if args.model in PRESETS:
        spec = PRESETS[args.model].with_overrides(**overrides)
    else:
        if args.steps is None or args.resolution is None:
            raise ValueError(
                f"{args.model!r} is not a preset (negt2i generate --list-models): give its settings explicitly "
                "with --steps and --resolution (and --guidance unless the pipeline's default is wanted)"
            )
        model = str(Path(args.model).resolve()) if Path(args.model).exists() else args.model
        spec = ModelSpec("custom", args.model, model, dtype="bfloat16").with_overrides(**overrides)
    dtype = args.dtype if args.dtype != "auto" else ("float32" if device == "cpu" else spec.dtype)
    return spec.with_overrides(dtype=dtype)


def _run(args: argparse.Namespace) -> int:
    if args.list_models:
        print(list_models())
        return 0
    if not args.model or not args.out:
        print("error: --model and --out are required (or --list-models)", file=sys.stderr)
        return 2
    if args.batch_size < 1 or (args.limit is not None and args.limit < 0) or args.in_flight < 1:
        print("error: --batch-size and --in-flight must be >= 1 and --limit >= 0", file=sys.stderr)
        return 2
    from negt2i.core.spec import SpecError, read_prompts
    from negt2i.corpus import corpus_path
    from negt2i.generate import GenerateError, generate, parse_seeds
    from negt2i.generate.runner import resolve_device
    from negt2i.generate.scoring import Scorer

    prompts_file = corpus_path(args.prompts)  # default: the corpus the package carries (any working folder)
    try:
        seeds = parse_seeds(args.seeds)
        if not Path(prompts_file).is_file():
            raise ValueError(f"{prompts_file}: no such prompt file (pass --prompts FILE)")
        prompts = read_prompts(prompts_file)
        device = resolve_device(args.device)
        spec = _spec(args, device)
    except (ValueError, SpecError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    scorer: Scorer | None = None
    results = None
    if args.orchestrator:
        shard = f"-{args.shard[0]}-of-{args.shard[1]}" if args.shard else ""
        results = Path(args.results) if args.results else Path(args.out) / f"results{shard}.jsonl"
        scorer = Scorer(args.orchestrator, results, in_flight=args.in_flight, wait=args.wait)
    try:
        summary = generate(
            spec, prompts, args.out, seeds=seeds, limit=args.limit, shard=args.shard, batch_size=args.batch_size,
            device=device, allow_download=args.allow_download, scorer=scorer, progress=not args.no_progress,
        )  # fmt: skip
    except (GenerateError, ValueError, OSError) as exc:
        if scorer is not None:
            scorer.close()
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BaseException:  # Ctrl-C: generate() stopped the scorer; close the results file, then exit 130
        if scorer is not None:
            scorer.stop()
            scorer.close()
        raise
    print(summary.text())
    print(f"images: {args.out} ({spec.label}, settings {spec.digest()})")
    if scorer is None:
        print(f"score them with: negt2i evaluate {args.out} --out {Path(args.out) / 'results.jsonl'}")
        return 0
    outcome = scorer.close()
    print(outcome.summary.text())
    print(f"results: {results}")
    if outcome.retry:
        from negt2i.metrics.totals import plural

        were = "was" if len(outcome.retry) == 1 else "were"
        print(
            f"{plural(len(outcome.retry), 'image')} {were} not scored (transient errors); run the same command again",
            file=sys.stderr,
        )
        return 1
    return 0
