"""Arguments and exit codes shared by the commands that write results files (``evaluate``, ``submit``)."""

from __future__ import annotations

import argparse
from typing import Final

EXIT_FAILED: Final = 1
"""The run failed (a service error, images left for a rerun)."""
EXIT_INPUT: Final = 2
"""Bad input: a missing input file or folder, a bad flag value, an ``--out`` file that is refused."""


def parse_device(text: str) -> str:
    """``auto``, ``cpu``, ``cuda``, ``cuda:N`` or ``mps``, checked for every backend (the synthetic ones
    ignore the device, but a typo is still a typo); whether CUDA is there is checked by the torch backends."""
    from negt2i.stages.torch_support import DEVICE_RE

    if not DEVICE_RE.match(text):
        raise argparse.ArgumentTypeError(f"unknown device {text!r}; use auto, cpu, cuda, cuda:N or mps")
    return text


def parse_shard(text: str) -> tuple[int, int]:
    """``I/N`` -> ``(I, N)`` with ``0 <= I < N``."""
    try:
        index, count = (int(v) for v in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected I/N, got {text!r}") from None
    if not 0 <= index < count:
        raise argparse.ArgumentTypeError(f"shard {text}: need 0 <= I < N")
    return index, count


def add_results_args(p: argparse.ArgumentParser) -> None:
    """``--shard``, ``--retry-errors``, ``--replace-changed`` (see docs/evaluate.md, Resuming) and
    ``--save-perception`` (docs/audit.md)."""
    p.add_argument(
        "--shard", type=parse_shard, default=None, help="only jobs i with i %% N == I, in job order (e.g. 0/4)"
    )
    p.add_argument(
        "--retry-errors",
        action="store_true",
        help="judge the images of error lines again (their old lines are replaced)",
    )
    p.add_argument(
        "--replace-changed",
        action="store_true",
        help="judge images whose file (SHA-256) or prompt changed since their line was written, replacing "
        "their lines (without it such a run is refused)",
    )
    p.add_argument(
        "--save-perception",
        nargs="?",
        const="",
        default=None,
        metavar="PATH",
        help="also store each judged image's detections and refined masks (RLE), keyed by image, for "
        "`negt2i audit` (default PATH: OUT with .perception.jsonl)",
    )


def perception_path(args: argparse.Namespace) -> str | None:
    """``--save-perception [PATH]``: None when not asked for; the default path next to ``--out``."""
    if args.save_perception is None:
        return None
    from negt2i.core.perception_file import default_path

    return args.save_perception or str(default_path(args.out))
