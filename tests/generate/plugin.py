"""A user's own generator, plugged in through NEGT2I_GENERATOR_MODULES (tests/generate/test_presets_cli.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from PIL import Image

from negt2i.generate import ModelSpec, register_generator


class SolidColour:
    """One flat colour per seed: image i depends only on seeds[i]."""

    def __init__(self, spec: ModelSpec, **_: Any) -> None:
        self.spec = spec

    def info(self) -> dict[str, Any]:
        return {"pipeline": "SolidColour", "scheduler": None}

    def generate(self, prompts: Sequence[str], seeds: Sequence[int]) -> list[Image.Image]:
        size = (self.spec.width, self.spec.height)
        return [Image.new("RGB", size, (s % 256, (7 * s) % 256, (13 * s) % 256)) for s in seeds]


register_generator("test-solid", SolidColour, replace=True)
