"""negt2i generate end to end on a tiny random-weight diffusers pipeline: layout, provenance, determinism
across batch sizes and shards, resume, refusal to mix settings, missing weights."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from negt2i.core.spec import Prompt, parse_prompt
from negt2i.generate import GenerateError, ModelSpec, generate, plan
from negt2i.generate.runner import RUN_FILE
from negt2i.run.jobs import discover
from tests.generate.conftest import Counting

SEEDS = (42, 43)


def _pixels(path: Path) -> np.ndarray:
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"), dtype=np.int16)


def _digests(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.glob("*/samples/*.png"))}  # fmt: skip


def test_geneval_layout_and_provenance(tmp_path: Path, tiny_spec: ModelSpec, tiny_gen: Any, prompts: list[Prompt]):
    out = tmp_path / "gen"
    summary = generate(tiny_spec, prompts[:2], out, seeds=SEEDS, batch_size=2, device="cpu",
                       generator=tiny_gen, progress=False)  # fmt: skip
    assert (summary.generated, summary.skipped, summary.planned) == (4, 0, 4)
    # GenEval layout: one folder per prompt (0-based index, 5 digits), metadata.jsonl + samples/NNNN.png.
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == ["00000", "00001"]
    for i, prompt in enumerate(prompts[:2]):
        folder = out / f"{i:05d}"
        (line,) = (folder / "metadata.jsonl").read_text().splitlines()
        assert parse_prompt(json.loads(line)) == prompt
        assert sorted(p.name for p in (folder / "samples").iterdir()) == ["0000.png", "0001.png"]
        for k, seed in enumerate(SEEDS):
            png = folder / "samples" / f"{k:04d}.png"
            assert Image.open(png).size == (32, 32)
            prov = json.loads((folder / "provenance" / f"{k:04d}.json").read_text())
            assert prov["seed"] == seed and prov["sample"] == k and prov["prompt_id"] == prompt.id
            assert prov["model_id"] == str(tiny_spec.model) and prov["pipeline"] == "StableDiffusionPipeline"
            assert prov["scheduler"] == "PNDMScheduler"
            assert (prov["steps"], prov["guidance"], prov["resolution"], prov["dtype"]) == (2, 7.5, [32, 32], "float32")
            assert prov["settings_digest"] == tiny_spec.digest()
            versions = set(prov["versions"])
            assert {"torch", "diffusers", "transformers", "accelerate", "negt2ibench", "python"} <= versions
            assert prov["versions"]["diffusers"]
            assert prov["image_sha256"] == hashlib.sha256(png.read_bytes()).hexdigest()
    # negt2i evaluate reads it as it is: every image a job with its prompt, nothing else a job.
    jobs = discover(out)
    assert [j.filename for j in jobs] == [f"0000{i}/samples/000{k}.png" for i in range(2) for k in range(2)]
    assert all(j.prompt is not None and j.error is None for j in jobs)
    assert json.loads((out / RUN_FILE).read_text())["seeds"] == list(SEEDS)


def _close(a: Path, b: Path) -> None:
    """The same image up to float rounding in batched kernels: +-1 grey level in under 1% of the pixels."""
    x, y = _pixels(a), _pixels(b)
    assert np.abs(x - y).max() <= 1 and (x != y).mean() < 0.01, (a, b)


def test_each_sample_is_determined_by_its_seed(tmp_path: Path, tiny_spec: ModelSpec, tiny_gen: Any,
                                               prompts: list[Prompt]):  # fmt: skip
    kw: dict[str, Any] = {"seeds": SEEDS, "device": "cpu", "generator": tiny_gen, "progress": False}
    whole = tmp_path / "whole"
    generate(tiny_spec, prompts, whole, batch_size=1, **kw)
    want = _digests(whole)
    assert len(want) == 8 and len(set(want.values())) == 8  # different prompts and seeds: different images
    # One image per call: two shards into one folder, and a run cut short by --limit then completed, give
    # byte-identical files.
    sharded = tmp_path / "sharded"
    for shard in ((1, 2), (0, 2)):
        generate(tiny_spec, prompts, sharded, batch_size=1, shard=shard, **kw)
    assert _digests(sharded) == want
    limited = tmp_path / "limited"
    generate(tiny_spec, prompts, limited, batch_size=1, limit=1, **kw)
    assert _digests(limited) == {k: v for k, v in want.items() if k.startswith("00000/")}
    generate(tiny_spec, prompts, limited, batch_size=1, **kw)
    assert _digests(limited) == want
    # Batches of 3, whole and sharded: the same noise per sample, so the same image (up to float rounding).
    for name, shard in (("b3", None), ("b3-shard", (1, 2))):
        generate(tiny_spec, prompts, tmp_path / name, batch_size=3, shard=shard, **kw)
        made = _digests(tmp_path / name)
        assert made.keys() == {k for k in want if shard is None or int(k[:5]) % 2 == 1}
        for image in made:
            _close(whole / image, tmp_path / name / image)
    # ...while another seed is another image.
    assert np.abs(_pixels(whole / "00000/samples/0000.png") - _pixels(whole / "00000/samples/0001.png")).mean() > 1


def test_plan_shards_by_prompt_after_limit(prompts: list[Prompt]):
    samples = plan(prompts, (42, 43, 44, 45), limit=3, shard=(1, 2))
    assert [(s.index, s.k, s.seed) for s in samples] == [(1, k, 42 + k) for k in range(4)]
    everything = {(s.index, s.k) for sh in range(3) for s in plan(prompts, SEEDS, shard=(sh, 3))}
    assert everything == {(i, k) for i in range(len(prompts)) for k in range(2)}
    with pytest.raises(ValueError, match="0 <= I < N"):
        plan(prompts, SEEDS, shard=(2, 2))


def test_resume_skips_valid_samples_and_regenerates_partial_ones(tmp_path: Path, tiny_spec: ModelSpec,
                                                                 tiny_gen: Any, prompts: list[Prompt]):  # fmt: skip
    out = tmp_path / "gen"
    generate(tiny_spec, prompts[:3], out, seeds=SEEDS, batch_size=2, device="cpu", generator=tiny_gen, progress=False)
    want = _digests(out)
    (out / "00000/samples/0001.png").unlink()  # missing
    data = (out / "00001/samples/0000.png").read_bytes()
    (out / "00001/samples/0000.png").write_bytes(data[: len(data) // 2])  # torn write
    (out / "00002/provenance/0001.json").unlink()  # crash between the PNG and its provenance
    (out / "00002/samples/.0000.png.tmp-999").write_bytes(b"partial")  # a temporary left by a crash
    counting = Counting(tiny_gen)
    summary = generate(tiny_spec, prompts[:3], out, seeds=SEEDS, batch_size=2, device="cpu", generator=counting,
                       progress=False)  # fmt: skip
    assert (summary.generated, summary.regenerated, summary.skipped) == (3, 2, 3)
    asked = sorted((p, s) for prompts_, seeds in counting.calls for p, s in zip(prompts_, seeds, strict=True))
    assert sorted(set(asked)) == sorted({(prompts[0].prompt, 43), (prompts[1].prompt, 42), (prompts[2].prompt, 43)})
    assert _digests(out) == want  # the same images again
    # Nothing left: the model is not even asked.
    again = Counting(tiny_gen)
    summary = generate(tiny_spec, prompts[:3], out, seeds=SEEDS, batch_size=2, device="cpu", generator=again,
                       progress=False)  # fmt: skip
    assert (summary.generated, summary.skipped, again.calls) == (0, 6, [])


def test_a_folder_never_mixes_models_or_settings(tmp_path: Path, tiny_spec: ModelSpec, tiny_gen: Any,
                                                 prompts: list[Prompt]):  # fmt: skip
    out = tmp_path / "gen"
    kw: dict[str, Any] = {"device": "cpu", "generator": tiny_gen, "progress": False}
    generate(tiny_spec, prompts[:1], out, seeds=SEEDS, **kw)
    with pytest.raises(GenerateError, match=r"other settings \(steps: 2 -> 3\)"):
        generate(tiny_spec.with_overrides(steps=3), prompts[:1], out, seeds=SEEDS, **kw)
    with pytest.raises(GenerateError, match=r"other settings .*model"):
        generate(tiny_spec.with_overrides(model="/elsewhere"), prompts[:1], out, seeds=SEEDS, **kw)
    with pytest.raises(GenerateError, match="other seeds"):
        generate(tiny_spec, prompts[:1], out, seeds=(1, 2), **kw)
    with pytest.raises(GenerateError, match="other prompts"):
        generate(tiny_spec, prompts[1:2], out, seeds=SEEDS, **kw)
    # A sample whose provenance names other settings (copied in by hand) is refused, not overwritten.
    prov_path = out / "00000/provenance/0000.json"
    prov = json.loads(prov_path.read_text())
    prov["settings_digest"] = "0" * 16
    prov_path.write_text(json.dumps(prov))
    with pytest.raises(GenerateError, match="never mixes"):
        generate(tiny_spec, prompts[:1], out, seeds=SEEDS, **kw)
    # A folder with files this command did not write is user data: refused, left as it was.
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep")
    with pytest.raises(GenerateError, match="did not write"):
        generate(tiny_spec, prompts[:1], foreign, seeds=SEEDS, **kw)
    assert sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]


def test_missing_weights_say_how_to_fetch_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from negt2i.generate import preset
    from negt2i.generate.diffusers_backend import DiffusersGenerator

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hint = r"hf download stable-diffusion-v1-5/stable-diffusion-v1-5.*--allow-download"
    with pytest.raises(GenerateError, match=hint):
        DiffusersGenerator(preset("sd1.5"), device="cpu", dtype="float32")
    with pytest.raises(GenerateError, match="no such model folder"):
        DiffusersGenerator(ModelSpec("custom", "x", str(tmp_path / "nope"), steps=1), device="cpu", dtype="float32")


def test_a_component_from_another_folder_replaces_the_pipelines(
    tmp_path: Path, tiny_spec: ModelSpec, tiny_gen: Any, monkeypatch: pytest.MonkeyPatch
):
    # The SD 1.5 + NegationCLIP preset in small: the same pipeline, another text encoder from a folder.
    from negt2i.generate import Component
    from negt2i.generate.diffusers_backend import DiffusersGenerator
    from tests.generate.tiny import save_text_encoder

    comp = Component("text_encoder", "transformers.CLIPTextModel", "$NEGT2I_TEST_ENCODER")
    spec = tiny_spec.with_overrides(components=(comp,))
    assert spec.digest() != tiny_spec.digest()
    monkeypatch.delenv("NEGT2I_TEST_ENCODER", raising=False)
    with pytest.raises(GenerateError, match="set NEGT2I_TEST_ENCODER"):
        DiffusersGenerator(spec, device="cpu", dtype="float32")
    folder = save_text_encoder(tmp_path / "encoder", seed=7)
    monkeypatch.setenv("NEGT2I_TEST_ENCODER", str(folder))
    swapped = DiffusersGenerator(spec, device="cpu", dtype="float32")
    assert swapped.info()["components"] == {"text_encoder": str(folder)}
    a = np.asarray(tiny_gen.generate(["a photo of a red tie"], [42])[0], dtype=np.int16)
    b = np.asarray(swapped.generate(["a photo of a red tie"], [42])[0], dtype=np.int16)
    assert np.abs(a - b).mean() > 0.5
