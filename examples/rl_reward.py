"""A GRPO-style reward loop a trainer can copy: sample a group per training prompt, score it, log advantages.

docs/reward.md explains the score and how to serve the judge. For each of the first ``--steps`` prompts of
a training split (``negt2i corpus build --split train``), a diffusers pipeline samples ``--group`` images
(one seed each), the judge scores them (``negt2i.reward``: ``RewardClient`` against an orchestrator, or
``RewardJudge`` in this process), and the loop logs the group's mean and std and each sample's advantage
``(r - mean) / (std + eps)`` (GRPO's group-relative advantage; Flow-GRPO and DanceGRPO use the same).
There is no optimiser step: that is the trainer's part. A group with a failed image is skipped and
logged, never given a default reward.

    # against a running orchestrator (docs/deployment.md), any diffusers text-to-image pipeline:
    python -m examples.rl_reward --pipeline stabilityai/stable-diffusion-2-1-base \\
        --prompts train.jsonl --orchestrator 127.0.0.1:50051 --steps 8 --group 8
    # everything in this process (the judge's models need their weights: negt2i weights fetch):
    python -m examples.rl_reward --pipeline PIPELINE_DIR --prompts train.jsonl --judge local --device cuda

One JSON line per step on stdout: ``{"step", "prompt_id", "rewards", "mean", "std", "advantages",
"seconds"}`` (or ``"skipped"`` with the failures).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from negt2i.core.spec import Prompt, read_prompts
from negt2i.reward import RewardClient, RewardFailure, RewardJudge

EPS = 1e-6


def group_advantages(rewards: Sequence[float]) -> tuple[float, float, list[float]]:
    """GRPO's group-relative advantages: (mean, std, (r - mean) / (std + EPS)) with the population std."""
    r = np.asarray(rewards, dtype=np.float64)
    mean, std = float(r.mean()), float(r.std())
    return mean, std, [float(a) for a in (r - mean) / (std + EPS)]


def load_pipeline(name: str, device: str, dtype: str) -> Any:
    """A diffusers text-to-image pipeline from a folder (offline) or a hub id."""
    import torch
    from diffusers import DiffusionPipeline

    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    pipe = DiffusionPipeline.from_pretrained(name, dtype=torch_dtype)
    pipe.set_progress_bar_config(disable=True)
    return pipe.to(device)


def sample_group(pipe: Any, prompt: Prompt, *, group: int, seed: int, steps: int, size: int | None) -> list[Any]:
    """``group`` PIL images of one prompt, seeds ``seed .. seed + group - 1``."""
    import torch

    generators = [torch.Generator("cpu").manual_seed(seed + k) for k in range(group)]
    extra: dict[str, Any] = {} if size is None else {"height": size, "width": size}
    out = pipe([prompt.prompt] * group, generator=generators, num_inference_steps=steps, output_type="pil", **extra)
    return list(out.images)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pipeline", required=True, help="diffusers pipeline folder or hub id")
    ap.add_argument("--prompts", required=True, help="training prompts (negt2i corpus build --split train)")
    ap.add_argument("--judge", choices=("orchestrator", "local"), default="orchestrator")
    ap.add_argument("--orchestrator", default="127.0.0.1:50051", help="host:port (--judge orchestrator)")
    ap.add_argument("--backend", default=None, help="--judge local: one backend for every stage (e.g. synthetic)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="fp32", help="the judge's precision (--judge local), fp32 / bf16 / fp16")
    ap.add_argument("--steps", type=int, default=4, help="training prompts to run (one group each)")
    ap.add_argument("--group", type=int, default=4, help="samples per prompt")
    ap.add_argument("--inference-steps", type=int, default=20)
    ap.add_argument("--size", type=int, default=None, help="image side in pixels (default: the pipeline's)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.steps < 1 or args.group < 2:
        ap.error("--steps must be >= 1 and --group >= 2 (a group-relative advantage needs two samples)")

    prompts = read_prompts(args.prompts)[: args.steps]
    pipe = load_pipeline(args.pipeline, args.device, "fp32")
    judge: RewardClient | RewardJudge
    if args.judge == "local":
        backends = (
            dict.fromkeys(("detector", "segmenter", "attributes", "depth"), args.backend) if args.backend else None
        )
        judge = RewardJudge(args.device, dtype=args.dtype, backends=backends)
    else:
        judge = RewardClient(args.orchestrator)
    try:
        for step, prompt in enumerate(prompts):
            start = time.perf_counter()
            images = sample_group(
                pipe, prompt, group=args.group, seed=args.seed + step * args.group, steps=args.inference_steps,
                size=args.size,
            )  # fmt: skip
            rewards = judge.score(images, [prompt] * len(images), on_error="return")
            failed = [r for r in rewards if isinstance(r, RewardFailure)]
            line: dict[str, Any] = {"step": step, "prompt_id": prompt.id}
            if failed:  # never train on a made-up reward: the group is skipped
                line["skipped"] = [str(f) for f in failed]
            else:
                mean, std, adv = group_advantages(rewards)
                line |= {"rewards": rewards, "mean": mean, "std": std, "advantages": adv}
            line["seconds"] = round(time.perf_counter() - start, 3)
            print(json.dumps(line), flush=True)
    finally:
        if isinstance(judge, RewardClient):
            judge.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
