"""``negt2i evaluate`` end to end with the synthetic backends: layouts, bad files, resumption."""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image as PILImage

from negt2i.cli import evaluate_cmd
from negt2i.core.config import CURRENT
from negt2i.core.images import load_image
from negt2i.core.results import ResultsFileError, read_results
from negt2i.evaluate import evaluate
from negt2i.pipeline import Stages
from negt2i.run.jobs import EvaluateError, discover
from negt2i.stages.synthetic import SceneObject, render_scene, write_geneval_layout


def main(argv: list[str]) -> int:
    """``negt2i`` with only the evaluate command (the other commands are not under test here)."""
    parser = argparse.ArgumentParser(prog="negt2i")
    evaluate_cmd.register(parser.add_subparsers())
    args = parser.parse_args(argv)
    return int(args.func(args))


SYNTH = dict.fromkeys(("detector", "segmenter", "attributes", "depth"), "synthetic")

NON_RED_CUP = {
    "id": "color-pos0_neg1-000",
    "category": "color",
    "prompt": "a photo of a non-red cup",
    "include": [{"class": "cup"}],
    "statements": [{"kind": "attribute", "object": 0, "value": "red", "polarity": "negated"}],
}
DOG_LEFT_OF_CAT = {  # GenEval's own encoding: no id (the folder name is used), position entry
    "tag": "position",
    "prompt": "a photo of a dog left of a cat",
    "include": [{"class": "dog"}, {"class": "cat", "position": ["right of", 0]}],
}
DOG_NOT_BEHIND_HORSE = {
    "id": "depth-pos0_neg1-000",
    "category": "depth",
    "prompt": "a photo of a dog not behind a horse",
    "include": [{"class": "dog"}, {"class": "horse"}],
    "statements": [{"kind": "relation", "subject": 0, "target": 1, "predicate": "behind", "polarity": "negated"}],
}


def _cup(color):
    return render_scene([SceneObject("cup", (16, 16, 48, 48), value=color)], (64, 64))


def _dog_cat(dog_x):
    return render_scene(
        [SceneObject("dog", (dog_x, 24, dog_x + 16, 40)), SceneObject("cat", (40, 24, 56, 40))], (64, 64)
    )


def _dog_horse(dog_bottom):
    return render_scene(
        [SceneObject("horse", (2, 10, 28, 40)), SceneObject("dog", (36, dog_bottom - 16, 60, dog_bottom), "ellipse")],
        (64, 64),
    )


@pytest.fixture
def images(tmp_path: Path) -> Path:
    root = tmp_path / "images"
    write_geneval_layout(
        root,
        [
            (NON_RED_CUP, [_cup("blue"), _cup("red"), _cup("white")]),  # correct, wrong, correct
            (DOG_LEFT_OF_CAT, [_dog_cat(4), _dog_cat(44)]),  # correct; dog peeking out right of the cat
            (DOG_NOT_BEHIND_HORSE, [_dog_horse(60), _dog_horse(20)]),  # dog lower = in front: correct; higher: behind
        ],
    )
    return root


def _run(images: Path, out: Path, *extra: str) -> int:
    return main(["evaluate", str(images), "--out", str(out), "--backend", "synthetic", "--no-progress", *extra])


def test_geneval_layout_verdicts_in_stable_order(images: Path, tmp_path: Path, capsys):
    out = tmp_path / "results.jsonl"
    assert _run(images, out, "--batch-size", "3") == 0
    rows = list(read_results(out))
    assert [r["filename"] for r in rows] == [
        "00000/samples/0000.png",
        "00000/samples/0001.png",
        "00000/samples/0002.png",
        "00001/samples/0000.png",
        "00001/samples/0001.png",
        "00002/samples/0000.png",
        "00002/samples/0001.png",
    ]
    assert [r["status"] for r in rows] == ["ok"] * 7
    assert [r["sample"] for r in rows] == [0, 1, 2, 0, 1, 0, 1]
    assert [r["correct"] for r in rows][:3] == [True, False, True]
    assert rows[3]["prompt_id"] == "00001" and rows[3]["correct"] is True
    assert rows[4]["correct"] is False and rows[4]["statements"][0]["cause"] == "positive_violated"
    assert [r["correct"] for r in rows][5:] == [True, False]
    assert rows[6]["statements"][0]["cause"] == "negated_violated"
    for r in rows:
        assert r["config"]["digest"] == CURRENT.digest()
        assert set(r["models"]) == {"detector", "segmenter", "attributes", "depth"}
        assert r["models"]["detector"]["backend"] == "synthetic"
    assert "7 images evaluated (0 already done, 7 in this run)" in capsys.readouterr().out


def test_batch_size_and_workers_do_not_change_results(images: Path, tmp_path: Path):
    a, b, c, d = (tmp_path / f"{n}.jsonl" for n in "abcd")
    assert _run(images, a, "--batch-size", "1", "--workers", "0") == 0
    assert _run(images, b, "--batch-size", "5", "--workers", "1") == 0
    assert _run(images, c, "--batch-size", "2", "--workers", "3") == 0
    assert _run(images, d) == 0  # default workers
    assert a.read_bytes() == b.read_bytes() == c.read_bytes() == d.read_bytes()


def test_workers_flag_is_checked(images: Path, tmp_path: Path, monkeypatch, capsys):
    with pytest.raises(SystemExit):
        _run(images, tmp_path / "r.jsonl", "--workers", "-1")
    assert "--workers: must be >= 0, got -1" in capsys.readouterr().err
    monkeypatch.setenv("NEGT2I_WORKERS", "two")
    with pytest.raises(SystemExit):
        _run(images, tmp_path / "r.jsonl")
    assert "expected a whole number, got 'two'" in capsys.readouterr().err
    assert not (tmp_path / "r.jsonl").exists()


def test_resumes_after_interruption_and_cuts_a_torn_line(images: Path, tmp_path: Path, capsys):
    full = tmp_path / "full.jsonl"
    assert _run(images, full) == 0
    out = tmp_path / "resumed.jsonl"
    assert _run(images, out, "--limit", "3") == 0
    lines = out.read_text().splitlines(keepends=True)
    assert len(lines) == 3
    # an interrupted write: a partial fourth line without its newline
    out.write_text("".join(lines) + '{"negt2i":"results/1","filename":"00001/samp')
    assert _run(images, out) == 0
    captured = capsys.readouterr()
    assert "removing a partial last line" in captured.err
    assert "4 images evaluated (3 already done, 7 in this run)" in captured.out
    assert out.read_text() == full.read_text()
    # nothing left to do
    assert _run(images, out) == 0
    assert "0 images evaluated (7 already done" in capsys.readouterr().out
    assert out.read_text() == full.read_text()


def test_resume_refuses_other_rules(images: Path, tmp_path: Path, capsys):
    out = tmp_path / "r.jsonl"
    assert _run(images, out, "--limit", "1") == 0
    assert _run(images, out, "--rules", "previous") == 2
    assert "write to another --out file" in capsys.readouterr().err


def test_resume_refuses_another_operating_point(images: Path, tmp_path: Path, capsys):
    """Same detector, same rules file digest aside: a file written at another floor is not mixed into."""
    out = tmp_path / "op.jsonl"
    assert _run(images, out, "--limit", "1") == 0
    record = json.loads(out.read_text())
    assert record["models"]["detector"]["operating_point"] == {"prediction_floor": 0.005, "suppression": "none",
                                                               "input_size": 0}  # fmt: skip
    record["models"]["detector"]["operating_point"]["prediction_floor"] = 0.25
    out.write_text(json.dumps(record) + "\n")
    assert _run(images, out) == 2
    assert "written by other models" in capsys.readouterr().err


def test_bad_files_are_error_lines(tmp_path: Path, capsys):
    root = tmp_path / "images"
    write_geneval_layout(root, [(NON_RED_CUP, [_cup("blue")] * 6), (NON_RED_CUP | {"id": "x2"}, [_cup("blue")])])
    samples = root / "00000" / "samples"
    (samples / "0001.png").write_bytes(b"")  # empty
    good = (samples / "0002.png").read_bytes()
    (samples / "0002.png").write_bytes(good[: len(good) // 2])  # truncated
    (samples / "0003.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"garbage" * 20)  # corrupt
    (samples / "0004.png").unlink()
    (samples / "notes.txt").write_text("not an image")  # non-image in samples/
    PILImage.fromarray(_cup("blue")).convert("L").save(samples / "0005.png")  # grayscale is fine
    # missing metadata / invalid metadata
    write_geneval_layout(tmp_path / "more", [(NON_RED_CUP, [_cup("blue")]), (NON_RED_CUP, [_cup("red")])])
    (root / "00002").mkdir()
    (tmp_path / "more" / "00000" / "samples").rename(root / "00002" / "samples")
    (root / "00003").mkdir()
    (tmp_path / "more" / "00001" / "samples").rename(root / "00003" / "samples")
    bad = NON_RED_CUP | {
        "id": "x3",
        "statements": [{"kind": "attribute", "object": 0, "value": "shiny", "polarity": "negated"}],
    }
    (root / "00003" / "metadata.jsonl").write_text(json.dumps(bad) + "\n")
    (root / "00001" / "metadata.jsonl").write_text("{not json\n")

    out = tmp_path / "r.jsonl"
    assert _run(images=root, out=out) == 0
    rows = {r["filename"]: r for r in read_results(out)}
    assert list(rows) == [
        "00000/samples/0000.png",
        "00000/samples/0001.png",
        "00000/samples/0002.png",
        "00000/samples/0003.png",
        "00000/samples/0005.png",
        "00000/samples/notes.txt",
        "00001/samples/0000.png",
        "00002/samples/0000.png",
        "00003/samples/0000.png",
    ]
    assert rows["00000/samples/0000.png"]["correct"] is True
    assert rows["00000/samples/0005.png"]["status"] == "ok"
    assert rows["00000/samples/0005.png"]["sample"] == 5
    kinds = {f: r["error"].split(":")[0] for f, r in rows.items() if r["status"] == "error"}
    assert kinds == {
        "00000/samples/0001.png": "unreadable_image",
        "00000/samples/0002.png": "unreadable_image",
        "00000/samples/0003.png": "unreadable_image",
        "00000/samples/notes.txt": "unreadable_image",
        "00001/samples/0000.png": "invalid_metadata",
        "00002/samples/0000.png": "missing_metadata",
        "00003/samples/0000.png": "invalid_metadata",
    }
    assert "empty file" in rows["00000/samples/0001.png"]["error"]
    assert "not a PNG, JPEG or WebP image" in rows["00000/samples/notes.txt"]["error"]
    assert rows["00000/samples/notes.txt"]["sample"] is None  # never the number of another file
    assert "shiny" in rows["00003/samples/0000.png"]["error"]
    err = rows["00000/samples/0001.png"]
    assert err["correct"] is False and err["prompt_id"] == NON_RED_CUP["id"] and err["category"] == "color"
    assert err["sample"] == 1 and err["models"]["detector"]["backend"] == "synthetic"
    assert rows["00003/samples/0000.png"]["prompt_id"] == "x3"
    summary = capsys.readouterr().out
    assert "9 images evaluated" in summary
    # the grayscale copy lost the cup's class colour; error lines count as incorrect images of their prompt
    assert (
        "9 images: 2 judged, 7 errors (invalid_metadata 2, missing_metadata 1, unreadable_image 4; "
        "2 without a prompt, not scored)" in summary
    )
    # the one scorable prompt (color, pos0_neg1) has 6 images, 1 correct; x3 has no category
    assert "image accuracy 16.7%" in summary and "1/7 images correct" in summary


def test_manifest_input(tmp_path: Path):
    (tmp_path / "imgs").mkdir()
    for name, color in (("a.png", "blue"), ("b.png", "red")):
        PILImage.fromarray(_cup(color)).save(tmp_path / "imgs" / name)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps(NON_RED_CUP) + "\n")
    manifest = tmp_path / "manifest.jsonl"
    manifest.write_text(
        "\n".join(
            json.dumps(x)
            for x in (
                {"file": "imgs/b.png", "metadata": NON_RED_CUP, "sample": 3},
                {"file": "imgs/a.png", "prompt_id": NON_RED_CUP["id"]},
                {"file": "imgs/c.png", "prompt_id": "nope"},
            )
        )
        + "\n"
    )
    out = tmp_path / "r.jsonl"
    assert _run(manifest, out, "--prompts", str(corpus)) == 0
    rows = list(read_results(out))
    assert [(r["filename"], r["sample"], r["correct"]) for r in rows] == [
        ("imgs/b.png", 3, False),
        ("imgs/a.png", None, True),
        ("imgs/c.png", None, False),
    ]
    assert rows[2]["error"] == "missing_metadata: prompt_id 'nope' is not in the corpus"


def test_manifest_errors(tmp_path: Path):
    manifest = tmp_path / "m.jsonl"
    manifest.write_text('{"file": "a.png", "prompt_id": "x"}\n')
    with pytest.raises(EvaluateError, match="pass --prompts"):
        discover(manifest)
    manifest.write_text('{"image": "a.png"}\n')
    with pytest.raises(EvaluateError, match='line 1 needs a "file" string'):
        discover(manifest)
    with pytest.raises(EvaluateError, match="no such folder"):
        discover(tmp_path / "absent")


def test_missing_weights_is_one_clear_error(images: Path, tmp_path: Path, capsys):
    code = main(["evaluate", str(images), "--out", str(tmp_path / "r.jsonl"), "--weights-dir", str(tmp_path / "w")])
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1
    assert "negt2i weights fetch" in err and "rfdetr-seg-xl" in err and "depth-anything-v2-small" in err
    assert not (tmp_path / "r.jsonl").exists()


def test_per_stage_backend_override(images: Path, tmp_path: Path, monkeypatch, capsys):
    # a per-stage flag beats --backend, which beats the environment
    monkeypatch.setenv("NEGT2I_DEPTH_BACKEND", "nope")
    code = main(
        ["evaluate", str(images), "--out", str(tmp_path / "r.jsonl"), "--backend", "synthetic", "--depth", "nope2"]
    )
    assert code == 2
    assert "unknown depth backend 'nope2'" in capsys.readouterr().err


def test_load_image_converts_to_rgb(tmp_path: Path):
    path = tmp_path / "a.png"
    PILImage.fromarray(np.full((5, 7, 4), 200, np.uint8), "RGBA").save(path)
    img = load_image(path)
    assert img.shape == (5, 7, 3) and img.dtype == np.uint8


def test_evaluate_api_limit(images: Path, tmp_path: Path):
    jobs = discover(images)
    summary = evaluate(jobs, tmp_path / "r.jsonl", Stages.create(SYNTH), limit=2, progress=False)
    assert (summary.total, summary.evaluated, summary.correct) == (2, 2, 1)


class InterruptingDetector:
    """The synthetic detector, interrupted (Ctrl-C) on its ``stop_at``-th call."""

    def __init__(self, stop_at: int):
        from negt2i.stages.synthetic import SyntheticDetector

        self.inner = SyntheticDetector()
        self.info = self.inner.info
        self.calls = 0
        self.stop_at = stop_at

    def detect(self, images):
        self.calls += 1
        if self.calls == self.stop_at:
            raise KeyboardInterrupt
        return self.inner.detect(images)


def test_interrupted_run_leaves_whole_lines_and_resumes_to_the_same_file(images: Path, tmp_path: Path):
    jobs = discover(images)
    full = tmp_path / "full.jsonl"
    evaluate(jobs, full, Stages.create(SYNTH), batch_size=2, progress=False)
    out = tmp_path / "r.jsonl"
    stages = Stages.create(SYNTH)
    stages.detector = InterruptingDetector(stop_at=3)  # dies during the third batch
    with pytest.raises(KeyboardInterrupt):
        evaluate(jobs, out, stages, batch_size=2, progress=False)
    text = out.read_text()
    # whole lines only: the first batch, whose models had all run (the second one had only been detected)
    assert text.endswith("\n") and len(text.splitlines()) == 2
    summary = evaluate(jobs, out, Stages.create(SYNTH), batch_size=2, progress=False)
    assert (summary.skipped, summary.evaluated) == (2, 5)
    assert out.read_text() == full.read_text()


def test_two_runs_cannot_append_to_the_same_file(images: Path, tmp_path: Path):
    import fcntl

    out = tmp_path / "r.jsonl"
    with out.open("a") as other:
        fcntl.flock(other.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(ResultsFileError, match="being written by another negt2i run"):
            evaluate(discover(images), out, Stages.create(SYNTH), progress=False)
    assert out.read_text() == ""


def test_save_perception_keeps_what_each_verdict_used(tmp_path: Path) -> None:
    """The side file holds, per judged image, the masks and scores the measurements came from."""
    from negt2i.core.perception_file import decode, read_perception
    from negt2i.core.rules import measure_comparative, measure_directional, measure_proximity
    from negt2i.stages.demo_data import write_demo

    root = tmp_path / "demo"
    write_demo(root, prompts=12, samples=2, seed=3)
    out = tmp_path / "r.jsonl"
    argv = ["evaluate", str(root), "--out", str(out), "--backend", "synthetic", "--no-progress", "--save-perception"]
    assert main(argv) == 0
    side = tmp_path / "r.perception.jsonl"
    saved = read_perception(side)
    rows = list(read_results(out))
    assert len(saved) == len(rows) == 24
    measure = {"directional": measure_directional, "proximity": measure_proximity, "comparative": measure_comparative}
    checked: set[str] = set()
    for row in rows:
        p = decode(saved[row["filename"]])
        for o in row["objects"]:  # every kept detection is stored, with the verdict's indices and scores
            for i, score in o["measurements"]["kept"]:
                assert p.detections[i].class_name == o["class"] and p.detections[i].score == score
        for s in row["statements"]:
            m = s["measurements"]
            if m["rule"] in measure:  # the relation rule recomputed from the stored refined masks alone
                a, b = (p.refined[i] for i in m["detections"])
                recorded = {k: v for k, v in m.items() if k not in ("detections", "mask")}
                assert measure[m["rule"]](a, b).values == recorded
                checked.add(m["rule"])
            elif m["rule"] == "attribute":
                assert p.attributes[m["detection"]] == m["scores"]
                checked.add("attribute")
    assert checked == {"attribute", *measure}
    # a resumed run judges nothing new and appends nothing
    size = side.stat().st_size
    assert main(argv) == 0
    assert side.stat().st_size == size


# --------------------------------------------------------------------------- pipelined runs (--workers)


@pytest.fixture(scope="module")
def many(tmp_path_factory) -> Path:
    """A few hundred tiny images of the benchmark's own prompts (every category), plus error lines of
    each kind: an unreadable image, a folder without metadata."""
    from negt2i.stages.demo_data import write_demo

    root = tmp_path_factory.mktemp("many") / "images"
    paths = write_demo(root, prompts=100, samples=3, seed=5, size=48)
    paths[7].write_bytes(b"\x89PNG\r\n\x1a\n" + b"garbage" * 20)
    (paths[40].parent.parent / "metadata.jsonl").unlink()
    return root


def test_workers_give_the_same_file_on_hundreds_of_images(many: Path, tmp_path: Path):
    jobs = discover(many)
    assert len(jobs) == 300
    files = []
    for workers, batch_size in ((1, 8), (4, 8), (0, 7), (4, 1)):
        out = tmp_path / f"w{workers}-b{batch_size}.jsonl"
        summary = evaluate(jobs, out, Stages.create(SYNTH), batch_size=batch_size, workers=workers, progress=False)
        assert summary.evaluated == 300
        files.append(out.read_bytes())
    assert all(f == files[0] for f in files[1:])
    rows = list(read_results(tmp_path / "w1-b8.jsonl"))
    assert [r["filename"] for r in rows] == [job.filename for job in jobs]  # job order
    kinds = Counter(r["error_kind"] for r in rows if r["status"] == "error")
    assert kinds == {"unreadable_image": 1, "missing_metadata": 3}
    assert {r["category"] for r in rows} >= {"color", "material", "directional", "proximity", "comparative", "depth"}
    assert 0 < sum(bool(r["correct"]) for r in rows) < 296  # null on the 3 lines without a prompt


def test_a_run_interrupted_twice_resumes_to_the_uninterrupted_file(many: Path, tmp_path: Path):
    """Ctrl-C during the detector's call on a batch: the lines of every batch whose models had all run are
    written (whole lines), and the resumed runs end with the same bytes as a run that was never interrupted."""
    jobs, workers = discover(many), 4
    full = tmp_path / "full.jsonl"
    evaluate(jobs, full, Stages.create(SYNTH), batch_size=8, workers=1, progress=False)
    out = tmp_path / "r.jsonl"
    done = 0
    for stop_at in (6, 11):
        stages = Stages.create(SYNTH)
        stages.detector = InterruptingDetector(stop_at=stop_at)
        with pytest.raises(KeyboardInterrupt):
            evaluate(jobs, out, stages, batch_size=8, workers=workers, progress=False)
        text = out.read_text()
        assert text.endswith("\n")
        done += 8 * (stop_at - 2)  # the batches whose models had all run: not the one detected before
        assert len(text.splitlines()) == done
        assert full.read_text().startswith(text)
    summary = evaluate(jobs, out, Stages.create(SYNTH), batch_size=8, workers=workers, progress=False)
    assert (summary.skipped, summary.evaluated) == (done, 300 - done)
    assert out.read_bytes() == full.read_bytes()


def test_models_run_on_the_calling_thread_and_the_rules_on_workers(images: Path, tmp_path: Path, monkeypatch):
    import threading

    from negt2i.core import flow

    main_thread = threading.get_ident()
    seen: dict[str, set[int]] = {}

    def spy(obj, name):
        real = getattr(obj, name)

        def call(*args, **kwargs):
            seen.setdefault(name, set()).add(threading.get_ident())
            return real(*args, **kwargs)

        monkeypatch.setattr(obj, name, call)

    stages = Stages.create(SYNTH)
    for obj, name in ((stages.detector, "detect"), (stages.segmenter, "refine_batch"),
                      (stages.attributes, "score_batch"), (stages.depth, "disparity"),
                      (flow, "begin"), (flow, "finish")):  # fmt: skip
        spy(obj, name)
    evaluate(discover(images), tmp_path / "r.jsonl", stages, batch_size=2, workers=2, progress=False)
    assert set(seen) == {"detect", "refine_batch", "score_batch", "disparity", "begin", "finish"}
    for name in ("detect", "refine_batch", "score_batch", "disparity"):
        assert seen[name] == {main_thread}, name
    for name in ("begin", "finish"):
        assert main_thread not in seen[name], name
    seen.clear()
    evaluate(discover(images), tmp_path / "s.jsonl", stages, batch_size=2, workers=0, progress=False)
    assert all(threads == {main_thread} for threads in seen.values())
    assert (tmp_path / "r.jsonl").read_bytes() == (tmp_path / "s.jsonl").read_bytes()


def test_reading_ahead_is_bounded(many: Path, tmp_path: Path, monkeypatch):
    """Slow models: the workers read ahead, but never more than ``AHEAD`` batches beyond the ones on the
    models, being judged or being written (at most ``AHEAD + 4`` batches of images in memory)."""
    import threading
    import time

    from negt2i import evaluate as ev
    from negt2i.core.results import ResultsWriter

    lock = threading.Lock()
    counts = {"read": 0, "written": 0, "most": 0}
    real_read, real_write = ev.read_job, ResultsWriter.write

    def read_job(job, **kwargs):
        with lock:
            counts["read"] += 1
            counts["most"] = max(counts["most"], counts["read"] - counts["written"])
        return real_read(job, **kwargs)

    def write(self, record):
        real_write(self, record)
        with lock:
            counts["written"] += 1

    monkeypatch.setattr(ev, "read_job", read_job)
    monkeypatch.setattr(ResultsWriter, "write", write)
    stages = Stages.create(SYNTH)
    real_detect = stages.detector.detect

    def detect(images):
        time.sleep(0.02)
        return real_detect(images)

    monkeypatch.setattr(stages.detector, "detect", detect)
    jobs = discover(many)[:120]
    evaluate(jobs, tmp_path / "r.jsonl", stages, batch_size=4, workers=4, progress=False)
    assert counts["read"] == counts["written"] == 120
    assert 4 * (ev.AHEAD + 1) <= counts["most"] <= 4 * (ev.AHEAD + 4)


@pytest.mark.parametrize("workers", [0, 3])
def test_a_bug_in_the_rules_stops_the_run_with_whole_lines_in_job_order(many: Path, tmp_path: Path, monkeypatch,
                                                                        workers: int):  # fmt: skip
    """An unexpected exception while judging one image (not a ``Failure``: a bug) ends the run with that
    exception; the file holds whole lines of the jobs before it, in job order, and a rerun completes it to
    the same bytes as a run without the bug."""
    from negt2i.core import flow

    jobs = discover(many)[:64]
    full = tmp_path / "full.jsonl"
    evaluate(jobs, full, Stages.create(SYNTH), batch_size=4, workers=workers, progress=False)
    real_finish = flow.finish
    bad = jobs[21].prompt

    def finish(prompt, *args, **kwargs):
        if prompt is bad:
            raise RuntimeError("a bug in the rules")
        return real_finish(prompt, *args, **kwargs)

    monkeypatch.setattr(flow, "finish", finish)
    out = tmp_path / "r.jsonl"
    with pytest.raises(RuntimeError, match="a bug in the rules"):
        evaluate(jobs, out, Stages.create(SYNTH), batch_size=4, workers=workers, progress=False)
    text = out.read_text()
    first_bad = next(i for i, job in enumerate(jobs) if job.prompt is bad)
    assert len(text.splitlines()) == first_bad  # every job before the first image of that prompt
    assert full.read_text().startswith(text)
    monkeypatch.setattr(flow, "finish", real_finish)
    evaluate(jobs, out, Stages.create(SYNTH), batch_size=4, workers=workers, progress=False)
    assert out.read_bytes() == full.read_bytes()
