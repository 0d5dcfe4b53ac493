"""Orchestrator settings are declared once (fields with metadata); the env and CLI readers follow from them and
refuse invalid values instead of falling back to a default."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.settings import DEFAULT_URLS, Settings, SettingsError, flag_of, spec

REPO = Path(__file__).resolve().parents[2]


def test_defaults_and_every_variable_read() -> None:
    d = Settings.from_env({})
    assert d == Settings() and d.depth_encoding == "float16" and d.urls == DEFAULT_URLS
    env = {"NEGT2I_DEPTH_ENCODING": "float32", "NEGT2I_RETRIES": "0", "NEGT2I_BACKOFF_S": "0.5",
           "NEGT2I_REFLECTION": "yes", "NEGT2I_MAX_CALLS": "7", "NEGT2I_SEGMENTER_URL": "https://seg:443/"}  # fmt: skip
    s = Settings.from_env(env)
    assert (s.depth_encoding, s.retries, s.backoff_s, s.reflection, s.max_calls) == ("float32", 0, 0.5, True, 7)
    assert s.urls["segmenter"] == "https://seg:443"


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"NEGT2I_DEPTH_ENCODING": "flaot16"}, "NEGT2I_DEPTH_ENCODING / --depth-encoding: 'flaot16' is not one of"),
        ({"NEGT2I_DEPTH_ENCODING": "FLOAT32"}, "'FLOAT32' is not one of float16, float32"),
        ({"NEGT2I_STAGE_BODIES": "binary"}, "NEGT2I_STAGE_BODIES / --stage-bodies: 'binary' is not one of auto, json"),
        ({"NEGT2I_STAGE_QUEUE": "lots"}, "NEGT2I_STAGE_QUEUE / --stage-queue: invalid literal for int()"),
        ({"NEGT2I_STAGE_CONCURRENCY": "0"}, "NEGT2I_STAGE_CONCURRENCY / --stage-concurrency: 0 is below the minimum 1"),
        ({"NEGT2I_CALL_TIMEOUT_S": "0"}, "NEGT2I_CALL_TIMEOUT_S / --call-timeout-s: 0.0 must be greater than 0"),
        ({"NEGT2I_PORT": "70000"}, "NEGT2I_PORT / --port: 70000 is above the maximum 65535"),
        ({"NEGT2I_RETRIES": "-1"}, "is below the minimum 0"),
        ({"NEGT2I_REFLECTION": "ture"}, "NEGT2I_REFLECTION / --reflection: 'ture' is not a yes/no value"),
        ({"NEGT2I_DEPTH_URL": "depth:3004"}, "NEGT2I_DEPTH_URL / --depth-url: 'depth:3004' is not an http://"),
    ],
)
def test_an_invalid_variable_is_refused_naming_it(env: dict[str, str], needle: str) -> None:
    with pytest.raises(SettingsError) as err:
        Settings.from_env(env)
    assert needle in str(err.value)


def test_values_set_in_code_are_checked_too() -> None:
    with pytest.raises(SettingsError, match="NEGT2I_DEPTH_ENCODING"):
        dataclasses.replace(Settings(), depth_encoding="float8")
    with pytest.raises(SettingsError, match="NEGT2I_MAX_ACTIVE"):
        Settings(max_active=0)


def test_flags_override_the_environment_and_are_derived_from_the_fields(monkeypatch, capsys) -> None:
    monkeypatch.setenv("NEGT2I_STAGE_QUEUE", "5")
    monkeypatch.setenv("NEGT2I_MAX_WAITING", "9")
    s = Settings.from_args(
        ["--stage-queue", "6", "--max-wait-s", "0.25", "--no-reflection", "--depth-url", "http://d:1"]
    )
    assert (s.stage_queue, s.max_waiting, s.max_wait_s, s.reflection) == (6, 9, 0.25, False)
    assert s.urls["depth"] == "http://d:1"
    for bad in (["--depth-encoding", "flaot16"], ["--stream-window", "0"], ["--port", "x"]):
        with pytest.raises(SystemExit):
            Settings.from_args(bad)
    assert "--stream-window: 0 is below the minimum 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        Settings.from_args(["--help"])
    text = capsys.readouterr().out
    for f in dataclasses.fields(Settings):
        meta = spec(f)
        if meta.flag:
            assert flag_of(f.name) in text and meta.env in text, f.name
    assert "--auth-token" not in text  # a secret never travels on the command line


def test_every_variable_is_documented() -> None:
    docs = (REPO / "docs" / "services.md").read_text()
    for f in dataclasses.fields(Settings):
        if spec(f).env:
            assert spec(f).env in docs, spec(f).env


def test_the_orchestrator_refuses_an_invalid_variable_with_one_line() -> None:
    env = {"PATH": "/usr/bin:/bin", "NEGT2I_DEPTH_ENCODING": "flaot16"}
    done = subprocess.run([sys.executable, "-m", "orchestrator"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "orchestrator: NEGT2I_DEPTH_ENCODING / --depth-encoding: 'flaot16' is not one of float16, float32"
    ]
