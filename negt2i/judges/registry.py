"""The one table of judge backends by name (``qwen3-vl-8b``, ``clipscore-vit-b-32``, ...), like the stages'.

Each ``JudgeBackend`` row holds the name, the kind (``vqa``: answers yes / no questions in the modes
``whole`` / ``pos`` / ``neg``; ``score``: one number per image and prompt, ``--mode score``), the factory,
the paper's name for it, its nominal size and its weights entry (``negt2i.weights.JUDGE_WEIGHTS``). Built-in
backends register when ``BUILTIN_MODULES`` are imported (lazily, on first use: importing the registry never
imports torch), then the plug-in modules named in ``NEGT2I_JUDGE_MODULES``.

``create(name, device=, weights_dir=, dtype=, random_init=)`` builds one. Real weights are the default
(``negt2i weights fetch NAME`` puts them in the cache; missing weights raise one ``WeightsMissingError``
saying so); ``random_init=True`` builds the same architecture from a tiny random configuration, offline
(tests, and the worked example of ``docs/agreement.md``: answers are meaningless, plumbing is real).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from negt2i.judges.base import Kind, ScoreJudge, VQAJudge

BUILTIN_MODULES: list[str] = ["negt2i.judges.vlm", "negt2i.judges.clip_score", "negt2i.judges.hf_clip"]
JUDGE_MODULES_ENV: Final = "NEGT2I_JUDGE_MODULES"
"""Comma-separated modules imported before a judge is built, to register more judges (plug-ins)."""


@dataclass(frozen=True)
class JudgeBackend:
    """One row of the judge table."""

    name: str
    kind: Kind
    factory: Callable[..., VQAJudge | ScoreJudge]
    """Called as ``factory(device=..., weights_dir=..., dtype=..., random_init=...)``."""
    label: str
    """The paper's name, written as the judge files' ``judge`` (e.g. ``Qwen3-VL-8B``)."""
    params: str = ""
    """Nominal size as the paper prints it (``8B``)."""
    weights: str | None = None
    """The ``negt2i.weights`` entry it loads (None: no weights to fetch)."""
    model: str = ""
    extra_weights: tuple[str, ...] = ()
    """Further entries it loads (PickScore's processor comes from another repository)."""

    def weight_entries(self) -> list[str]:
        """Every ``negt2i.weights`` entry the judge needs, its own first."""
        return [*([self.weights] if self.weights else []), *self.extra_weights]


_TABLE: dict[str, JudgeBackend] = {}
_state = {"loaded": False}


def register(row: JudgeBackend, *, replace: bool = False) -> None:
    if row.kind not in ("vqa", "score"):
        raise ValueError(f"judge {row.name!r}: kind must be vqa or score, got {row.kind!r}")
    if row.name in _TABLE and not replace:
        raise ValueError(f"judge {row.name!r} is already registered")
    _TABLE[row.name] = row


def import_judge_modules(env: Mapping[str, str] | None = None) -> list[str]:
    value = (os.environ if env is None else env).get(JUDGE_MODULES_ENV, "")
    names = [m.strip() for m in value.split(",") if m.strip()]
    for module in names:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ValueError(f"{JUDGE_MODULES_ENV}: cannot import {module!r} ({exc})") from None
    return names


def _load() -> None:
    if not _state["loaded"]:
        _state["loaded"] = True
        for module in BUILTIN_MODULES:
            importlib.import_module(module)
        import_judge_modules()


def judges() -> list[JudgeBackend]:
    """Every row, VQA judges first, then by name."""
    _load()
    return sorted(_TABLE.values(), key=lambda r: (r.kind != "vqa", r.name))


def backend(name: str) -> JudgeBackend:
    """The row of judge ``name``; the error lists the known names."""
    _load()
    try:
        return _TABLE[name]
    except KeyError:
        raise ValueError(f"unknown judge {name!r}; registered: {', '.join(sorted(_TABLE)) or 'none'}") from None


def create(
    name: str,
    *,
    device: str = "auto",
    weights_dir: str | Path | None = None,
    dtype: str = "auto",
    random_init: bool = False,
) -> VQAJudge | ScoreJudge:
    """Build judge ``name`` and check it against its kind's protocol (``negt2i.judges.base``)."""
    row = backend(name)
    built = row.factory(device=device, weights_dir=weights_dir, dtype=dtype, random_init=random_init)
    protocol: type = VQAJudge if row.kind == "vqa" else ScoreJudge
    if not isinstance(built, protocol):
        raise TypeError(f"judge {name!r} built a {type(built).__name__}, which is not a {protocol.__name__}")
    return built
