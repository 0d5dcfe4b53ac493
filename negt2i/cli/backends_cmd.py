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
    from negt2i.stages.registry import DEFAULT_BACKENDS, backends

    try:
        rows = backends()
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{'stage':<11} {'backend':<26} {'model':<44} weights")
    for b in rows:
        name = b.name + (" *" if DEFAULT_BACKENDS[b.stage] == b.name else "")
        print(f"{b.stage:<11} {name:<26} {b.model or '-':<44} {b.weights or '-'}")
    print("* the paper's default; weights: the `negt2i weights fetch` entry (- none needed)")
    return 0
