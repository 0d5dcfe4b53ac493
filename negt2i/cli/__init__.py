"""The ``negt2i`` command line. Each command group lives in its own module.

A module in ``COMMANDS`` exposes ``register(subparsers)``, which adds its
sub-command(s) and sets ``func`` (taking the parsed ``argparse.Namespace`` and
returning an exit code) on each parser it adds.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from negt2i import __version__

COMMANDS: tuple[str, ...] = (
    "negt2i.cli.rules_cmd",
    "negt2i.cli.prompts_cmd",
    "negt2i.cli.evaluate_cmd",
    "negt2i.cli.weights_cmd",
    "negt2i.cli.corpus_cmd",
    "negt2i.cli.report_cmd",
    "negt2i.cli.audit_cmd",
    "negt2i.cli.agreement_cmd",
    "negt2i.cli.submit_cmd",
    "negt2i.cli.conformance_cmd",
    "negt2i.cli.generate_cmd",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="negt2i",
        description="NegT2IBench evaluator: detector-based scoring of negation in text-to-image models.",
    )
    parser.add_argument("--version", action="version", version=f"negt2i {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        parser.print_help()
        return 2
    try:
        code: int = args.func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
