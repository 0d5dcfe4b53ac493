"""``docs/report-sample/`` is what ``python -m negt2i.metrics.sample docs/report-sample`` writes today."""

from __future__ import annotations

from pathlib import Path

from PIL import Image

from negt2i.metrics.sample import SAMPLE_FILES, generate

SAMPLE = Path(__file__).resolve().parents[2] / "docs" / "report-sample"
FIX = "out of date: regenerate it with `python -m negt2i.metrics.sample docs/report-sample` (make report-sample)"


def test_the_committed_sample_report_is_up_to_date(tmp_path: Path) -> None:
    out = generate(tmp_path)
    for name in SAMPLE_FILES:
        want = (out / name).read_text(encoding="utf-8")
        assert (SAMPLE / name).read_text(encoding="utf-8") == want, f"docs/report-sample/{name} is {FIX}"
    fresh = sorted(p.name for p in (out / "plots").glob("*.png"))
    assert sorted(p.name for p in (SAMPLE / "plots").glob("*.png")) == fresh, f"docs/report-sample/plots is {FIX}"
    for name in fresh:  # pixels depend on the matplotlib build; the figure layout must match
        with Image.open(out / "plots" / name) as a, Image.open(SAMPLE / "plots" / name) as b:
            assert a.size == b.size, f"docs/report-sample/plots/{name} is {FIX}"
