"""``negt2i prompts check FILE``: validate prompt metadata (ours or GenEval's JSONL)."""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from typing import Any

from negt2i.core.spec import SpecError, iter_prompts


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser("prompts", help="work with prompt metadata files")
    psub = p.add_subparsers(dest="prompts_command", metavar="ACTION", required=True)
    check = psub.add_parser("check", help="validate a prompt JSONL file and summarise it")
    check.add_argument("file", help="JSONL prompt metadata (NegT2IBench or GenEval format)")
    check.set_defaults(func=_check)


def _check(args: argparse.Namespace) -> int:
    cells: Counter[tuple[str, str]] = Counter()
    try:
        for prompt in iter_prompts(args.file):
            cells[(prompt.category.value if prompt.category else "-", prompt.setting)] += 1
    except SpecError as exc:
        print(f"{args.file}: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    total = sum(cells.values())
    print(f"{args.file}: {total} valid prompts")
    for (category, setting), n in sorted(cells.items()):
        print(f"  {category:<12} {setting:<10} {n}")
    return 0
