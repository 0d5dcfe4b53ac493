"""One accuracy for a results file: the totals line printed by ``negt2i evaluate``, ``negt2i submit``
and ``negt2i report``.

All three compute it with ``BenchmarkState.compute()`` over the whole file (every
line, not only the lines of the current session), so they always agree:

- ``images``: results lines (one per image); ``judged``: verdict lines; ``errors``:
  error lines, by kind (the first word of ``error``);
- ``image accuracy``: the report's overall image accuracy, ``mean_c mean_s Acc(c, s)``
  (``negt2i.metrics.benchmark``), error lines counted as incorrect images of their
  prompt; error lines without a prompt id are left out (``unplaced``);
- ``prompt accuracy``: the share of prompts with at least one correct image,
  aggregated the same way;
- ``correct``: correct images over scored images (the pooled accuracy, which is what
  GenEval's ``summary_scores.py`` prints as "% correct images"; it equals the image
  accuracy when every category x setting cell has the same number of images, as in
  the corpus).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from negt2i.metrics.benchmark import BenchmarkState
from negt2i.metrics.records import iter_rows


@dataclass(frozen=True)
class Totals:
    """A results file's (or a model's) totals; see the module docstring."""

    images: int
    judged: int
    errors: dict[str, int]
    unplaced: int
    correct: int
    scored: int
    prompts: int
    image_accuracy: float | None
    prompt_accuracy: float | None

    @property
    def error_lines(self) -> int:
        return sum(self.errors.values())

    def text(self) -> str:
        """One line, e.g. ``50 images: 48 judged, 2 errors (unreadable_image 2); image accuracy 41.7%, ...``."""
        err = ""
        if self.errors:
            kinds = ", ".join(f"{k} {v}" for k, v in sorted(self.errors.items()))
            err = f" ({kinds}{f'; {self.unplaced} without a prompt, not scored' if self.unplaced else ''})"
        return (
            f"{plural(self.images, 'image')}: {self.judged} judged, {plural(self.error_lines, 'error')}{err}; "
            f"image accuracy {_pct(self.image_accuracy)}, prompt accuracy {_pct(self.prompt_accuracy)} "
            f"({plural(self.prompts, 'prompt')}; {self.correct}/{plural(self.scored, 'image')} correct; "
            "errors count as incorrect)"
        )


def plural(n: int, noun: str, nouns: str | None = None) -> str:
    """A count and its noun, singular for exactly one: ``1 image``, ``0 images``, ``2 images`` (``nouns``: an
    irregular plural). Every summary line the commands print counts with it."""
    return f"{n} {noun if n == 1 else nouns or noun + 's'}"


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{100.0 * v:.1f}%"


def state_totals(state: BenchmarkState) -> Totals:
    """The totals of a merged ``BenchmarkState`` (what ``negt2i report`` scores)."""
    m = state.compute()
    kinds: Counter[str] = Counter({str(k): int(n) for k, n in m["errors"]["kinds"].items()})  # by FailureKind
    return Totals(
        images=int(m["images"]),
        judged=int(m["images"]) - int(m["errors"]["lines"]),
        errors=dict(kinds),
        unplaced=int(m["errors"]["unplaced"]),
        correct=int(m["correct_images"]),
        scored=int(m["scored_images"]),
        prompts=int(m["prompts"]),
        image_accuracy=m["image_accuracy"]["overall"],
        prompt_accuracy=m["prompt_accuracy"]["overall"],
    )


def file_totals(paths: str | Path | Iterable[str | Path]) -> Totals:
    """The totals of one results file, or of several (shards of one model) merged."""
    items = [paths] if isinstance(paths, str | Path) else list(paths)
    state = BenchmarkState()
    for path in items:
        state.merge(BenchmarkState.from_rows(iter_rows(path)))
    return state_totals(state)
