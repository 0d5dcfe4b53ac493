"""examples/rl_reward.py runs offline: a tiny random diffusers pipeline, the in-process judge, group advantages."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from examples.rl_reward import group_advantages, main
from negt2i.core.spec import read_prompts
from negt2i.corpus.build import write_corpus
from negt2i.corpus.selectors import TableSelector
from negt2i.corpus.split import build_train
from tests.generate.tiny import build_pipeline

REPO = Path(__file__).resolve().parents[1]


def test_group_advantages_are_grpo_s() -> None:
    mean, std, adv = group_advantages([1.0, 0.5, 0.5, 0.0])
    assert mean == 0.5 and std == pytest.approx(np.std([1.0, 0.5, 0.5, 0.0]))
    assert adv == pytest.approx([(r - 0.5) / (std + 1e-6) for r in (1.0, 0.5, 0.5, 0.0)])
    assert group_advantages([0.5, 0.5])[2] == [0.0, 0.0]  # a flat group carries no signal


def test_the_example_runs_offline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pipe = build_pipeline(tmp_path / "pipe")
    bench = read_prompts(REPO / "data" / "negt2ibench.jsonl")
    train = write_corpus(tmp_path / "train.jsonl", build_train(TableSelector(), bench, size=48, seed=1))
    argv = ["--pipeline", str(pipe), "--prompts", str(train), "--judge", "local", "--backend", "synthetic",
            "--steps", "2", "--group", "3", "--inference-steps", "2", "--size", "32"]  # fmt: skip
    assert main(argv) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [x["step"] for x in lines] == [0, 1] and lines[0]["prompt_id"].startswith("train-")
    for x in lines:
        assert len(x["rewards"]) == 3 and all(0.0 <= r <= 1.0 for r in x["rewards"])
        assert x["mean"] == pytest.approx(np.mean(x["rewards"])) and sum(x["advantages"]) == pytest.approx(0, abs=1e-6)
