"""``negt2i corpus build|validate|stats``: the benchmark corpus (docs/corpus.md)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from negt2i.corpus import DEFAULT_CORPUS
from negt2i.corpus.build import (
    CATEGORIES,
    DEFAULT_TARGET_POOL,
    PROMPTS_PER_CELL,
    BuildError,
    build_corpus,
    build_metadata,
    metadata_path,
    write_corpus,
)
from negt2i.corpus.selectors import (
    DEFAULT_MODEL,
    DEFAULT_URL,
    LLMSelector,
    PlausibilitySelector,
    SelectorError,
    TableSelector,
)
from negt2i.corpus.stats import corpus_stats, format_stats
from negt2i.corpus.validate import validate_file, validate_prompts
from negt2i.spec import SpecError, read_prompts
from negt2i.vocab import Category

DEFAULT_LLM_CACHE = Path.home() / ".cache" / "negt2i" / "corpus-selector"


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser("corpus", help="build, validate and describe the benchmark corpus")
    psub = p.add_subparsers(dest="corpus_command", metavar="ACTION", required=True)

    b = psub.add_parser("build", help="build the 4,800-prompt corpus as JSONL (plus X.meta.json beside it)")
    b.add_argument("--out", required=True, help=f"output JSONL (the committed corpus is {DEFAULT_CORPUS})")
    b.add_argument("--seed", type=int, default=0, help="balancing seed (default 0, the committed corpus)")
    b.add_argument("--selector", choices=("table", "llm"), default="table",
                   help="plausibility selector: the offline table (default) or an OpenAI-compatible LLM")  # fmt: skip
    b.add_argument("--per-cell", type=_positive, default=PROMPTS_PER_CELL, help="prompts per category x setting")
    b.add_argument("--categories", default=",".join(c.value for c in CATEGORIES),
                   help="comma-separated categories (default: all six)")  # fmt: skip
    b.add_argument("--target-pool", type=_positive, default=DEFAULT_TARGET_POOL,
                   help="relation targets are drawn from this many least-used candidates")  # fmt: skip
    llm = b.add_argument_group("LLM selector (--selector llm)")
    llm.add_argument("--llm-url", default=DEFAULT_URL, help=f"API root of the chat endpoint (default {DEFAULT_URL})")
    llm.add_argument("--llm-model", default=DEFAULT_MODEL, help=f"model name (default {DEFAULT_MODEL})")
    llm.add_argument("--llm-cache", type=Path, default=DEFAULT_LLM_CACHE, help="answer cache directory")
    llm.add_argument("--llm-pool-size", type=_positive, default=13, help="candidate targets per relation request")
    llm.add_argument("--llm-concurrency", type=_positive, default=8, help="parallel requests")
    llm.add_argument("--llm-retries", type=int, default=2, help="retries of a malformed answer")
    llm.add_argument("--llm-offline", action="store_true", help="use only the cache; a miss is an error")
    llm.add_argument("--llm-no-json-mode", action="store_true", help="do not send response_format=json_object")
    b.set_defaults(func=_build)

    v = psub.add_parser("validate", help="check a corpus file against the benchmark's invariants")
    v.add_argument("file", help="corpus JSONL")
    v.add_argument(
        "--per-cell", type=_positive, default=PROMPTS_PER_CELL, help="expected prompts per category x setting"
    )
    v.add_argument("--partial", action="store_true", help="skip the whole-corpus counts and class coverage")
    v.set_defaults(func=_validate)

    s = psub.add_parser("stats", help="per-category statistics (settings, coverage, balance)")
    s.add_argument("file", nargs="?", default=DEFAULT_CORPUS, help=f"corpus JSONL (default {DEFAULT_CORPUS})")
    s.add_argument("--json", action="store_true", help="print JSON instead of text")
    s.set_defaults(func=_stats)


def _positive(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _categories(text: str) -> tuple[Category, ...]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        raise SystemExit("error: --categories names no category")
    try:
        return tuple(Category(n) for n in names)
    except ValueError:
        expected = ", ".join(c.value for c in CATEGORIES)
        raise SystemExit(f"error: unknown category in {text!r} (expected {expected})") from None


def _selector(args: argparse.Namespace) -> PlausibilitySelector:
    if args.selector == "table":
        return TableSelector()
    return LLMSelector(
        base_url=args.llm_url,
        model=args.llm_model,
        cache_dir=args.llm_cache,
        pool_size=args.llm_pool_size,
        concurrency=args.llm_concurrency,
        retries=args.llm_retries,
        offline=args.llm_offline,
        json_mode=not args.llm_no_json_mode,
    )


def _build(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    categories = _categories(args.categories)
    selector = _selector(args)
    try:
        prompts = build_corpus(
            selector, seed=args.seed, per_cell=args.per_cell, categories=categories, target_pool=args.target_pool
        )
    except (BuildError, SelectorError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        if isinstance(selector, LLMSelector):
            selector.close()
    partial = args.per_cell != PROMPTS_PER_CELL or set(categories) != set(CATEGORIES)
    problems = validate_prompts([(None, p) for p in prompts], per_cell=args.per_cell, partial=partial)
    if problems:  # a bug in the builder, never expected
        for problem in problems[:20]:
            print(f"error: {problem}", file=sys.stderr)
        return 1
    meta = build_metadata(
        prompts, selector, seed=args.seed, per_cell=args.per_cell, categories=categories, target_pool=args.target_pool
    )
    out = write_corpus(args.out, prompts, meta)
    print(f"wrote {len(prompts)} prompts to {out} (sha256 {meta['sha256']}); metadata in {metadata_path(out)}")
    if isinstance(selector, LLMSelector):
        st = selector.stats
        print(f"llm selector: {st.requests} requests, {st.cache_hits} cached, {st.malformed} malformed answers, "
              f"{st.rejected_items} out-of-list items rejected")  # fmt: skip
    return 0


def _validate(args: argparse.Namespace) -> int:
    try:
        report = validate_file(args.file, per_cell=args.per_cell, partial=args.partial)
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for violation in report.violations:
        print(f"{args.file}: {violation}")
    if report.ok:
        print(f"{args.file}: {report.prompts} prompts, all benchmark invariants hold")
        return 0
    print(f"{args.file}: {len(report.violations)} violations", file=sys.stderr)
    return 1


def _stats(args: argparse.Namespace) -> int:
    try:
        prompts = read_prompts(args.file)
    except SpecError as exc:
        print(f"{args.file}: {exc} (run `negt2i corpus validate` for every problem)", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    stats = corpus_stats(prompts)
    if args.json:
        print(json.dumps(stats.to_json(), indent=2))
    else:
        print(format_stats(stats, args.file))
    return 0
