"""Agreement of the evaluator (and of other judges) with human labels: Section 4 and Appendix B.

Inputs
------
Human labels, one row per (image, element, annotator), JSONL or CSV (by suffix)::

    {"image": "00012/samples/0003.png", "element": "statement:1", "annotator": "a07", "answer": "no"}

``image`` is the results line's ``filename`` (or ``prompt_id#sample``, or ``MODEL:filename`` where MODEL is the
results file's name without ``.jsonl``, needed when several results files hold the same filename); ``element`` is
``object:I`` (``include[I]``: is the object there, with the right count?) or ``statement:K``
(``statements[K]``, always asked in its affirmative form, as in the annotation interface:
"is the bench wooden?" for "a non-wooden bench"); ``answer`` is ``yes`` / ``no`` (or true /
false / 1 / 0). An optional ``polarity`` column is checked against the verdict. Element k
is *satisfied* by an answer when ``answer = yes`` for objects and positive statements and
``answer = no`` for negated statements. Every annotator of an image labels all its
elements, and every image has the same number m of annotators.

Judge answers (optional), one row per (judge, mode, image, element)::

    {"judge": "Qwen3-VL-32B", "mode": "pos", "image": "...", "element": "statement:1", "p_yes": 0.93}

``mode`` is ``whole`` (one question for the whole prompt, ``element: "prompt"``), ``pos``
(the per-element questions in affirmative form: the expected answer is yes, except no for
negated statements) or ``neg`` (negated statements asked in negated form: the expected
answer is always yes). ``p_yes`` may be replaced by ``answer``. The probability of the
expected answer is the element's score; it is satisfied when that probability > 0.5.

Score-only evaluators (Table 7's similarity and reward scores, ``negt2i judges run --mode score``) write
``{"judge": "CLIPScore", "mode": "score", "image": "...", "element": "prompt", "score": 0.31}``: any finite
number, higher = better match. They have no binary form (Appendix B.3): only Kendall tau, Spearman rho and
pair accuracy are computed for them; their kappa, accuracy, precision and recall are NaN (shown ``-``).
Run headers of ``negt2i judges run`` (``{"negt2i": "judge-run/1", ...}``) are skipped.

References and scores (Appendix B.1, B.2)
-----------------------------------------
- element reference: strict majority, satisfied iff more than m/2 annotators say so;
- binary image label: every element satisfied; continuous image score: share of satisfied elements;
- an evaluator's binary verdict: NegT2IBench's ``correct``; a judge passes an image when every
  element gets the expected answer (``whole``: p_yes > 0.5); its continuous score is the share of
  elements it marks satisfied (NegT2IBench) or the mean probability of the expected answer (judges);
- Appendix B.2: a judge's statement about an object it answers absent counts as unsatisfied (probability 0),
  so "no bench" does not satisfy "a non-wooden bench" (``absent_objects="independent"`` turns this off);
- H. inter-annotator: each annotator slot (annotators of an image in sorted order) is scored against
  the strict majority of the other m - 1 (with m = 3: satisfied only when both others say so; a 1-1 split
  counts as unsatisfied), and the statistic is averaged over the m slots; ``loo_tie="satisfied"`` counts
  the split as satisfied instead;
- Fleiss' kappa and the unanimous share on the raw answers, per block of elements;
- the negated-question probe (Table 10) of judges answering in both ``pos`` and ``neg`` modes.

Statistics come from ``negt2i.metrics.stats``; intervals are percentile intervals of a bootstrap that
resamples images (the elements of an image stay together), with one set of draws shared by every
evaluator so that differences between evaluators are paired.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from negt2i.core.jsonl import iter_json_lines
from negt2i.metrics.benchmark import category_order, setting_order
from negt2i.metrics.bootstrap import percentile_interval
from negt2i.metrics.records import ImageRow
from negt2i.metrics.stats import (
    binary_scores,
    confusion,
    fleiss_kappa,
    kendall_tau,
    rank_scores,
    resample_weights,
    spearman_rho,
    spearman_rows,
)

ELEMENT_RE = re.compile(r"^(object|statement):(\d+)$")
MODES: tuple[str, ...] = ("whole", "pos", "neg")
SCORE_MODE = "score"
"""The mode of score-only evaluators (similarity and reward scores): rank statistics only."""
RUN_HEADER = "judge-run/1"
OURS = "NegT2IBench"
BLOCKS: tuple[str, ...] = ("objects", "statements", "affirmative", "negated", "asserted", "all")
"""Element blocks: object questions, all statements, positive statements, negated statements, and the paper's
two blocks of Tables 5 and 13: ``asserted`` (objects and positive statements, the questions whose satisfying
answer is yes: Table 13's "Affirmative statements", n = 2249 of 2772) and ``all`` (every element)."""

Bool = NDArray[np.bool_]
Float = NDArray[np.float64]


class AgreementInputError(ValueError):
    """Malformed or inconsistent labels / judge answers; names the file and line."""


@dataclass(frozen=True, slots=True)
class LabelRow:
    image: str
    element: str
    annotator: str
    answer: bool
    polarity: str | None
    where: str


@dataclass(frozen=True, slots=True)
class JudgeRow:
    judge: str
    mode: str
    image: str
    element: str
    p_yes: float
    where: str
    seconds: float | None = None
    """Optional cost fields: wall-clock seconds of this question, peak GPU memory (GiB), parameter count."""
    gpu_gib: float | None = None
    params: str | None = None
    score: float | None = None
    """A score-only evaluator's score (``mode == "score"``; ``p_yes`` is NaN then)."""


def _rows(path: str | Path) -> Iterable[tuple[str, Mapping[str, Any]]]:
    p = Path(path)
    if p.suffix.lower() == ".csv":
        with p.open(newline="", encoding="utf-8") as fh:
            for lineno, rec in enumerate(csv.DictReader(fh), start=2):
                yield f"{p}:{lineno}", {k: v for k, v in rec.items() if v not in (None, "")}
        return
    for line in iter_json_lines(p):
        if line.error is not None:
            raise AgreementInputError(f"{p}:{line.lineno}: {line.error}")
        if not isinstance(line.value, dict):
            raise AgreementInputError(f"{p}:{line.lineno}: expected a JSON object")
        yield f"{p}:{line.lineno}", line.value


def _field(rec: Mapping[str, Any], key: str, where: str) -> str:
    if key not in rec or rec[key] is None or str(rec[key]) == "":
        raise AgreementInputError(f"{where}: missing field {key!r}")
    return str(rec[key])


_YES = {"yes": True, "y": True, "true": True, "1": True, "no": False, "n": False, "false": False, "0": False}


def _answer(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    key = str(value).strip().lower()
    if key not in _YES:
        raise AgreementInputError(f"{where}: answer must be yes or no, got {value!r}")
    return _YES[key]


def read_labels(path: str | Path) -> list[LabelRow]:
    """Human labels (format in the module docstring); a repeated (image, element, annotator) is an error."""
    out: list[LabelRow] = []
    seen: dict[tuple[str, str, str], str] = {}
    for where, rec in _rows(path):
        image, element, annotator = (_field(rec, k, where) for k in ("image", "element", "annotator"))
        if not ELEMENT_RE.match(element):
            raise AgreementInputError(f"{where}: element must be object:I or statement:K, got {element!r}")
        polarity = rec.get("polarity")
        if polarity is not None and polarity not in ("positive", "negated"):
            raise AgreementInputError(f"{where}: polarity must be positive or negated, got {polarity!r}")
        key = (image, element, annotator)
        if key in seen:
            raise AgreementInputError(
                f"{where}: annotator {annotator} labels {image} {element} again (first at {seen[key]})"
            )
        seen[key] = where
        out.append(LabelRow(image, element, annotator, _answer(_field(rec, "answer", where), where), polarity, where))
    if not out:
        raise AgreementInputError(f"{path}: no labels")
    return out


def read_judges(path: str | Path) -> list[JudgeRow]:
    """Judge answers (format in the module docstring)."""
    out: list[JudgeRow] = []
    for where, rec in _rows(path):
        if rec.get("negt2i") == RUN_HEADER:
            continue
        judge, mode, image, element = (_field(rec, k, where) for k in ("judge", "mode", "image", "element"))
        if mode not in (*MODES, SCORE_MODE):
            raise AgreementInputError(f"{where}: mode must be one of {', '.join((*MODES, SCORE_MODE))}, got {mode!r}")
        if (mode in ("whole", SCORE_MODE)) != (element == "prompt"):
            raise AgreementInputError(
                f"{where}: mode {mode} goes with element "
                f"{'prompt' if mode in ('whole', SCORE_MODE) else 'object:I / statement:K'}, got {element!r}"
            )
        score: float | None = None
        if mode == SCORE_MODE:
            try:
                score = float(rec["score"])
            except KeyError:
                raise AgreementInputError(f"{where}: a score-mode row needs a score") from None
            except (TypeError, ValueError):
                raise AgreementInputError(f"{where}: score must be a number, got {rec['score']!r}") from None
            if not np.isfinite(score):
                raise AgreementInputError(f"{where}: score must be finite, got {rec['score']!r}")
            p = float("nan")
        elif "p_yes" in rec:
            try:
                p = float(rec["p_yes"])
            except (TypeError, ValueError):
                raise AgreementInputError(f"{where}: p_yes must be a number, got {rec['p_yes']!r}") from None
            if not 0.0 <= p <= 1.0:
                raise AgreementInputError(f"{where}: p_yes must be in [0, 1], got {p}")
        elif "answer" in rec:
            p = 1.0 if _answer(rec["answer"], where) else 0.0
        else:
            raise AgreementInputError(f"{where}: needs p_yes or answer")
        cost: dict[str, float | None] = {}
        for key in ("seconds", "gpu_gib"):
            if rec.get(key) is not None:  # null: not measured (gpu_gib off CUDA)
                try:
                    cost[key] = float(rec[key])
                except (TypeError, ValueError):
                    raise AgreementInputError(f"{where}: {key} must be a number, got {rec[key]!r}") from None
                if not cost[key] >= 0:  # type: ignore[operator]
                    raise AgreementInputError(f"{where}: {key} must be >= 0, got {rec[key]!r}")
        params = str(rec["params"]) if rec.get("params") not in (None, "") else None
        out.append(
            JudgeRow(judge, mode, image, element, p, where, cost.get("seconds"), cost.get("gpu_gib"), params, score)
        )
    return out


def read_judge_runs(path: str | Path) -> list[dict[str, Any]]:
    """The run headers of a judge file written by ``negt2i judges run`` (load time, model, revision, ...)."""
    return [dict(rec) for _, rec in _rows(path) if rec.get("negt2i") == RUN_HEADER]


def judge_costs(
    judges: Sequence[JudgeRow], questions_per_image: float, runs: Sequence[Mapping[str, Any]] = ()
) -> dict[str, dict[str, Any]]:
    """Table 2 / Table 8 cost columns per judge, from the optional cost fields of its rows (Appendix B.4):
    params (first given), GiB (peak over rows), s/Q (mean seconds over its per-element questions; a score-only
    evaluator's over its images), s/img = s/Q x ``questions_per_image`` (the mean number of element questions
    per image of the study; a score-only evaluator's s/img is its s/Q: one call per image), and the model load
    time (mean ``load_seconds`` of the judge's run headers ``runs``, Table 8's Load (s))."""
    out: dict[str, dict[str, Any]] = {}
    for judge in sorted({j.judge for j in judges}):
        rows = [j for j in judges if j.judge == judge]
        score_only = all(j.mode == SCORE_MODE for j in rows)
        secs = [j.seconds for j in rows if j.seconds is not None and j.mode != "whole"]
        gib = [j.gpu_gib for j in rows if j.gpu_gib is not None]
        params = next((j.params for j in rows if j.params), None)
        s_q = float(np.mean(secs)) if secs else None
        loads = [
            float(r["load_seconds"]) for r in runs if r.get("judge") == judge and r.get("load_seconds") is not None
        ]
        out[judge] = {
            "params": params,
            "gpu_gib": max(gib) if gib else None,
            "s_per_question": s_q,
            "s_per_image": None if s_q is None else (s_q if score_only else s_q * questions_per_image),
        }
        if loads:
            out[judge]["load_seconds"] = float(np.mean(loads))
    return out


@dataclass(slots=True)
class Decisions:
    """One evaluator's decisions: per image (binary, continuous) and, for per-element evaluators, per element.
    Score-only evaluators have no binary decision (``image_binary`` None)."""

    image_binary: Bool | None
    image_score: Float
    element_binary: Bool | None = None
    element_p_yes: Float | None = None
    """A judge's probability of "yes" per element, as asked (for the negated-question probe)."""


@dataclass(slots=True)
class Study:
    """Labels, verdicts and judge answers aligned on images and elements."""

    images: list[str]
    category: list[str | None]
    setting: list[str | None]
    element_image: NDArray[np.intp]
    element_name: list[str]
    element_block: list[str]
    """``objects``, ``affirmative`` or ``negated``."""
    element_objects: list[tuple[int, ...]]
    """The ``include`` indices each element is about: ``(I,)`` for ``object:I``, the statement's objects for
    ``statement:K`` (empty when the results do not record them)."""
    answers: Bool
    """(elements, m) raw yes answers, annotators of each image in sorted order."""
    satisfied: Bool
    """(elements, m) whether each annotator's answer satisfies the element."""
    evaluators: dict[str, Decisions] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    @property
    def n_annotators(self) -> int:
        return int(self.answers.shape[1])


def per_image(values: NDArray[Any], element_image: NDArray[np.intp], n_images: int) -> tuple[Bool, Float]:
    """(all elements true, mean over elements) per image, from per-element bool or float values."""
    v = np.asarray(values, dtype=np.float64)
    count = np.bincount(element_image, minlength=n_images).astype(np.float64)
    total = np.bincount(element_image, weights=v, minlength=n_images)
    worst = np.ones(n_images)
    np.minimum.at(worst, element_image, v)
    return worst > 0.5, total / count


ABSENT_RULES: tuple[str, ...] = ("unsatisfied", "independent")
"""How a judge's statement about an object it calls absent is scored: ``unsatisfied`` (Appendix B.2, the
default) or ``independent`` (each element on its own, the rule before issue 22: success by omission)."""


def results_model(source: str | Path) -> str:
    """The model a results file holds, as image keys ``MODEL:filename`` name it: the file name without
    ``.jsonl`` (``runs/flux2-dev.jsonl`` -> ``flux2-dev``)."""
    name = Path(source).name
    return name.removesuffix(".jsonl").removesuffix(".json")


def build_study(
    labels: Sequence[LabelRow],
    rows: Iterable[ImageRow],
    judges: Sequence[JudgeRow] = (),
    *,
    absent_objects: str = "unsatisfied",
    allow_partial: bool = False,
) -> Study:
    """Align labels with verdicts (and judge answers); every label must name a judged image and element.

    ``absent_objects`` is the judge scoring rule of ``_add_judges`` (one of ``ABSENT_RULES``). A labelled image
    must have labels for all its elements unless ``allow_partial`` (then the missing ones are warned about)."""
    if absent_objects not in ABSENT_RULES:
        raise ValueError(f"absent_objects must be one of {', '.join(ABSENT_RULES)}, got {absent_objects!r}")
    by_name: dict[str, ImageRow] = {}
    ambiguous: dict[str, list[str]] = {}
    for row in rows:
        qualified = f"{results_model(row.source)}:{row.filename}"
        if qualified in by_name:
            raise AgreementInputError(f"{row.where}: image {row.filename!r} is also at {by_name[qualified].where}")
        by_name[qualified] = row
        for name in (row.filename, row.key):
            other = by_name.setdefault(name, row)
            if other is not row and other.source != row.source:
                ambiguous.setdefault(name, [results_model(other.source)]).append(results_model(row.source))
    warnings: list[str] = []
    grouped: dict[str, dict[str, dict[str, LabelRow]]] = {}
    for lab in labels:
        if lab.image not in by_name:
            raise AgreementInputError(f"{lab.where}: image {lab.image!r} is not in the results")
        if lab.image in ambiguous:
            raise AgreementInputError(
                f"{lab.where}: image {lab.image!r} is in several results files ({', '.join(ambiguous[lab.image])}); "
                f"name it MODEL:filename, e.g. {ambiguous[lab.image][0]}:{lab.image}"
            )
        grouped.setdefault(lab.image, {}).setdefault(lab.element, {})[lab.annotator] = lab
    images = sorted(grouped)
    m_values = set()
    el_image: list[int] = []
    el_name: list[str] = []
    el_block: list[str] = []
    el_objects: list[tuple[int, ...]] = []
    answers: list[list[bool]] = []
    ours_el: list[bool] = []
    for i, image in enumerate(images):
        row = by_name[image]
        if row.status == "error":
            warnings.append(f"{image}: the results have an error line for this image; all its elements count as failed")
        annot = sorted({a for per in grouped[image].values() for a in per})
        m_values.add(len(annot))
        for element in sorted(grouped[image], key=_element_order):
            per = grouped[image][element]
            if set(per) != set(annot):
                missing = ", ".join(sorted(set(annot) - set(per)))
                raise AgreementInputError(
                    f"{image}: annotators {missing} did not label {element}; every annotator labels every element"
                )
            kind, k = ELEMENT_RE.match(element).groups()  # type: ignore[union-attr]
            idx = int(k)
            objs: tuple[int, ...] = (idx,) if kind == "object" else ()
            if row.status == "error":
                polarity = next((p.polarity for p in per.values() if p.polarity), "positive")
                ok = False
            elif kind == "object":
                if idx >= len(row.objects_ok):
                    raise AgreementInputError(
                        f"{per[annot[0]].where}: {image} has {len(row.objects_ok)} objects, no {element}"
                    )
                polarity, ok = "positive", row.objects_ok[idx]
            else:
                if idx >= len(row.statements):
                    raise AgreementInputError(
                        f"{per[annot[0]].where}: {image} has {len(row.statements)} statements, no {element}"
                    )
                polarity, ok = row.statements[idx].polarity, row.statements[idx].passed
                objs = row.statements[idx].objects
            for lab in per.values():
                if lab.polarity is not None and lab.polarity != polarity:
                    raise AgreementInputError(
                        f"{lab.where}: polarity {lab.polarity} but the verdict says {element} is {polarity}"
                    )
            el_image.append(i)
            el_name.append(element)
            el_block.append("objects" if kind == "object" else ("negated" if polarity == "negated" else "affirmative"))
            el_objects.append(objs)
            answers.append([per[a].answer for a in annot])
            ours_el.append(ok)
        if row.status == "ok":
            n_el = len(row.objects_ok) + len(row.statements)
            if len(grouped[image]) < n_el:
                names = [f"object:{i}" for i in range(len(row.objects_ok))]
                names += [f"statement:{k}" for k in range(len(row.statements))]
                lacking = ", ".join(e for e in names if e not in grouped[image])
                if not allow_partial:
                    raise AgreementInputError(
                        f"{image}: no labels for {lacking} ({n_el - len(grouped[image])} of its {n_el} elements); "
                        "every element of a labelled image needs labels (allow_partial / --allow-partial scores "
                        "the labelled elements only)"
                    )
                warnings.append(f"{image}: {n_el - len(grouped[image])} of its {n_el} elements are not labelled")
    if len(m_values) != 1:
        raise AgreementInputError(f"every image needs the same number of annotators, got {sorted(m_values)}")
    ans = np.array(answers, dtype=bool)
    negated = np.array([b == "negated" for b in el_block])
    study = Study(
        images=images,
        category=[by_name[im].category for im in images],
        setting=[by_name[im].setting for im in images],
        element_image=np.array(el_image, dtype=np.intp),
        element_name=el_name,
        element_block=el_block,
        element_objects=el_objects,
        answers=ans,
        satisfied=ans ^ negated[:, None],
        warnings=warnings,
    )
    ours = np.array(ours_el, dtype=bool)
    _, score = per_image(ours, study.element_image, len(images))
    binary = np.array([by_name[im].correct for im in images], dtype=bool)
    study.evaluators[OURS] = Decisions(binary, score, ours)
    _add_judges(study, judges, absent_objects=absent_objects, known=set(by_name))
    return study


def _element_order(element: str) -> tuple[int, int]:
    kind, k = element.split(":")
    return (0 if kind == "object" else 1, int(k))


def _add_judges(
    study: Study, judges: Sequence[JudgeRow], *, absent_objects: str = "unsatisfied", known: set[str] | None = None
) -> None:
    """Each (judge, mode) as an evaluator.

    Per element (``pos`` / ``neg``): p_correct = p_yes, except 1 - p_yes for a negated statement asked
    affirmatively (``pos``); satisfied iff p_correct > 0.5. With ``absent_objects="unsatisfied"``
    (Appendix B.2) a statement about an object the judge calls absent (that object's own question answered
    p_correct <= 0.5) counts as unsatisfied, p_correct := 0, so "no bench" cannot satisfy "a non-wooden
    bench" by omission. Image: binary = every element satisfied; score = mean p_correct over its elements.
    ``whole``: binary = p_yes > 0.5, score = p_yes.
    """
    groups: dict[tuple[str, str], dict[tuple[str, str], JudgeRow]] = {}
    for j in judges:
        key = (j.image, j.element)
        group = groups.setdefault((j.judge, j.mode), {})
        if key in group:
            raise AgreementInputError(
                f"{j.where}: {j.judge} ({j.mode}) answers {j.image} {j.element} again (first at {group[key].where})"
            )
        group[key] = j
    n = len(study.images)
    negated = np.array([b == "negated" for b in study.element_block])
    labelled = set(study.images)
    if known is not None:
        unknown = sorted({j.image for j in judges} - known)
        if unknown:
            first = next(j for j in judges if j.image == unknown[0])
            raise AgreementInputError(
                f"{first.where}: the judge file answers {len(unknown)} images the results do not have, e.g. "
                f"{unknown[0]!r}; give the results files those images were judged in (or drop those answers)"
            )
    for (judge, mode), answers in sorted(groups.items()):
        name = f"{judge} ({mode})"
        extra = {im for im, _ in answers} - labelled
        if extra:
            study.warnings.append(f"{name} answers {len(extra)} images that are not labelled (ignored)")
        if mode in ("whole", SCORE_MODE):
            missing = [im for im in study.images if (im, "prompt") not in answers]
            if missing:
                raise AgreementInputError(f"{name} has no answer for {len(missing)} labelled images, e.g. {missing[0]}")
            if mode == SCORE_MODE:
                s = np.array([answers[(im, "prompt")].score for im in study.images], dtype=np.float64)
                study.evaluators[name] = Decisions(None, s)
                continue
            p = np.array([answers[(im, "prompt")].p_yes for im in study.images])
            study.evaluators[name] = Decisions(p > 0.5, p)
            continue
        keys = [(study.images[i], e) for i, e in zip(study.element_image, study.element_name, strict=True)]
        missing_el = [k for k in keys if k not in answers]
        if missing_el:
            raise AgreementInputError(
                f"{name} has no answer for {len(missing_el)} labelled elements, "
                f"e.g. {missing_el[0][0]} {missing_el[0][1]}"
            )
        p_yes = np.array([answers[k].p_yes for k in keys])
        p_correct = np.where(negated & (mode == "pos"), 1.0 - p_yes, p_yes)
        if absent_objects == "unsatisfied":
            p_correct = _absent_objects_unsatisfied(study, name, answers, p_correct)
        el = p_correct > 0.5
        binary, _ = per_image(el, study.element_image, n)
        _, score = per_image(p_correct, study.element_image, n)
        study.evaluators[name] = Decisions(binary, score, el, p_yes)


def _absent_objects_unsatisfied(
    study: Study, name: str, answers: Mapping[tuple[str, str], JudgeRow], p_correct: Float
) -> Float:
    """Appendix B.2: a statement element whose object the judge answers absent (p_yes <= 0.5 to ``object:I``,
    labelled or not) gets p_correct 0. Objects the judge did not answer leave the statement as it is (warned)."""
    out = p_correct.copy()
    unknown = 0
    for e, (i, element) in enumerate(zip(study.element_image, study.element_name, strict=True)):
        if not element.startswith("statement:"):
            continue
        objs = study.element_objects[e]
        if not objs:
            unknown += 1
            continue
        for o in objs:
            ans = answers.get((study.images[i], f"object:{o}"))
            if ans is None:
                unknown += 1
                break
            if ans.p_yes <= 0.5:
                out[e] = 0.0
                break
    if unknown:
        study.warnings.append(
            f"{name}: {unknown} statements could not be checked against the judge's object answers (no object:I "
            "answer, or results without statement objects); they are scored on their own"
        )
    return out


def human_reference(satisfied: Bool, element_image: NDArray[np.intp], n_images: int) -> tuple[Bool, Bool, Float]:
    """(element majority, binary image label, continuous image score); majority is strict: more than half."""
    majority = satisfied.mean(axis=1) > 0.5
    binary, score = per_image(majority, element_image, n_images)
    return majority, binary, score


BINARY_KEYS: tuple[str, ...] = ("tp", "tn", "fp", "fn")


def _image_stats(ref_bin: Bool, ref_score: Float, dec_bin: Bool | None, dec_score: Float) -> dict[str, Any]:
    """Binary and rank agreement of one evaluator on images; without ``dec_bin`` (a score-only evaluator) the
    binary statistics are NaN and the counts None."""
    if dec_bin is None:
        nan = binary_scores(0, 0, 0, 0)
        out: dict[str, Any] = {"n": len(ref_bin), **dict.fromkeys(BINARY_KEYS), **{k: float("nan") for k in nan}}
    else:
        counts = confusion(ref_bin, dec_bin)
        out = {"n": len(ref_bin), **{k: int(v) for k, v in counts.items()}}
        out.update({k: _num(v) for k, v in binary_scores(**counts).items()})
    out["kendall_tau"] = kendall_tau(ref_score, dec_score) if len(ref_bin) > 1 else float("nan")
    out["spearman_rho"] = spearman_rho(ref_score, dec_score) if len(ref_bin) > 1 else float("nan")
    out["pair_accuracy"] = _num(rank_scores(ref_score, dec_score)["pair_accuracy"])
    return out


def _element_stats(ref: Bool, dec: Bool) -> dict[str, Any]:
    s = binary_scores(**confusion(ref, dec))
    sat, unsat = _num(s["recall"]), _num(s["specificity"])
    return {
        "n": len(ref),
        "accuracy": _num(s["accuracy"]),
        "kappa": _num(s["kappa"]),
        "satisfied": sat,
        "unsatisfied": unsat,
        "balanced": (sat + unsat) / 2,
    }


def _num(v: Any) -> float:
    return float(np.asarray(v))


LOO_TIES: tuple[str, ...] = ("unsatisfied", "satisfied")
"""Leave-one-out tie rule: how a tie among the other annotators (a 1-1 split of the two others when m = 3)
counts as the held-out annotator's reference: ``unsatisfied`` (strict majority, the default) or ``satisfied``."""


def loo_reference(others: Bool, tie: str = "unsatisfied") -> Bool:
    """Reference of the held-out annotator per element from the other annotators' satisfied flags (elements, m-1):
    satisfied iff more than half say so, or exactly half when ``tie == "satisfied"``."""
    share = others.mean(axis=1)
    return np.asarray((share > 0.5) | ((share == 0.5) & (tie == "satisfied")))


def _loo(study: Study, images: Bool, elements: Bool, tie: str = "unsatisfied") -> dict[str, Any]:
    """H. inter-annotator on a subset: each annotator slot against the majority of the others (ties by ``tie``),
    averaged over the slots."""
    m = study.n_annotators
    if m < 2:
        return {}
    el_mask = elements & images[study.element_image]
    keep_img = np.unique(study.element_image[el_mask])
    if not len(keep_img):
        return {}
    remap = -np.ones(len(study.images), dtype=np.intp)
    remap[keep_img] = np.arange(len(keep_img))
    el_img = remap[study.element_image[el_mask]]
    image_runs: list[dict[str, Any]] = []
    element_runs: list[dict[str, Any]] = []
    for s in range(m):
        held = study.satisfied[el_mask, s]
        others = np.delete(study.satisfied[el_mask], s, axis=1)
        ref_el = loo_reference(others, tie)
        ref_bin, ref_score = per_image(ref_el, el_img, len(keep_img))
        held_bin, held_score = per_image(held, el_img, len(keep_img))
        image_runs.append(_image_stats(ref_bin, ref_score, held_bin, held_score))
        element_runs.append(_element_stats(ref_el, held))
    keys = ("kappa", "accuracy", "called_correct", "kendall_tau", "spearman_rho", "pair_accuracy")
    return {
        "image": {k: float(np.mean([r[k] for r in image_runs])) for k in keys},
        "element": {k: float(np.mean([r[k] for r in element_runs])) for k in ("kappa", "accuracy")},
    }


def _block_mask(study: Study, block: str) -> Bool:
    b = np.array(study.element_block)
    if block == "statements":
        return np.asarray(b != "objects")
    if block == "asserted":
        return np.asarray(b != "negated")
    if block == "all":
        return np.ones(len(b), dtype=bool)
    return np.asarray(b == block)


def analyze(
    study: Study, *, n_resamples: int = 1000, seed: int = 0, confidence: float = 0.95, loo_tie: str = "unsatisfied"
) -> dict[str, Any]:
    """Every agreement number of the study as a JSON-ready dict (see the module docstring).

    ``loo_tie`` is the leave-one-out tie rule of the inter-annotator score (one of ``LOO_TIES``)."""
    if loo_tie not in LOO_TIES:
        raise ValueError(f"loo_tie must be one of {', '.join(LOO_TIES)}, got {loo_tie!r}")
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be at least 1, got {n_resamples}")
    n = len(study.images)
    majority, ref_bin, ref_score = human_reference(study.satisfied, study.element_image, n)
    all_images = np.ones(n, dtype=bool)
    all_elements = np.ones(len(study.element_name), dtype=bool)
    rng = np.random.default_rng(seed)
    idx, w = resample_weights(n, n_resamples, rng)
    w_el = w[:, study.element_image]

    image_level: dict[str, Any] = {}
    replicates: dict[str, dict[str, Float]] = {}
    for name, dec in study.evaluators.items():
        point = _image_stats(ref_bin, ref_score, dec.image_binary, dec.image_score)
        if dec.image_binary is None:
            rep = {k: np.full(n_resamples, np.nan) for k in binary_scores(0, 0, 0, 0)}
        else:
            rep = {
                k: np.asarray(v, dtype=np.float64)
                for k, v in binary_scores(**confusion(ref_bin, dec.image_binary, w)).items()
            }
        rep.update({k: np.asarray(v, dtype=np.float64) for k, v in rank_scores(ref_score, dec.image_score, w).items()})
        rep["spearman_rho"] = spearman_rows(ref_score[idx], dec.image_score[idx])
        replicates[name] = rep
        stats_keys = ("kappa", "accuracy", "precision", "recall", "kendall_tau", "spearman_rho", "pair_accuracy")
        point["interval"] = {k: percentile_interval(rep[k], confidence) for k in stats_keys}
        image_level[name] = point

    element_level: dict[str, Any] = {}
    for block in BLOCKS:
        mask = _block_mask(study, block)
        if not mask.any():
            continue
        entry: dict[str, Any] = {"n": int(mask.sum()), "evaluators": {}}
        for name, dec in study.evaluators.items():
            if dec.element_binary is None:
                continue
            st = _element_stats(majority[mask], dec.element_binary[mask])
            rep = binary_scores(**confusion(majority[mask], dec.element_binary[mask], w_el[:, mask]))["kappa"]
            st["kappa_interval"] = percentile_interval(np.asarray(rep, dtype=np.float64), confidence)
            entry["evaluators"][name] = st
        entry["inter_annotator"] = _annotators(study, mask, loo_tie)
        element_level[block] = entry

    return {
        "images": n,
        "elements": {b: int(_block_mask(study, b).sum()) for b in BLOCKS},
        "annotators_per_image": study.n_annotators,
        "human_accept_rate": float(ref_bin.mean()),
        "bootstrap": {"n_resamples": n_resamples, "seed": seed, "confidence": confidence, "unit": "image"},
        "image_level": image_level,
        "inter_annotator": _loo(study, all_images, all_elements, loo_tie),
        "leave_one_out_tie": loo_tie,
        "differences": _differences(study, replicates, image_level, confidence),
        "negation_probe": negation_probe(study),
        "by_setting": _breakdown(study, study.setting, ref_bin, ref_score, setting_order, tie=loo_tie),
        "by_category": _breakdown(study, study.category, ref_bin, ref_score, category_order, tie=loo_tie),
        "element_level": element_level,
        "warnings": list(study.warnings),
    }


def negation_probe(study: Study) -> dict[str, Any]:
    """Table 10, for each judge answering in both ``pos`` and ``neg`` modes, over the negated statements.

    flip = share of negated statements whose yes / no answer (p_yes > 0.5) changes between the affirmative and
    the negated wording; complementarity error = mean |p_pos + p_neg - 1| (0 when the answers are complementary).
    """
    negated = np.array([b == "negated" for b in study.element_block])
    out: dict[str, Any] = {}
    for name, dec in study.evaluators.items():
        if not name.endswith(" (pos)"):
            continue
        judge = name[: -len(" (pos)")]
        neg = study.evaluators.get(f"{judge} (neg)")
        if neg is None or dec.element_p_yes is None or neg.element_p_yes is None or not negated.any():
            continue
        assert dec.image_binary is not None and neg.image_binary is not None
        p_pos, p_neg = dec.element_p_yes[negated], neg.element_p_yes[negated]
        out[judge] = {
            "n": int(negated.sum()),
            "flip": float(np.mean((p_pos > 0.5) != (p_neg > 0.5))),
            "complementarity_error": float(np.mean(np.abs(p_pos + p_neg - 1.0))),
            "called_correct_pos": float(dec.image_binary.mean()),
            "called_correct_neg": float(neg.image_binary.mean()),
        }
    return out


def _annotators(study: Study, mask: Bool, tie: str = "unsatisfied") -> dict[str, Any]:
    ans = study.answers[mask]
    m = study.n_annotators
    yes = ans.sum(axis=1)
    out: dict[str, Any] = {"n": int(mask.sum()), "unanimous": float(np.mean((yes == 0) | (yes == m)))}
    out["fleiss_kappa"] = fleiss_kappa(np.stack([yes, m - yes], axis=1)) if m >= 2 else float("nan")
    loo = _loo(study, np.ones(len(study.images), dtype=bool), mask, tie)
    out["leave_one_out_kappa"] = loo.get("element", {}).get("kappa", float("nan"))
    out["leave_one_out_accuracy"] = loo.get("element", {}).get("accuracy", float("nan"))
    return out


def _differences(
    study: Study, replicates: dict[str, dict[str, Float]], point: dict[str, Any], confidence: float
) -> dict[str, Any]:
    """Paired differences on the same image resamples: each judge minus NegT2IBench, and neg minus pos per judge."""
    pairs: list[tuple[str, str]] = [(name, OURS) for name in study.evaluators if name != OURS]
    for name in study.evaluators:
        if name.endswith(" (neg)"):
            pos = name[: -len(" (neg)")] + " (pos)"
            if pos in study.evaluators:
                pairs.append((name, pos))
    out: dict[str, Any] = {}
    for a, b in pairs:
        out[f"{a} - {b}"] = {
            k: {
                "value": point[a][k] - point[b][k],
                "interval": percentile_interval(replicates[a][k] - replicates[b][k], confidence),
            }
            for k in ("kappa", "kendall_tau", "spearman_rho", "pair_accuracy")
        }
    return out


def _breakdown(
    study: Study,
    groups: Sequence[str | None],
    ref_bin: Bool,
    ref_score: Float,
    order: Callable[[str], Any],
    *,
    tie: str = "unsatisfied",
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    labels = np.array([g or "-" for g in groups])
    all_elements = np.ones(len(study.element_name), dtype=bool)
    for g in sorted(set(labels.tolist()), key=order):
        mask = labels == g
        entry: dict[str, Any] = {"n": int(mask.sum()), "evaluators": {}}
        for name, dec in study.evaluators.items():
            dec_bin = None if dec.image_binary is None else dec.image_binary[mask]
            s = _image_stats(ref_bin[mask], ref_score[mask], dec_bin, dec.image_score[mask])
            entry["evaluators"][name] = {k: s[k] for k in ("kappa", "accuracy", "kendall_tau", "spearman_rho")}
        entry["inter_annotator"] = _loo(study, mask, all_elements, tie).get("image", {})
        out[g] = entry
    return out
