"""Time resuming a corpus-sized results file: 4,800 prompts x K images, judged, then resumed.

What a rerun pays before it judges anything (issue "Results files you can trust"): opening
and checking the results file (lock, marker on every line, config and models), hashing every
image (SHA-256) and planning by content; then the cost of superseding lines (``--retry-errors``
rewrites the file without them, atomically). Images are small synthetic PNGs (what is timed is the
results file and the hashing, not perception); hashing cost grows with the image bytes, so the
MB/s figure is printed too.

After a ``machine:`` line (CPU model, core count, load average), the figure lines include::

    hashing N images (M MB): S s (R MB/s)
    open + check N lines: S s; full resume plan (incl. hashing): T s

Run: ``.venv/bin/python benchmarks/bench_resume.py [--prompts 4800] [--samples 1] [--dir DIR]``; ``--smoke``: 8
prompts at 32 px (seconds).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's negt2i, wherever it is run from

from benchmarks.machine import describe
from negt2i.core.config import CURRENT
from negt2i.core.results import ResultsWriter
from negt2i.evaluate import evaluate
from negt2i.pipeline import Stages
from negt2i.run.jobs import discover, resume_keys
from negt2i.run.output import ResultsRun
from negt2i.stages.demo_data import write_demo

SYNTH = dict.fromkeys(("detector", "segmenter", "attributes", "depth"), "synthetic")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--prompts", type=int, default=4800)
    p.add_argument("--samples", type=int, default=1)
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--dir", default=None, help="work folder (default: a temporary one)")
    p.add_argument("--smoke", action="store_true", help="8 prompts at 32 px: seconds")
    a = p.parse_args(argv)
    if a.smoke:
        a.prompts, a.samples, a.size = 8, 1, 32
    print(describe())
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(a.dir or tmp)
        images = root / "images"
        t = time.perf_counter()
        write_demo(images, prompts=a.prompts, samples=a.samples, seed=0, size=a.size)
        jobs = discover(images)
        print(f"{len(jobs)} images of {a.prompts} prompts written in {time.perf_counter() - t:.1f} s")
        out = root / "results.jsonl"
        stages = Stages.create(SYNTH)
        t = time.perf_counter()
        evaluate(jobs, out, stages, batch_size=16, progress=False)
        mb = out.stat().st_size / 1e6
        print(f"judged into {out.name} ({mb:.1f} MB) in {time.perf_counter() - t:.1f} s")
        models = stages.models()

        t = time.perf_counter()
        keys = resume_keys(jobs)
        hashed = time.perf_counter() - t
        image_mb = sum(job.path.stat().st_size for job in jobs) / 1e6
        print(f"hashing {len(keys)} images ({image_mb:.1f} MB): {hashed:.2f} s ({image_mb / hashed:.0f} MB/s)")

        t = time.perf_counter()
        with ResultsRun(out) as run:
            opened = time.perf_counter() - t
            todo = run.plan(jobs, CURRENT, models)
        planned = time.perf_counter() - t
        print(f"open + check {len(jobs)} lines: {opened:.2f} s; full resume plan (incl. hashing): {planned:.2f} s")
        assert not todo and run.summary.skipped == len(jobs)

        t = time.perf_counter()
        with ResultsWriter(out) as writer:
            writer.supersede([job.filename for job in jobs[::10]])
        print(f"superseding {len(jobs[::10])} lines (atomic rewrite of the file): {time.perf_counter() - t:.2f} s")

        t = time.perf_counter()
        summary = evaluate(jobs, out, stages, batch_size=16, progress=False)
        print(f"rerun judging the {summary.evaluated} superseded images: {time.perf_counter() - t:.1f} s")
        print(summary.text())


if __name__ == "__main__":
    main()
