"""Synthetic results files with known rates, for tests, demos and the sample report.

Every line is a real ``negt2i.core.verdict.Verdict`` (validated by its pydantic model)
written with ``negt2i.core.results.ok_record`` / ``error_record``, for real prompts
(``negt2i.core.spec.Prompt``, validated). Nothing is sampled per image: in a cell of
n images and target accuracy a, exactly ``round(a * n)`` images are correct
(which ones is a seeded shuffle), so the report must show ``round(a * n) / n``.
Incorrect images cycle through the failure patterns the prompt admits, in
``mix`` order, so failure counts are known too.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from negt2i.core.config import CURRENT, RuleConfig
from negt2i.core.results import error_record, ok_record
from negt2i.core.spec import SETTING_RE, AttributeStatement, ObjectSpec, Polarity, Prompt, RelationStatement
from negt2i.core.stage_types import ModelInfo
from negt2i.core.verdict import FailureCause, ObjectVerdict, StatementVerdict, Verdict, row_failure
from negt2i.core.vocab import BENCHMARK_CLASSES, PREDICATES, VALUES, Category
from negt2i.metrics.records import CATEGORY_ORDER, SETTING_ORDER

PATTERNS: tuple[str, ...] = (
    "negated_violated",
    "positive_violated",
    "both_polarities",
    "over_count",
    "undetected_object",
    "dead_zone",
)
"""Failure patterns of synthetic incorrect images (``dead_zone``: a positive statement with nothing fired)."""

DEFAULT_MODELS: dict[str, dict[str, Any]] = {
    stage: ModelInfo(stage=stage, backend=backend, model=model, revision=rev, library="synthetic").model_dump(
        mode="json"
    )
    for stage, backend, model, rev in (
        ("detector", "rfdetr-seg-xl", "RFDETRSegXLarge", "v1.3"),
        ("segmenter", "sam2.1-hiera-small", "facebook/sam2.1-hiera-small", "main"),
        ("attributes", "siglip2-so400m", "ViT-SO400M-14-SigLIP2-378/webli", "main"),
        ("depth", "depth-anything-v2-small", "depth-anything/Depth-Anything-V2-Small-hf", "main"),
    )
}
"""Stage model records written into synthetic lines (the paper's models, synthetic library)."""


def make_prompts(per_cell: int, *, seed: int = 0, cells: Sequence[tuple[str, str]] | None = None) -> list[Prompt]:
    """``per_cell`` valid prompts per (category, setting), ids ``{category}-{setting}-{i:03d}``."""
    rng = np.random.default_rng(seed)
    out: list[Prompt] = []
    for cat_name, setting in cells or [(c.value, s) for c in CATEGORY_ORDER for s in SETTING_ORDER]:
        cat = Category(cat_name)
        m = SETTING_RE.match(setting)
        if m is None:
            raise ValueError(f"setting must look like pos{{P}}_neg{{N}}, got {setting!r}")
        polarities = [Polarity.POSITIVE] * int(m.group(1)) + [Polarity.NEGATED] * int(m.group(2))
        n_objects = len(polarities) + (0 if cat.is_attribute else 1)
        for i in range(per_cell):
            classes = [str(c) for c in rng.choice(BENCHMARK_CLASSES, size=max(n_objects, 1), replace=False)]
            statements: list[AttributeStatement | RelationStatement] = []
            for k, pol in enumerate(polarities):
                if cat.is_attribute:
                    statements.append(AttributeStatement(object=k, value=str(rng.choice(VALUES[cat])), polarity=pol))
                else:
                    pred = str(rng.choice(PREDICATES[cat]))
                    statements.append(RelationStatement(subject=0, target=k + 1, predicate=pred, polarity=pol))
            out.append(
                Prompt(
                    id=f"{cat.value}-{setting}-{i:03d}",
                    prompt="a photo of " + ", ".join(f"a {c}" for c in classes),
                    category=cat,
                    tag=cat.value,
                    objects=tuple(ObjectSpec(class_name=c) for c in classes),
                    statements=tuple(statements),
                )
            )
    return out


def patterns_for(prompt: Prompt) -> list[str]:
    """Failure patterns this prompt admits (e.g. no ``negated_violated`` without a negated statement)."""
    pos, neg = prompt.n_positive > 0, prompt.n_negated > 0
    dz = prompt.category is not None and prompt.category.has_dead_zone
    ok = {
        "negated_violated": neg,
        "positive_violated": pos,
        "both_polarities": pos and neg,
        "over_count": True,
        "undetected_object": True,
        "dead_zone": pos and dz,
    }
    return [p for p in PATTERNS if ok[p]]


def _other(prompt: Prompt, requested: str) -> str:
    assert prompt.category is not None
    pool = VALUES[prompt.category] if prompt.category.is_attribute else PREDICATES[prompt.category]
    return next(v for v in pool if v != requested)


def make_verdict(
    prompt: Prompt, pattern: str | None, *, dead_zone_pass: bool = False, config: RuleConfig = CURRENT
) -> Verdict:
    """A verdict for ``prompt``: correct when ``pattern`` is None, else failing by ``pattern`` (see ``PATTERNS``).

    ``dead_zone_pass`` makes the negated statements of a dead-zone category pass with an empty fired set.
    """
    if pattern is not None and pattern not in patterns_for(prompt):
        raise ValueError(f"pattern {pattern!r} does not apply to {prompt.id} (allowed: {patterns_for(prompt)})")
    bad_obj = 0 if pattern in ("over_count", "undetected_object") else None
    objects = [
        ObjectVerdict(
            index=i,
            class_name=o.class_name,
            requested=o.count,
            present=not (i == bad_obj and pattern == "undetected_object"),
            counted=0 if (i == bad_obj and pattern == "undetected_object") else (2 if i == bad_obj else 1),
            kept=1,
            fallback=False,
            top_score=None if (i == bad_obj and pattern == "undetected_object") else 0.9,
            over_count=i == bad_obj and pattern == "over_count",
            under_count=False,
            exempt=False,
            detections=[] if (i == bad_obj and pattern == "undetected_object") else [i],
        )
        for i, o in enumerate(prompt.objects)
    ]
    first_pos = next((k for k, s in enumerate(prompt.statements) if s.polarity is Polarity.POSITIVE), None)
    first_neg = next((k for k, s in enumerate(prompt.statements) if s.polarity is Polarity.NEGATED), None)
    statements: list[StatementVerdict] = []
    for k, st in enumerate(prompt.statements):
        requested = st.value if isinstance(st, AttributeStatement) else st.predicate
        neg = st.polarity is Polarity.NEGATED
        cause: FailureCause | None = None
        fired: list[str] | None
        if bad_obj is not None and bad_obj in st.object_indices:
            cause = FailureCause.UNDETECTED_OBJECT if pattern == "undetected_object" else FailureCause.OVER_COUNT
            fired = None
        elif k == first_neg and pattern in ("negated_violated", "both_polarities"):
            cause, fired = FailureCause.NEGATED_VIOLATED, [requested]
        elif k == first_pos and pattern in ("positive_violated", "both_polarities"):
            cause, fired = FailureCause.POSITIVE_VIOLATED, [_other(prompt, requested)]
        elif k == first_pos and pattern == "dead_zone":
            cause, fired = FailureCause.DEAD_ZONE, []
        elif neg and dead_zone_pass and prompt.category is not None and prompt.category.has_dead_zone:
            fired = []
        else:
            fired = [_other(prompt, requested)] if neg else [requested]
        statements.append(
            StatementVerdict(
                index=k,
                kind=st.kind,
                polarity=st.polarity,
                text=prompt.describe(k),
                objects=list(st.object_indices),
                requested=requested,
                evaluated=fired is not None,
                fired=fired,
                passed=cause is None,
                cause=cause,
                dead_zone=fired == [] and prompt.category is not None and prompt.category.has_dead_zone,
                measurements={},
            )
        )
    correct = all(o.present and not o.over_count for o in objects) and all(s.passed for s in statements)
    return Verdict(
        prompt_id=prompt.id,
        tag=prompt.tag,
        prompt=prompt.prompt,
        category=prompt.category,
        setting=prompt.setting,
        correct=correct,
        reason="" if correct else f"synthetic {pattern}",
        failure_class=None if correct else row_failure(objects, statements),
        objects=objects,
        statements=statements,
        config=config.record(),
    )


RateFn = Callable[[str, str], float]


def make_results(
    prompts: Sequence[Prompt],
    rate: RateFn | Mapping[tuple[str, str], float],
    *,
    images_per_prompt: int = 4,
    seed: int = 0,
    error_every: int = 0,
    dead_zone_every: int = 3,
    config: RuleConfig = CURRENT,
    models: Mapping[str, Any] | None = None,
) -> Iterator[dict[str, Any]]:
    """Results lines for ``prompts``: exactly ``round(rate(c, s) * n)`` correct images in each cell of n images.

    ``error_every = e > 0`` turns every e-th incorrect image into an error line (prompt id known);
    every ``dead_zone_every``-th image's negated statements pass with nothing fired.
    """
    rng = np.random.default_rng(seed)
    models = dict(DEFAULT_MODELS if models is None else models)
    cells: dict[tuple[str, str], list[Prompt]] = {}
    for p in prompts:
        assert p.category is not None
        cells.setdefault((p.category.value, p.setting), []).append(p)
    number = {p.id: i for i, p in enumerate(prompts)}
    for (cat, setting), group in cells.items():
        target = rate(cat, setting) if callable(rate) else rate[(cat, setting)]
        n = len(group) * images_per_prompt
        ok = np.zeros(n, dtype=bool)
        ok[rng.permutation(n)[: round(target * n)]] = True
        failures = 0
        for j, prompt in enumerate(group):
            allowed = patterns_for(prompt)
            for s in range(images_per_prompt):
                slot = j * images_per_prompt + s
                filename = f"{number[prompt.id]:05d}/samples/{s:04d}.png"
                if ok[slot]:
                    pattern = None
                else:
                    failures += 1
                    if error_every and failures % error_every == 0:
                        yield error_record(
                            filename=filename, error="unreadable image", prompt_id=prompt.id, sample=s,
                            tag=prompt.tag, prompt=prompt.prompt, category=cat, setting=setting,
                            config=config.record(), models=models,
                        )  # fmt: skip
                        continue
                    pattern = allowed[(failures - 1) % len(allowed)]
                dz = bool(dead_zone_every) and slot % dead_zone_every == 0
                verdict = make_verdict(prompt, pattern, dead_zone_pass=dz, config=config)
                yield ok_record(verdict, filename=filename, sample=s, models=models)


def elements_of(record: Mapping[str, Any]) -> list[tuple[str, str, bool]]:
    """(element, polarity, satisfied by the verdict) for each object and statement of an ok results line."""
    out = [
        (f"object:{o['index']}", "positive", bool(o["present"] and not o["over_count"] and not o["under_count"]))
        for o in record["objects"]
    ]
    out += [(f"statement:{s['index']}", str(s["polarity"]), bool(s["passed"])) for s in record["statements"]]
    return out


def make_labels(
    records: Sequence[Mapping[str, Any]],
    *,
    annotators: int = 3,
    pool: int = 36,
    truth_flip: float = 0.08,
    annotator_flip: float = 0.08,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Human-label rows for the ok ``records``: a hidden truth (the verdict, flipped with ``truth_flip``) that each
    annotator reports, flipped with ``annotator_flip``; answers are to the affirmative question."""
    rng = np.random.default_rng(seed)
    rows: list[dict[str, Any]] = []
    for rec in records:
        if rec.get("status") != "ok":
            continue
        who = rng.choice(pool, size=annotators, replace=False)
        for element, polarity, ok in elements_of(rec):
            truth = ok != (rng.random() < truth_flip)
            for a in who:
                satisfied = truth != (rng.random() < annotator_flip)
                answer = satisfied != (polarity == "negated")
                rows.append(
                    {
                        "image": rec["filename"],
                        "element": element,
                        "annotator": f"a{a:02d}",
                        "answer": "yes" if answer else "no",
                    }
                )
    return rows


def make_judge(
    records: Sequence[Mapping[str, Any]],
    labels: Sequence[Mapping[str, Any]],
    *,
    judge: str = "synthetic-judge",
    noise: float = 0.25,
    negation_blind: float = 0.3,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Judge rows in ``whole``, ``pos`` and ``neg`` modes that follow the annotator majority with noise.

    In ``neg`` mode a share ``negation_blind`` of negated statements is answered as if not negated (the
    judge repeats its affirmative answer), the failure mode Table 10 measures.
    """
    rng = np.random.default_rng(seed)
    votes: dict[tuple[str, str], list[bool]] = {}
    for lab in labels:
        votes.setdefault((lab["image"], lab["element"]), []).append(lab["answer"] == "yes")
    rows: list[dict[str, Any]] = []
    for rec in records:
        if rec.get("status") != "ok" or (rec["filename"], "object:0") not in votes:
            continue
        all_ok = True
        for element, polarity, _ in elements_of(rec):
            yes_share = float(np.mean(votes[(rec["filename"], element)]))
            p_yes = float(np.clip(yes_share + rng.normal(0, noise), 0.0, 1.0))
            rows.append(
                {"judge": judge, "mode": "pos", "image": rec["filename"], "element": element, "p_yes": round(p_yes, 4)}
            )
            neg_p = p_yes
            if polarity == "negated" and rng.random() >= negation_blind:
                neg_p = 1.0 - p_yes
            rows.append(
                {"judge": judge, "mode": "neg", "image": rec["filename"], "element": element, "p_yes": round(neg_p, 4)}
            )
            all_ok &= (p_yes > 0.5) != (polarity == "negated")
        whole = float(np.clip((0.7 if all_ok else 0.3) + rng.normal(0, noise), 0.0, 1.0))
        rows.append(
            {"judge": judge, "mode": "whole", "image": rec["filename"], "element": "prompt", "p_yes": round(whole, 4)}
        )
    return rows


SAMPLE_CATEGORY_OFFSET: dict[str, float] = {
    "color": 0.05,
    "material": 0.0,
    "comparative": -0.05,
    "depth": -0.03,
    "directional": 0.02,
    "proximity": -0.02,
}
SAMPLE_MODELS: dict[str, tuple[float, float, float]] = {
    "model-A": (0.85, 0.17, 0.08),
    "model-B": (0.78, 0.15, 0.03),
    "model-C": (0.70, 0.15, 0.10),
}
"""name -> (accuracy at load 1 with no negation, drop per extra statement, drop per negated statement)."""


def sample_rate(model: str, category: str, setting: str) -> float:
    """The known accuracy of a sample model in a cell: ``base - drop_load (P + N - 1) - drop_neg N + offset(category)``,
    clipped to [0.02, 0.95] and rounded to whole percent."""
    base, per_load, per_neg = SAMPLE_MODELS[model]
    m = SETTING_RE.match(setting)
    assert m is not None
    p, n = int(m.group(1)), int(m.group(2))
    value = base - per_load * (p + n - 1) - per_neg * n + SAMPLE_CATEGORY_OFFSET[category]
    return round(min(0.95, max(0.02, value)), 2)


def write_sample(out: str | Path, *, per_cell: int = 25, seed: int = 0) -> list[Path]:
    """Results files of the three sample models (``per_cell`` prompts x 4 images per cell, exact known rates),
    with human labels and judge answers on 120 images of ``model-A``; returns the paths written."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    prompts = make_prompts(per_cell, seed=seed)
    written: list[Path] = []
    first: list[dict[str, Any]] = []
    for k, name in enumerate(SAMPLE_MODELS):
        path = out / f"{name}.jsonl"
        cells = {(p.category.value, p.setting) for p in prompts if p.category is not None}
        rates = {(c, st): sample_rate(name, c, st) for c, st in cells}
        records = list(make_results(prompts, rates, seed=seed + k, error_every=50 if k == 2 else 0))
        path.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records), encoding="utf-8")
        written.append(path)
        if k == 0:
            first = records
    rng = np.random.default_rng(seed)
    chosen = [first[i] for i in sorted(rng.choice(len(first), size=min(120, len(first)), replace=False))]
    labels = make_labels(chosen, seed=seed)
    judge = make_judge(chosen, labels, seed=seed)
    for name, rows in (("labels.jsonl", labels), ("judges.jsonl", judge)):
        path = out / name
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        written.append(path)
    return written


if __name__ == "__main__":  # pragma: no cover
    import sys

    for p in write_sample(sys.argv[1] if len(sys.argv) > 1 else "sample-results"):
        print(p)
