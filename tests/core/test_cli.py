"""The core's command-line entry points: `negt2i rules` and `negt2i prompts check`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from negt2i.cli import main
from negt2i.core.config import CURRENT, PREVIOUS


def test_rules_prints_each_preset(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rules", "previous"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["name"] == "previous" and out["digest"] == PREVIOUS.digest()
    assert out["directional"] == {"extent_margin": 0.10, "axis_threshold": 0.50}
    assert main(["rules"]) == 0
    assert json.loads(capsys.readouterr().out)["digest"] == CURRENT.digest()


def test_rules_reads_a_json_file_and_rejects_unknown_names(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "rules.json"
    cfg.write_text(json.dumps({"name": "tight", "proximity": {"gap_factor": 0.6}}))
    assert main(["rules", str(cfg)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["proximity"]["gap_factor"] == 0.6 and out["comparative"]["size_ratio"] == 1.05
    assert main(["rules", "strict"]) == 2
    assert "neither a preset (current, previous, geneval) nor a JSON file" in capsys.readouterr().err


def test_prompts_check_summarises_and_reports_the_bad_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = {"prompt": "a photo of a red cup", "include": [{"class": "cup", "count": 1, "color": "red"}]}
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, "include": [{"class": "cup", "count": 1}]}) + "\n")
    assert main(["prompts", "check", str(path)]) == 0
    out = capsys.readouterr().out
    assert "2 valid prompts" in out and "color" in out and "pos1_neg0" in out
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, "include": [{"class": "kettle"}]}) + "\n")
    assert main(["prompts", "check", str(path)]) == 1
    assert "line 2, field include[0].class: unknown class 'kettle'" in capsys.readouterr().err
    assert main(["prompts", "check", str(tmp_path / "missing.jsonl")]) == 2


def test_console_script_runs_as_a_module() -> None:
    done = subprocess.run([sys.executable, "-m", "negt2i", "--version"], capture_output=True, text=True, check=True)
    assert done.stdout.startswith("negt2i ")
