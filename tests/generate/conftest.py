"""Fixtures: the tiny pipeline (built once per session), its settings, a loaded generator, a few prompts."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from negt2i.core.spec import Prompt, read_prompts
from negt2i.generate.presets import ModelSpec
from tests.generate.tiny import build_pipeline

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_pipeline(tmp_path_factory.mktemp("tiny") / "pipe")


@pytest.fixture(scope="session")
def tiny_spec(tiny_dir: Path) -> ModelSpec:
    return ModelSpec("custom", "tiny SD", str(tiny_dir), steps=2, guidance=7.5, width=32, height=32, dtype="float32")


@pytest.fixture(scope="session")
def tiny_gen(tiny_spec: ModelSpec) -> Any:
    from negt2i.generate.diffusers_backend import DiffusersGenerator

    return DiffusersGenerator(tiny_spec, device="cpu", dtype="float32")


@pytest.fixture(scope="session")
def corpus() -> list[Prompt]:
    return read_prompts(REPO / "data" / "negt2ibench.jsonl")


@pytest.fixture(scope="session")
def prompts(corpus: Sequence[Prompt]) -> list[Prompt]:
    """Four prompts of different categories (an attribute, relations with two and three objects)."""
    by_setting = {(p.category.value if p.category else "", p.setting): p for p in corpus}
    return [by_setting["color", "pos1_neg0"], by_setting["depth", "pos0_neg1"], by_setting["material", "pos1_neg1"],
            by_setting["directional", "pos1_neg1"]]  # fmt: skip


class Counting:
    """Wraps a generator and counts what it was asked for (a resume must ask for exactly the missing samples)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: list[tuple[list[str], list[int]]] = []

    def info(self) -> dict[str, Any]:
        return dict(self.inner.info())

    def generate(self, prompts: Sequence[str], seeds: Sequence[int]) -> Any:
        self.calls.append((list(prompts), list(seeds)))
        return self.inner.generate(prompts, seeds)


@pytest.fixture(autouse=True)
def one_torch_thread() -> Any:
    """One intra-op thread while a test generates: the tiny models are far too small to gain from more, and
    on a loaded 2-core CI machine oversubscribed threads made them 30x slower. Restored afterwards."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
