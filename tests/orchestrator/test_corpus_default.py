"""docs/api.md's claims about prompt ids: the orchestrator loads the benchmark corpus by default, and the
demo's ids are not corpus ids (so the demo is sent inline)."""

from __future__ import annotations

from pathlib import Path

import pytest

from negt2i.stages.demo_data import prompt_records
from orchestrator.server import load_corpus
from orchestrator.settings import Settings

REPO = Path(__file__).resolve().parents[2]


def test_without_negt2i_corpus_the_benchmark_corpus_is_loaded(monkeypatch: pytest.MonkeyPatch):
    settings = Settings.from_env({})
    assert settings.corpus == "data/negt2ibench.jsonl"  # relative to the working directory
    monkeypatch.chdir(REPO)
    corpus = load_corpus(settings.corpus)
    assert len(corpus) == 4800 and "color-pos0_neg1-000" in corpus
    assert not {r["id"] for r in prompt_records(12)} & set(corpus)  # the demo's ids: not corpus ids
    other = Settings.from_env({"NEGT2I_CORPUS": "data/negt2ibench-control.jsonl"})
    assert "control-color-pos1_neg0-000" in load_corpus(other.corpus)
    dockerfile = (REPO / "orchestrator" / "Dockerfile").read_text()
    assert "WORKDIR /app" in dockerfile and "data/negt2ibench.jsonl" in dockerfile  # the image ships it
