"""The judge harness end to end with the real architectures built from tiny random configurations, offline:
question file and images in, P("yes") per question out, resume, timing and memory fields, bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from negt2i.cli import main
from negt2i.judges import registry
from negt2i.judges.harness import RUN_FORMAT

VQA = ("qwen2.5-vl-7b", "qwen3-vl-8b", "internvl3.5-8b")


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two demo images (GenEval layout), their prompts and question file."""
    from negt2i.stages.demo_data import main as demo

    root = tmp_path_factory.mktemp("judges")
    images = root / "images"
    assert demo([str(images), "--prompts", "2", "--samples", "1", "--size", "64"]) == 0
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(p.read_text() for p in sorted(images.glob("*/metadata.jsonl"))))
    questions = root / "q.jsonl"
    assert main(["questions", str(prompts), "--out", str(questions)]) == 0
    return {"root": root, "images": images, "questions": questions}


def _rows(path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return [x for x in lines if x.get("negt2i") == RUN_FORMAT], [x for x in lines if "negt2i" not in x]


def _questions(study: dict[str, Path], mode: str) -> set[tuple[str, str]]:
    out = set()
    for line in study["questions"].read_text().splitlines():
        rec = json.loads(line)
        folder = next(p.parent.name for p in study["images"].glob("*/metadata.jsonl")
                      if json.loads(p.read_text())["id"] == rec["prompt_id"])  # fmt: skip
        out |= {(f"{folder}/samples/0000.png", q["element"]) for q in rec["questions"] if mode in q["modes"]}
    return out


def _run(study: dict[str, Path], judge: str, mode: str, out: Path, *extra: str) -> int:
    return main(["judges", "run", "--judge", judge, "--mode", mode, "--questions", str(study["questions"]),
                 "--images", str(study["images"]), "--out", str(out), "--random-init", "--no-progress",
                 *extra])  # fmt: skip


@pytest.mark.parametrize("judge", VQA)
def test_each_architecture_answers_every_question_and_resumes(study: dict[str, Path], judge: str) -> None:
    out = study["root"] / f"{judge}.jsonl"
    assert _run(study, judge, "neg", out, "--batch-size", "3") == 0
    headers, rows = _rows(out)
    assert len(headers) == 1
    h = headers[0]
    assert h["judge"] == registry.backend(judge).label + "-random" and h["mode"] == "neg"
    assert h["revision"] == "random-init" and h["batch_size"] == 3 and h["load_seconds"] > 0
    assert h["library"].startswith("transformers ") and h["params"] > 0 and len(h["questions"]["sha256"]) == 64
    assert {(r["image"], r["element"]) for r in rows} == _questions(study, "neg")
    assert len(rows) == len(_questions(study, "neg"))
    for r in rows:
        assert 0.0 <= r["p_yes"] <= 1.0 and 0.0 <= r["p_no"] <= 1.0 and r["p_yes"] + r["p_no"] <= 1.0 + 1e-6
        assert r["seconds"] > 0 and r["gpu_gib"] is None and r["rss_gib"] > 0 and r["run"] == h["run"]
    # resume: nothing left to ask, the file is unchanged
    before = out.read_bytes()
    assert _run(study, judge, "neg", out) == 0
    assert out.read_bytes() == before
    # a run killed mid-write: the last row torn off, another lost; the rerun asks exactly those two again
    lines = before.decode().splitlines(keepends=True)
    out.write_text("".join(lines[:-2]) + lines[-2][:25])
    assert _run(study, judge, "neg", out) == 0
    headers2, rows2 = _rows(out)
    assert len(headers2) == 2 and len(rows2) == len(rows)
    assert {(r["image"], r["element"]) for r in rows2} == _questions(study, "neg")
    assert sorted(r["run"] for r in rows2).count(headers2[1]["run"]) == 2


def test_a_batch_gives_each_question_its_own_probabilities() -> None:
    """Left padding: questions of different lengths about different images, batched or one by one."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)) for h, w in ((40, 70), (90, 50))]
    items = [(images[0], "Is there exactly one bench?"), (images[1], "Is the backpack not above the parking meter?")]
    for name in VQA:
        judge: Any = registry.create(name, device="cpu", random_init=True)
        batched = judge.answer_batch(items)
        alone = [judge.answer_batch([it])[0] for it in items]
        assert np.allclose(batched, alone, atol=1e-5), name


def test_score_judge_and_the_kind_mode_pairing(study: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    out = study["root"] / "clip.jsonl"
    assert _run(study, "clipscore-vit-b-32", "score", out, "--batch-size", "2") == 0
    headers, rows = _rows(out)
    assert headers[0]["kind"] == "score" and headers[0]["library"].startswith("open_clip_torch")
    assert len(rows) == 2 and all(r["element"] == "prompt" and -1.0 <= r["score"] <= 1.0 for r in rows)
    capsys.readouterr()
    assert _run(study, "clipscore-vit-b-32", "pos", study["root"] / "x.jsonl") == 1
    assert "clipscore-vit-b-32 is a score judge: use --mode score" in capsys.readouterr().err
    assert _run(study, "qwen3-vl-8b", "score", study["root"] / "x.jsonl") == 1
    assert "is a vqa judge: use --mode whole | pos | neg" in capsys.readouterr().err
    assert not (study["root"] / "x.jsonl").exists()


def test_bad_input_is_refused_before_any_model_loads(
    study: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a question file from another corpus version: one prompt differs from the images' metadata
    lines = study["questions"].read_text().splitlines()
    rec = json.loads(lines[0])
    rec["prompt_sha256"] = "0" * 64
    other = tmp_path / "q-other.jsonl"
    other.write_text("\n".join([json.dumps(rec), *lines[1:]]) + "\n")
    args = ["judges", "run", "--judge", "qwen3-vl-8b", "--mode", "pos", "--images", str(study["images"]),
            "--random-init", "--no-progress"]  # fmt: skip
    assert main([*args, "--questions", str(other), "--out", str(tmp_path / "a.jsonl")]) == 1
    assert "the question file was made from another corpus version" in capsys.readouterr().err
    # a question file lacking an image's prompt
    (tmp_path / "q-short.jsonl").write_text(lines[0] + "\n")
    assert main([*args, "--questions", str(tmp_path / "q-short.jsonl"), "--out", str(tmp_path / "a.jsonl")]) == 1
    assert "the question file has no questions for prompt" in capsys.readouterr().err
    assert not (tmp_path / "a.jsonl").exists()
    # --out that is not a judge file, or another judge's / mode's file: refused and left as it is
    user = tmp_path / "notes.jsonl"
    user.write_text('{"my": "data"}\n')
    assert main([*args, "--questions", str(study["questions"]), "--out", str(user)]) == 2
    assert "not a judge file line" in capsys.readouterr().err and user.read_text() == '{"my": "data"}\n'
    clip = tmp_path / "clip.jsonl"
    clip.write_text(
        json.dumps({"judge": "CLIPScore", "mode": "score", "image": "x", "element": "prompt", "score": 0.1}) + "\n"
    )
    before = clip.read_bytes()
    assert main([*args, "--questions", str(study["questions"]), "--out", str(clip)]) == 2
    assert "one file per judge and mode" in capsys.readouterr().err and clip.read_bytes() == before


def test_real_weights_are_the_default_and_missing_ones_say_how_to_fetch(
    study: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for judge, mode in (("qwen2.5-vl-7b", "pos"), ("clipscore-vit-b-32", "score")):
        code = main(["judges", "run", "--judge", judge, "--mode", mode, "--questions", str(study["questions"]),
                     "--images", str(study["images"]), "--out", str(tmp_path / f"{judge}.jsonl"),
                     "--weights-dir", str(tmp_path / "cache")])  # fmt: skip
        err = capsys.readouterr().err
        assert code == 1
        assert err.count("error:") == 1 and f"negt2i weights fetch --dir {tmp_path / 'cache'} {judge}" in err
        assert "--random-init" in err
        assert not (tmp_path / f"{judge}.jsonl").exists()


def test_judges_list_shows_every_judge_with_its_weights(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["judges", "list", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for name in (*VQA, "clipscore-vit-b-32"):
        assert name in out
    assert out.count("missing") == 9 and "Qwen3-VL-8B" in out and "InternVL3.5-38B" in out
    assert "PickScore" in out and "NegationCLIP" in out


def test_weights_fetch_takes_judge_names_and_fetches_their_shards(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A judge's entry fetches its required files and every file of the repository matching its patterns
    (the weight shards), then records the lock that loading verifies."""
    import types

    import huggingface_hub

    from negt2i import weights

    repo_files = ["config.json", "model.safetensors.index.json", "preprocessor_config.json", "tokenizer_config.json",
                  "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "chat_template.jinja",
                  "README.md", "assets/figure.png"]  # fmt: skip
    fetched: list[str] = []

    class Api:
        def model_info(self, repo: str, revision: str) -> Any:
            assert repo == "Qwen/Qwen3-VL-8B-Instruct" and revision == "main"
            siblings = [types.SimpleNamespace(rfilename=f) for f in repo_files]
            return types.SimpleNamespace(sha="c0ffee", siblings=siblings)

    def download(repo: str, rel: str, revision: str, local_dir: Path) -> str:
        assert revision == "c0ffee"
        fetched.append(rel)
        (Path(local_dir) / rel).write_text(rel)
        return str(Path(local_dir) / rel)

    monkeypatch.setattr(huggingface_hub, "HfApi", Api)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    assert main(["weights", "fetch", "--dir", str(tmp_path), "qwen3-vl-8b"]) == 0
    assert sorted(fetched) == sorted(f for f in repo_files if not f.startswith(("README", "assets")))
    assert weights.status("qwen3-vl-8b", tmp_path) == "ok"
    assert weights.verify("qwen3-vl-8b", tmp_path).revision == "c0ffee"


@pytest.mark.parametrize("judge", VQA)
def test_the_default_loading_code_reads_a_fetched_checkpoint(
    judge: str, study: dict[str, Path], tmp_path: Path
) -> None:
    """The real path (no --random-init): a checkpoint laid out as on the Hub (sharded safetensors + index, config,
    processor and tokenizer files), recorded with `negt2i weights record`, is verified, loaded through
    AutoProcessor / AutoModelForImageTextToText and answers exactly as the model it was saved from."""
    from negt2i.judges import tiny

    build = {"qwen2.5-vl-7b": tiny.tiny_qwen2_5_vl, "qwen3-vl-8b": tiny.tiny_qwen3_vl,
             "internvl3.5-8b": tiny.tiny_internvl}[judge]  # fmt: skip
    model, processor = build()
    folder = tmp_path / judge
    model.save_pretrained(folder, max_shard_size="100KB")
    processor.save_pretrained(folder)
    assert len(list(folder.glob("model-*-of-*.safetensors"))) > 1
    assert main(["weights", "record", judge, "--dir", str(tmp_path), "--revision", "abc123"]) == 0
    real, rand = tmp_path / "real.jsonl", tmp_path / "random.jsonl"
    args = ["judges", "run", "--judge", judge, "--mode", "pos", "--questions", str(study["questions"]),
            "--images", str(study["images"]), "--no-progress", "--limit", "1"]  # fmt: skip
    assert main([*args, "--out", str(real), "--weights-dir", str(tmp_path)]) == 0
    assert main([*args, "--out", str(rand), "--random-init"]) == 0
    (h_real,), rows_real = _rows(real)
    _, rows_rand = _rows(rand)
    assert h_real["revision"] == "abc123" and len(h_real["sha256"]) == 64
    assert h_real["judge"] == registry.backend(judge).label
    assert [(r["element"], r["p_yes"], r["p_no"]) for r in rows_real] == [
        (r["element"], r["p_yes"], r["p_no"]) for r in rows_rand
    ]


def test_clipscore_loads_an_open_clip_checkpoint_by_default(study: dict[str, Path], tmp_path: Path) -> None:
    """The real CLIPScore path: an open_clip hub folder (open_clip_config.json + open_clip_model.safetensors),
    recorded, loaded through open_clip's local-dir: loader, scores exactly as the model it was saved from."""
    from safetensors.torch import save_file

    from negt2i.judges.clip_score import TINY_CFG, tiny_clip

    model, _, _ = tiny_clip()
    folder = tmp_path / "clipscore-vit-b-32"
    folder.mkdir()
    (folder / "open_clip_config.json").write_text(json.dumps({"model_cfg": TINY_CFG}))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(folder / "open_clip_model.safetensors"))
    assert main(["weights", "record", "clipscore-vit-b-32", "--dir", str(tmp_path)]) == 0
    args = ["judges", "run", "--judge", "clipscore-vit-b-32", "--mode", "score", "--questions", str(study["questions"]),
            "--images", str(study["images"]), "--no-progress"]  # fmt: skip
    assert main([*args, "--out", str(tmp_path / "real.jsonl"), "--weights-dir", str(tmp_path)]) == 0
    assert main([*args, "--out", str(tmp_path / "rand.jsonl"), "--random-init"]) == 0
    real, rand = _rows(tmp_path / "real.jsonl")[1], _rows(tmp_path / "rand.jsonl")[1]
    assert [r["score"] for r in real] == pytest.approx([r["score"] for r in rand], abs=1e-6)
    assert _rows(tmp_path / "real.jsonl")[0][0]["revision"] == "main"


def test_a_plug_in_judge_registers_through_the_environment(
    study: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/agreement.md's plug-in recipe: a module named in NEGT2I_JUDGE_MODULES registers a judge that
    `judges list` shows and `judges run` runs (here a score judge: the prompt's length, on the CPU)."""
    plugin = tmp_path / "my_judges.py"
    plugin.write_text(
        "from negt2i.judges.base import JudgeInfo\n"
        "from negt2i.judges.registry import JudgeBackend, register\n"
        "class Length:\n"
        "    info = JudgeInfo('PromptLength', 'score', 'len', 'v1', '', 'python', 'cpu', 'none', 0)\n"
        "    def score_batch(self, items):\n"
        "        return [float(len(text)) for _, text in items]\n"
        "register(JudgeBackend('prompt-length', 'score', lambda **_: Length(), label='PromptLength'))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("NEGT2I_JUDGE_MODULES", "my_judges")
    monkeypatch.setattr(registry, "_TABLE", dict(registry._TABLE))  # the plug-in's row goes away afterwards
    monkeypatch.setattr(registry, "_state", {"loaded": False})
    assert main(["judges", "list"]) == 0
    assert "prompt-length" in capsys.readouterr().out
    out = tmp_path / "len.jsonl"
    assert main(["judges", "run", "--judge", "prompt-length", "--mode", "score", "--questions", str(study["questions"]),
                 "--images", str(study["images"]), "--out", str(out), "--no-progress"]) == 0  # fmt: skip
    prompts = {json.loads(x)["prompt"] for x in study["questions"].read_text().splitlines()}
    assert sorted(r["score"] for r in _rows(out)[1]) == sorted(float(len(p)) for p in prompts)


CLIP_JUDGES = ("pickscore-v1", "negationclip")


@pytest.mark.parametrize("judge", CLIP_JUDGES)
def test_transformers_clip_judges_score_every_prompt_and_resume(study: dict[str, Path], judge: str) -> None:
    """PickScore / NegationCLIP (tiny random CLIPModel): one score per image, header, timing, resume."""
    out = study["root"] / f"{judge}.jsonl"
    assert _run(study, judge, "score", out, "--batch-size", "2") == 0
    (h,), rows = _rows(out)
    assert h["judge"] == registry.backend(judge).label + "-random" and h["mode"] == "score" and h["kind"] == "score"
    assert h["library"].startswith("transformers ") and h["revision"] == "random-init" and h["load_seconds"] > 0
    assert h["params"] > 0 and h["batch_size"] == 2
    assert sorted(r["image"] for r in rows) == sorted(img for img, _ in _questions(study, "whole"))
    for r in rows:
        assert r["element"] == "prompt" and isinstance(r["score"], float) and abs(r["score"]) < 1e3
        assert r["seconds"] > 0 and r["gpu_gib"] is None and r["rss_gib"] > 0 and r["run"] == h["run"]
    before = out.read_bytes()
    assert _run(study, judge, "score", out) == 0
    assert out.read_bytes() == before
    lines = before.decode().splitlines(keepends=True)
    out.write_text("".join(lines[:-1]) + lines[-1][:20])  # killed mid-write: the last row torn
    assert _run(study, judge, "score", out) == 0
    headers2, rows2 = _rows(out)
    assert len(headers2) == 2 and [r["score"] for r in rows2] == pytest.approx([r["score"] for r in rows], abs=1e-5)
    assert [r["run"] for r in rows2].count(headers2[1]["run"]) == 1


def test_clip_score_is_logit_scale_times_cosine_and_batch_independent() -> None:
    """The model card's formula, checked against CLIPModel's own logits_per_image (= logit_scale * cosine)."""
    import numpy as np
    import torch
    from PIL import Image

    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)) for h, w in ((40, 70), (90, 50))]
    long = "a photo of a backpack and a parking meter, where the backpack is not above it " * 3
    items = [(images[0], "a photo of a non-red cup"), (images[1], long)]
    judge: Any = registry.create("pickscore-v1", device="cpu", random_init=True)
    batched = judge.score_batch(items)
    alone = [judge.score_batch([it])[0] for it in items]
    assert batched == pytest.approx(alone, abs=1e-4)
    for (image, text), got in zip(items, batched, strict=True):
        tokens = judge.tokenizer([text], truncation=True, max_length=77, return_tensors="pt")
        assert tokens["input_ids"].shape[1] <= 77
        pixels = judge.image_processor(images=[image], return_tensors="pt")["pixel_values"]
        with torch.inference_mode():
            logits = judge.model(input_ids=tokens["input_ids"], pixel_values=pixels).logits_per_image
        assert got == pytest.approx(float(logits[0, 0]), abs=1e-4)
    assert batched[0] != pytest.approx(batched[1], abs=1e-3)


@pytest.mark.parametrize("judge", CLIP_JUDGES)
def test_clip_judges_load_a_saved_transformers_checkpoint_by_default(
    judge: str, study: dict[str, Path], tmp_path: Path
) -> None:
    """The real path: CLIPModel.from_pretrained + AutoImageProcessor / AutoTokenizer from the cache folders
    (PickScore: model from pickscore-v1, processor from pickscore-processor, as its model card does),
    recorded, verified, scoring exactly as the model they were saved from."""
    from negt2i.judges.hf_clip import tiny_clip

    model, image_processor, tokenizer = tiny_clip()
    model_dir = tmp_path / judge
    processor_dir = tmp_path / "pickscore-processor" if judge == "pickscore-v1" else model_dir
    model.save_pretrained(model_dir)
    image_processor.save_pretrained(processor_dir)
    tokenizer.save_pretrained(processor_dir)
    names = [judge, "pickscore-processor"] if judge == "pickscore-v1" else [judge]
    assert main(["weights", "record", *names, "--dir", str(tmp_path), "--revision", "abc123"]) == 0
    args = ["judges", "run", "--judge", judge, "--mode", "score", "--questions", str(study["questions"]),
            "--images", str(study["images"]), "--no-progress"]  # fmt: skip
    assert main([*args, "--out", str(tmp_path / "real.jsonl"), "--weights-dir", str(tmp_path)]) == 0
    assert main([*args, "--out", str(tmp_path / "rand.jsonl"), "--random-init"]) == 0
    (h,), real = _rows(tmp_path / "real.jsonl")
    rand = _rows(tmp_path / "rand.jsonl")[1]
    assert h["revision"] == "abc123" and len(h["sha256"]) == 64 and h["judge"] == registry.backend(judge).label
    assert [r["score"] for r in real] == pytest.approx([r["score"] for r in rand], abs=1e-5)


def test_clip_judges_missing_weights_say_how_to_get_them(
    study: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """PickScore names both of its entries in one fetch command; NegationCLIP (no pinned repository) says where
    to put a checkpoint and how to record it, `weights fetch` refuses it, `--judges` leaves it out."""
    from negt2i import weights
    from negt2i.cli.weights_cmd import fetch_names

    cache = tmp_path / "cache"
    for judge in CLIP_JUDGES:
        code = main(["judges", "run", "--judge", judge, "--mode", "score", "--questions", str(study["questions"]),
                     "--images", str(study["images"]), "--out", str(tmp_path / f"{judge}.jsonl"),
                     "--weights-dir", str(cache)])  # fmt: skip
        err = capsys.readouterr().err
        assert code == 1 and err.count("error:") == 1 and "--random-init" in err
        assert not (tmp_path / f"{judge}.jsonl").exists()
        if judge == "pickscore-v1":
            assert f"negt2i weights fetch --dir {cache} pickscore-v1 pickscore-processor" in err
        else:
            assert "no pinned repository" in err and f"negt2i weights record --dir {cache} negationclip" in err
            assert "weights fetch" not in err
    assert main(["weights", "fetch", "--dir", str(cache), "negationclip"]) != 0
    assert "no pinned repository" in capsys.readouterr().err
    assert not (cache / "negationclip").exists()
    import argparse

    names = fetch_names(argparse.Namespace(names=[], all=False, judges=True))
    assert "negationclip" not in names and {"pickscore-v1", "pickscore-processor"} <= set(names)
    assert set(names) == set(weights.JUDGE_WEIGHTS) - {"negationclip"}
