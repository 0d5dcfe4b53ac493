"""The ``negt2i`` command line. Each command group lives in its own module.

A module in ``COMMANDS`` exposes ``register(subparsers)``, which adds its
sub-command(s) and sets ``func`` (taking the parsed ``argparse.Namespace`` and
returning an exit code) on each parser it adds.

Exit codes shared by every command: 0 done, 1 the work failed (invalid data, a
failed service call), 2 bad input (a missing input file or folder, an invalid
flag, an ``--out`` file that is refused), 130 interrupted, 141 the reader of
stdout went away (``negt2i ... | head``; no traceback).
"""

from __future__ import annotations

import argparse
import importlib
import os
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
    "negt2i.cli.questions_cmd",
    "negt2i.cli.labels_cmd",
    "negt2i.cli.submit_cmd",
    "negt2i.cli.conformance_cmd",
    "negt2i.cli.backends_cmd",
    "negt2i.cli.generate_cmd",
    "negt2i.cli.calibrate_cmd",
    "negt2i.cli.ablate_cmd",
    "negt2i.cli.judges_cmd",
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
        sys.stdout.flush()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`negt2i ... | head`): stop quietly, like a SIGPIPE
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except FileNotFoundError as exc:  # a missing input that a command did not report itself
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return code


EXIT_BROKEN_PIPE = 141
"""128 + SIGPIPE: what a shell reports for a command whose reader closed the pipe."""


def _silence_stdout() -> None:
    """Point stdout at /dev/null so that the interpreter's final flush does not raise again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
