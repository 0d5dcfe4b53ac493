"""Time the whole judgement of one relation image: 1024x1024, 5 objects (a pos2_neg2 star prompt).

Prints the median and 90th percentile of the thread's CPU time per relation category and for an
attribute prompt (CPU time, unlike wall time, does not count the waits of a shared, busy machine), the
wall-time median beside it, and the CPU median as a ratio to the reference workload (``benchmarks/machine.py``),
run once after every judgement on the same clock (``x ref``): the ratio moves far less with the machine and
its load than the time does. Goal (issue "Core evaluator", restated in issue 44): the slowest prompt's
median at most ``GOAL_X_REFERENCE`` (0.8) x reference, which is 5 ms per image on one core of the
development machine the ratio was set on (docs/performance.md). The last line reads::

    slowest: depth R x reference (goal <= 0.8); for information N ms CPU, reference M ms; machine: ...

Run: ``make bench`` or ``.venv/bin/python benchmarks/bench_judge.py [--repeats N]``; ``--smoke``: 3 runs per
prompt (seconds).

``--baseline REV`` also times the ``negt2i`` package of git revision REV (exported from this
repository to a temporary directory under the name ``negt2i_baseline``) on the same images,
interleaved with this tree's judge (alternating which goes first), and prints both medians, the
ratio this / baseline, and whether the two verdicts of every image record the same values (on the
fields both revisions have; numbers bit for bit). On a shared machine that ratio, measured in one
run, is the figure to read; absolute times swing with load::

    .venv/bin/python benchmarks/bench_judge.py --baseline main --repeats 200
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import io
import os
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's negt2i, wherever it is run from

import negt2i
from benchmarks.machine import REFERENCE_VERSION, Reference, describe, ratio

SIZE = 1024
CLASSES = ("laptop", "zebra", "backpack", "surfboard", "carrot")
MODULES = ("perception", "spec", "verdict", "vocab")
BASELINE = "negt2i_baseline"
GOAL_X_REFERENCE = 0.8
"""The goal: the slowest prompt's CPU median at most this many times the reference workload's (see the docs)."""


def ellipse(cy: float, cx: float, ry: float, rx: float) -> np.ndarray:
    yy, xx = np.ogrid[:SIZE, :SIZE]
    return np.asarray(((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2 <= 1.0)


def scene(rng: np.random.Generator) -> list[np.ndarray]:
    """The subject in the middle, four targets around it: realistic generated-image object sizes."""
    masks = [ellipse(512 + rng.normal(0, 30), 512 + rng.normal(0, 30), rng.uniform(90, 160), rng.uniform(90, 160))]
    for cy, cx in ((220, 220), (220, 800), (800, 220), (800, 800)):
        masks.append(
            ellipse(cy + rng.normal(0, 40), cx + rng.normal(0, 40), rng.uniform(60, 150), rng.uniform(60, 150))
        )
    return masks


def package(name: str) -> SimpleNamespace:
    """The modules the benchmark uses from package ``name`` (``negt2i.core.X`` or, in older trees, ``negt2i.X``)."""
    found: dict[str, Any] = {}
    for module in MODULES:
        try:
            found[module] = importlib.import_module(f"{name}.core.{module}")
        except ModuleNotFoundError:
            found[module] = importlib.import_module(f"{name}.{module}")
    return SimpleNamespace(**found)


def export_baseline(rev: str, into: Path) -> SimpleNamespace:
    """``negt2i`` of git revision ``rev`` as package ``negt2i_baseline`` under ``into`` (imports renamed)."""
    repo = Path(negt2i.__file__).resolve().parents[1]
    done = subprocess.run(["git", "-C", str(repo), "archive", rev, "negt2i"], capture_output=True, check=False)
    if done.returncode != 0:
        sys.exit(f"--baseline {rev}: git archive failed: {done.stderr.decode(errors='replace').strip()}")
    with tarfile.open(fileobj=io.BytesIO(done.stdout)) as tar:
        tar.extractall(into, filter="data")
    (into / "negt2i").rename(into / BASELINE)
    absolute = re.compile(r"\bnegt2i(?=\.[A-Za-z_]|\s+import\b)")  # module paths; the distribution name stays
    for path in (into / BASELINE).rglob("*.py"):
        path.write_text(absolute.sub(BASELINE, path.read_text(encoding="utf-8")), encoding="utf-8")
    sys.path.insert(0, str(into))
    return package(BASELINE)


def relation_prompt(pkg: SimpleNamespace, category: Any) -> object:
    preds = pkg.vocab.PREDICATES[category]
    statements = [
        {"kind": "relation", "subject": 0, "target": t, "predicate": preds[t % len(preds)],
         "polarity": "positive" if t <= 2 else "negated"}
        for t in range(1, 5)
    ]  # fmt: skip
    return pkg.spec.parse_prompt({"id": category.value, "prompt": "bench", "category": category.value,
                                  "include": [{"class": c} for c in CLASSES], "statements": statements})  # fmt: skip


def cases(pkg: SimpleNamespace) -> list[tuple[str, object, list[Any]]]:
    """(name, prompt, five perceptions) per relation category and a colour prompt, built with ``pkg``'s types."""
    p, category = pkg.perception, pkg.vocab.Category
    rng = np.random.default_rng(0)
    scenes = [scene(rng) for _ in range(5)]
    disparity = p.DisparityMap(rng.random((SIZE, SIZE), dtype=np.float32), (SIZE, SIZE))
    out: list[tuple[str, object, list[Any]]] = []
    for cat in (category.DIRECTIONAL, category.PROXIMITY, category.COMPARATIVE, category.DEPTH):
        percs = []
        for masks in scenes:
            dets = p.Detections.from_masks(CLASSES, [0.9] * 5, masks, (SIZE, SIZE))
            refined = p.RefinedMasks(dict(enumerate(masks)), (SIZE, SIZE))
            disp = disparity if cat is category.DEPTH else None
            percs.append(p.ImagePerception(dets, refined=refined, disparity=disp))
        out.append((cat.value, relation_prompt(pkg, cat), percs))
    statements = [
        {"kind": "attribute", "object": i, "value": "red", "polarity": "positive" if i < 2 else "negated"}
        for i in range(4)
    ]
    include = [{"class": c} for c in CLASSES[:4]]
    color = pkg.spec.parse_prompt(
        {"id": "c", "prompt": "bench", "category": "color", "include": include, "statements": statements}
    )
    scores = {i: {v: float(rng.normal()) for v in pkg.vocab.COLOR_ANSWERS} for i in range(4)}
    color_percs = [
        p.ImagePerception(
            p.Detections.from_masks(CLASSES[:4], [0.9] * 4, masks[:4], (SIZE, SIZE)),
            attributes=p.AttributeScores(scores, pkg.vocab.COLOR_ANSWERS),
        )
        for masks in scenes
    ]
    out.append(("color", color, color_percs))
    return out


def same_record(a: Any, b: Any) -> bool:
    """Two verdicts (or parts of them) record the same values: models, dataclasses and dicts compared on the
    fields both have (a revision may have added fields), everything else by ``repr`` (numbers bit for bit)."""
    if hasattr(a, "model_dump") and hasattr(b, "model_dump"):  # pydantic models (the verdicts)
        a, b = a.model_dump(), b.model_dump()
    elif dataclasses.is_dataclass(a) and dataclasses.is_dataclass(b):
        a, b = _fields(a), _fields(b)
    if isinstance(a, dict) and isinstance(b, dict):
        return all(same_record(a[k], b[k]) for k in a.keys() & b.keys())
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same_record(x, y) for x, y in zip(a, b, strict=True))
    return repr(a) == repr(b)


def _fields(obj: Any) -> dict[str, Any]:
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}


def timed(judge: Callable[..., Any], prompt: object, perception: object, cpu: list[float], wall: list[float]) -> None:
    c0, t0 = time.thread_time(), time.perf_counter()
    judge(prompt, perception)
    cpu.append((time.thread_time() - c0) * 1000)
    wall.append((time.perf_counter() - t0) * 1000)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--baseline", metavar="REV", help="also time git revision REV's judge, interleaved")
    parser.add_argument("--smoke", action="store_true", help="3 runs per prompt: the script works (seconds)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.repeats = 3
    if args.repeats < 2:
        parser.error("--repeats must be at least 2")
    this = package("negt2i")
    reference = Reference()
    with tempfile.TemporaryDirectory() as tmp:
        base = export_baseline(args.baseline, Path(tmp)) if args.baseline else None
        mine = cases(this)
        theirs = cases(base) if base else [None] * len(mine)
        print(describe())
        print(f"judge() on {SIZE}x{SIZE} images with 5 objects (4 statements), {args.repeats} runs each, one thread; "
              f"x ref: the CPU median over the reference workload's (benchmarks/machine.py, v{REFERENCE_VERSION}), "
              f"timed alternately with it")  # fmt: skip
        if base is None:
            print(f"{'prompt':<14}{'cpu median ms':>15}{'cpu p90 ms':>12}{'wall median ms':>16}{'x ref':>8}")
        else:
            print(f"{'prompt':<14}{'cpu median ms':>15}{'cpu p90 ms':>12}{'x ref':>8}{'baseline median':>17}"
                  f"{'this / baseline':>17}{'  verdicts identical'}")  # fmt: skip
        worst: tuple[float, str, float] = (0.0, "", 0.0)
        references: list[float] = []
        for (name, prompt, percs), other in zip(mine, theirs, strict=True):
            cpu: list[float] = []
            wall: list[float] = []
            base_cpu: list[float] = []
            ref: list[float] = []
            this.verdict.judge(prompt, percs[0])  # warm-up
            reference.ms()
            for i in range(args.repeats):
                k = i % len(percs)
                if other is None:
                    timed(this.verdict.judge, prompt, percs[k], cpu, wall)
                else:
                    order = (0, 1) if i % 2 == 0 else (1, 0)  # alternate which goes first
                    for which in order:
                        if which == 0:
                            timed(this.verdict.judge, prompt, percs[k], cpu, wall)
                        else:
                            timed(base.verdict.judge, other[1], other[2][k], base_cpu, [])  # type: ignore[union-attr]
                ref.append(reference.ms())
            med = statistics.median(cpu)
            times_ref = ratio(cpu, ref)
            references.extend(ref)
            if times_ref > worst[0]:
                worst = (times_ref, name, med)
            p90 = statistics.quantiles(cpu, n=10)[-1]
            if other is None:
                print(f"{name:<14}{med:>15.2f}{p90:>12.2f}{statistics.median(wall):>16.2f}{times_ref:>8.2f}")
                continue
            same = all(
                same_record(this.verdict.judge(prompt, p), base.verdict.judge(other[1], q))  # type: ignore[union-attr]
                for p, q in zip(percs, other[2], strict=True)
            )
            base_med = statistics.median(base_cpu)
            print(f"{name:<14}{med:>15.2f}{p90:>12.2f}{times_ref:>8.2f}{base_med:>17.2f}{med / base_med:>17.3f}"
                  f"  {'yes' if same else 'NO'}")  # fmt: skip
        times_ref, name, med = worst
        print(f"slowest: {name} {times_ref:.2f} x reference (goal <= {GOAL_X_REFERENCE:g}); for information "
              f"{med:.2f} ms CPU, reference {statistics.median(references):.2f} ms; {describe()}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
