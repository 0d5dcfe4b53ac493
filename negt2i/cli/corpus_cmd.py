"""``negt2i corpus build|validate|stats|control|paraphrase``: the benchmark corpus and its probe sets
(docs/corpus.md)."""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import sys
from pathlib import Path
from typing import Any

from negt2i.core.spec import SpecError, read_prompts
from negt2i.core.vocab import Category
from negt2i.corpus import DEFAULT_CONTROL, DEFAULT_CORPUS, DEFAULT_PARAPHRASE
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
from negt2i.corpus.control import build_control, control_metadata, unique_texts
from negt2i.corpus.paraphrase import DEFAULT_PER_CELL as DEFAULT_PARAPHRASE_PER_CELL
from negt2i.corpus.paraphrase import FORMS, build_paraphrase, paraphrase_metadata, select_sources
from negt2i.corpus.selectors import (
    DEFAULT_MODEL,
    DEFAULT_URL,
    LLMSelector,
    PlausibilitySelector,
    SelectorError,
    TableSelector,
)
from negt2i.corpus.split import SPLITS, TRAIN_PREFIX, Exclusion, build_train, train_metadata
from negt2i.corpus.stats import corpus_stats, format_stats
from negt2i.corpus.validate import (
    KINDS,
    detect_kind,
    validate_control_file,
    validate_file,
    validate_paraphrase_file,
    validate_prompts,
)

DEFAULT_LLM_CACHE = Path.home() / ".cache" / "negt2i" / "corpus-selector"


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser("corpus", help="build, validate and describe the benchmark corpus")
    psub = p.add_subparsers(dest="corpus_command", metavar="ACTION", required=True)

    b = psub.add_parser(
        "build", help="build the 4,800-prompt corpus, or a training split disjoint from it, as JSONL (+ X.meta.json)"
    )
    b.add_argument("--out", required=True, help=f"output JSONL (the committed corpus is {DEFAULT_CORPUS})")
    b.add_argument("--split", choices=SPLITS, default="test",
                   help="test: the benchmark (default); train: --size prompts made the same way, disjoint from "
                   "--benchmark (docs/corpus.md#training-split)")  # fmt: skip
    b.add_argument("--size", type=_positive, default=None, help="prompts in a --split train file (required there)")
    b.add_argument("--benchmark", default=DEFAULT_CORPUS,
                   help=f"the corpus a training split is made disjoint from (default {DEFAULT_CORPUS})")  # fmt: skip
    b.add_argument("--allow-shared-pairs", action="store_true",
                   help="train: refuse only identical prompts, not the benchmark's object pairs")  # fmt: skip
    b.add_argument("--seed", type=int, default=0, help="balancing seed (default 0, the committed corpus)")
    b.add_argument("--selector", choices=("table", "llm"), default="table",
                   help="plausibility selector: the offline table (default) or an OpenAI-compatible LLM")  # fmt: skip
    b.add_argument("--per-cell", type=_positive, default=None,
                   help=f"prompts per category x setting (test split; default {PROMPTS_PER_CELL})")  # fmt: skip
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

    v = psub.add_parser(
        "validate", help="check a corpus, control or paraphrase file against its invariants (docs/corpus.md)"
    )
    v.add_argument("file", help="corpus, control or paraphrase JSONL")
    v.add_argument(
        "--per-cell", type=_positive, default=PROMPTS_PER_CELL, help="expected prompts per category x setting"
    )
    v.add_argument("--partial", action="store_true", help="skip the whole-file counts and coverage")
    v.add_argument("--kind", choices=("auto", *KINDS), default="auto",
                   help="what the file is (default: from its first record)")  # fmt: skip
    v.add_argument("--source", default=DEFAULT_CORPUS,
                   help=f"the corpus a control / paraphrase set was made from (default {DEFAULT_CORPUS})")  # fmt: skip
    v.set_defaults(func=_validate)

    c = psub.add_parser("control", help="build the control set: each corpus prompt's objects, statements as probes")
    c.add_argument("--source", default=DEFAULT_CORPUS, help=f"corpus JSONL (default {DEFAULT_CORPUS})")
    c.add_argument("--out", required=True, help=f"output JSONL (the committed set is {DEFAULT_CONTROL})")
    c.add_argument("--per-cell", type=_positive, default=None,
                   help="only this many source prompts per category x setting (the paraphrase set's draw); "
                   "default: every corpus prompt")  # fmt: skip
    c.add_argument("--seed", type=int, default=0, help="seed of the --per-cell draw (default 0)")
    c.set_defaults(func=_control)

    r = psub.add_parser("paraphrase", help="build the paraphrase set: corpus prompts in other negation forms")
    r.add_argument("--source", default=DEFAULT_CORPUS, help=f"corpus JSONL (default {DEFAULT_CORPUS})")
    r.add_argument("--out", required=True, help=f"output JSONL (the committed set is {DEFAULT_PARAPHRASE})")
    r.add_argument("--per-cell", type=_positive, default=DEFAULT_PARAPHRASE_PER_CELL,
                   help=f"source prompts per category x setting (default {DEFAULT_PARAPHRASE_PER_CELL})")  # fmt: skip
    r.add_argument("--seed", type=int, default=0, help="seed of the draw (default 0)")
    r.add_argument("--forms", default=",".join(FORMS), help=f"comma-separated forms (default: {','.join(FORMS)})")
    r.set_defaults(func=_paraphrase)

    s = psub.add_parser("stats", help="per-category statistics (settings, coverage, balance)")
    s.add_argument("file", nargs="?", default=DEFAULT_CORPUS, help=f"corpus JSONL (default {DEFAULT_CORPUS})")
    s.add_argument("--json", action="store_true", help="print JSON instead of text")
    s.add_argument("--against", default=DEFAULT_CORPUS,
                   help=f"a training split's overlap is counted against it (default {DEFAULT_CORPUS})")  # fmt: skip
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
    if args.split == "train":
        return _build_train(args, categories)
    if args.size is not None or args.allow_shared_pairs:
        print("error: --size and --allow-shared-pairs are for --split train (the test split is "
              f"{PROMPTS_PER_CELL} prompts per category x setting; see --per-cell)", file=sys.stderr)  # fmt: skip
        return 2
    args.per_cell = PROMPTS_PER_CELL if args.per_cell is None else args.per_cell
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


def _build_train(args: argparse.Namespace, categories: tuple[Category, ...]) -> int:
    if args.size is None:
        print("error: --split train needs --size N (the number of training prompts)", file=sys.stderr)
        return 2
    if args.per_cell is not None:
        print("error: --per-cell is for the test split; a training split is sized by --size", file=sys.stderr)
        return 2
    out, bench = Path(args.out), Path(args.benchmark)
    if out.exists() and bench.exists() and out.resolve() == bench.resolve():
        print(f"error: --out {args.out} is the benchmark the split must be disjoint from", file=sys.stderr)
        return 2
    try:
        raw = bench.read_bytes()
        benchmark = read_prompts(bench)
    except SpecError as exc:
        print(f"error: --benchmark {args.benchmark}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: --benchmark: {exc}", file=sys.stderr)
        return 2
    selector = _selector(args)
    pairs = not args.allow_shared_pairs
    try:
        prompts = build_train(
            selector,
            benchmark,
            size=args.size,
            seed=args.seed,
            categories=categories,
            target_pool=args.target_pool,
            pairs=pairs,
        )
    except (BuildError, SelectorError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        if isinstance(selector, LLMSelector):
            selector.close()
    meta = train_metadata(
        prompts,
        selector,
        benchmark,
        benchmark_path=args.benchmark,
        benchmark_sha256=hashlib.sha256(raw).hexdigest(),
        seed=args.seed,
        size=args.size,
        categories=categories,
        target_pool=args.target_pool,
        pairs=pairs,
    )
    overlap = meta["disjoint_from"]["overlap"]
    if overlap["identical_prompts"] or (pairs and overlap["shared_object_pairs"]):  # a builder bug, never expected
        print(f"error: the split overlaps {args.benchmark}: {overlap}", file=sys.stderr)
        return 1
    target = write_corpus(args.out, prompts, meta)
    print(f"wrote {len(prompts)} training prompts to {target} (sha256 {meta['sha256']}), disjoint from "
          f"{args.benchmark}: 0 identical prompts, {overlap['shared_object_pairs']} sharing an object pair; "
          f"metadata in {metadata_path(target)}")  # fmt: skip
    return 0


def _validate(args: argparse.Namespace) -> int:
    try:
        kind = detect_kind(args.file) if args.kind == "auto" else args.kind
        if kind == "control":
            report = validate_control_file(args.file, args.source, partial=args.partial)
        elif kind == "paraphrase":
            report = validate_paraphrase_file(args.file, args.source, partial=args.partial)
        else:
            report = validate_file(args.file, per_cell=args.per_cell, partial=args.partial)
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except SpecError as exc:
        print(f"error: source corpus {args.source}: {exc}", file=sys.stderr)
        return 2
    for violation in report.violations:
        print(f"{args.file}: {violation}")
    if report.ok:
        what = "benchmark" if kind == "corpus" else f"{kind} set"
        print(f"{args.file}: {report.prompts} prompts, all {what} invariants hold")
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
    overlap: dict[str, Any] | None = None
    if prompts and all(p.id.startswith(TRAIN_PREFIX) for p in prompts):  # a training split: how disjoint it is
        against = _read_source(args.against)
        if against is None:
            return 2
        overlap = {"against": args.against, **Exclusion.of(against).overlap(prompts)}
    if args.json:
        print(json.dumps({**stats.to_json(), **({"split": "train", "overlap": overlap} if overlap else {})}, indent=2))
    else:
        print(format_stats(stats, args.file))
        if overlap is not None:
            print(f"\ntraining split; against {overlap['against']}: {overlap['identical_prompts']} identical "
                  f"prompts, {overlap['shared_object_pairs']} sharing an object pair in the same category")  # fmt: skip
    return 0


def _read_source(path: str) -> list[Any] | None:
    try:
        return read_prompts(path)
    except SpecError as exc:
        print(f"error: {path}: {exc} (run `negt2i corpus validate {path}`)", file=sys.stderr)
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
    return None


def _write_set(out: str, prompts: list[Any], meta: dict[str, Any]) -> Path:
    target = write_corpus(out, prompts, None)
    metadata_path(target).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return target


def _control(args: argparse.Namespace) -> int:
    sources = _read_source(args.source)
    if sources is None:
        return 2
    if args.per_cell is not None:
        sources = select_sources(sources, per_cell=args.per_cell, seed=args.seed)
    try:
        prompts = build_control(sources)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    meta = control_metadata(prompts, args.source)
    if args.per_cell is not None:
        meta.update(per_cell=args.per_cell, seed=args.seed)
    out = _write_set(args.out, prompts, meta)
    print(f"wrote {len(prompts)} control prompts ({unique_texts(prompts)} distinct texts to generate) to {out} "
          f"(sha256 {meta['sha256']}); metadata in {metadata_path(out)}")  # fmt: skip
    return 0


def _paraphrase(args: argparse.Namespace) -> int:
    forms = [f.strip() for f in args.forms.split(",") if f.strip()]
    unknown = [f for f in forms if f not in FORMS]
    if not forms or unknown or len(set(forms)) != len(forms):
        print(f"error: --forms {args.forms!r}: expected distinct forms among {', '.join(FORMS)}", file=sys.stderr)
        return 2
    sources = _read_source(args.source)
    if sources is None:
        return 2
    try:
        prompts = build_paraphrase(sources, per_cell=args.per_cell, seed=args.seed, forms=forms)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    meta = paraphrase_metadata(prompts, args.source, per_cell=args.per_cell, seed=args.seed, forms=forms)
    out = _write_set(args.out, prompts, meta)
    print(f"wrote {len(prompts)} paraphrases ({meta['source_prompts']} source prompts x {len(forms)} forms) to "
          f"{out} (sha256 {meta['sha256']}); metadata in {metadata_path(out)}")  # fmt: skip
    return 0
