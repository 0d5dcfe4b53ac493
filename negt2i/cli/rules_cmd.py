"""``negt2i rules``: show the rule constants of a preset or config file."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from negt2i.core.config import PRESETS, load_config


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "rules", help="show the rule constants (Table 15 'current' or Table 16 'previous')"
    )
    p.add_argument("config", nargs="?", default="current", help=f"a preset ({', '.join(PRESETS)}) or a JSON file")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(config.record(), indent=2))
    return 0
