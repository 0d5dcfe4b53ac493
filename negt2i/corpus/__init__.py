"""The NegT2IBench corpus: build, validate and describe the 4,800 benchmark prompts.

- ``templates``: the deterministic wording (Table 4);
- ``plausibility``: the default, reviewable plausibility table;
- ``selectors``: the selector interface, the table selector and the LLM selector;
- ``balancing``: least-used selection and the most-even allocation;
- ``build``: the builder (``build_corpus``, ``write_corpus``);
- ``validate``: the benchmark's invariants, violations with their line;
- ``stats``: per-category statistics (Appendix A.2);
- ``control`` and ``paraphrase``: the two probe sets made from the corpus (Appendix F's limits).
"""

from __future__ import annotations

from pathlib import Path

DEFAULT_CORPUS = "data/negt2ibench.jsonl"
"""The committed corpus, relative to the repository root (built with seed 0 and the table). The package
carries the same bytes (``packaged_corpus``), which is what commands read when no prompt file is named."""

DEFAULT_CONTROL = "data/negt2ibench-control.jsonl"
"""The committed control set (``negt2i corpus control``)."""

DEFAULT_PARAPHRASE = "data/negt2ibench-paraphrase.jsonl"
"""The committed paraphrase set (``negt2i corpus paraphrase``)."""


def packaged_corpus() -> Path:
    """The benchmark corpus as installed with the package (``negt2i/data/negt2ibench.jsonl``, package data of
    the wheel), found from any working directory.

    ``data/negt2ibench.jsonl`` is the corpus as built and documented in the repository; the package ships
    a byte-identical copy (git stores the two as one blob; ``tests/corpus/test_packaged_corpus.py`` fails
    when they differ) so that an installed ``negt2i`` (``pip install .``, a wheel, an image) has its own
    data: ``python -m negt2i.stages.demo_data DIR --full`` and ``negt2i generate`` without ``--prompts``
    read this file, not a path relative to the working directory."""
    from importlib import resources

    return Path(str(resources.files("negt2i").joinpath("data").joinpath("negt2ibench.jsonl")))


def corpus_path(path: str | Path | None = None) -> Path:
    """``path`` when given, else the packaged corpus (``packaged_corpus``)."""
    return Path(path) if path is not None and str(path) != "" else packaged_corpus()


__all__ = ["DEFAULT_CONTROL", "DEFAULT_CORPUS", "DEFAULT_PARAPHRASE", "corpus_path", "packaged_corpus"]
