"""Small synthetic results sets shared by the metrics tests (real verdicts, exact known rates)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from negt2i.core.spec import Prompt
from negt2i.metrics.synthetic import make_prompts, make_results


def rate_a(category: str, setting: str) -> float:
    """Known accuracy of model A per cell: 0.75 at load 1 without negation, lower with load and negation."""
    p, n = (int(x) for x in setting.removeprefix("pos").split("_neg"))
    return 0.75 - 0.125 * (p + n - 1) - 0.125 * n + (0.125 if category == "color" else 0.0)


@pytest.fixture(scope="session")
def prompts() -> list[Prompt]:
    return make_prompts(2, seed=1)


@pytest.fixture(scope="session")
def records_a(prompts: list[Prompt]) -> list[dict[str, Any]]:
    return list(make_results(prompts, rate_a, seed=2, error_every=5))


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path
