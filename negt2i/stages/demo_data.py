"""A deterministic image source: synthetic GenEval-layout folders covering all six categories.

``--full`` takes its prompts from the committed corpus instead: one prompt per category x
setting (Table 3's 48 cells: six categories x eight P:N settings), so the first
``negt2i report`` of a newcomer fills the whole table.

Used by the smoke run in the README, the services tests, ``benchmarks/bench_services.py``
and the generation-loop example. Scenes are drawn with the synthetic renderer
(``negt2i.stages.synthetic.render_scene``) from a seeded RNG, so the same seed
gives byte-identical PNGs; verdicts vary (correct, wrong, missing objects,
over-counts), which is what parity tests need.

``python -m negt2i.stages.demo_data OUT_DIR [--prompts 12 | --full] [--samples 4] [--seed 0] [--size 128]``
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from negt2i.core.vocab import COLORS, MATERIALS, PREDICATES, Category
from negt2i.stages.base import Image
from negt2i.stages.synthetic import SceneObject, render_scene, write_geneval_layout

CLASSES = ("cup", "dog", "cat", "horse", "chair", "bench", "clock", "vase", "laptop", "bicycle", "car", "bowl")


def _record(
    pid: str, category: Category, text: str, include: list[dict[str, Any]], st: list[dict[str, Any]]
) -> dict[str, Any]:
    return {"id": pid, "category": category.value, "prompt": text, "include": include, "statements": st}


def prompt_records(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` prompt records cycling through the six categories and both polarities."""
    rng = np.random.default_rng(seed)
    cats = list(Category)
    out: list[dict[str, Any]] = []
    for k in range(n):
        cat = cats[k % len(cats)]
        polarity = "negated" if (k // len(cats)) % 2 == 0 else "positive"
        a, b = (str(c) for c in rng.choice(CLASSES, size=2, replace=False))
        pid = f"{cat.value}-demo-{k:03d}"
        if cat.is_attribute:
            values = COLORS if cat is Category.COLOR else MATERIALS
            value = str(rng.choice(values))
            neg = "non-" if polarity == "negated" else ""
            st = [{"kind": "attribute", "object": 0, "value": value, "polarity": polarity}]
            out.append(_record(pid, cat, f"a photo of a {neg}{value} {a}", [{"class": a}], st))
        else:
            pred = str(rng.choice(PREDICATES[cat]))
            neg = "not " if polarity == "negated" else ""
            st = [{"kind": "relation", "subject": 0, "target": 1, "predicate": pred, "polarity": polarity}]
            out.append(_record(pid, cat, f"a photo of a {a} {neg}{pred} a {b}", [{"class": a}, {"class": b}], st))
    return out


def corpus_records(seed: int = 0, corpus: str | Path | None = None) -> list[dict[str, Any]]:
    """One prompt of the corpus (default the benchmark corpus the package carries,
    ``negt2i.corpus.packaged_corpus``: it works outside the repository) per category x setting, chosen with
    ``seed``, in Table 3's order (category, then setting)."""
    from negt2i.core.spec import dumps_prompt, read_prompts
    from negt2i.corpus import corpus_path

    rng = np.random.default_rng(seed)
    cells: dict[tuple[int, str], list[Any]] = {}
    order = {c: i for i, c in enumerate(Category)}
    for p in read_prompts(corpus_path(corpus)):
        if p.category is not None:
            cells.setdefault((order[p.category], p.setting), []).append(p)
    picked = [cells[key][int(rng.integers(len(cells[key])))] for key in sorted(cells)]
    return [json.loads(dumps_prompt(p)) for p in picked]


def _box(rng: np.random.Generator, size: int, lo: float, hi: float) -> tuple[int, int, int, int]:
    w = int(rng.integers(int(size * lo), int(size * hi)))
    h = int(rng.integers(int(size * lo), int(size * hi)))
    x0 = int(rng.integers(1, size - w - 1))
    y0 = int(rng.integers(1, size - h - 1))
    return (x0, y0, x0 + w, y0 + h)


def scene_for(record: dict[str, Any], rng: np.random.Generator, size: int = 128) -> Image:
    """One image for a prompt record: its objects at random places (sometimes one missing or doubled)."""
    return render_scene(scene_objects(record, rng, size), (size, size))


def scene_objects(record: dict[str, Any], rng: np.random.Generator, size: int = 128) -> list[SceneObject]:
    """The objects ``scene_for`` draws (its synthetic truth), in drawing order."""
    classes = [o["class"] for o in record["include"]]
    category = Category(record["category"])
    roll = float(rng.random())
    objs: list[SceneObject] = []
    for i, cls in enumerate(classes):
        if roll < 0.08 and i == len(classes) - 1:
            continue  # a missing object
        value: str | None = None
        if category.is_attribute:
            pool = [*COLORS, "gray"] if category is Category.COLOR else list(MATERIALS)
            value = str(rng.choice(pool))
        shape = "ellipse" if rng.random() < 0.4 else "rect"
        objs.append(SceneObject(cls, _box(rng, size, 0.15, 0.4), shape=shape, value=value))  # type: ignore[arg-type]
    if 0.08 <= roll < 0.14 and objs:
        first = objs[0]
        objs.append(SceneObject(first.class_name, _box(rng, size, 0.1, 0.2), value=first.value))  # an over-count
    return objs


def demo_entries(
    prompts: int = 12, samples: int = 4, seed: int = 0, size: int = 128, *, full: bool = False
) -> Iterator[tuple[dict[str, Any], list[Image]]]:
    """(prompt record, images) pairs: ``prompts`` generated records, or with ``full`` the corpus's one per
    category x setting (``corpus_records``)."""
    rng = np.random.default_rng(seed + 1)
    for record in corpus_records(seed) if full else prompt_records(prompts, seed):
        yield record, [scene_for(record, rng, size) for _ in range(samples)]


def write_demo(
    root: str | Path,
    prompts: int = 12,
    samples: int = 4,
    seed: int = 0,
    size: int = 128,
    *,
    coco: str | Path | None = None,
    full: bool = False,
) -> list[Path]:
    """Write a GenEval-layout folder; returns the image paths in job order. ``coco``: also write the scenes'
    synthetic truth as COCO instances JSON (``negt2i calibrate --labels``): one annotation per drawn object,
    ``file_name`` the image's path under ``root`` (the results line's ``filename``). ``full``: the corpus's
    prompts, one per category x setting (``corpus_records``), instead of ``prompts`` generated ones."""
    rng = np.random.default_rng(seed + 1)
    entries: list[tuple[dict[str, Any], list[Image]]] = []
    truth: list[tuple[str, list[SceneObject]]] = []
    for k, record in enumerate(corpus_records(seed) if full else prompt_records(prompts, seed)):
        images = []
        for j in range(samples):
            objs = scene_objects(record, rng, size)
            images.append(render_scene(objs, (size, size)))
            truth.append((f"{k:05d}/samples/{j:04d}.png", objs))
        entries.append((record, images))
    paths = write_geneval_layout(root, entries)
    if coco is not None:
        write_coco_truth(coco, truth, size)
    return paths


def write_coco_truth(path: str | Path, truth: list[tuple[str, list[SceneObject]]], size: int) -> None:
    """COCO instances JSON of drawn scenes: images, one bbox annotation per object, the COCO categories."""
    import json

    from negt2i.core.vocab import COCO_CLASSES

    cat_id = {name: k + 1 for k, name in enumerate(COCO_CLASSES)}
    images: list[dict[str, Any]] = []
    annotations: list[dict[str, Any]] = []
    for i, (name, objs) in enumerate(truth, start=1):
        images.append({"id": i, "file_name": name, "height": size, "width": size})
        for o in objs:
            x0, y0, x1, y1 = o.box
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": i,
                    "category_id": cat_id[o.class_name],
                    "bbox": [x0, y0, x1 - x0, y1 - y0],
                    "area": (x1 - x0) * (y1 - y0),
                    "iscrowd": 0,
                }
            )
    data = {"images": images, "annotations": annotations,
            "categories": [{"id": k, "name": n} for n, k in cat_id.items()]}  # fmt: skip
    out = Path(path)
    if out.parent != Path():
        out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    """Command line."""
    p = argparse.ArgumentParser(
        prog="python -m negt2i.stages.demo_data", description=__doc__.splitlines()[0] if __doc__ else None
    )
    p.add_argument("out")
    p.add_argument("--prompts", type=int, default=12, help="generated prompts cycling categories and polarities")
    p.add_argument(
        "--full", action="store_true", help="instead: one corpus prompt per category x setting (all of Table 3)"
    )
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--size", type=int, default=128)
    p.add_argument("--coco", metavar="PATH", help="also write the scenes' synthetic truth as COCO instances JSON")
    a = p.parse_args(argv)
    paths = write_demo(a.out, a.prompts, a.samples, a.seed, a.size, coco=a.coco, full=a.full)
    count = len(paths) // a.samples if a.samples else 0
    from negt2i.metrics.totals import plural

    made = f"{plural(len(paths), 'image')} of {plural(count, 'prompt')}"
    print(f"{made} under {a.out}" + (f"; truth in {a.coco}" if a.coco else ""))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
