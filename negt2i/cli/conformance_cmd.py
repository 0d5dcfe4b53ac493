"""``negt2i conformance {detector,segmenter,attributes,depth} URL``: check a stage service against the contract."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from negt2i.core.stage_types import STAGES


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "conformance",
        help="check that a running stage service honours the stage contract (docs/stage-contract.md)",
        description="Run the stage contract's checks against the service at URL; exit 0 only if all pass.",
    )
    p.add_argument("stage", choices=STAGES)
    p.add_argument("url", help="the service's base URL, e.g. http://127.0.0.1:3001")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds per HTTP call (default 30)")
    p.add_argument("--rules", default=None, help="the orchestrator's rules, preset or JSON file, that /info's "
                   "stated rule constants must match [NEGT2I_RULES, default current]")  # fmt: skip
    p.add_argument("--strict-stages", action="store_true", default=None,
                   help="fail a service that leaves its rules or operating point unstated, as an orchestrator with "
                   "NEGT2I_STRICT_STAGES=1 refuses it (else: a warning) [NEGT2I_STRICT_STAGES]")  # fmt: skip
    p.add_argument(
        "--image",
        action="append",
        default=[],
        metavar="FILE",
        help="a photo the service should find something in (repeatable); every answer is checked",
    )
    p.add_argument("--expect", action="append", default=[], metavar="CLASS",
                   help="a class the detector must find in at least one --image (repeatable)")  # fmt: skip
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from negt2i.conformance import format_report, run_checks

    if args.expect and not args.image:
        print("error: --expect needs at least one --image", file=sys.stderr)
        return 2
    missing = [f for f in args.image if not Path(f).is_file()]
    if missing:
        print(f"error: no such image file: {', '.join(missing)}", file=sys.stderr)
        return 2
    from negt2i.core.config import load_config

    config = load_config(args.rules) if args.rules else None
    checks = run_checks(args.stage, args.url, timeout=args.timeout, images=args.image, expect=args.expect,
                        config=config, strict=args.strict_stages)  # fmt: skip
    print(format_report(args.stage, args.url, checks))
    if not any(c.passed for c in checks[:3]):
        print(f"error: nothing answered at {args.url}", file=sys.stderr)
    return 0 if all(c.passed for c in checks) else 1
