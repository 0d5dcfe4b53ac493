"""The paper's configurations as presets (Table 18), the generator registry, and the CLI around them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from negt2i.cli import main
from negt2i.core.spec import Prompt, dumps_prompt
from negt2i.generate import DEFAULT_SEEDS, PRESETS, GenerateError, available, create, parse_seeds, preset
from negt2i.generate import registry as gen_registry

# Table 18 (Appendix E.1): steps and resolution of the eleven configurations.
TABLE_18 = [
    ("flux2-klein-9b", "FLUX.2-klein-9B", 4, 1024),
    ("hunyuanimage-2.1-distilled", "HunyuanImage-2.1 (distilled)", 8, 1024),
    ("z-image-turbo", "Z-Image-Turbo", 9, 1024),
    ("flux2-dev-4bit", "FLUX.2-dev (4-bit)", 28, 1024),
    ("sd3.5-large", "SD 3.5 Large", 28, 1024),
    ("blip3o-next-sft-3b", "BLIP3-o NEXT SFT 3B", 30, 1024),
    ("hidream-i1-4bit", "HiDream-I1 (4-bit)", 50, 1024),
    ("qwen-image", "Qwen-Image", 50, 1024),
    ("sd1.5", "SD 1.5", 50, 512),
    ("sd1.5-negationclip", "SD 1.5 + NegationCLIP", 50, 512),
    ("janus-pro-7b", "Janus-Pro-7B", None, 384),  # autoregressive: no diffusion steps
]


@pytest.mark.parametrize(("name", "label", "steps", "side"), TABLE_18)
def test_presets_follow_table_18(name: str, label: str, steps: int | None, side: int):
    spec = preset(name)
    assert (spec.label, spec.steps, spec.width, spec.height) == (label, steps, side, side)


def test_the_protocol_around_the_presets():
    assert list(PRESETS) == [row[0] for row in TABLE_18]
    assert DEFAULT_SEEDS == (42, 43, 44, 45)  # Appendix E.1
    # The registered guidance scales of the SD 1.5 pair (Appendix E.1): same checkpoint, 9.0 vs 7.5.
    sd, neg = preset("sd1.5"), preset("sd1.5-negationclip")
    assert (sd.guidance, neg.guidance, sd.model) == (9.0, 7.5, neg.model)
    assert [c.name for c in neg.components] == ["text_encoder"]
    assert preset("flux2-dev-4bit").quantize and preset("hidream-i1-4bit").quantize
    import diffusers

    for spec in PRESETS.values():
        if spec.generator == "diffusers":
            assert spec.pipeline is not None and hasattr(diffusers, spec.pipeline), spec.name
        assert spec.generator in available()
        assert not any("negative" in key for key, _ in spec.options)  # the negative-prompt field stays unused
    assert len({s.digest() for s in PRESETS.values()}) == len(PRESETS)
    with pytest.raises(KeyError, match="presets: flux2-klein-9b"):
        preset("sd2")


@pytest.mark.parametrize(
    ("text", "seeds"),
    [("42-45", (42, 43, 44, 45)), ("42,43", (42, 43)), ("0-1,7", (0, 1, 7)), ("5", (5,))],
)
def test_parse_seeds(text: str, seeds: tuple[int, ...]):
    assert parse_seeds(text) == seeds


@pytest.mark.parametrize("text", ["", "45-42", "a", "1,1", "1-2,2"])
def test_parse_seeds_rejects(text: str):
    with pytest.raises(ValueError, match="seeds"):
        parse_seeds(text)


def test_list_models(capsys: pytest.CaptureFixture[str]):
    assert main(["generate", "--list-models"]) == 0
    out = capsys.readouterr().out
    for name, label, _, side in TABLE_18:
        line = next(ln for ln in out.splitlines() if ln.startswith(name + " "))
        assert label in line and f"{side}x{side}" in line
    assert "4 (true_cfg_scale)" in out and "NEGT2I_NEGATIONCLIP" in out


def test_models_diffusers_does_not_cover_say_what_they_need():
    with pytest.raises(GenerateError, match="register a generator named 'blip3o-next'"):
        create(preset("blip3o-next-sft-3b"), device="cpu", dtype="float32")
    try:
        import janus  # noqa: F401
    except ImportError:
        with pytest.raises(GenerateError, match="needs the `janus` package"):
            create(preset("janus-pro-7b"), device="cpu", dtype="float32")


def test_a_plugged_in_generator_runs_without_touching_the_runner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, prompts: list[Prompt], capsys: pytest.CaptureFixture[str]
):
    monkeypatch.setenv("NEGT2I_GENERATOR_MODULES", "tests.generate.plugin")
    monkeypatch.setitem(gen_registry._state, "loaded", False)  # re-read the variable
    pfile = tmp_path / "p.jsonl"
    pfile.write_text("".join(dumps_prompt(p) + "\n" for p in prompts[:2]))
    out = tmp_path / "gen"
    args = ["generate", "--model", "my-model", "--generator", "test-solid", "--steps", "1", "--resolution", "16x8",
            "--prompts", str(pfile), "--out", str(out), "--no-progress", "--device", "cpu"]  # fmt: skip
    assert main(args) == 0
    assert "8 images generated" in capsys.readouterr().out
    prov = json.loads((out / "00001" / "provenance" / "0003.json").read_text())
    assert (prov["pipeline"], prov["seed"], prov["image_size"], prov["settings"]["generator"]) == (
        "SolidColour", 45, [16, 8], "test-solid"
    )  # fmt: skip


def test_cli_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    assert main(["generate", "--model", "some/repo", "--out", str(tmp_path / "o")]) == 2
    assert "give its settings explicitly with --steps and --resolution" in capsys.readouterr().err
    missing = ["generate", "--model", "sd1.5", "--out", str(tmp_path / "o"), "--prompts", str(tmp_path / "no.jsonl")]
    assert main(missing) == 2
    assert "no such prompt file" in capsys.readouterr().err
    assert main(["generate", "--model", "sd1.5"]) == 2
    assert main(["generate", "--model", "sd1.5", "--out", str(tmp_path / "o"), "--seeds", "3-1"]) == 2
    assert "seeds" in capsys.readouterr().err
