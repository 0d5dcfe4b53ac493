"""How often the attribute verdicts differ between two text template sets (issue 30 item 2), on the demo data.

The demo folder (``negt2i.stages.demo_data.write_demo``, the corpus's prompts: one per category x setting,
``--samples`` images each) is evaluated twice with the same stages, once with ``attributes.text_templates =
single`` (the ``current`` rules) and once with ``geneval`` (GenEval's three-template ensemble); the colour and
material images whose verdict (correct or not) differs, and the attribute statements whose outcome differs, are
counted and printed.

The scorer is SigLIP with RANDOM weights (no weights can be downloaded here): ``--model tiny`` (the tests'
toy open_clip model with the real tokenizer; seconds) or ``--model so400m`` (the paper's SO400M/14-378
architecture with the bundled tokenizer; minutes on a CPU). Random weights make the number meaningless as a
statement about SigLIP 2: it shows only that the option takes effect and how the comparison is made. With the
published weights (``negt2i weights fetch``) run ``negt2i evaluate`` twice instead (docs/rules.md).
The synthetic scorer reads no text, so with ``--backend attributes=synthetic`` the two sets agree by
construction. Usage::

    PYTHONPATH=$PWD .venv/bin/python benchmarks/template_agreement.py [--samples 2] [--model tiny]

The figure line (after a ``machine:`` line: CPU model, core count, load average)::

    image verdicts that differ (single vs geneval templates): N of M (P%)

``--smoke``: ``--samples 1 --model tiny`` (seconds).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's negt2i, wherever it is run from

from benchmarks.machine import describe
from negt2i.core.config import CURRENT, AttributeConfig, RuleConfig
from negt2i.evaluate import evaluate
from negt2i.pipeline import Stages
from negt2i.run.jobs import discover
from negt2i.stages.demo_data import write_demo
from negt2i.stages.synthetic import SyntheticDepthEstimator, SyntheticDetector, SyntheticSegmenter

ATTRIBUTE_CATEGORIES = frozenset({"color", "material"})
"""The categories whose verdicts the attribute scorer decides (only their images are evaluated)."""

TINY = {
    "embed_dim": 32,
    "init_logit_bias": -10,
    "custom_text": True,
    "vision_cfg": {"image_size": 32, "layers": 2, "width": 64, "patch_size": 8, "head_width": 32},
    "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 2,
                 "no_causal_mask": True, "proj_bias": True, "pool_type": "last"},
}  # fmt: skip
"""The tests' toy SigLIP 2 layout (``tests/stages/test_siglip.py``), with open_clip's bundled tokenizer."""


def scorer(model: str, config: RuleConfig, tmp: Path) -> Any:
    import open_clip
    import torch

    from negt2i.core.stage_types import ModelInfo, applied
    from negt2i.stages.siglip_backend import SigLIPScorer

    name = "ViT-SO400M-14-SigLIP2-378"
    if model == "tiny":
        path = tmp / "negt2i-tiny-sl2.json"
        path.write_text(json.dumps(TINY))
        open_clip.add_model_config(path)
        name = "negt2i-tiny-sl2"
    torch.manual_seed(0)
    net, _, preprocess = open_clip.create_model_and_transforms(name, pretrained=None)
    tokenizer = open_clip.get_tokenizer("negt2i-tiny-sl2" if model == "tiny" else "ViT-B-32")  # no download
    info = applied(ModelInfo(stage="attributes", backend="siglip2-so400m-378", model=f"{name} random"), config)
    return SigLIPScorer(net, preprocess, tokenizer, info, config=config)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--samples", type=int, default=2, help="images per prompt")
    p.add_argument("--model", choices=("tiny", "so400m"), default="tiny")
    p.add_argument("--smoke", action="store_true", help="--samples 1 --model tiny: seconds")
    a = p.parse_args(argv)
    if a.smoke:
        a.samples, a.model = 1, "tiny"
    print(describe())
    ensemble = RuleConfig(name="geneval-templates", attributes=AttributeConfig(text_templates="geneval"))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_demo(root / "images", samples=a.samples, full=True)
        jobs = [j for j in discover(root / "images") if j.prompt and j.prompt.category and
                j.prompt.category.value in ATTRIBUTE_CATEGORIES]  # fmt: skip
        runs: dict[str, dict[str, dict[str, Any]]] = {}
        for config in (CURRENT, ensemble):
            stages = Stages(SyntheticDetector(config=config), SyntheticSegmenter(config=config),
                            scorer(a.model, config, root), SyntheticDepthEstimator())  # fmt: skip
            out = root / f"{config.name}.jsonl"
            evaluate(jobs, out, stages, config=config, workers=0, progress=False)
            lines = [json.loads(line) for line in out.read_text().splitlines()]
            runs[config.name] = {r["filename"]: r for r in lines if r.get("category") in ATTRIBUTE_CATEGORIES}
        single, geneval = runs[CURRENT.name], runs[ensemble.name]
        assert single.keys() == geneval.keys()
        images = sorted(single)
        differ = [f for f in images if single[f].get("correct") != geneval[f].get("correct")]
        statements = differ_statements = 0
        for f in images:
            sa, sb = single[f].get("statements") or [], geneval[f].get("statements") or []
            statements += len(sa)
            key = [(x.get("passed"), x.get("fired")) for x in sa], [(y.get("passed"), y.get("fired")) for y in sb]
            differ_statements += sum(x != y for x, y in zip(*key, strict=True))
        print(f"demo data: {len(images)} colour / material images ({a.samples} per prompt), SigLIP {a.model} with "
              f"RANDOM weights (the figure says nothing about SigLIP 2's published weights)")  # fmt: skip
        print(
            f"image verdicts that differ (single vs geneval templates): {len(differ)} of {len(images)} "
            f"({100 * len(differ) / max(1, len(images)):.1f}%)"
        )
        print(f"attribute statements whose outcome (passed, value fired) differs: {differ_statements} of {statements}")
        for f in differ:
            print(f"  {f}: {single[f].get('correct')} -> {geneval[f].get('correct')}")


if __name__ == "__main__":
    main()
