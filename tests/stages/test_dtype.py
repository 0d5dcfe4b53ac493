"""``--dtype`` / ``NEGT2I_DTYPE``: one precision for every stage or per stage, fp32 by default, recorded in
``ModelInfo.dtype`` (which every results line carries)."""

from __future__ import annotations

import pytest

from negt2i.stages.registry import STAGES
from negt2i.stages.torch_support import DTYPES, check_dtype, parse_dtypes
from negt2i.wire.stage_handlers import StageSettings


def test_dtype_names():
    assert DTYPES == {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
    assert check_dtype("bfloat16") == "bf16" and check_dtype("fp16") == "fp16"
    with pytest.raises(ValueError, match="unknown dtype 'int8'; use fp32, bf16 or fp16"):
        check_dtype("int8")


def test_dtype_spec_for_all_or_some_stages():
    assert parse_dtypes("", STAGES) == dict.fromkeys(STAGES, "fp32")
    assert parse_dtypes("bf16", STAGES) == dict.fromkeys(STAGES, "bf16")
    assert parse_dtypes("segmenter=bf16, depth=float16", STAGES) == {
        "detector": "fp32",
        "segmenter": "bf16",
        "attributes": "fp32",
        "depth": "fp16",
    }
    with pytest.raises(ValueError, match="unknown stage 'detektor'"):
        parse_dtypes("detektor=bf16", STAGES)
    with pytest.raises(ValueError, match="unknown dtype"):
        parse_dtypes("depth=fp8", STAGES)


def test_stage_services_read_their_dtype_from_the_environment():
    env = {"NEGT2I_DTYPE": "attributes=fp16"}
    assert StageSettings.from_env("attributes", env).dtype == "fp16"
    assert StageSettings.from_env("detector", env).dtype == "fp32"
    assert StageSettings.from_env("depth", {}).dtype == "fp32"


def test_evaluate_refuses_an_unknown_dtype(tmp_path, capsys):
    from negt2i.cli import main

    images = tmp_path / "images"
    (images / "00000" / "samples").mkdir(parents=True)
    code = main(["evaluate", str(images), "--out", str(tmp_path / "r.jsonl"), "--dtype", "int8", "--no-progress"])
    assert code == 2
    assert "unknown dtype 'int8'" in capsys.readouterr().err
