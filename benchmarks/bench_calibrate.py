"""How fast re-judging saved perception is: candidate rule configurations per second on the demo set.

Calibration and the ablation never re-run a model: they re-apply the pure rules to what the stages saw
(``negt2i evaluate --save-perception``). This runs the synthetic stages once over the demo images, then times
``negt2i.core.rejudge`` over the whole saved set for three kinds of candidate:

- detection candidates (presence / counting thresholds: objects only, statements skipped, as ``--fit detection``);
- full candidates (every statement re-measured: relations and attributes, as ``--fit relations`` and the ablation);
- the eight ablation configurations of Table 17 (C5-C8 on one detector, SAM on / off, current / previous).

Prints candidates per second and images re-judged per second (wall time, one process, the loading of the
side file counted separately), after a ``machine:`` line (CPU model, core count, load average); the figure line::

    full (every statement)              N candidates/s  M images/s

Run: ``.venv/bin/python benchmarks/bench_calibrate.py [--prompts 48 --samples 4]``; ``--smoke``: 6 prompts, one
image each at 64 px, 2 candidates per kind (seconds; the figures mean nothing).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's negt2i, wherever it is run from

from benchmarks.machine import describe
from negt2i.ablate import VARIANTS, variant_config
from negt2i.calibrate import with_values
from negt2i.cli import main as cli
from negt2i.core.config import CURRENT, PREVIOUS
from negt2i.core.rejudge import load_saved
from negt2i.stages.demo_data import write_demo


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--prompts", type=int, default=48)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--candidates", type=int, default=20, help="candidates timed per kind (default 20)")
    ap.add_argument("--smoke", action="store_true", help="6 prompts x 1 image at 64 px, 2 candidates: seconds")
    args = ap.parse_args(argv)
    if args.smoke:
        args.prompts, args.samples, args.size, args.candidates = 6, 1, 64, 2
    print(describe())
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        write_demo(d / "demo", args.prompts, args.samples, seed=0, size=args.size)
        res = d / "r.jsonl"
        t0 = time.perf_counter()
        argv = ["evaluate", str(d / "demo"), "--out", str(res), "--backend", "synthetic", "--no-progress",
                "--save-perception"]  # fmt: skip
        assert cli(argv) == 0
        perceive = time.perf_counter() - t0
        t0 = time.perf_counter()
        run = load_saved([res])
        load = time.perf_counter() - t0
        n = len(run.images)
        print(
            f"demo: {n} images of {args.prompts} prompts at {args.size} px; models + judging once {perceive:.2f} s;"
            f" side file loaded in {load:.2f} s ({(d / 'r.perception.jsonl').stat().st_size / 1e6:.1f} MB)"
        )

        def time_kind(label: str, configs: list, *, objects_only: bool) -> None:  # type: ignore[type-arg]
            t = time.perf_counter()
            for c in configs:
                for im in run.images:
                    im.judge(c, objects_only=objects_only)
            dt = time.perf_counter() - t
            print(f"{label:<34} {len(configs) / dt:8.2f} candidates/s  {len(configs) * n / dt:9.0f} images/s")

        k = args.candidates
        det = [with_values(CURRENT, {"detection.presence_threshold": 0.01 + 0.01 * i,
                                     "detection.count_threshold": 0.3 + 0.02 * i}) for i in range(k)]  # fmt: skip
        time_kind("detection (objects only)", det, objects_only=True)
        full = [with_values(CURRENT, {"proximity.gap_factor": 0.5 + 0.05 * i, "comparative.size_ratio": 1.0 + 0.01 * i,
                                      "depth.base_margin": 0.01 * i}) for i in range(k)]  # fmt: skip
        time_kind("full (every statement)", full, objects_only=False)
        abl = [variant_config(CURRENT, CURRENT if v.constants == "current" else PREVIOUS, v.sam, v.name)
               for v in VARIANTS if v.detector == "main"]  # fmt: skip
        time_kind("ablation configs C5-C8", abl, objects_only=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
