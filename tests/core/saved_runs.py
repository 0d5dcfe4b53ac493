"""Saved runs written by the real writers (results lines + perception side file) from hand-built perception,
for the calibration and ablation tests: no model runs, the files are exactly what ``negt2i evaluate
--save-perception`` writes."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from negt2i.core.config import CURRENT, RuleConfig
from negt2i.core.perception import ImagePerception
from negt2i.core.perception_file import PerceptionWriter, perception_record
from negt2i.core.results import ok_record, prompt_metadata
from negt2i.core.spec import Prompt
from negt2i.core.verdict import judge

DETECTOR = {"stage": "detector", "backend": "planted", "model": "planted-scores-v1"}


@dataclass
class Item:
    filename: str
    prompt: Prompt
    perception: ImagePerception
    truth: dict[str, int]
    """Ground-truth instances per class (for COCO labels)."""


def write_run(
    folder: Path, items: Sequence[Item], *, detector: dict[str, Any] | None = None, config: RuleConfig = CURRENT,
    name: str = "results",
) -> Path:  # fmt: skip
    """``folder/name.jsonl`` and ``folder/name.perception.jsonl``; returns the results path."""
    folder.mkdir(parents=True, exist_ok=True)
    res = folder / f"{name}.jsonl"
    models = {"detector": detector or DETECTOR}
    with res.open("w", encoding="utf-8") as fh, PerceptionWriter(folder / f"{name}.perception.jsonl") as side:
        for k, it in enumerate(items):
            v = judge(it.prompt, it.perception, config)
            line = ok_record(v, filename=it.filename, sample=k % 4, models=models, metadata=prompt_metadata(it.prompt))
            fh.write(json.dumps(line) + "\n")
            side.write_record(perception_record(it.filename, k % 4, v, it.perception))
    return res


def write_coco(path: Path, items: Sequence[Item]) -> Path:
    from negt2i.core.vocab import COCO_CLASSES

    cat = {n: k + 1 for k, n in enumerate(COCO_CLASSES)}
    images, anns = [], []
    for i, it in enumerate(items, start=1):
        images.append({"id": i, "file_name": it.filename})
        for cls, n in it.truth.items():
            anns += [{"id": len(anns) + 1, "image_id": i, "category_id": cat[cls]} for _ in range(n)]
    path.write_text(json.dumps({"images": images, "annotations": anns,
                                "categories": [{"id": k, "name": n} for n, k in cat.items()]}))  # fmt: skip
    return path
