"""Reference labels for calibration and the ablation, in either of two forms, aligned with saved images.

- **Human element labels** (the file ``negt2i agreement`` reads: one row per image, element, annotator and
  yes / no answer; format in ``negt2i.metrics.agreement``). Each element's reference is the strict majority
  of its annotators: it is *satisfied* when more than half of them give the answer that satisfies it (``yes``
  for objects and positive statements, ``no`` for negated statements, which are asked in affirmative form).
  An image's label is satisfied when all its labelled elements are.
- **COCO object ground truth** (``instances`` JSON: ``images`` with ``file_name``, ``annotations`` with
  ``image_id`` and ``category_id``, ``categories`` with ``name`` in the benchmark's spelling). It labels
  object elements only: ``object:I`` is satisfied when the image holds exactly the requested number of
  instances of the class (at least that many for ``skis``, exempt from over-counting, as in the rules).
  ``iscrowd`` annotations are ignored. This fits presence and counting thresholds without a human study.

Every labelled image must have saved perception: a label for an image the run did not judge (or judged
without ``--save-perception``) is an error that names it, never silently skipped.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from negt2i.core.rejudge import SavedImage, SavedRun
from negt2i.core.spec import Polarity
from negt2i.core.vocab import COCO_CLASSES, OVER_COUNT_EXEMPT
from negt2i.metrics.agreement import read_labels

Form = Literal["human", "coco"]


class LabelsError(ValueError):
    """Labels that cannot be used; the message names the file and what is wrong."""


@dataclass(frozen=True, eq=False)
class Labels:
    """Satisfied / not per (image filename, element), for the saved images they label."""

    form: Form
    path: str
    sha256: str
    elements: Mapping[tuple[str, str], bool]
    images: tuple[str, ...]
    """Filenames (``SavedImage.filename``) of the labelled images, sorted."""

    def image_label(self, filename: str) -> bool:
        """All labelled elements of the image satisfied."""
        return all(v for (f, _), v in self.elements.items() if f == filename)

    def record(self) -> dict[str, Any]:
        return {"path": self.path, "form": self.form, "sha256": self.sha256, "images": len(self.images),
                "elements": len(self.elements)}  # fmt: skip


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _missing(names: list[str], path: Path) -> LabelsError:
    shown = ", ".join(sorted(names)[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    return LabelsError(
        f"{path}: {len(names)} labelled image(s) have no saved perception in the results given: {shown} "
        "(evaluate them with --save-perception, or drop their labels)"
    )


def read_human(path: str | Path, run: SavedRun) -> Labels:
    """Human element labels, majority per element (see the module docstring)."""
    p = Path(path)
    try:
        rows = read_labels(p)
    except OSError as exc:
        raise LabelsError(f"{p}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise LabelsError(str(exc)) from None
    keys = run.by_key()
    missing = sorted({r.image for r in rows if r.image not in keys})
    if missing:
        raise _missing(missing, p)
    votes: dict[tuple[str, str], list[bool]] = defaultdict(list)
    for r in rows:
        image = keys[r.image]
        kind, _, idx = r.element.partition(":")
        k = int(idx)
        if kind == "object":
            if k >= len(image.prompt.objects):
                raise LabelsError(f"{r.where}: {r.element}, but the prompt names {len(image.prompt.objects)} objects")
            satisfied = r.answer
        else:
            if k >= len(image.prompt.statements):
                raise LabelsError(
                    f"{r.where}: {r.element}, but the prompt has {len(image.prompt.statements)} statements"
                )
            negated = image.prompt.statements[k].polarity is Polarity.NEGATED
            if r.polarity is not None and (r.polarity == "negated") != negated:
                raise LabelsError(f"{r.where}: polarity {r.polarity}, but {r.element} of the prompt is not")
            satisfied = r.answer != negated
        votes[(image.filename, r.element)].append(satisfied)
    elements = {key: sum(v) * 2 > len(v) for key, v in votes.items()}
    return Labels("human", str(p), _sha256(p), elements, tuple(sorted({f for f, _ in elements})))


def read_coco(path: str | Path, run: SavedRun) -> Labels:
    """COCO instances ground truth, as object-element labels (see the module docstring)."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise LabelsError(f"{p}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise LabelsError(f"{p}: not valid JSON ({exc})") from None
    if not isinstance(data, dict) or not all(
        isinstance(data.get(k), list) for k in ("images", "annotations", "categories")
    ):
        raise LabelsError(f"{p}: a COCO file needs the lists images, annotations and categories")
    vocab = set(COCO_CLASSES)
    categories: dict[int, str] = {}
    for c in data["categories"]:
        try:
            cid, name = int(c["id"]), str(c["name"])
        except (KeyError, TypeError, ValueError):
            raise LabelsError(f"{p}: category {c!r} needs an integer id and a name") from None
        if name not in vocab:
            raise LabelsError(
                f"{p}: category {cid} {name!r} is not a COCO class in the benchmark's spelling "
                "(negt2i.core.vocab.COCO_CLASSES)"
            )
        categories[cid] = name
    files: dict[int, str] = {}
    for im in data["images"]:
        try:
            files[int(im["id"])] = str(im["file_name"])
        except (KeyError, TypeError, ValueError):
            raise LabelsError(f"{p}: image {im!r} needs an integer id and a file_name") from None
    counts: dict[int, dict[str, int]] = {i: defaultdict(int) for i in files}
    for k, a in enumerate(data["annotations"]):
        try:
            iid, cid = int(a["image_id"]), int(a["category_id"])
        except (KeyError, TypeError, ValueError):
            raise LabelsError(f"{p}: annotation {k} needs image_id and category_id") from None
        if iid not in files:
            raise LabelsError(f"{p}: annotation {k} refers to image {iid}, which images does not list")
        if cid not in categories:
            raise LabelsError(f"{p}: annotation {k} has category {cid}, which categories does not list")
        if not a.get("iscrowd"):
            counts[iid][categories[cid]] += 1
    keys = run.by_key()
    missing = sorted(f for f in files.values() if f not in keys)
    if missing:
        raise _missing(missing, p)
    elements: dict[tuple[str, str], bool] = {}
    for iid, name in files.items():
        image: SavedImage = keys[name]
        for i, obj in enumerate(image.prompt.objects):
            n = counts[iid].get(obj.class_name, 0)
            ok = n >= obj.count if obj.class_name in OVER_COUNT_EXEMPT else n == obj.count
            elements[(image.filename, f"object:{i}")] = ok
    if not elements:
        raise LabelsError(f"{p}: no images")
    return Labels("coco", str(p), _sha256(p), elements, tuple(sorted({f for f, _ in elements})))


def read(path: str | Path, run: SavedRun, form: str = "auto") -> Labels:
    """Labels of either form; ``auto``: COCO for a ``.json`` file holding ``annotations``, else human labels."""
    p = Path(path)
    if not p.is_file():
        raise LabelsError(f"{p}: labels file not found")
    if form == "auto":
        form = "human"
        if p.suffix.lower() == ".json":
            try:
                head = json.loads(p.read_text(encoding="utf-8"))
            except (OSError, json.JSONDecodeError):
                head = None
            form = "coco" if isinstance(head, dict) and "annotations" in head else "human"
    if form == "coco":
        return read_coco(p, run)
    if form == "human":
        return read_human(p, run)
    raise LabelsError(f"unknown labels form {form!r} (auto, human, coco)")
