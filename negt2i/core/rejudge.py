"""Perception saved once, rules applied many times: re-judge saved images under other rule configs.

``negt2i evaluate --save-perception`` (and ``negt2i submit --save-perception``) write, next to the results
file, what the stages saw for each image (``negt2i.core.perception_file``). ``load_saved`` pairs each results line
(its prompt, from GenEval's ``metadata``; its models) with its side-file line and rebuilds the
``ImagePerception``; ``SavedImage.judge(config)`` then calls the one judge (``negt2i.core.verdict.judge``) with
another config. No model runs: calibration (``negt2i.calibrate``) and the ablation (``negt2i.ablate``)
re-judge thousands of candidate configs from one perception pass.

What a saved perception can answer: any presence / counting threshold (every kept detection of the prompt's
classes is stored, down to the run's prediction floor and per-class cap), SAM refinement on or off (refined
and detector masks are both stored), every relation and attribute constant, both depth rules (the disparity
map is stored when the run was in process). It cannot lower the prediction floor or raise the per-class cap
below / above the run's (those detections were never returned): ``check_config`` refuses such a config.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from negt2i.core.config import RuleConfig
from negt2i.core.geometry import MaskStats
from negt2i.core.perception import AttributeScores, Detections, DisparityMap, ImagePerception, RefinedMasks
from negt2i.core.perception_file import SavedPerception, decode, default_path, read_perception
from negt2i.core.spec import Prompt, SpecError, parse_prompt
from negt2i.core.verdict import PerceptionError, Verdict, judge
from negt2i.core.vocab import ANSWERS


class RejudgeError(ValueError):
    """Saved results / perception that cannot be re-judged as asked; the message names the file and image."""


@dataclass(frozen=True, eq=False)
class SavedImage:
    """One judged image: its prompt, the perception rebuilt from the side file, and its results line."""

    filename: str
    prompt: Prompt
    perception: ImagePerception
    line: Mapping[str, Any]
    masks: dict[tuple[int, bool], MaskStats] = field(default_factory=dict, repr=False)
    """Mask measurements shared by every re-judging of this image (``judge(mask_cache=)``)."""

    @property
    def keys(self) -> tuple[str, ...]:
        """The names labels may use for it: the results line's ``filename`` and ``prompt_id#sample``."""
        out = [self.filename]
        if self.line.get("sample") is not None:
            out.append(f"{self.prompt.id}#{self.line['sample']}")
        return tuple(out)

    def judge(self, config: RuleConfig, *, objects_only: bool = False) -> Verdict:
        """The verdict under ``config`` (``objects_only``: presence and counting alone, statements skipped)."""
        prompt = self.prompt.model_copy(update={"statements": (), "probes": ()}) if objects_only else self.prompt
        try:
            return judge(prompt, self.perception, config, mask_cache=self.masks)
        except (PerceptionError, ValueError) as exc:
            raise RejudgeError(
                f"{self.filename}: the saved perception cannot be judged with rules {config.name!r}: {exc} (save it "
                "in process with `negt2i evaluate --save-perception`, which stores everything a re-judge reads)"
            ) from None


@dataclass(frozen=True, eq=False)
class SavedRun:
    """The images of one or more results files made by one detector, with their perception."""

    images: list[SavedImage]
    detector: Mapping[str, Any]
    """The detector's model info, as the results lines record it (``models.detector``)."""
    config: Mapping[str, Any]
    """The rule config record the run was judged with."""
    sources: list[dict[str, str]] = field(default_factory=list)
    """``{"path", "sha256"}`` of every results and perception file read."""

    def by_key(self) -> dict[str, SavedImage]:
        out: dict[str, SavedImage] = {}
        for im in self.images:
            for k in im.keys:
                out[k] = im
        return out

    @property
    def detector_name(self) -> str:
        return detector_id(self.detector)


def detector_id(info: Mapping[str, Any]) -> str:
    """``backend (model)`` of a detector's model info: what a rules file's provenance must match."""
    backend, model = str(info.get("backend", "?")), str(info.get("model", "?"))
    return backend if model in ("", "?", backend) else f"{backend} ({model})"


def same_detector(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two model infos name the same detector (backend, model and weights where both give them)."""
    for key in ("backend", "model", "weights", "weights_sha256", "revision"):
        if key in a and key in b and a[key] != b[key]:
            return False
    return True


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with Path(path).open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def rebuild(saved: SavedPerception) -> ImagePerception:
    """The ``ImagePerception`` of a side-file line: the stored detections in the detector's index order
    (so ties between equal scores break as they did), refined masks and attribute scores re-keyed to them."""
    order = sorted(saved.detections)
    pos = {orig: k for k, orig in enumerate(order)}
    hw = saved.shape_hw
    if order:
        dets = [saved.detections[i] for i in order]
        detections = Detections(
            tuple(d.class_name for d in dets),
            np.array([d.score for d in dets], np.float32),
            np.array([d.box for d in dets], np.float32),
            np.stack([d.mask for d in dets]),
            hw,
        )
    else:
        detections = Detections.empty(hw)
    refined = RefinedMasks({pos[i]: m for i, m in saved.refined.items() if i in pos}, hw) if saved.refined else None
    attributes = None
    if saved.attributes:
        first = next(iter(saved.attributes.values()))
        answers = next((a for a in ANSWERS.values() if set(a) == set(first)), tuple(first))
        attributes = AttributeScores({pos[i]: s for i, s in saved.attributes.items() if i in pos}, answers)
    disparity = DisparityMap(saved.disparity, hw) if saved.disparity is not None else None
    return ImagePerception(detections, refined=refined, attributes=attributes, disparity=disparity)


def _lines(path: Path) -> Iterable[tuple[int, dict[str, Any]]]:
    with path.open(encoding="utf-8") as fh:
        lines = fh.readlines()
    for k, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            if k == len(lines) and not line.endswith("\n"):
                return  # a torn last line (an interrupted run)
            raise RejudgeError(f"{path}:{k}: not valid JSON") from None
        if isinstance(rec, dict):
            yield k, rec


def load_saved(results: Sequence[str | Path], perception: Sequence[str | Path] | None = None) -> SavedRun:
    """Read results files and their perception side files (default: ``X.perception.jsonl`` next to ``X.jsonl``).

    Only judged lines (``status`` ok, with a verdict) are kept; the last line per ``filename`` wins, as in
    every reader of results files. Every file must come from one detector. An image without a side-file line
    is left out here; the label readers say which labelled images have none."""
    if not results:
        raise RejudgeError("no results files given")
    sides = list(perception) if perception else [default_path(r) for r in results]
    if len(sides) != len(results):
        raise RejudgeError(f"{len(results)} results files but {len(sides)} perception files")
    images: dict[str, SavedImage] = {}
    detector: Mapping[str, Any] | None = None
    config: Mapping[str, Any] = {}
    sources: list[dict[str, str]] = []
    for res, side in zip(results, sides, strict=True):
        res_p, side_p = Path(res), Path(side)
        for p, what in ((res_p, "results file"), (side_p, "perception file")):
            if not p.is_file():
                hint = " (evaluate with --save-perception)" if what == "perception file" else ""
                raise RejudgeError(f"{p}: {what} not found{hint}")
        sources += [
            {"path": str(res_p), "sha256": file_sha256(res_p)},
            {"path": str(side_p), "sha256": file_sha256(side_p)},
        ]
        try:
            stored = read_perception(side_p)
        except ValueError as exc:
            raise RejudgeError(f"{side_p}: {exc}") from None
        lines: dict[str, dict[str, Any]] = {}
        for k, rec in _lines(res_p):
            if "filename" in rec:
                rec["_where"] = f"{res_p}:{k}"
                lines[str(rec["filename"])] = rec  # the last line per image wins
        for filename, rec in lines.items():
            if rec.get("status") != "ok" or filename not in stored:
                continue
            det_info = (rec.get("models") or {}).get("detector") or {}
            if detector is None:
                detector, config = det_info, rec.get("config") or {}
            elif not same_detector(detector, det_info):
                raise RejudgeError(
                    f"{rec['_where']}: detector {detector_id(det_info)}, but earlier lines come from "
                    f"{detector_id(detector)}: give one detector's results at a time"
                )
            try:
                prompt = parse_prompt(json.loads(rec["metadata"]))
            except (KeyError, TypeError, json.JSONDecodeError, SpecError) as exc:
                raise RejudgeError(f"{rec['_where']}: the line's prompt (metadata) cannot be read: {exc}") from None
            try:
                perception_rec = decode(stored[filename])
                rebuilt = rebuild(perception_rec)
            except ValueError as exc:
                raise RejudgeError(f"{side_p}: {filename}: {exc}") from None
            images[filename] = SavedImage(filename, prompt, rebuilt, rec)
    if not images:
        raise RejudgeError(
            f"no judged image of {', '.join(map(str, results))} has saved perception (evaluate with --save-perception)"
        )
    return SavedRun(sorted(images.values(), key=lambda im: im.filename), detector or {}, config, sources)


def check_config(run: SavedRun, config: RuleConfig) -> None:
    """Refuse a config that needs detections the saved run never kept (a lower floor, a larger cap), or attribute
    scores it never computed (another text template set)."""
    saved = run.config.get("detection") or {}
    floor, cap = saved.get("prediction_floor"), saved.get("per_class_cap")
    det = config.detection
    if floor is not None and det.prediction_floor < float(floor):
        raise RejudgeError(
            f"rules {config.name!r}: prediction floor {det.prediction_floor} is below the saved run's {floor} "
            "(detections under it were never returned)"
        )
    if cap is not None and det.per_class_cap > int(cap):
        raise RejudgeError(f"rules {config.name!r}: per-class cap {det.per_class_cap} exceeds the saved run's {cap}")
    saved_templates = (run.config.get("attributes") or {}).get("text_templates", "single")  # absent: the default
    if config.attributes.text_templates != saved_templates:
        raise RejudgeError(
            f"rules {config.name!r}: text templates {config.attributes.text_templates!r} differ from the saved run's "
            f"{saved_templates!r} (its attribute scores were computed with those; evaluate again instead)"
        )
