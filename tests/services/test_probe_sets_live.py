"""The probe sets through ``negt2i submit`` and the live orchestrator: the same lines as ``negt2i evaluate``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from negt2i.cli import main
from negt2i.core.spec import read_prompts
from negt2i.corpus.control import control_prompt
from negt2i.corpus.paraphrase import paraphrase_prompt
from negt2i.stages.synthetic import SceneObject, render_scene, write_geneval_layout
from tests.services.live import REPO, Proc

pytestmark = pytest.mark.xdist_group("services")


def test_control_and_paraphrase_prompts_submit_like_evaluate(orchestrator: Proc, tmp_path: Path) -> None:
    corpus = {p.id: p for p in read_prompts(REPO / "data" / "negt2ibench.jsonl")}
    directional = corpus["directional-pos1_neg1-000"]  # subject, two targets
    color = corpus["color-pos1_neg1-000"]
    names = [o.class_name for o in directional.objects]
    scene = render_scene(
        [SceneObject(names[0], (40, 40, 60, 60)), SceneObject(names[1], (5, 5, 25, 25)),
         SceneObject(names[2], (70, 70, 90, 90))],
        (96, 96),
    )  # fmt: skip
    cnames = [o.class_name for o in color.objects]
    value = color.statements[0].value  # "a <value> A and a non-<value> B": both drawn in <value>
    cscene = render_scene(
        [SceneObject(cnames[0], (5, 5, 40, 40), value=value), SceneObject(cnames[1], (50, 50, 90, 90), value=value)],
        (96, 96),
    )
    entries = [
        (control_prompt(directional).to_json(), [scene]),
        (control_prompt(color).to_json(), [cscene]),
        (paraphrase_prompt(directional, "which_isnt").to_json(), [scene]),
        (paraphrase_prompt(color, "sentences_isnt").to_json(), [cscene]),
    ]
    write_geneval_layout(tmp_path / "images", entries)
    embedded, submitted = tmp_path / "e.jsonl", tmp_path / "s.jsonl"
    assert main(["evaluate", str(tmp_path / "images"), "--out", str(embedded), "--backend", "synthetic",
                 "--no-progress"]) == 0  # fmt: skip
    assert main(["submit", str(tmp_path / "images"), "--orchestrator", orchestrator.target, "--out", str(submitted),
                 "--no-progress"]) == 0  # fmt: skip
    want = [json.loads(line) for line in embedded.read_text().splitlines()]
    got = [json.loads(line) for line in submitted.read_text().splitlines()]
    for g in got:
        g.pop("services", None)
    assert got == want
    control_lines, para_lines = want[:2], want[2:]
    assert all(r["status"] == "ok" and r["statements"] == [] and r["probes"] for r in control_lines)
    assert [p["outcome"] for p in control_lines[1]["probes"]] == ["holds", "holds"]  # both objects carry the value
    assert all(r["correct"] for r in control_lines)  # the objects are there; probes never count
    assert [r["form"] for r in para_lines] == ["which_isnt", "sentences_isnt"]
    assert not para_lines[1]["correct"] and para_lines[1]["failure_class"] == "negated_violated"
