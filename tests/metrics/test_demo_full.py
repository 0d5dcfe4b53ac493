"""The newcomer's first report: ``demo_data --full`` fills every cell of Table 3, and a cell without images
says "n/a" in the tables and the heatmap instead of staying blank."""

from __future__ import annotations

import json
from pathlib import Path

from negt2i.core.vocab import Category
from negt2i.metrics.report_tables import SETTING_ORDER, pct
from negt2i.stages.demo_data import corpus_records, main


def test_full_demo_covers_every_category_and_setting(tmp_path: Path):
    records = corpus_records(seed=0)
    cells = [(r["category"], r["setting"]) for r in records]
    assert len(cells) == len(set(cells)) == 48
    assert set(cells) == {(c.value, s) for c in Category for s in SETTING_ORDER}
    assert corpus_records(seed=0) == records and corpus_records(seed=1) != records  # seeded choice
    assert main([str(tmp_path / "demo"), "--full", "--samples", "1", "--size", "64"]) == 0
    folders = sorted(p for p in (tmp_path / "demo").iterdir())
    assert len(folders) == 48 and all(len(list((f / "samples").iterdir())) == 1 for f in folders)
    first = json.loads((folders[0] / "metadata.jsonl").read_text())
    assert (first["category"], first["setting"]) == ("color", "pos0_neg1")


def test_a_cell_without_images_says_n_a():
    import matplotlib

    matplotlib.use("Agg")
    from negt2i.metrics.plots import heatmap

    assert pct(None) == "n/a" and pct(float("nan")) == "n/a" and pct(0.5) == "50.0"
    report = {"models": {"m": {"image_accuracy": {"by_cell": {"color/pos1_neg0": 0.5}, "overall": 0.5}}}}
    fig = heatmap(report, "m")
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert texts.count("50.0") == 1 and texts.count("n/a") == 6 * 8 - 1
