"""``negt2i questions PROMPTS --out Q.jsonl``: the element questions of every prompt, both wordings."""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

from negt2i.cli.common import EXIT_FAILED, EXIT_INPUT


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "questions",
        help="per-element yes/no questions of each prompt (affirmative and negated wording) and the whole-prompt one",
        description="Write the annotators' per-element questions (one per object with its count, one per statement, "
        "asked affirmatively), the same with negated statements asked in negated form, and the whole-prompt "
        "question, keyed object:I / statement:K / prompt with the expected answers (format: docs/agreement.md).",
    )
    p.add_argument("prompts", help="prompt JSONL (data/negt2ibench.jsonl or any NegT2IBench / GenEval prompt file)")
    p.add_argument("--out", required=True, help="question file to write (JSONL); an existing file must be one")
    p.set_defaults(func=_run)


def _refuse(out: Path) -> str | None:
    """Why ``out`` may not be overwritten (a file that is not a question file is user data), else None."""
    if not out.exists():
        return None
    if not out.is_file():
        return f"{out} exists and is not a file"
    with out.open(encoding="utf-8", errors="replace") as fh:
        first = fh.readline()
    try:
        ok = json.loads(first).get("negt2i") == "questions/1"
    except (ValueError, AttributeError):
        ok = False
    return None if ok else f"{out} exists and is not a question file; refusing to overwrite it"


def _run(args: argparse.Namespace) -> int:
    from negt2i.annotation.questions import write_questions
    from negt2i.core.spec import SpecError, read_prompts

    src, out = Path(args.prompts), Path(args.out)
    why = _refuse(out)
    if why:
        print(f"error: {why}", file=sys.stderr)
        return EXIT_INPUT
    try:
        digest = hashlib.sha256(src.read_bytes()).hexdigest()
        prompts = read_prompts(src)
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_INPUT
    except SpecError as exc:
        print(f"{src}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    summary = write_questions(out, prompts, digest)
    n = summary["prompts"]
    print(
        f"{n} prompts, {summary['element_questions']} element questions (x2 wordings) + {n} whole-prompt questions; "
        f"corpus sha256 {digest[:16]}"
    )
    print(f"mean element questions per image: {summary['mean_element_questions']:.2f}")
    for cat, mean in sorted(summary["by_category"].items()):
        print(f"  {cat:<12} {mean:.2f}")
    print(f"wrote {out}")
    return 0
