"""``benchmarks/gpu_check.py --smoke`` runs end to end on CPU (tiny models), so that the GPU check keeps
working between the runs on a GPU machine; its figures are not asserted, only that every one is printed."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("rfdetr")
pytest.importorskip("sam2")
pytest.importorskip("open_clip")
pytest.importorskip("transformers")

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.mark.slow
def test_gpu_check_smoke_prints_every_figure(capsys):
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import gpu_check
    finally:
        sys.path.remove(str(BENCHMARKS))
    assert gpu_check.main(["--smoke", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    for stage in ("detector", "segmenter", "attributes", "depth"):
        for dtype in ("fp32", "bf16"):
            assert re.search(rf"^{stage}\s+{dtype}\s+[\d.]+\s+[\d.]+\s+[\d.]+ GiB", out, re.M), (stage, dtype, out)
        assert re.search(rf"^  {stage}\s+bf16\s+\S", out, re.M), out  # its drift against fp32
    assert re.search(r"K \(raw detections >= 0.005 per image\): min \d+ median [\d.]+ max \d+", out)
    assert re.search(r"full pipeline, fp32, 2 images: [\d.]+ images/s", out)
