"""``benchmarks/bench_judge.py --baseline REV`` times another revision's judge beside this tree's and says
whether their verdicts record the same values; its figures are not asserted, only that every row is
printed (with its ratio to the reference workload) and that the comparison tells equal verdicts from different
ones."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "bench_judge.py"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=REPO, timeout=300, check=False
    )


def test_baseline_of_this_revision_prints_every_prompt() -> None:
    """HEAD exported beside the working tree (identical verdicts unless the tree changes the rules)."""
    done = _run("--baseline", "HEAD", "--repeats", "2")
    assert done.returncode == 0, done.stderr
    for prompt in ("directional", "proximity", "comparative", "depth", "color"):
        row = rf"^{prompt}\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+(yes|NO)$"  # ... x ref, baseline
        assert re.search(row, done.stdout, re.M), done.stdout
    assert re.search(r"^slowest: \w+ [\d.]+ x reference \(goal <= [\d.]+\)", done.stdout, re.M), done.stdout


def test_unknown_revision_is_refused_with_git_s_reason() -> None:
    done = _run("--baseline", "no-such-revision-here", "--repeats", "2")
    assert done.returncode != 0
    assert "--baseline no-such-revision-here: git archive failed" in done.stderr


def test_same_record_compares_shared_fields_bit_for_bit() -> None:
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import bench_judge
    finally:
        sys.path.remove(str(SCRIPT.parent))
    this = bench_judge.package("negt2i")
    name, prompt, perceptions = bench_judge.cases(this)[3]
    assert name == "depth"
    first, second = (this.verdict.judge(prompt, p) for p in perceptions[:2])
    assert bench_judge.same_record(first, this.verdict.judge(prompt, perceptions[0]))
    assert not bench_judge.same_record(first, second)
    record = first.model_dump()
    changed = {**record, "statements": [dict(s) for s in record["statements"]]}
    measured = dict(changed["statements"][0]["measurements"])
    measured["disparity_a"] = float(measured["disparity_a"]) + 1e-16  # one unit in the last place
    changed["statements"][0]["measurements"] = measured
    assert not bench_judge.same_record(record, changed)
    # a field only one side records (a later revision added it) is not compared
    assert bench_judge.same_record({**record, "added_later": 1}, record)
