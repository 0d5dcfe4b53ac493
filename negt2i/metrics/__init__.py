"""Scores, intervals, agreement statistics and reports (``negt2i report``, ``negt2i agreement``).

| module | what |
|---|---|
| ``records`` | results-file lines -> validated ``ImageRow`` (file:line errors) |
| ``benchmark`` | ``BenchmarkState``: mergeable tallies -> Table 3, prompt accuracy, failure causes, dead zones |
| ``bootstrap`` | prompt-bootstrap intervals (stratified by cell) and paired model differences |
| ``stats`` | Cohen's / Fleiss' kappa, precision / recall, Kendall / Spearman, pairwise accuracy (vectorised) |
| ``agreement`` | the human-label study of Section 4 / Appendix B |
| ``report``, ``agreement_report``, ``plots`` | JSON / CSV / Markdown / HTML outputs (plots need matplotlib) |
| ``synthetic`` | results files with known rates (tests, the sample report in ``docs/report.md``) |

See ``docs/report.md`` for the definitions and file formats.
"""
