"""Weights identity of a generation run: a local folder by its content, a cached repository by its commit;
resume refuses images of other weights; effective settings recorded; missing weights fail before anything
is created."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from negt2i.core.spec import Prompt
from negt2i.generate import GenerateError, ModelSpec, generate, preset
from negt2i.generate.diffusers_backend import DiffusersGenerator, folder_digest, loaded_files, weights_identity
from negt2i.generate.runner import RUN_FILE
from tests.generate.tiny import build_pipeline

SEEDS = (42,)


def _provenance(out: Path) -> dict[str, Any]:
    prov: dict[str, Any] = json.loads((out / "00000/provenance/0000.json").read_text())
    return prov


def test_a_local_model_is_identified_by_content_and_resume_refuses_other_weights(tmp_path: Path, prompts: list[Prompt]):
    model = build_pipeline(tmp_path / "my-finetune", seed=0)
    # guidance left to the pipeline: the provenance records the pipeline's own default, never null
    spec = ModelSpec("custom", "my fine-tune", str(model), steps=2, width=32, height=32, dtype="float32")
    out = tmp_path / "gen"
    kw: dict[str, Any] = {"seeds": SEEDS, "device": "cpu", "progress": False}
    generate(spec, prompts[:1], out, **kw)
    prov = _provenance(out)
    digest = folder_digest(model)
    assert prov["weights"] == {"model": {"source": str(model.resolve()), "sha256": digest}}
    assert prov["revision"] == f"sha256:{digest}"
    assert (prov["steps"], prov["guidance"]) == (2, 7.5)  # StableDiffusionPipeline's default guidance_scale
    assert all(prov[k] is not None for k in ("revision", "pipeline", "scheduler", "steps", "guidance"))
    run = json.loads((out / RUN_FILE).read_text())
    assert run["weights_digest"] == prov["weights_digest"] and len(run["weights_digest"]) == 16
    # Unchanged weights: resume skips the sample.
    assert generate(spec, prompts[:1], out, **kw).skipped == 1

    # Other weights at the same path (a retrained fine-tune): refused, naming the folder and a new --out.
    build_pipeline(model, seed=1)
    assert folder_digest(model) != digest
    before = sorted(p.relative_to(out).as_posix() for p in out.rglob("*"))
    with pytest.raises(GenerateError, match=r"other weights \(the files under .*my-finetune changed.*--out .*gen-"):
        generate(spec, prompts[:2], out, **kw)
    # A folder from before weights digests (no digest in its run file): the samples' provenance still refuses.
    del run["weights"], run["weights_digest"]
    (out / RUN_FILE).write_text(json.dumps(run))
    with pytest.raises(GenerateError, match=r"made from other weights .*start a new folder"):
        generate(spec, prompts[:1], out, **kw)
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if "lock" not in p.name) == [
        b for b in before if "lock" not in b
    ]


def test_the_digest_covers_the_loaded_files_only(tmp_path: Path):
    model = build_pipeline(tmp_path / "m", seed=0)
    files = {p.relative_to(model).as_posix() for p in loaded_files(model)}
    assert "model_index.json" in files and any(f.startswith("unet/") for f in files)
    digest = folder_digest(model)
    (model / "README.md").write_text("notes")  # not loaded: same weights
    (model / ".cache").mkdir()
    (model / ".cache" / "x").write_text("hidden")
    assert folder_digest(model) == digest
    unet = next(p for p in (model / "unet").iterdir() if p.suffix == ".safetensors")
    data = bytearray(unet.read_bytes())
    data[-1] ^= 1  # one bit of one weight
    unet.write_bytes(bytes(data))
    assert folder_digest(model) != digest


def test_a_cached_repository_is_identified_by_its_commit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    spec = preset("sd1.5")
    with pytest.raises(GenerateError, match="hf download stable-diffusion-v1-5/stable-diffusion-v1-5"):
        weights_identity(spec)
    assert weights_identity(spec, allow_download=True) == {"model": {"source": spec.model, "revision": "main"}}
    base = tmp_path / "hub" / "models--stable-diffusion-v1-5--stable-diffusion-v1-5"
    commit = "a" * 40
    (base / "refs").mkdir(parents=True)
    (base / "refs" / "main").write_text(commit)
    (base / "snapshots" / commit).mkdir(parents=True)
    assert weights_identity(spec) == {"model": {"source": spec.model, "revision": commit}}


def test_offline_generate_fails_before_creating_anything(tmp_path: Path, prompts: list[Prompt]):
    out = tmp_path / "gen"
    with pytest.raises(GenerateError, match="no such model folder"):
        generate(ModelSpec("custom", "x", str(tmp_path / "nope"), steps=1), prompts, out, device="cpu")
    assert not out.exists()
    # The CLI with a preset whose weights are not cached: one error, exit 2, and no output folder.
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "negt2i", "generate", "--model", "sd1.5", "--out", str(out), "--device", "cpu"],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "hf download stable-diffusion-v1-5/stable-diffusion-v1-5" in proc.stderr
    assert proc.stderr.count("\n") == 1
    assert not out.exists()


def test_a_handed_in_generator_with_an_unknown_source_is_not_checked(tmp_path: Path, tiny_gen: DiffusersGenerator):
    # A caller that loaded the generator itself: the runner does not insist on the files (strict=False).
    spec = ModelSpec("custom", "x", str(tmp_path / "nope"), steps=2, width=32, height=32, dtype="float32")
    assert weights_identity(spec, strict=False) == {}
