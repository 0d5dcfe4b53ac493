"""Qwen-Image samples with true CFG at the preset's scale (issue 30, item 1).

diffusers' ``QwenImagePipeline`` runs true classifier-free guidance only when a negative
prompt is passed (``true_cfg_scale > 1 and negative_prompt is not None``). The preset
passes the model card's content-free ``" "``; these tests check, through the real loading
path with a pipeline stand-in that records its call, that the call switches CFG on at 4.0,
that no other preset passes a negative prompt, and that provenance states the guidance in
effect.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any, ClassVar

import pytest
from PIL import Image

from negt2i.core.spec import Prompt
from negt2i.generate import PRESETS, preset
from negt2i.generate.diffusers_backend import DiffusersGenerator
from negt2i.generate.runner import generate


class RecordingPipeline:
    """Stands in for a loaded diffusers pipeline: records every call, returns grey images."""

    calls: ClassVar[list[dict[str, Any]]] = []

    @classmethod
    def from_pretrained(cls, source: str, **kwargs: Any) -> RecordingPipeline:
        return cls()

    def to(self, device: str) -> RecordingPipeline:
        return self

    def set_progress_bar_config(self, **kwargs: Any) -> None:
        pass

    def __call__(self, **kwargs: Any) -> Any:
        RecordingPipeline.calls.append(kwargs)
        images = [Image.new("RGB", (kwargs["width"], kwargs["height"]), (128, 128, 128)) for _ in kwargs["prompt"]]
        return type("Output", (), {"images": images})()


def true_cfg_runs(call: dict[str, Any]) -> tuple[bool, float]:
    """diffusers' own switch (QwenImagePipeline.__call__): CFG iff true_cfg_scale > 1 and a negative prompt."""
    scale = float(call.get("true_cfg_scale", 4.0))
    has_negative = call.get("negative_prompt") is not None or call.get("negative_prompt_embeds") is not None
    return scale > 1 and has_negative, scale


@pytest.fixture
def recording(monkeypatch: pytest.MonkeyPatch) -> type[RecordingPipeline]:
    import diffusers

    RecordingPipeline.calls = []
    monkeypatch.setattr(diffusers, "QwenImagePipeline", RecordingPipeline)
    monkeypatch.setattr(diffusers, "StableDiffusionPipeline", RecordingPipeline)
    return RecordingPipeline


def test_the_switch_this_test_reads_is_the_installed_pipelines() -> None:
    """The rule ``true_cfg_runs`` copies must still be the one the installed diffusers applies."""
    from diffusers import QwenImagePipeline

    params = inspect.signature(QwenImagePipeline.__call__).parameters
    assert {"negative_prompt", "true_cfg_scale"} <= set(params)
    assert params["true_cfg_scale"].default == 4.0
    source = inspect.getsource(QwenImagePipeline.__call__)
    assert "do_true_cfg = true_cfg_scale > 1 and has_neg_prompt" in source


def test_qwen_image_runs_true_cfg_at_the_preset_scale(
    tmp_path: Path, recording: type[RecordingPipeline], prompts: list[Prompt]
) -> None:
    spec = preset("qwen-image").with_overrides(model=str(tmp_path), width=16, height=16)
    gen = DiffusersGenerator(spec, device="cpu", dtype="float32")
    gen.generate([p.prompt for p in prompts[:3]], [42, 43, 44])
    (call,) = recording.calls
    assert true_cfg_runs(call) == (True, 4.0)
    assert call["negative_prompt"] == [" "] * 3  # content-free: the negative-prompt field carries nothing
    assert call["num_inference_steps"] == 50 and call["prompt"] == [p.prompt for p in prompts[:3]]
    assert gen.info()["guidance"] == {"argument": "true_cfg_scale", "scale": 4.0, "negative_prompt": " ", "cfg": True}


def test_without_the_unconditional_text_qwen_image_would_sample_without_cfg(
    tmp_path: Path, recording: type[RecordingPipeline]
) -> None:
    """What the preset did before issue 30, kept as a check that the switch really depends on the text."""
    from dataclasses import replace

    spec = replace(preset("qwen-image"), model=str(tmp_path), width=16, height=16, cfg_unconditional=None)
    DiffusersGenerator(spec, device="cpu", dtype="float32").generate(["a photo of a cat"], [42])
    assert true_cfg_runs(recording.calls[0]) == (False, 4.0)
    assert spec.guidance_record()["cfg"] is False
    assert spec.digest() != preset("qwen-image").digest()  # a different sampler is a different run


def test_no_other_preset_passes_a_negative_prompt(tmp_path: Path, recording: type[RecordingPipeline]) -> None:
    others = [s for s in PRESETS.values() if s.name != "qwen-image"]
    assert all(s.cfg_unconditional is None and "cfg_unconditional" not in s.record() for s in others)
    spec = preset("sd1.5").with_overrides(model=str(tmp_path), width=16, height=16)
    DiffusersGenerator(spec, device="cpu", dtype="float32").generate(["a photo of a cat"], [42])
    assert "negative_prompt" not in recording.calls[0] and recording.calls[0]["guidance_scale"] == 9.0


def test_provenance_states_the_guidance_in_effect(
    tmp_path: Path, recording: type[RecordingPipeline], prompts: list[Prompt]
) -> None:
    spec = preset("qwen-image").with_overrides(model=str(tmp_path / "weights"), width=16, height=16)
    (tmp_path / "weights").mkdir()
    gen = DiffusersGenerator(spec, device="cpu", dtype="float32")
    generate(spec, prompts[:1], tmp_path / "out", seeds=(42,), device="cpu", generator=gen, progress=False)
    prov = json.loads((tmp_path / "out" / "00000" / "provenance" / "0000.json").read_text())
    expected = {"argument": "true_cfg_scale", "scale": 4.0, "negative_prompt": " ", "cfg": True}
    assert prov["guidance_in_effect"] == expected
    assert prov["settings"]["cfg_unconditional"] == " "
