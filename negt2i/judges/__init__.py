"""Judges of the agreement study (Section 4, Appendix B.2-B.4): VQA judges and score-only baselines.

``registry`` holds the table of judge backends (``negt2i judges list``), ``harness`` the one run loop that
asks them the question file's questions about a folder of images and writes a judge file
(``negt2i judges run``; format in ``docs/agreement.md``). Backends import torch / transformers / open_clip
only inside their factories, so importing this package is cheap.
"""
