"""The per-image flow's contract checks (``negt2i.core.flow``): one row per contract rule, one bad stage answer each.

Every row starts from a sound answer of every stage (judged without a failure, the first test) and breaks
exactly one thing; ``begin`` or ``finish`` must then raise ``StageError`` naming the stage and the rule
(``negt2i.core.failures.ContractRule``). The three rules about what travels between processes
(``detect-result``, ``result-schema``, ``stage-info``) are checked by the orchestrator's stage client and
asserted by name in ``tests/orchestrator/test_stage_client.py``; the last test keeps the two lists whole.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pytest

from negt2i.core import flow
from negt2i.core.config import CURRENT
from negt2i.core.failures import ContractRule, StageError
from negt2i.core.perception import Detections
from negt2i.core.spec import Prompt, parse_prompt

from .helpers import rect

HW = (64, 96)

DEPTH = parse_prompt({"id": "depth", "category": "depth", "prompt": "a photo of a horse in front of a bicycle",
                      "include": [{"class": "horse"}, {"class": "bicycle"}],
                      "statements": [{"kind": "relation", "subject": 0, "target": 1, "predicate": "in front of",
                                      "polarity": "positive"}]})  # fmt: skip
"""Needs all four stages: detector, segmenter (relation masks), depth; the colour prompt adds the scorer."""
COLOR = parse_prompt({"id": "color", "category": "color", "prompt": "a photo of a red cup",
                      "include": [{"class": "cup"}],
                      "statements": [{"kind": "attribute", "object": 0, "value": "red",
                                      "polarity": "positive"}]})  # fmt: skip

HORSE, BICYCLE, CUP = rect(30, 10, 25, 30, HW), rect(10, 50, 20, 30, HW), rect(20, 30, 20, 20, HW)


def detections(names: tuple[str, ...] = ("horse", "bicycle"), scores: tuple[float, ...] = (0.9, 0.8),
               shape: tuple[int, int] = HW) -> Detections:  # fmt: skip
    masks = {"horse": HORSE, "bicycle": BICYCLE, "cup": CUP, "Horse": HORSE, "unicorn": BICYCLE}
    return Detections.from_masks(list(names), list(scores), [masks[n][: shape[0], : shape[1]] for n in names], shape)


def disparity() -> np.ndarray:
    out = np.full(HW, 0.2, dtype=np.float32)
    out[HORSE] = 0.9  # the horse is closer
    return out


@dataclass(frozen=True)
class Answer:
    """One image's prompt and every stage's answer (``detections`` as the detector gave them)."""

    prompt: Prompt
    detections: Any
    refined: Any = None
    scores: Any = None
    disparity: Any = None


def sound(prompt: Prompt) -> Answer:
    """Answers that break no rule: the refined masks are the detector's, the cup scores red highest."""
    if prompt is COLOR:
        return Answer(COLOR, detections(("cup",), (0.9,)), scores="fill")
    return Answer(DEPTH, detections(), refined="fill", disparity=disparity())


def run(answer: Answer) -> Any:
    """``begin`` then ``finish`` on ``answer`` (``"fill"``: the sound answer to whatever ``begin`` asked)."""
    req = flow.begin(answer.prompt, answer.detections, HW, CURRENT)
    refined = answer.refined
    if isinstance(refined, str) and req.refine is not None:
        refined = req.refine.reference_masks.copy()
    scores = answer.scores
    if isinstance(scores, str) and req.attributes is not None:
        scores = np.tile(np.linspace(10.0, 5.0, len(req.attributes.answers), dtype=np.float32),
                         (len(req.attributes.indices), 1))  # fmt: skip
        scores[:, list(req.attributes.answers).index("red")] = 20.0
    verdict, _ = flow.finish(answer.prompt, req, flow.StageAnswers(refined, scores, answer.disparity), config=CURRENT)
    return verdict


def box_off_image(a: Answer) -> Answer:
    d = a.detections
    boxes = d.xyxy.copy()
    boxes[1, 2] = HW[1] + 5.0
    return replace(a, detections=Detections(d.class_names, d.scores, boxes, d.masks, d.shape_hw))


def short_rows(a: Answer) -> Answer:
    req = flow.begin(a.prompt, a.detections, HW, CURRENT)
    assert req.refine is not None
    return replace(a, refined=req.refine.reference_masks[:, :-1, :])


def one_mask_too_many(a: Answer) -> Answer:
    req = flow.begin(a.prompt, a.detections, HW, CURRENT)
    assert req.refine is not None
    masks = req.refine.reference_masks
    return replace(a, refined=np.concatenate([masks, masks[:1]]))


Row = tuple[str, Prompt, Callable[[Answer], Answer], str, ContractRule]
ROWS: list[Row] = [
    ("detections for another image size", DEPTH, lambda a: replace(a, detections=detections(shape=(32, 48))),
     "detector", ContractRule.IMAGE_SIZE),
    ("'Horse' is not the benchmark's spelling", DEPTH,
     lambda a: replace(a, detections=detections(("Horse", "bicycle"))), "detector", ContractRule.CLASS_VOCABULARY),
    ("a class outside the vocabulary, even one the prompt does not name", DEPTH,
     lambda a: replace(a, detections=detections(("horse", "bicycle", "unicorn"), (0.9, 0.8, 0.7))),
     "detector", ContractRule.CLASS_VOCABULARY),
    ("a score below the prediction floor (0.005)", DEPTH,
     lambda a: replace(a, detections=detections(scores=(0.9, 0.004))), "detector", ContractRule.SCORE_RANGE),
    ("a box past the image's right edge", DEPTH, box_off_image, "detector", ContractRule.BOX_INSIDE_IMAGE),
    ("the detector answers something that is not Detections", DEPTH,
     lambda a: replace(a, detections=[("horse", 0.9)]), "detector", ContractRule.RESULT_COUNT),
    ("refined masks one row short of the image", DEPTH, short_rows, "segmenter", ContractRule.MASK_SIZE),
    ("one refined mask more than boxes asked", DEPTH, one_mask_too_many, "segmenter", ContractRule.RESULT_COUNT),
    ("no segmenter answer to a relation prompt", DEPTH, lambda a: replace(a, refined=None), "segmenter",
     ContractRule.RESULT_COUNT),
    ("one attribute row short", COLOR, lambda a: replace(a, scores=np.zeros((0, 3), np.float32)), "attributes",
     ContractRule.RESULT_COUNT),
    ("no attribute scores for a colour prompt", COLOR, lambda a: replace(a, scores=None), "attributes",
     ContractRule.RESULT_COUNT),
    ("an attribute score that is not finite", COLOR, lambda a: replace(a, scores="nan"), "attributes",
     ContractRule.SCORE_FINITE),
    ("a disparity map of another size", DEPTH, lambda a: replace(a, disparity=disparity()[:32]), "depth",
     ContractRule.MASK_SIZE),
    ("no disparity for a depth prompt", DEPTH, lambda a: replace(a, disparity=None), "depth",
     ContractRule.RESULT_COUNT),
    ("a disparity value that is not finite", DEPTH,
     lambda a: replace(a, disparity=np.where(HORSE, np.inf, disparity()).astype(np.float32)), "depth",
     ContractRule.DEPTH_FINITE),
]  # fmt: skip

STAGE_CLIENT_RULES = {ContractRule.DETECT_RESULT, ContractRule.RESULT_SCHEMA, ContractRule.STAGE_INFO}
"""Checked where answers arrive over HTTP (``orchestrator.stages.RemoteStages``), not in the flow."""


def test_the_sound_answers_are_judged() -> None:
    for prompt in (DEPTH, COLOR):
        verdict = run(sound(prompt))
        assert verdict.correct, (prompt.id, verdict.reason)


@pytest.mark.parametrize(("why", "prompt", "breaks", "stage", "rule"), ROWS, ids=[r[0] for r in ROWS])
def test_one_bad_answer_fails_the_image_naming_its_stage_and_rule(
    why: str, prompt: Prompt, breaks: Callable[[Answer], Answer], stage: str, rule: ContractRule
) -> None:
    answer = breaks(sound(prompt))
    if isinstance(answer.scores, str) and answer.scores == "nan":
        req = flow.begin(answer.prompt, answer.detections, HW, CURRENT)
        assert req.attributes is not None
        bad = np.full((len(req.attributes.indices), len(req.attributes.answers)), 10.0, np.float32)
        bad[0, 0] = np.nan
        answer = replace(answer, scores=bad)
    with pytest.raises(StageError) as err:
        run(answer)
    failure = err.value
    assert (failure.stage, failure.rule) == (stage, rule), failure.details()
    assert failure.rule is rule  # the enum member itself, not a look-alike string
    assert failure.line().startswith(f"stage_error: {stage}: [{rule.value}] ")


def test_every_contract_rule_has_a_row_here_or_in_the_stage_client_tests() -> None:
    assert {r[4] for r in ROWS} | STAGE_CLIENT_RULES == set(ContractRule)
    assert not {r[4] for r in ROWS} & STAGE_CLIENT_RULES
    assert all(rule.requirement for rule in ContractRule)


def test_a_rules_spelling_is_checked_and_a_name_from_a_newer_server_is_dropped() -> None:
    assert StageError("depth", "x", rule="depth-finite").rule is ContractRule.DEPTH_FINITE  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="depth-fnite"):
        StageError("depth", "x", rule="depth-fnite")  # type: ignore[arg-type]
    assert ContractRule.parse("depth-finite") is ContractRule.DEPTH_FINITE
    assert ContractRule.parse("") is None and ContractRule.parse("a-rule-of-v1.9") is None


def test_the_class_filter_runs_in_begin_after_the_check() -> None:
    """A detector that ignored the request (a third class, more than the cap of one class) gives ``begin``
    the same detections as one that honoured it; their class counts say what the cap dropped."""
    many = detections(("horse", "cup", *["bicycle"] * 20), (0.9, 0.95, *np.linspace(0.8, 0.1, 20)))
    req = flow.begin(DEPTH, many, HW, CURRENT)
    assert req.detections.class_names == ("horse", *["bicycle"] * CURRENT.detection.per_class_cap)
    assert req.detections.class_counts == {"bicycle": 20}
    assert flow.begin(DEPTH, detections(), HW, CURRENT).detections.class_names == ("horse", "bicycle")
