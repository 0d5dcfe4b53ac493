"""The labelling kit without a browser: sampling, the task folder, importing answers, and bad input."""

from __future__ import annotations

import csv
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from negt2i.annotation.questions import write_questions
from negt2i.annotation.task import TaskError, export_task, import_labels
from negt2i.cli import main
from negt2i.core.results import ok_record
from negt2i.core.spec import parse_prompt
from negt2i.metrics.synthetic import make_prompts, make_verdict

MODELS = ("model-a", "model-b")


def _write_run(root: Path, model: str, prompts: list[Any]) -> tuple[Path, Path]:
    images = root / f"images-{model}"
    lines = []
    for n, prompt in enumerate(prompts):
        name = f"{n:05d}/samples/0000.png"
        (images / name).parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (8, 8), (n % 256, 0, 0)).save(images / name)
        meta = json.dumps(prompt.to_json())
        lines.append(ok_record(make_verdict(prompt, None), filename=name, sample=0, models={}, metadata=meta))
    results = root / f"{model}.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in lines))
    return results, images


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("runs")
    cells = [("color", "pos0_neg1"), ("material", "pos1_neg1"), ("directional", "pos0_neg1"), ("depth", "pos1_neg0")]
    prompts = make_prompts(3, cells=cells, seed=1)  # 3 prompts per cell, 12 in all
    out: dict[str, Any] = {"root": root, "prompts": prompts, "results": [], "images": []}
    for model in MODELS:
        r, i = _write_run(root, model, prompts)
        out["results"].append(r)
        out["images"].append(i)
    return out


def test_the_sample_is_spread_over_category_setting_and_model(runs: dict[str, Any], tmp_path: Path) -> None:
    manifest = export_task(runs["results"], runs["images"], tmp_path / "task", sample=8)
    items = manifest["items"]
    assert len(items) == 8
    assert Counter(i["model"] for i in items) == {"model-a": 4, "model-b": 4}
    assert Counter(i["category"] for i in items) == {"color": 2, "material": 2, "directional": 2, "depth": 2}
    assert all(i["image"].startswith(f"{i['model']}:") for i in items)  # several results: MODEL:filename
    # the task folder: neutral image names, the page, the crowd CSV; the page does not show the generator
    files = sorted(p.name for p in (tmp_path / "task").iterdir())
    assert files == ["crowd.csv", "images", "index.html", "task.json"]
    assert sorted(p.name for p in (tmp_path / "task" / "images").iterdir()) == [f"t{n:04d}.png" for n in range(1, 9)]
    page = (tmp_path / "task" / "index.html").read_text()
    assert "expected" not in page and "polarity" not in page and '"model"' not in page
    assert "http://" not in page and "https://" not in page  # self-contained: nothing fetched
    with (tmp_path / "task" / "crowd.csv").open() as fh:
        crowd = list(csv.DictReader(fh))
    assert [r["item_id"] for r in crowd] == [i["id"] for i in items]
    assert crowd[0]["q1_text"] == items[0]["questions"][0]["text"]
    # the same seed gives the same task; a different one another order
    again = export_task(runs["results"], runs["images"], tmp_path / "task", sample=8)
    assert again["items"] == items
    assert export_task(runs["results"], runs["images"], tmp_path / "t2", sample=8, seed=5)["items"] != items


def _answers(manifest: dict[str, Any], who: str, *, skip: str | None = None) -> list[dict[str, str]]:
    return [
        {"image": i["image"], "element": q["element"], "annotator": who, "answer": "yes"}
        for i in manifest["items"]
        for q in i["questions"]
        if not (skip and i["id"] == "t0001" and q["element"] == skip)
    ]


def _jsonl(path: Path, rows: list[dict[str, str]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_import_validates_and_writes_the_labels_agreement_reads(
    runs: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results, images = runs["results"][:1], runs["images"][:1]
    manifest = export_task(results, images, tmp_path / "task", sample=4, strata=["category"])
    files = [_jsonl(tmp_path / f"{w}.jsonl", _answers(manifest, w)) for w in ("a01", "a02", "a03")]
    out = tmp_path / "labels.csv"
    summary = import_labels(files, tmp_path / "task", out, annotators=3)
    assert summary["images"] == 4 and summary["annotators_per_image"] == 3
    code = main(["agreement", "--labels", str(out), "--results", str(results[0]), "--out", str(tmp_path / "agr"),
                 "--bootstrap", "20"])  # fmt: skip
    assert code == 0
    assert json.loads((tmp_path / "agr" / "agreement.json").read_text())["annotators_per_image"] == 3
    # a missing element, a third annotator short, a bad id, a conflicting repeat: all named, nothing written
    item = manifest["items"][0]
    bad = [
        _jsonl(tmp_path / "b1.jsonl", _answers(manifest, "a01", skip="object:0")),
        _jsonl(tmp_path / "b2.jsonl", _answers(manifest, "a02")),
        _jsonl(tmp_path / "b3.jsonl", [{**_answers(manifest, "a03")[0], "annotator": "bad id!"}]),
        _jsonl(tmp_path / "b4.jsonl", [{**_answers(manifest, "a02")[0], "answer": "no"}]),
    ]
    out2 = tmp_path / "labels2.jsonl"
    with pytest.raises(TaskError) as err:
        import_labels(bad, tmp_path / "task", out2, annotators=3)
    text = str(err.value)
    assert f"{item['image']} (item t0001): annotator a01 did not answer object:0" in text
    assert "2 annotators (a01, a02), expected 3" in text
    assert "annotator id 'bad id!' is not valid" in text
    assert "answers" in text and "but yes at" in text
    assert not out2.exists()
    # the command says the same on stderr with exit code 1
    assert main(["labels", "import", *map(str, bad), "--task", str(tmp_path / "task"), "--out", str(out2)]) == 1
    assert "did not answer object:0" in capsys.readouterr().err


def test_crowd_platform_answers_import(runs: dict[str, Any], tmp_path: Path) -> None:
    manifest = export_task(runs["results"][:1], runs["images"][:1], tmp_path / "task", sample=2, strata=["category"])
    crowd = tmp_path / "batch.csv"
    most = max(len(i["questions"]) for i in manifest["items"])
    with crowd.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["Input.item_id", "WorkerId", *(f"Answer.q{k}" for k in range(1, most + 1))])
        for who in ("W1", "W2", "W3"):
            for item in manifest["items"]:
                answers = ["no"] * len(item["questions"])
                w.writerow([item["id"], who, *answers, *([""] * (most - len(answers)))])
    out = tmp_path / "labels.jsonl"
    assert import_labels([crowd], tmp_path / "task", out)["annotators_per_image"] == 3
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert {r["annotator"] for r in rows} == {"W1", "W2", "W3"} and {r["answer"] for r in rows} == {"no"}
    assert len(rows) == 3 * sum(len(i["questions"]) for i in manifest["items"])


def test_export_refuses_bad_input_and_user_data(runs: dict[str, Any], tmp_path: Path) -> None:
    results, images = runs["results"], runs["images"]
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(TaskError, match="not a labelling task; refusing"):
        export_task(results, images, mine, sample=2)
    assert (mine / "notes.txt").read_text() == "keep me"
    with pytest.raises(TaskError, match="unknown stratum 'colour'"):
        export_task(results, images, tmp_path / "t", sample=2, strata=["colour"])
    with pytest.raises(TaskError, match="one --images folder, or one per results file"):
        export_task(results, [*images, images[0]], tmp_path / "t", sample=2)
    with pytest.raises(TaskError, match="--sample must be between"):
        export_task(results, images, tmp_path / "t", sample=0)
    assert not (tmp_path / "t").exists()


def test_export_checks_the_question_file_digest(runs: dict[str, Any], tmp_path: Path, capsys: Any) -> None:
    prompts = runs["prompts"]
    same = tmp_path / "q.jsonl"
    write_questions(same, prompts, None)
    r, i = str(runs["results"][0]), str(runs["images"][0])
    assert main(["labels", "export", r, "--images", i, "--sample", "3", "--questions", str(same),
                 "--out", str(tmp_path / "ok")]) == 0  # fmt: skip
    # another corpus version: the same ids, a different statement value
    other = [parse_prompt({**p.to_json(), "prompt": p.prompt + " (v2)"}) for p in prompts]
    old = tmp_path / "old.jsonl"
    write_questions(old, other, "f" * 64)
    assert main(["labels", "export", r, "--images", i, "--sample", "3", "--questions", str(old),
                 "--out", str(tmp_path / "no")]) == 1  # fmt: skip
    assert "made from another corpus version" in capsys.readouterr().err
    assert not (tmp_path / "no").exists()


def test_several_generators_are_labelled_as_model_filename(runs: dict[str, Any], tmp_path: Path, capsys: Any) -> None:
    """Filenames repeat across generators: the labels name MODEL:filename, which `negt2i agreement` resolves."""
    manifest = export_task(runs["results"], runs["images"], tmp_path / "task", sample=4)
    labels = tmp_path / "labels.jsonl"
    import_labels([_jsonl(tmp_path / "a.jsonl", _answers(manifest, "a01"))], tmp_path / "task", labels)
    results = [str(p) for p in runs["results"]]
    assert main(["agreement", "--labels", str(labels), "--results", *results, "--out", str(tmp_path / "agr"),
                 "--bootstrap", "20"]) == 0  # fmt: skip
    agreement = json.loads((tmp_path / "agr" / "agreement.json").read_text())
    assert agreement["images"] == 4
    bare = _jsonl(tmp_path / "bare.jsonl", [{**_answers(manifest, "a01")[0], "image": "00000/samples/0000.png"}])
    assert main(["agreement", "--labels", str(bare), "--results", *results, "--out", str(tmp_path / "x")]) == 1
    assert "is in several results files (model-a, model-b); name it MODEL:filename" in capsys.readouterr().err
