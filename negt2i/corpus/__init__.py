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

DEFAULT_CORPUS = "data/negt2ibench.jsonl"
"""The committed corpus, relative to the repository root (built with seed 0 and the table)."""

DEFAULT_CONTROL = "data/negt2ibench-control.jsonl"
"""The committed control set (``negt2i corpus control``)."""

DEFAULT_PARAPHRASE = "data/negt2ibench-paraphrase.jsonl"
"""The committed paraphrase set (``negt2i corpus paraphrase``)."""

__all__ = ["DEFAULT_CONTROL", "DEFAULT_CORPUS", "DEFAULT_PARAPHRASE"]
