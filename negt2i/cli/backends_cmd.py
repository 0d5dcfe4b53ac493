"""``negt2i backends``: the registered stage backends (built-in and ``NEGT2I_BACKEND_MODULES`` plug-ins)."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "backends",
        help="list the stage backends by name (and the modules of NEGT2I_BACKEND_MODULES)",
        description="List every registered backend per stage: the default (*), its weights entry, if any.",
    )
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from negt2i.stages.registry import DEFAULT_BACKENDS, STAGES, available
    from negt2i.weights import WEIGHTS

    try:
        rows = [(stage, name) for stage in STAGES for name in available(stage)]
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{'stage':<11} {'backend':<28} weights")
    for stage, name in rows:
        mark = "*" if DEFAULT_BACKENDS[stage] == name else " "
        entry = WEIGHTS.get(name)
        print(f"{stage:<11} {name + ' ' + mark:<28} {entry.model if entry else '-'}")
    print("* the paper's default")
    return 0
