"""What a benchmark ran on, and the reference workload its CPU figures are divided by (a helper module, not a
benchmark).

An absolute CPU time says as much about the machine as about the code: the rules of one relation image took
4.6 ms on one development machine and 12.5 ms on another, with the same code. So the CPU goals are ratios:
the code's time divided by the time of ``REFERENCE``, a fixed workload timed in the same process, in the same
run, interleaved with the code (so a slower, busier or throttled machine slows both). The reference is made of
the kinds of operations the rules and the CPU path spend their time on, in about the same shares:

- five 1024 x 1024 boolean masks measured as ``negt2i.core.geometry.mask_stats`` does: one whole-mask pass
  (occupied rows, eight pixels at a time), then over the mask's box: occupied columns, row and column counts,
  the 4-boundary, ``flatnonzero`` + ``divmod``, 2 x 2 pooling: memory-bound NumPy;
- a k-d tree over the masks' boundary pixels (about 3,200 points, leaves of 64) and 12 queries of 32 points:
  SciPy's build and its fixed cost per query;
- a loop over small arrays (64 elements: differences, ``hypot``, ``argsort``, ``minimum``, fancy indexing):
  NumPy's per-call overhead and the interpreter;
- image-sized arrays allocated afresh (a 512 x 512 RGB image to float, normalised and pooled; two masks
  stacked): the page faults and memory traffic of the image transforms and the detector's mask copies;
- pure Python: dicts, tuples, sorting and string formatting for a few hundred records, as the verdicts'
  bookkeeping.

The workload is versioned (``REFERENCE_VERSION``): ratios are comparable only between runs of the same
version; change the workload, bump the version, and re-measure the documented ratios. Every benchmark prints
``describe()`` (CPU model, core count, load average) beside its figures.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

REFERENCE_VERSION = 1
"""Bumped whenever ``Reference.run`` changes: a ratio names the version it was measured against."""

SIZE = 1024


def cpu_model() -> str:
    """The CPU's model name, with family / model / stepping (virtual machines often report a generic name such
    as "Intel(R) Xeon(R) Processor"); ``platform.processor()`` where ``/proc/cpuinfo`` is not readable."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            key, sep, value = line.partition(":")
            if not sep:
                if fields:
                    break  # the first processor's block is enough
                continue
            fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    name = fields.get("model name") or platform.processor() or platform.machine() or "unknown CPU"
    ids = [f"{k} {fields[k]}" for k in ("cpu family", "model", "stepping") if k in fields]
    return f"{name} ({', '.join(ids)})" if ids else name


def cpu_count() -> int:
    """The CPUs this process may run on (``nproc``)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def describe() -> str:
    """``machine: <CPU model>, <N> CPUs, load average <1> <5> <15> min``: the line every benchmark prints."""
    one, five, fifteen = os.getloadavg()
    return f"machine: {cpu_model()}, {cpu_count()} CPUs, load average {one:.2f} {five:.2f} {fifteen:.2f}"


def _ellipse(cy: float, cx: float, ry: float, rx: float) -> np.ndarray:
    yy, xx = np.ogrid[:SIZE, :SIZE]
    return np.asarray(((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2 <= 1.0)


class Reference:
    """The reference workload (see the module docstring): ``run()`` once is one unit; ``ms()`` its thread CPU
    time in milliseconds (about 6 ms on the 2-vCPU development machine of issue 44)."""

    def __init__(self) -> None:
        from scipy.spatial import cKDTree

        self._tree_type = cKDTree
        rng = np.random.default_rng(20240)
        centres = ((512, 512, 140, 120), (220, 220, 100, 130), (220, 800, 120, 90), (800, 220, 90, 110),
                   (800, 800, 130, 100))  # fmt: skip
        self.masks = [_ellipse(cy, cx, ry, rx) for cy, cx, ry, rx in centres]
        edges = []
        for k, m in enumerate(self.masks):
            edge = m & ~(np.roll(m, 1, 0) & np.roll(m, -1, 0) & np.roll(m, 1, 1) & np.roll(m, -1, 1))
            rows, cols = np.nonzero(edge)
            edges.append(np.column_stack([rows, cols, np.full(rows.size, k * 4096.0)]).astype(np.float64))
        self.points = np.concatenate(edges)
        self.queries = [self.points[rng.choice(len(self.points), 32)] + rng.normal(0, 20, (32, 3)) * (1, 1, 0)
                        for _ in range(12)]  # fmt: skip
        self.small = [rng.normal(0, 100, (64, 2)) for _ in range(80)]
        self.records = [(f"object-{k}", float(v), int(k % 7)) for k, v in enumerate(rng.normal(0, 1, 500))]
        self.image = rng.integers(0, 256, (SIZE // 2, SIZE // 2, 3), dtype=np.uint8)

    def run(self) -> float:
        """One unit of the workload; returns a number derived from every part (so none is optimised away)."""
        acc = 0.0
        for m in self.masks:  # a whole-mask pass, then passes over the mask's box
            rows = np.flatnonzero(np.bitwise_or.reduce(m.view(np.uint64), axis=1) != 0)
            band = m[rows[0] : rows[-1] + 1]
            cols = np.flatnonzero(band.any(axis=0))
            crop = band[:, cols[0] : cols[-1] + 1]
            row_counts = np.add.reduce(crop.view(np.uint8), axis=1, dtype=np.int32)
            col_counts = np.add.reduce(crop.view(np.uint8), axis=0, dtype=np.int32)
            core = crop[1:-1, 1:-1] & crop[:-2, 1:-1]
            core &= crop[2:, 1:-1]
            core &= crop[1:-1, :-2]
            core &= crop[1:-1, 2:]
            inner = np.zeros(crop.shape, dtype=bool)
            inner[1:-1, 1:-1] = core
            edge_rows, edge_cols = np.divmod(np.flatnonzero(crop > inner), crop.shape[1])
            h, w = crop.shape[0] // 2 * 2, crop.shape[1] // 2 * 2
            pooled = crop[:h:2, :w:2] | crop[1:h:2, 1:w:2]
            acc += float(row_counts @ np.arange(crop.shape[0])) + float(col_counts.sum())
            acc += float(edge_rows.sum() + edge_cols.sum()) + float(np.count_nonzero(pooled))
        tree = self._tree_type(self.points, leafsize=64)  # the k-d tree
        for q in self.queries:
            d, _ = tree.query(q, k=1)
            acc += float(d.sum())
        for a in self.small:  # small arrays: per-call overhead
            c = a.mean(axis=0)
            d = np.hypot(a[:, 0] - c[0], a[:, 1] - c[1])
            order = np.argsort(d)[:8]
            acc += float(np.minimum(d[order], 50.0).sum()) + float(a[order, 0].max())
        pixels = self.image.astype(np.float32)  # image-sized arrays, freshly allocated: transforms, mask copies
        pixels *= 1 / 255
        pixels -= 0.5
        half = pixels[::2, ::2] + pixels[1::2, 1::2]
        stacked = np.stack(self.masks[:2])
        acc += float(half[::64, ::64].sum()) + float(stacked[:, ::64, ::64].sum())
        table: dict[str, Any] = {}  # pure Python: the bookkeeping
        for name, value, group in self.records:
            row = {"name": name, "value": round(value, 6), "group": group, "label": f"{name}={value:.3f}"}
            table.setdefault(str(group), []).append(row)
        for rows in table.values():
            rows.sort(key=lambda r: (r["value"], r["name"]))
            acc += len(", ".join(r["label"] for r in rows[:5]))
        return acc

    def ms(self, clock: Callable[[], float] = time.thread_time) -> float:
        """Milliseconds of one ``run()`` on ``clock`` (default: this thread's CPU time)."""
        start = clock()
        self.run()
        return (clock() - start) * 1000


def ratio(work_ms: list[float], reference_ms: list[float]) -> float:
    """The figure: median of the work over median of the reference."""
    return statistics.median(work_ms) / statistics.median(reference_ms)
