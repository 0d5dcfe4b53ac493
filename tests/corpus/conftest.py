"""Shared fixtures: one default build per test session (about 2 s)."""

from __future__ import annotations

from pathlib import Path

import pytest

from negt2i.core.spec import Prompt
from negt2i.corpus.build import build_corpus
from negt2i.corpus.selectors import TableSelector

REPO = Path(__file__).resolve().parents[2]
COMMITTED = REPO / "data" / "negt2ibench.jsonl"


@pytest.fixture(scope="session")
def built() -> list[Prompt]:
    """The default corpus: table selector, seed 0 (what data/ holds)."""
    return build_corpus(TableSelector(), seed=0)
