"""The labelling kit: a stratified sample of judged images as a static HTML task, and importing the answers.

``export_task`` writes ``TASK_DIR`` with

- ``index.html``: the labelling page (``negt2i.annotation.page``), self-contained (inline script and style, the
  task inline as JSON), in the layout of the paper's Figure 7: the prompt in full, the image, one yes / no
  question per object and per statement, asked affirmatively; progress is kept in the browser's
  localStorage; the export buttons download the labels file ``negt2i agreement`` reads (JSONL or CSV);
- ``images/tNNNN.<ext>``: copies of the sampled images under neutral names, in shuffled order, so neither the
  generator nor the sample order shows;
- ``task.json``: the manifest (``labels-task/1``): every item with its image key (what ``negt2i agreement``
  matches against the results), prompt, digest and questions, the inputs with SHA-256, seed and strata;
- ``crowd.csv``: one row per image for crowd platforms: ``item_id, image_file, prompt, n_questions`` and
  ``qN_element`` / ``qN_text`` for N = 1 .. the most questions of an item (empty where an item has fewer).

``import_labels`` reads answers (page exports, JSONL or CSV, or crowd-platform CSVs) and validates them
against the manifest: every image answered by exactly m annotators, every element of an answered image
answered by each of them, annotator ids well formed, no conflicting repeats, nothing outside the task.
"""

from __future__ import annotations

import csv
import hashlib
import json
import random
import re
import shutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from negt2i import __version__
from negt2i.annotation.questions import (
    PromptQuestions,
    check_questions,
    element_questions,
    prompt_digest,
    prompt_of_metadata,
)
from negt2i.core.results import read_results
from negt2i.metrics.agreement import AgreementInputError, read_labels, results_model

TASK_FORMAT = "labels-task/1"
STRATA: tuple[str, ...] = ("category", "setting", "model")
ANNOTATOR_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")
"""Annotator ids: 1-64 characters, letters, digits, ``_ . @ -``, starting with a letter or digit."""
MAX_SAMPLE = 100_000


class TaskError(ValueError):
    """Bad input to the labelling kit; the message names the file and what is wrong."""


@dataclass(frozen=True, slots=True)
class Candidate:
    image: str
    """The key ``negt2i agreement`` matches: the results filename, or ``MODEL:filename`` for several results."""
    path: Path
    model: str
    record: Mapping[str, Any]
    where: str


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def model_name(results: Path) -> str:
    """A results file's model, for ``--stratify model`` and image keys: the file name without suffix."""
    return results_model(results)


def candidates(results: Sequence[Path], images: Sequence[Path]) -> list[Candidate]:
    """Judged (``ok``) images of the results files; ``images`` is one folder for all or one per results file."""
    if len(images) not in (1, len(results)):
        raise TaskError(f"give one --images folder, or one per results file ({len(results)}), not {len(images)}")
    models = [model_name(p) for p in results]
    if len(set(models)) != len(models):
        raise TaskError(f"two results files have the same name ({', '.join(models)}); the name is the model")
    out: list[Candidate] = []
    for k, path in enumerate(results):
        folder = images[k if len(images) > 1 else 0]
        if not folder.is_dir():
            raise TaskError(f"--images {folder}: not a folder")
        for n, rec in enumerate(read_results(path), start=1):
            if rec.get("status") != "ok":
                continue
            filename = str(rec["filename"])
            image = filename if len(results) == 1 else f"{models[k]}:{filename}"
            out.append(Candidate(image, folder / filename, models[k], rec, f"{path}:{n}"))
    if not out:
        raise TaskError("the results have no judged images to label")
    return out


def stratified_sample(items: Sequence[Candidate], n: int, strata: Sequence[str], seed: int) -> list[Candidate]:
    """``n`` items spread as evenly as possible over the strata: each stratum shuffled (``seed``), then one item
    per stratum in turn (strata in sorted order), until ``n`` are taken or all are used."""
    for s in strata:
        if s not in STRATA:
            raise TaskError(f"--stratify: unknown stratum {s!r}; use any of {', '.join(STRATA)}")
    rng = random.Random(seed)
    groups: dict[tuple[str, ...], list[Candidate]] = {}
    for c in items:
        key = tuple(str(c.model if s == "model" else c.record.get(s) or "-") for s in strata)
        groups.setdefault(key, []).append(c)
    queues = []
    for key in sorted(groups):
        g = list(groups[key])
        rng.shuffle(g)
        queues.append(g)
    out: list[Candidate] = []
    depth = 0
    while len(out) < n and any(depth < len(q) for q in queues):
        for q in queues:
            if depth < len(q) and len(out) < n:
                out.append(q[depth])
        depth += 1
    return out


def _refuse_dir(out: Path) -> None:
    if not out.exists():
        return
    if not out.is_dir():
        raise TaskError(f"--out {out} exists and is not a folder")
    if any(out.iterdir()) and not (out / "task.json").is_file():
        raise TaskError(f"--out {out} is a folder with files that are not a labelling task; refusing to write there")
    if (out / "task.json").is_file():
        try:
            ok = json.loads((out / "task.json").read_text(encoding="utf-8")).get("negt2i") == TASK_FORMAT
        except (ValueError, AttributeError, OSError):
            ok = False
        if not ok:
            raise TaskError(f"--out {out}: its task.json is not a labelling task; refusing to write there")


def export_task(
    results: Sequence[str | Path],
    images: Sequence[str | Path],
    out: str | Path,
    *,
    sample: int,
    strata: Sequence[str] = ("category", "setting", "model"),
    seed: int = 0,
    questions: Mapping[str, PromptQuestions] | None = None,
    questions_source: str = "",
) -> dict[str, Any]:
    """Write the task folder (see the module docstring); returns the manifest. Nothing is written on bad input."""
    from negt2i.annotation.page import render_page

    if not 1 <= sample <= MAX_SAMPLE:
        raise TaskError(f"--sample must be between 1 and {MAX_SAMPLE}, got {sample}")
    res = [Path(p) for p in results]
    out = Path(out)
    _refuse_dir(out)
    chosen = stratified_sample(candidates(res, [Path(p) for p in images]), sample, strata, seed)
    missing = [c for c in chosen if not c.path.is_file()]
    if missing:
        shown = ", ".join(str(c.path) for c in missing[:3])
        raise TaskError(f"{len(missing)} sampled images are not in --images: {shown}")
    prompts = [prompt_of_metadata(c.record.get("metadata"), c.where) for c in chosen]
    if questions is not None:
        check_questions(questions, prompts, questions_source or "the results")
    order = list(range(len(chosen)))
    random.Random(seed + 1).shuffle(order)
    items: list[dict[str, Any]] = []
    for n, k in enumerate(order, start=1):
        c, prompt = chosen[k], prompts[k]
        item_id = f"t{n:04d}"
        qs = questions[prompt.id].questions[:-1] if questions is not None else tuple(element_questions(prompt))
        items.append(
            {
                "id": item_id,
                "file": f"images/{item_id}{c.path.suffix.lower() or '.png'}",
                "image": c.image,
                "model": c.model,
                "prompt_id": prompt.id,
                "prompt": prompt.prompt,
                "prompt_sha256": prompt_digest(prompt),
                "category": prompt.category.value if prompt.category else None,
                "setting": prompt.setting,
                "questions": [
                    {"element": q.element, "text": q.modes["pos"][0], "polarity": q.polarity}
                    for q in qs
                    if q.element != "prompt"
                ],
                "source": str(c.path),
            }
        )
    digest = hashlib.sha256(
        json.dumps([[i["image"], i["prompt_sha256"]] for i in items], separators=(",", ":")).encode()
    ).hexdigest()
    manifest = {
        "negt2i": TASK_FORMAT,
        "task_id": digest[:16],
        "created_by": f"negt2i labels export (negt2i {__version__})",
        "sample": sample,
        "stratify": list(strata),
        "seed": seed,
        "results": [{"path": str(p), "sha256": _sha256(p), "model": model_name(p)} for p in res],
        "questions": questions_source or None,
        "mean_element_questions": sum(len(i["questions"]) for i in items) / len(items),
        "items": items,
    }
    tmp = out.with_name(out.name + ".partial")
    if tmp.exists():
        shutil.rmtree(tmp)
    (tmp / "images").mkdir(parents=True)
    for item in items:
        shutil.copyfile(item["source"], tmp / item["file"])
    (tmp / "task.json").write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    (tmp / "index.html").write_text(render_page(manifest), encoding="utf-8")
    _write_crowd_csv(tmp / "crowd.csv", items)
    if out.exists():
        shutil.rmtree(out)
    tmp.replace(out)
    return manifest


def _write_crowd_csv(path: Path, items: Sequence[Mapping[str, Any]]) -> None:
    most = max(len(i["questions"]) for i in items)
    header = ["item_id", "image_file", "prompt", "n_questions"]
    for q in range(1, most + 1):
        header += [f"q{q}_element", f"q{q}_text"]
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        for item in items:
            row = [item["id"], item["file"], item["prompt"], len(item["questions"])]
            for q in item["questions"]:
                row += [q["element"], q["text"]]
            row += [""] * (len(header) - len(row))
            w.writerow(row)


def read_task(task: str | Path) -> dict[str, Any]:
    p = Path(task)
    if p.is_dir():
        p = p / "task.json"
    try:
        manifest = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise TaskError(f"{p}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise TaskError(f"{p}: not JSON ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("negt2i") != TASK_FORMAT:
        raise TaskError(f'{p}: not a labelling task (expected "negt2i": "{TASK_FORMAT}")')
    return manifest


_CROWD_ITEM = ("item_id", "Input.item_id")
_CROWD_WORKER = ("annotator", "WorkerId", "worker_id")
_Q_RE = re.compile(r"^(?:Answer\.)?q(\d+)$")


def _crowd_rows(path: Path, items: Mapping[str, Mapping[str, Any]]) -> Iterable[dict[str, str]]:
    """A crowd-platform CSV (item id, worker id, ``qN`` / ``Answer.qN`` columns) as label rows."""
    with path.open(newline="", encoding="utf-8") as fh:
        for lineno, rec in enumerate(csv.DictReader(fh), start=2):
            where = f"{path}:{lineno}"
            item_id = next((rec[k] for k in _CROWD_ITEM if rec.get(k)), None)
            worker = next((rec[k] for k in _CROWD_WORKER if rec.get(k)), None)
            if item_id is None or worker is None:
                raise TaskError(f"{where}: a crowd row needs item_id (or Input.item_id) and WorkerId (or annotator)")
            item = items.get(item_id)
            if item is None:
                raise TaskError(f"{where}: item {item_id!r} is not in the task")
            for col, value in rec.items():
                m = _Q_RE.match(col or "")
                if m is None or value in (None, ""):
                    continue
                q = int(m.group(1))
                if not 1 <= q <= len(item["questions"]):
                    raise TaskError(
                        f"{where}: {col} answered, but item {item_id} has {len(item['questions'])} questions"
                    )
                yield {
                    "image": item["image"],
                    "element": item["questions"][q - 1]["element"],
                    "annotator": worker,
                    "answer": value,
                    "_where": where,
                }


def _is_crowd_csv(path: Path) -> bool:
    if path.suffix.lower() != ".csv":
        return False
    with path.open(newline="", encoding="utf-8") as fh:
        header = next(csv.reader(fh), [])
    return any(h in header for h in _CROWD_ITEM)


def import_labels(
    files: Sequence[str | Path], task: str | Path, out: str | Path, *, annotators: int | None = None
) -> dict[str, Any]:
    """Validate answers against the task and write one labels file (JSONL, or CSV by suffix) that ``negt2i
    agreement`` reads; returns a summary. Raises ``TaskError`` with every problem found (up to 20) and writes
    nothing when the answers are incomplete or inconsistent."""
    manifest = read_task(task)
    items = {i["id"]: i for i in manifest["items"]}
    by_image = {i["image"]: i for i in manifest["items"]}
    rows: list[dict[str, str]] = []
    for f in files:
        p = Path(f)
        if not p.is_file():
            raise TaskError(f"{p}: no such file")
        if _is_crowd_csv(p):
            rows.extend(_crowd_rows(p, items))
            continue
        try:
            for lab in read_labels(p):
                rows.append(
                    {
                        "image": lab.image,
                        "element": lab.element,
                        "annotator": lab.annotator,
                        "answer": "yes" if lab.answer else "no",
                        "_where": lab.where,
                    }
                )
        except AgreementInputError as exc:
            raise TaskError(str(exc)) from None
    problems: list[str] = []
    answers: dict[tuple[str, str, str], tuple[bool, str]] = {}
    for r in rows:
        where = r["_where"]
        item = by_image.get(r["image"])
        if item is None:
            problems.append(f"{where}: image {r['image']!r} is not in the task")
            continue
        if not ANNOTATOR_RE.match(r["annotator"]):
            problems.append(f"{where}: annotator id {r['annotator']!r} is not valid (1-64 letters, digits, _ . @ -)")
            continue
        elements = {q["element"] for q in item["questions"]}
        if r["element"] not in elements:
            problems.append(
                f"{where}: {r['image']} has no element {r['element']!r} (it has {', '.join(sorted(elements))})"
            )
            continue
        value = str(r["answer"]).strip().lower()
        if value not in ("yes", "no", "y", "n", "true", "false", "1", "0"):
            problems.append(f"{where}: answer must be yes or no, got {r['answer']!r}")
            continue
        yes = value in ("yes", "y", "true", "1")
        key = (r["image"], r["element"], r["annotator"])
        if key in answers and answers[key][0] != yes:
            problems.append(
                f"{where}: annotator {r['annotator']} answers {r['image']} {r['element']} "
                f"{'yes' if yes else 'no'}, but {'yes' if answers[key][0] else 'no'} at {answers[key][1]}"
            )
            continue
        answers.setdefault(key, (yes, where))
    per_image: dict[str, dict[str, set[str]]] = {}
    for image, element, who in answers:
        per_image.setdefault(image, {}).setdefault(who, set()).add(element)
    counts = {image: len(by_who) for image, by_who in per_image.items()}
    m = annotators if annotators is not None else (max(counts.values()) if counts else 0)
    for image, by_who in sorted(per_image.items()):
        needed = [q["element"] for q in by_image[image]["questions"]]
        for who, got in sorted(by_who.items()):
            lacking = [e for e in needed if e not in got]
            if lacking:
                problems.append(
                    f"{image} (item {by_image[image]['id']}): annotator {who} did not answer {', '.join(lacking)}"
                )
        if len(by_who) != m:
            problems.append(
                f"{image} (item {by_image[image]['id']}): {len(by_who)} annotators ({', '.join(sorted(by_who))}), "
                f"expected {m}"
            )
    unlabelled = [i["id"] for i in manifest["items"] if i["image"] not in per_image]
    if unlabelled:
        problems.append(
            f"{len(unlabelled)} of {len(items)} task images have no answers (items {', '.join(unlabelled[:5])}"
            + (" ..." if len(unlabelled) > 5 else "")
            + ")"
        )
    if problems:
        more = f"\n... and {len(problems) - 20} more" if len(problems) > 20 else ""
        raise TaskError(f"{len(problems)} problems in the answers:\n" + "\n".join(problems[:20]) + more)
    out = Path(out)
    rows_out = [
        {"image": image, "element": element, "annotator": who, "answer": "yes" if yes else "no"}
        for (image, element, who), (yes, _) in sorted(answers.items())
    ]
    write_labels(out, rows_out)
    return {"images": len(per_image), "annotators_per_image": m, "labels": len(rows_out)}


LABEL_FIELDS: tuple[str, ...] = ("image", "element", "annotator", "answer")


def write_labels(out: Path, rows: Sequence[Mapping[str, str]]) -> None:
    """The labels file ``negt2i agreement`` reads, JSONL or CSV by suffix; refuses a file that is not one."""
    if out.exists():
        try:
            read_labels(out)
        except (AgreementInputError, OSError, UnicodeDecodeError):
            raise TaskError(f"{out} exists and is not a labels file; refusing to overwrite it") from None
    tmp = out.with_name(out.name + ".tmp")
    if out.suffix.lower() == ".csv":
        with tmp.open("w", newline="", encoding="utf-8") as fh:
            w = csv.DictWriter(fh, fieldnames=list(LABEL_FIELDS))
            w.writeheader()
            w.writerows(rows)
    else:
        tmp.write_text("".join(json.dumps(dict(r)) + "\n" for r in rows), encoding="utf-8")
    tmp.replace(out)
