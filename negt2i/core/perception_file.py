"""The perception side file (``--save-perception``): what each verdict was judged from, keyed by image.

One JSON line per judged image (schema in ``docs/results.md``)::

    {"filename": "00012/samples/0003.png", "prompt_id": "...", "sample": 3, "height": H, "width": W,
     "detections": [{"index": 4, "class": "cup", "score": 0.91, "box": [x0, y0, x1, y1], "mask": RLE}, ...],
     "refined": {"4": RLE, ...}, "attributes": {"4": {"red": 12.3, ...}}, "used_depth": false,
     "disparity": {"dtype": "float32", "shape": [H, W], "zlib_base64": "..."}}

``detections`` holds every detection of the prompt's classes that the verdict kept
(``objects[].measurements.kept``), with the detector's own index, so the verdict's
detection indices resolve here; ``refined`` the SAM 2 masks the relation rules
measured; ``attributes`` the scores the attribute rules read. Masks are COCO RLE
(``negt2i.core.rle``). ``disparity`` (when the image needed depth and the map reached the
writer: always in process; not through an orchestrator, whose answer leaves the map out) is the
float32 map, little-endian, row-major, zlib-compressed and base64-encoded, so that the depth rules
can be re-applied exactly. A rerun appends; readers take the last line per ``filename``. An
audit (``negt2i audit``) reads this file instead of re-running the models; ``negt2i calibrate``
and ``negt2i ablate`` re-judge from it (``negt2i.core.rejudge``).

Saved perception is planned for re-judging (``negt2i.core.plan.plan_perception(complete=True)``): the
top detection of every named class with a kept detection has its refined mask / attribute scores
(and the image its depth) even where this run's thresholds made the statement unevaluable.
"""

from __future__ import annotations

import base64
import json
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np
from numpy.typing import NDArray

from negt2i.core import rle
from negt2i.core.perception import ImagePerception
from negt2i.core.verdict import Verdict


def default_path(results: str | Path) -> Path:
    """``results.jsonl`` -> ``results.perception.jsonl`` (next to the results file)."""
    p = Path(results)
    return p.with_name(p.stem + ".perception.jsonl" if p.suffix == ".jsonl" else p.name + ".perception.jsonl")


def perception_record(
    filename: str, sample: int | None, verdict: Verdict, perception: ImagePerception, *, used_depth: bool | None = None
) -> dict[str, Any]:
    """The side-file line of one judged image (see the module docstring); ``used_depth`` overrides
    ``perception.disparity is not None`` (a perception received over the wire has no disparity map)."""
    det = perception.detections
    used: set[int] = set()
    for o in verdict.objects:
        used.update(int(i) for i, _ in o.measurements.get("kept", []))
        used.update(o.detections)
    refined = perception.refined
    attrs = perception.attributes
    if refined is not None:
        used.update(refined.masks)
    if attrs is not None:
        used.update(attrs.scores)
    h, w = perception.shape_hw
    return {
        "filename": filename,
        "prompt_id": verdict.prompt_id,
        "sample": sample,
        "height": h,
        "width": w,
        "detections": [
            {
                "index": i,
                "class": det.class_names[i],
                "score": float(det.scores[i]),
                "box": [float(v) for v in det.xyxy[i]],
                "mask": rle.encode(det.masks[i]),
            }
            for i in sorted(used)
        ],
        "refined": {str(i): rle.encode(m) for i, m in sorted(refined.masks.items())} if refined is not None else {},
        "attributes": {str(i): dict(s) for i, s in sorted(attrs.scores.items())} if attrs is not None else {},
        "used_depth": perception.disparity is not None if used_depth is None else used_depth,
        **({"disparity": encode_array(perception.disparity.values)} if perception.disparity is not None else {}),
    }


def encode_array(values: NDArray[np.floating]) -> dict[str, Any]:
    """A float32 (H, W) map as ``{"dtype", "shape", "zlib_base64"}`` (little-endian, row-major; exact)."""
    arr = np.ascontiguousarray(values, dtype="<f4")
    return {
        "dtype": "float32",
        "shape": list(arr.shape),
        "zlib_base64": base64.b64encode(zlib.compress(arr.tobytes(), 6)).decode(),
    }


def decode_array(record: Mapping[str, Any], shape_hw: tuple[int, int]) -> NDArray[np.float32]:
    """``encode_array``'s inverse; raises ``ValueError`` when the record does not hold an (H, W) float32 map."""
    if record.get("dtype") != "float32":
        raise ValueError(f"disparity dtype must be float32, got {record.get('dtype')!r}")
    shape = tuple(int(v) for v in record.get("shape", ()))
    if shape != tuple(shape_hw):
        raise ValueError(f"disparity is {shape}, image is {tuple(shape_hw)}")
    try:
        raw = zlib.decompress(base64.b64decode(str(record["zlib_base64"]), validate=True))
    except (KeyError, ValueError, zlib.error) as exc:
        raise ValueError(f"disparity data is not zlib / base64 ({exc})") from None
    if len(raw) != 4 * shape[0] * shape[1]:
        raise ValueError(f"disparity holds {len(raw)} bytes, expected {4 * shape[0] * shape[1]}")
    return np.frombuffer(raw, dtype="<f4").reshape(shape).astype(np.float32)


class PerceptionWriter:
    """Appends side-file lines, whole and flushed (like the results file)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if self.path.parent != Path():
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh: TextIO = self.path.open("a", encoding="utf-8")

    def write(
        self,
        filename: str,
        sample: int | None,
        verdict: Verdict,
        perception: ImagePerception,
        *,
        used_depth: bool | None = None,
    ) -> None:
        self.write_record(perception_record(filename, sample, verdict, perception, used_depth=used_depth))

    def write_record(self, record: dict[str, Any]) -> None:
        """Append a ``perception_record`` (made elsewhere, e.g. on a worker thread) as a whole line."""
        from negt2i.core.results import dumps_line  # file names that are not UTF-8 written as the results file does

        self._fh.write(dumps_line(record) + "\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> PerceptionWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class SavedDetection:
    """One stored detection: the detector's index, class, score, box and mask (decoded)."""

    index: int
    class_name: str
    score: float
    box: tuple[float, float, float, float]
    mask: NDArray[np.bool_]


@dataclass(frozen=True)
class SavedPerception:
    """A side-file line decoded: detections by index, refined masks by detection index, attribute scores."""

    filename: str
    shape_hw: tuple[int, int]
    detections: Mapping[int, SavedDetection]
    refined: Mapping[int, NDArray[np.bool_]]
    attributes: Mapping[int, Mapping[str, float]]
    used_depth: bool
    disparity: NDArray[np.float32] | None = None
    """The disparity map the depth rule read (None: not needed, or not stored)."""
    prompt_id: str | None = None
    sample: int | None = None

    def mask(self, index: int) -> NDArray[np.bool_] | None:
        """The mask the relation rules measured (refined if stored, else the detector's)."""
        if index in self.refined:
            return self.refined[index]
        d = self.detections.get(index)
        return None if d is None else d.mask


def decode(record: Mapping[str, Any]) -> SavedPerception:
    """Decode one side-file line; raises ``ValueError`` naming what is wrong."""
    try:
        hw = (int(record["height"]), int(record["width"]))
        dets: dict[int, SavedDetection] = {}
        for d in record["detections"]:
            mask = rle.decode(d["mask"])
            if mask.shape != hw:
                raise ValueError(f"detection {d['index']}: mask is {mask.shape}, image is {hw}")
            x0, y0, x1, y1 = (float(v) for v in d["box"])
            dets[int(d["index"])] = SavedDetection(
                int(d["index"]), str(d["class"]), float(d["score"]), (x0, y0, x1, y1), mask
            )
        refined = {int(k): rle.decode(v) for k, v in record.get("refined", {}).items()}
        attrs = {int(k): {str(a): float(s) for a, s in v.items()} for k, v in record.get("attributes", {}).items()}
        disparity = decode_array(record["disparity"], hw) if record.get("disparity") is not None else None
        sample = record.get("sample")
        return SavedPerception(
            str(record["filename"]), hw, dets, refined, attrs, bool(record.get("used_depth")), disparity,
            None if record.get("prompt_id") is None else str(record["prompt_id"]),
            None if sample is None else int(sample),
        )  # fmt: skip
    except (KeyError, TypeError) as exc:
        raise ValueError(f"not a perception record ({type(exc).__name__}: {exc})") from None


def iter_records(path: str | Path) -> Iterator[dict[str, Any]]:
    """Lines of a side file (a torn last line is skipped)."""
    with Path(path).open(encoding="utf-8") as fh:
        lines = fh.readlines()
    for k, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            yield json.loads(line)
        except json.JSONDecodeError:
            if k == len(lines) and not line.endswith("\n"):
                return
            raise ValueError(f"{path}: line {k} is not valid JSON") from None


def read_perception(path: str | Path) -> dict[str, dict[str, Any]]:
    """``filename`` -> its last side-file line (undecoded; ``decode`` one when it is needed)."""
    return {str(r.get("filename")): r for r in iter_records(path)}
