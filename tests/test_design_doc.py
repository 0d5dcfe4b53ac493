"""The design is in the repository (docs/design.md), linked from the README and docs/architecture.md, and no page
sends a reader to a design outside it; what the page names exists, and its conventions are the code's."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

from negt2i.core.vocab import COLOR_ANSWERS, COLORS, PREDICATES

REPO = Path(__file__).resolve().parents[1]
DESIGN = REPO / "docs" / "design.md"


def test_the_design_page_is_linked_from_the_readme_and_the_architecture_page():
    assert DESIGN.is_file()
    assert "](docs/design.md)" in (REPO / "README.md").read_text()
    architecture = (REPO / "docs" / "architecture.md").read_text()
    assert "](design.md)" in architecture.split("\n## ")[0]  # in its opening paragraph


def test_no_page_points_at_a_design_outside_the_repository():
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    code = sorted((REPO / "negt2i").rglob("*.py"))
    for path in [*pages, *code]:
        text = path.read_text()
        assert "DESIGN.md" not in text, path
        assert "shared/DESIGN" not in text, path
    for page in (DESIGN, REPO / "docs" / "architecture.md", REPO / "README.md"):
        assert "../shared" not in page.read_text(), page


def test_the_design_covers_what_a_reader_needs():
    text = DESIGN.read_text()
    headings = re.findall(r"^## (.+)$", text, flags=re.M)
    for needed in ("A pure core with thin shells", "The stage contract, and why it looks as it does",
                   "Conventions the rules rely on", "One flow, two ways to reach a stage",
                   "One run loop for every driver"):  # fmt: skip
        assert needed in headings, needed


def test_what_the_design_names_exists():
    text = DESIGN.read_text()
    for link in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        assert (DESIGN.parent / link).is_file(), link
    for path in re.findall(r"`((?:negt2i|tests|protos|data|services|orchestrator|k8s|docker)/[^`\s]*)`", text):
        assert (REPO / path).exists(), path
    for dotted in re.findall(r"`(negt2i\.[a-z_.]+[A-Za-z_]*)`", text):
        parts = dotted.split(".")
        for cut in range(len(parts), 0, -1):  # the longest importable prefix, then attributes
            try:
                obj = importlib.import_module(".".join(parts[:cut]))
            except ModuleNotFoundError:
                continue
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
            break
        else:
            raise AssertionError(dotted)


def test_the_conventions_are_the_codes():
    text = DESIGN.read_text()
    conventions = text[text.index("## Conventions the rules rely on") :]
    for predicates in PREDICATES.values():
        for predicate in predicates:
            assert f"`{predicate}`" in conventions, predicate
    assert "gray" in COLOR_ANSWERS and "gray" not in COLORS and "`gray`" in conventions
    assert "R = (sqrt(|A|/pi) + sqrt(|B|/pi)) / 2" in conventions
