"""Time the whole judgement of one relation image: 1024x1024, 5 objects (a pos2_neg2 star prompt).

Goal (issue "Core evaluator"): median <= 5 ms per image on one core. Prints the
median and 90th percentile of the thread's CPU time per relation category and for an
attribute prompt (CPU time, unlike wall time, does not count the waits of a shared,
busy machine), and the wall-time median beside it.
Run: ``make bench`` or ``.venv/bin/python benchmarks/bench_judge.py [--repeats N]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np

from negt2i.core.perception import AttributeScores, Detections, DisparityMap, ImagePerception, RefinedMasks
from negt2i.core.spec import parse_prompt
from negt2i.core.verdict import judge
from negt2i.core.vocab import COLOR_ANSWERS, PREDICATES, Category

SIZE = 1024
CLASSES = ("laptop", "zebra", "backpack", "surfboard", "carrot")


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


def relation_prompt(category: Category) -> object:
    preds = PREDICATES[category]
    statements = [
        {"kind": "relation", "subject": 0, "target": t, "predicate": preds[t % len(preds)],
         "polarity": "positive" if t <= 2 else "negated"}
        for t in range(1, 5)
    ]  # fmt: skip
    return parse_prompt({"id": category.value, "prompt": "bench", "category": category.value,
                         "include": [{"class": c} for c in CLASSES], "statements": statements})  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    scenes = [scene(rng) for _ in range(5)]
    disparity = DisparityMap(rng.random((SIZE, SIZE), dtype=np.float32), (SIZE, SIZE))
    print(f"judge() on {SIZE}x{SIZE} images with 5 objects (4 statements), {args.repeats} runs each, one thread")
    print(f"{'prompt':<14}{'cpu median ms':>15}{'cpu p90 ms':>12}{'wall median ms':>16}")
    cases: list[tuple[str, object, list[ImagePerception]]] = []
    for category in (Category.DIRECTIONAL, Category.PROXIMITY, Category.COMPARATIVE, Category.DEPTH):
        percs = []
        for masks in scenes:
            dets = Detections.from_masks(CLASSES, [0.9] * 5, masks, (SIZE, SIZE))
            refined = RefinedMasks(dict(enumerate(masks)), (SIZE, SIZE))
            disp = disparity if category is Category.DEPTH else None
            percs.append(ImagePerception(dets, refined=refined, disparity=disp))
        cases.append((category.value, relation_prompt(category), percs))
    statements = [
        {"kind": "attribute", "object": i, "value": "red", "polarity": "positive" if i < 2 else "negated"}
        for i in range(4)
    ]
    include = [{"class": c} for c in CLASSES[:4]]
    color = parse_prompt(
        {"id": "c", "prompt": "bench", "category": "color", "include": include, "statements": statements}
    )
    scores = {i: {v: float(rng.normal()) for v in COLOR_ANSWERS} for i in range(4)}
    color_percs = [
        ImagePerception(
            Detections.from_masks(CLASSES[:4], [0.9] * 4, masks[:4], (SIZE, SIZE)),
            attributes=AttributeScores(scores, COLOR_ANSWERS),
        )
        for masks in scenes
    ]
    cases.append(("color", color, color_percs))
    worst = 0.0
    for name, prompt, percs in cases:
        cpu, wall = [], []
        for i in range(args.repeats):
            p = percs[i % len(percs)]
            c0, t0 = time.thread_time(), time.perf_counter()
            judge(prompt, p)  # type: ignore[arg-type]
            cpu.append((time.thread_time() - c0) * 1000)
            wall.append((time.perf_counter() - t0) * 1000)
        med = statistics.median(cpu)
        worst = max(worst, med)
        p90 = statistics.quantiles(cpu, n=10)[-1]
        print(f"{name:<14}{med:>15.2f}{p90:>12.2f}{statistics.median(wall):>16.2f}")
    print(f"slowest CPU-time median: {worst:.2f} ms (goal <= 5 ms)")


if __name__ == "__main__":
    main()
