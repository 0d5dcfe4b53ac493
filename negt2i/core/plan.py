"""What perception a prompt needs beyond detection (run only what the prompt needs).

Both the embedded pipeline and the orchestrator call ``plan_perception`` after the
detector and before the other stages, so the two paths ask the stages for exactly
the same things and feed ``judge`` identical perception.

- Refined masks (SAM 2) only for the four relation categories, and only for the
  instance each evaluable statement will measure: the counted instance of an
  object that is present with a valid count. Other detections of named classes
  would be refined by the paper too, but no verdict reads them.
- Attribute scores only for color / material prompts, for the same instances,
  against every answer of the category (colors plus gray, or materials).
- Depth only for depth prompts with at least one evaluable statement.

Probes (``Prompt.probes``) are measured like statements, so they count here too.
"""

from __future__ import annotations

from dataclasses import dataclass

from negt2i.core.config import CURRENT, RuleConfig
from negt2i.core.perception import Detections
from negt2i.core.rules import select_instances
from negt2i.core.spec import Prompt
from negt2i.core.vocab import ANSWERS, Category


@dataclass(frozen=True)
class PerceptionPlan:
    """Detection indices that need refined masks / attribute scores, and whether depth is needed."""

    refine: tuple[int, ...] = ()
    attributes: tuple[int, ...] = ()
    answers: tuple[str, ...] = ()
    depth: bool = False

    @property
    def empty(self) -> bool:
        return not (self.refine or self.attributes or self.depth)


def plan_perception(
    prompt: Prompt, detections: Detections, config: RuleConfig = CURRENT, *, complete: bool = False
) -> PerceptionPlan:
    """The stages a prompt needs after detection; see the module docstring.

    ``complete`` (perception saved for re-judging, ``--save-perception``): plan for every statement whose
    objects each have a kept detection, whatever the presence and counting thresholds say, so that rules with
    other thresholds (``negt2i calibrate`` / ``negt2i ablate``) find what they measure. The instance measured is
    the same either way: the counted instance of a present class is always its top kept detection."""
    if prompt.category is None or not (prompt.statements or prompt.probes):
        return PerceptionPlan()
    selections = [select_instances(detections, o.class_name, o.count, config) for o in prompt.objects]
    needed: list[int] = []
    any_evaluable = False
    for st in (*prompt.statements, *prompt.probes):
        sels = [selections[i] for i in st.object_indices]
        if complete:
            evaluable = all(s.kept for s in sels)
        else:
            evaluable = all(s.present and not s.over_count and not s.under_count for s in sels)
        if evaluable:
            any_evaluable = True
            for s in sels:
                if s.kept[0] not in needed:
                    needed.append(s.kept[0])
    needed.sort()
    category = prompt.category
    if category.is_attribute:
        return PerceptionPlan(attributes=tuple(needed), answers=ANSWERS[category] if needed else ())
    refine = tuple(needed) if config.masks.refine else ()
    return PerceptionPlan(refine=refine, depth=category is Category.DEPTH and any_evaluable)


def category_stages(category: Category | None, config: RuleConfig = CURRENT) -> tuple[str, ...]:
    """Every stage a prompt of ``category`` may need (``plan_perception``'s choices, in stage order):
    the detector always; the attribute scorer for color / material; the segmenter for the relation
    categories (unless ``config.masks.refine`` is off); depth for depth prompts. ``None`` (no statements):
    the detector only. The orchestrator's per-category health follows this."""
    if category is None:
        return ("detector",)
    if category.is_attribute:
        return ("detector", "attributes")
    refine = ("segmenter",) if config.masks.refine else ()
    return ("detector", *refine, *(("depth",) if category is Category.DEPTH else ()))
