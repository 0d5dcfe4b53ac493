"""Results files you can trust, with real files on disk: output safety, the lock (two real processes),
resume by content, --retry-errors, one decoder for a folder with a bomb and a rotated JPEG, one accuracy
(evaluate == report), and GenEval's summary fields."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image as PILImage

from negt2i.cli import main
from negt2i.core.results import MARKER, ResultsFileError, ResultsWriter, read_results
from negt2i.evaluate import evaluate
from negt2i.pipeline import Stages
from negt2i.run.jobs import discover
from negt2i.stages.demo_data import write_demo
from negt2i.stages.synthetic import SceneObject, render_scene, write_geneval_layout
from tests.imagefiles import bomb_png, encoded, exif_rotated_jpeg

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "data" / "negt2ibench.jsonl"
SYNTH = dict.fromkeys(("detector", "segmenter", "attributes", "depth"), "synthetic")

DOG_LEFT_OF_COW = {
    "tag": "position",
    "prompt": "a photo of a dog left of a cow",
    "include": [{"class": "dog"}, {"class": "cow", "position": ["right of", 0]}],
}


def _evaluate(images: Path, out: Path, *extra: str) -> int:
    return main(["evaluate", str(images), "--out", str(out), "--backend", "synthetic", "--no-progress", *extra])


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


@pytest.fixture
def demo(tmp_path: Path) -> Path:
    root = tmp_path / "demo"
    write_demo(root, prompts=12, samples=2, seed=3, size=64)
    return root


# --------------------------------------------------------------------------- 1. output safety


def _refused(images: Path, out: Path, capsys) -> str:
    before = out.read_bytes()
    assert _evaluate(images, out) == 2
    assert out.read_bytes() == before  # byte-identical
    return capsys.readouterr().err


def test_a_corpus_copy_is_refused_and_left_byte_identical(demo: Path, tmp_path: Path, capsys):
    corpus = tmp_path / "negt2ibench.jsonl"
    shutil.copyfile(CORPUS, corpus)
    err = _refused(demo, corpus, capsys)
    assert "is not a negt2i results file (line 1 has no" in err and "left unchanged" in err


def test_a_prompt_folders_metadata_is_refused(demo: Path, capsys):
    err = _refused(demo, demo / "00000" / "metadata.jsonl", capsys)
    assert "is not a negt2i results file" in err


@pytest.mark.parametrize("text", ["first line\nlast line without newline", "a single line, no newline", "{}\n"])
def test_a_text_file_is_refused_even_without_a_final_newline(demo: Path, tmp_path: Path, capsys, text: str):
    out = tmp_path / "notes.txt"
    out.write_text(text)
    err = _refused(demo, out, capsys)
    assert "not a negt2i results file" in err and "partial last line" not in err


def test_a_folder_is_refused(demo: Path, tmp_path: Path, capsys):
    assert _evaluate(demo, tmp_path) == 2
    assert "is not a regular file" in capsys.readouterr().err


def test_a_new_or_empty_file_is_accepted_and_every_line_is_marked(demo: Path, tmp_path: Path):
    out = tmp_path / "empty.jsonl"
    out.write_bytes(b"")
    assert _evaluate(demo, out, "--limit", "3") == 0
    lines = out.read_text().splitlines()
    assert len(lines) == 3 and all(line.startswith('{"negt2i":"results/1",') for line in lines)
    assert all(r["negt2i"] == MARKER for r in read_results(out))


def test_a_torn_last_line_is_cut_only_when_it_is_ours(demo: Path, tmp_path: Path, capsys):
    out = tmp_path / "r.jsonl"
    assert _evaluate(demo, out, "--limit", "2") == 0
    whole = out.read_bytes()
    out.write_bytes(whole + b'{"filename":"00001/samples/00')  # someone else's partial line: refused as is
    _refused(demo, out, capsys)
    out.write_bytes(whole + b'{"negt2i":"results/1","filename":"00001/samp')  # ours, torn by a crash
    assert _evaluate(demo, out, "--limit", "3") == 0
    assert "removing a partial last line" in capsys.readouterr().err
    assert len(out.read_text().splitlines()) == 3


# --------------------------------------------------------------------------- 1. the lock, real processes

HOLD = """
import sys
from negt2i.core.results import ResultsWriter
w = ResultsWriter(sys.argv[1])
print("locked", flush=True)
sys.stdin.read()
w.close()
"""


def test_a_second_writer_process_is_refused_while_one_holds_the_file(demo: Path, tmp_path: Path):
    out = tmp_path / "r.jsonl"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], cwd=REPO, env=_env(), text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        cmd = [sys.executable, "-m", "negt2i", "evaluate", str(demo), "--out", str(out), "--backend", "synthetic",
               "--no-progress"]  # fmt: skip
        done = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 2, done.stderr
        assert "is being written by another negt2i run" in done.stderr
        assert out.read_bytes() == b""
    finally:
        holder.communicate("", timeout=30)


def test_two_concurrent_evaluate_processes_never_interleave(tmp_path: Path):
    images = tmp_path / "many"
    write_demo(images, prompts=30, samples=2, seed=5, size=64)
    out = tmp_path / "r.jsonl"
    cmd = [sys.executable, "-m", "negt2i", "evaluate", str(images), "--out", str(out), "--backend", "synthetic",
           "--no-progress", "--batch-size", "1"]  # fmt: skip
    procs = [
        subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    results = [(p.wait(timeout=180), *p.communicate()) for p in procs]
    codes = sorted(code for code, _, _ in results)
    assert codes in ([0, 0], [0, 2]), results  # the second one finished after the first, or was refused
    if codes == [0, 2]:
        assert any("being written by another negt2i run" in err for code, _, err in results if code == 2)
    names = [r["filename"] for r in read_results(out)]
    assert len(names) == 60 and len(set(names)) == 60  # every image once, no duplicates


# --------------------------------------------------------------------------- 2. resume by content


def test_lines_record_the_images_sha256(demo: Path, tmp_path: Path):
    out = tmp_path / "r.jsonl"
    assert _evaluate(demo, out) == 0
    for r in read_results(out):
        assert r["sha256"] == hashlib.sha256((demo / r["filename"]).read_bytes()).hexdigest()


def test_another_image_set_with_the_same_layout_is_refused_naming_the_images(tmp_path: Path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    write_demo(a, prompts=6, samples=2, seed=1, size=64)
    write_demo(b, prompts=6, samples=2, seed=1, size=64)
    for path in sorted(b.glob("*/samples/*.png"))[:3]:  # same names, other pixels for three images
        path.write_bytes(encoded(np.fliplr(np.asarray(PILImage.open(path))).copy(), "PNG"))
    out = tmp_path / "r.jsonl"
    assert _evaluate(a, out) == 0
    capsys.readouterr()
    before = out.read_bytes()
    assert _evaluate(b, out) == 2
    err = capsys.readouterr().err
    assert "3 images differ from what" in err and "00000/samples/0000.png" in err and "--replace-changed" in err
    assert out.read_bytes() == before
    # --replace-changed judges exactly those again and replaces their lines (never a duplicate)
    assert _evaluate(b, out, "--replace-changed") == 0
    assert "3 images evaluated (9 already done" in capsys.readouterr().out
    rows = list(read_results(out))
    assert len(rows) == 12 and len({r["filename"] for r in rows}) == 12
    for r in rows:
        assert r["sha256"] == hashlib.sha256((b / r["filename"]).read_bytes()).hexdigest()
    assert main(["report", str(out), "--out", str(tmp_path / "rep"), "--no-plots", "--bootstrap", "10"]) == 0


def test_a_changed_prompt_is_a_changed_image(demo: Path, tmp_path: Path, capsys):
    out = tmp_path / "r.jsonl"
    assert _evaluate(demo, out) == 0
    meta = demo / "00001" / "metadata.jsonl"
    record = json.loads(meta.read_text())
    meta.write_text(json.dumps({**record, "prompt": record["prompt"] + " (edited)"}) + "\n")
    assert _evaluate(demo, out) == 2
    assert "2 images differ" in capsys.readouterr().err


def test_error_lines_are_judged_again_when_fixed_or_with_retry_errors(tmp_path: Path, capsys):
    root = tmp_path / "images"
    write_demo(root, prompts=6, samples=2, seed=2, size=64)
    meta = root / "00002" / "metadata.jsonl"
    good_meta = meta.read_text()
    meta.unlink()  # missing metadata: two error lines
    broken = root / "00003" / "samples" / "0001.png"
    good_png = broken.read_bytes()
    broken.write_bytes(good_png[:100])  # truncated: one error line
    out = tmp_path / "r.jsonl"
    assert _evaluate(root, out) == 0
    errors = {r["filename"] for r in read_results(out) if r["status"] == "error"}
    assert errors == {"00002/samples/0000.png", "00002/samples/0001.png", "00003/samples/0001.png"}
    capsys.readouterr()
    # nothing changed: error lines are kept, and the summary says how to judge them again
    assert _evaluate(root, out) == 0
    assert "0 images evaluated (12 already done" in (text := capsys.readouterr().out)
    assert "3 error lines kept (--retry-errors" in text
    # the metadata is back: those two images are judged again (their prompt changed), their lines replaced
    meta.write_text(good_meta)
    assert _evaluate(root, out) == 0
    assert "2 images evaluated (10 already done" in capsys.readouterr().out
    # --retry-errors judges the remaining error line again (still truncated: still an error, still one line)
    assert _evaluate(root, out, "--retry-errors") == 0
    assert "1 image evaluated (11 already done" in capsys.readouterr().out
    broken.write_bytes(good_png)  # fixed image: a changed file, judged again without any flag
    assert _evaluate(root, out) == 0
    assert "1 image evaluated (11 already done" in capsys.readouterr().out
    rows = list(read_results(out))
    assert len(rows) == 12 and len({r["filename"] for r in rows}) == 12
    assert all(r["status"] == "ok" for r in rows)
    assert not list(tmp_path.glob(".r.jsonl*"))  # no temporary file left behind


# --------------------------------------------------------------------------- 3. one decoder, per-image errors


def test_a_folder_with_a_bomb_gets_every_other_verdict_and_one_error_line(demo: Path, tmp_path: Path, capsys):
    (demo / "00004" / "samples" / "0001.png").write_bytes(bomb_png())
    (demo / "00005" / "samples" / "0000.png").write_bytes(encoded(np.zeros((8, 8, 3), np.uint8), "TIFF"))
    out = tmp_path / "r.jsonl"
    assert _evaluate(demo, out) == 0
    rows = {r["filename"]: r for r in read_results(out)}
    assert len(rows) == 24
    errors = {f: r["error"] for f, r in rows.items() if r["status"] == "error"}
    assert errors == {
        "00004/samples/0001.png": "unreadable_image: 00004/samples/0001.png: image is 40000 x 40000 = "
        "1600000000 pixels, "
        "above the limit of 16777216",
        "00005/samples/0000.png": "unreadable_image: 00005/samples/0000.png: not a PNG, JPEG or WebP image "
        "(the file is TIFF)",
    }
    assert "24 images: 22 judged, 2 errors (unreadable_image 2)" in capsys.readouterr().out


def test_a_jpeg_rotated_by_exif_is_judged_upright(tmp_path: Path):
    upright = render_scene([SceneObject("dog", (4, 20, 24, 44)), SceneObject("cow", (40, 20, 60, 44))], (64, 64))
    root = tmp_path / "images"
    write_geneval_layout(root, [(DOG_LEFT_OF_COW, [upright])])
    sample = root / "00000" / "samples" / "0000.png"
    sample.unlink()
    (sample.parent / "0000.jpg").write_bytes(exif_rotated_jpeg(upright))
    out = tmp_path / "r.jsonl"
    summary = evaluate(discover(root), out, Stages.create(SYNTH), progress=False)
    assert summary.correct == 1
    (row,) = read_results(out)
    assert row["correct"] is True and row["filename"] == "00000/samples/0000.jpg"
    # the stored pixels (orientation ignored) put the dog below the cow: the same scene judged wrong
    with PILImage.open(sample.parent / "0000.jpg") as raw:
        sideways = np.asarray(raw.convert("RGB"))
    PILImage.fromarray(sideways).save(tmp_path / "sideways.png")
    write_geneval_layout(tmp_path / "sideways", [(DOG_LEFT_OF_COW, [sideways])])
    side = evaluate(discover(tmp_path / "sideways"), tmp_path / "s.jsonl", Stages.create(SYNTH), progress=False)
    assert side.correct == 0


# --------------------------------------------------------------------------- 4. one accuracy


def _totals_line(text: str, prefix: str) -> str:
    (line,) = [ln for ln in text.splitlines() if ln.startswith(prefix)]
    return line[len(prefix) :]


def test_the_end_of_run_summary_is_the_files_totals_and_equals_the_report(tmp_path: Path, capsys):
    root = tmp_path / "images"
    write_demo(root, prompts=12, samples=3, seed=4, size=64)
    (root / "00003" / "samples" / "0002.png").write_bytes(b"")  # an error line of a known prompt
    out = tmp_path / "r.jsonl"
    assert _evaluate(root, out, "--limit", "20") == 0
    capsys.readouterr()
    assert _evaluate(root, out) == 0  # a resumed session: the summary still covers the whole file
    evaluated = _totals_line(capsys.readouterr().out, "results file: ")
    assert evaluated.startswith("36 images: 35 judged, 1 error (unreadable_image 1)")
    assert main(["report", str(out), "--out", str(tmp_path / "rep"), "--no-plots", "--bootstrap", "10"]) == 0
    reported = _totals_line(capsys.readouterr().out, "r: ")
    assert reported == evaluated
    m = json.loads((tmp_path / "rep" / "report.json").read_text())["models"]["r"]
    assert f"image accuracy {100 * m['image_accuracy']['overall']:.1f}%" in evaluated
    assert f"prompt accuracy {100 * m['prompt_accuracy']['overall']:.1f}%" in evaluated
    assert f"{m['correct_images']}/{m['scored_images']} images correct" in evaluated


# --------------------------------------------------------------------------- 5. GenEval interop


def test_geneval_summary_fields_and_groupings(tmp_path: Path):
    """What GenEval's evaluation/summary_scores.py does with a results file (read with pandas'
    ``read_json(lines=True)``; rows grouped by the ``metadata`` string for prompts and by ``tag`` for
    tasks; ``correct`` averaged), reproduced on our file: it runs, and gives our report's numbers."""
    pd = pytest.importorskip("pandas")
    root = tmp_path / "images"
    write_demo(root, prompts=24, samples=2, seed=9, size=64)  # 6 categories x 2 settings x 2 prompts x 2 images
    out = tmp_path / "r.jsonl"
    assert _evaluate(root, out) == 0
    from negt2i.metrics.totals import file_totals

    ours = file_totals(out)
    df = pd.read_json(out, orient="records", lines=True)
    for column in ("filename", "tag", "prompt", "correct", "reason", "metadata", "details"):
        assert column in df.columns
    assert df["metadata"].map(type).eq(str).all() and df["details"].map(type).eq(str).all()
    records = [json.loads(m) for m in df["metadata"]]
    assert all(rec["id"] == pid for rec, pid in zip(records, df["prompt_id"], strict=True))
    assert all(isinstance(json.loads(d), dict) for d in df["details"])
    by_prompt = df.groupby("metadata")["correct"]
    assert len(df) == ours.images == 48
    assert by_prompt.ngroups == ours.prompts == 24
    assert by_prompt.size().eq(2).all()  # every image of a prompt carries the same metadata string
    assert df["correct"].mean() == pytest.approx(ours.correct / ours.scored)
    assert df["correct"].mean() == pytest.approx(ours.image_accuracy)  # balanced cells: pooled == report
    assert by_prompt.any().mean() == pytest.approx(ours.prompt_accuracy)
    tags = df.groupby("tag", sort=False)["correct"].mean()
    assert set(tags.index) == {"color", "material", "comparative", "depth", "directional", "proximity"}
    assert tags.mean() == pytest.approx(ours.image_accuracy)  # GenEval's "avg. over tasks" = mean over categories


def _geneval_summary(pd, path: Path) -> dict[str, object]:
    """What GenEval's evaluation/summary_scores.py prints, computed as it computes it (pandas)."""
    df = pd.read_json(path, orient="records", lines=True)
    tasks = {tag: task["correct"].mean() for tag, task in df.groupby("tag", sort=False)}
    return {
        "images": len(df),
        "prompts": df.groupby("metadata").ngroups,
        "correct_images": df["correct"].mean(),
        "correct_prompts": df.groupby("metadata")["correct"].any().mean(),
        "tasks": tasks,
        "overall": float(np.mean(list(tasks.values()))),
    }


def test_geneval_agrees_with_the_report_on_files_with_error_lines(tmp_path: Path, capsys):
    """Error lines of known prompts carry their tag and metadata (GenEval counts them as incorrect images of
    their task, as we do); error lines without a prompt (a folder without metadata.jsonl, one with an invalid
    one) have null tag, correct and metadata, so GenEval leaves them out as our report does: no task named
    "" at 0 %, and "% correct images" over the placed images only (issue 29, item 7)."""
    pd = pytest.importorskip("pandas")
    root = tmp_path / "images"
    write_demo(root, prompts=24, samples=2, seed=9, size=64)
    (root / "00003" / "samples" / "0001.png").write_bytes(b"")  # an error line of a known prompt
    sample = next((root / "00000" / "samples").iterdir()).read_bytes()
    for folder, metadata in (("00090", None), ("00091", "{not json")):
        (root / folder / "samples").mkdir(parents=True)
        for k in range(2):
            (root / folder / "samples" / f"{k:04d}.png").write_bytes(sample)
        if metadata is not None:
            (root / folder / "metadata.jsonl").write_text(metadata)
    out = tmp_path / "r.jsonl"
    _evaluate(root, out)
    lines = list(read_results(out))
    unplaced = [ln for ln in lines if ln["status"] == "error" and ln["prompt_id"] is None]
    assert len(unplaced) == 4 and all(ln["tag"] is None and ln["correct"] is None for ln in unplaced)
    known = [ln for ln in lines if ln["status"] == "error" and ln["prompt_id"] is not None]
    assert len(known) == 1 and known[0]["tag"] and known[0]["correct"] is False and known[0]["metadata"]
    from negt2i.metrics.totals import file_totals

    ours = file_totals(out)
    assert (ours.images, ours.unplaced, ours.scored) == (52, 4, 48)
    geneval = _geneval_summary(pd, out)
    assert "" not in geneval["tasks"] and set(geneval["tasks"]) == {
        "color", "material", "comparative", "depth", "directional", "proximity"}  # fmt: skip
    assert geneval["correct_images"] == pytest.approx(ours.correct / ours.scored)
    assert geneval["prompts"] == ours.prompts == 24
    assert geneval["correct_prompts"] == pytest.approx(ours.prompt_accuracy)
    assert geneval["overall"] == pytest.approx(ours.image_accuracy)  # mean over the six (balanced) tasks
    assert main(["report", str(out), "--out", str(tmp_path / "rep"), "--no-plots", "--bootstrap", "10"]) == 0
    printed = capsys.readouterr()
    assert "4 without a prompt id are left out" in printed.out + printed.err


def test_unwritable_results_file_errors_are_results_file_errors(tmp_path: Path):
    out = tmp_path / "r.jsonl"
    with ResultsWriter(out), pytest.raises(ResultsFileError, match="being written by another"):
        ResultsWriter(out)
    with ResultsWriter(out) as w:  # released on close
        assert w.records() == []
