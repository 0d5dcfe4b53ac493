"""What a judge backend is: a VQA judge answers yes / no questions about images, a score judge gives one
number per (image, prompt). Both are built by a factory of the registry (``negt2i.judges.registry``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    from PIL import Image as PILImage

Kind = Literal["vqa", "score"]
VQA_MODES: Final[tuple[str, ...]] = ("whole", "pos", "neg")
"""The question file's modes (``negt2i questions``): whole prompt, per element affirmative, per element with
negated statements asked negated."""
SCORE_MODE: Final = "score"
"""The mode of score-only judges: one score of the whole prompt per image (Table 7's similarity and reward rows)."""


@dataclass(frozen=True)
class JudgeInfo:
    """What produced a judge file's answers: recorded in the run header of every run."""

    judge: str
    kind: Kind
    model: str
    revision: str
    """The weights' resolved revision (from the lock), or ``random-init`` for tiny test models."""
    sha256: str
    library: str
    device: str
    dtype: str
    params: int
    """Parameter count of the loaded model."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def params_label(n: int) -> str:
    """Parameter count as the paper prints it: ``8.3B``, ``151M``, ``0.1M``."""
    if n >= 1e9:
        return f"{n / 1e9:.1f}B"
    return f"{n / 1e6:.1f}M"


@runtime_checkable
class VQAJudge(Protocol):
    """Answers yes / no questions: P("yes") and P("no") of the first answer token."""

    info: JudgeInfo

    def answer_batch(self, items: Sequence[tuple[PILImage.Image, str]]) -> list[tuple[float, float]]:
        """(p_yes, p_no) per (image, question), in order."""
        ...


@runtime_checkable
class ScoreJudge(Protocol):
    """Scores how well an image matches a prompt (a similarity or a reward; any real number)."""

    info: JudgeInfo

    def score_batch(self, items: Sequence[tuple[PILImage.Image, str]]) -> list[float]:
        """One score per (image, prompt), in order."""
        ...
