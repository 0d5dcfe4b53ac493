"""A generation loop that scores each image with the orchestrator while it keeps generating.

With ``diffusers`` installed, ``--diffusers MODEL_DIR`` uses a (local) text-to-image pipeline; otherwise, or
by default, a deterministic image source stands in for the generator (the synthetic renderer of
``negt2i.stages.demo_data``), so the loop runs anywhere. Scoring overlaps generation: each image is sent as
soon as it exists (``AsyncEvaluatorClient``) and at most ``--in-flight`` requests are outstanding.

``python -m orchestrator.examples.generation_loop --orchestrator 127.0.0.1:50051 --images 8``
"""

from __future__ import annotations

import argparse
import asyncio
import io
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from negt2i.client import AsyncEvaluatorClient, ClientError, EvaluateResult
from negt2i.core.spec import Prompt, parse_prompt
from negt2i.stages.demo_data import prompt_records, scene_for
from negt2i.wire.adapter import encode_png


def synthetic_generator(seed: int = 0) -> Callable[[Prompt, dict[str, Any]], bytes]:
    """A deterministic stand-in for a text-to-image model: draws the prompt's objects at random places."""
    rng = np.random.default_rng(seed)

    def generate(_: Prompt, record: dict[str, Any]) -> bytes:
        return encode_png(scene_for(record, rng))

    return generate


def diffusers_generator(
    model_dir: str, steps: int = 2
) -> Callable[[Prompt, dict[str, Any]], bytes]:  # pragma: no cover
    """A diffusers pipeline loaded from a local folder (no network)."""
    from diffusers import DiffusionPipeline  # type: ignore[import-not-found,unused-ignore]  # optional

    pipe = DiffusionPipeline.from_pretrained(model_dir, local_files_only=True)  # type: ignore[no-untyped-call,unused-ignore]

    def generate(prompt: Prompt, _: dict[str, Any]) -> bytes:
        image = pipe(prompt.prompt, num_inference_steps=steps).images[0]
        buf = io.BytesIO()
        image.save(buf, format="PNG")
        return buf.getvalue()

    return generate


async def run(target: str, n_images: int, in_flight: int, generate: Callable[[Prompt, dict[str, Any]], bytes]) -> int:
    records = prompt_records(max(n_images, 1))
    slots = asyncio.Semaphore(in_flight)
    results: list[EvaluateResult | ClientError] = []

    async with AsyncEvaluatorClient(target) as client:

        async def score(image: bytes, prompt: Prompt, k: int) -> None:
            try:
                results.append(await client.evaluate(image, prompt=prompt, request_id=f"image-{k}"))
            except ClientError as exc:
                results.append(exc)
            finally:
                slots.release()

        tasks = []
        for k in range(n_images):
            record = records[k % len(records)]
            prompt = parse_prompt(record)
            image = await asyncio.to_thread(generate, prompt, record)  # the generator keeps the loop free
            await slots.acquire()
            tasks.append(asyncio.create_task(score(image, prompt, k)))
        await asyncio.gather(*tasks)
    ok = [r for r in results if isinstance(r, EvaluateResult)]
    for r in ok:
        v = r.verdict
        print(f"{r.request_id}: {'correct' if v.correct else 'wrong  '} {v.prompt!r} {v.reason}")
    for err in (r for r in results if isinstance(r, ClientError)):
        print(f"error: {err}", file=sys.stderr)
    correct = sum(r.verdict.correct for r in ok)
    print(f"{len(ok)} images scored while generating; {correct} correct")
    return 0 if len(ok) == n_images else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--orchestrator", default="127.0.0.1:50051")
    p.add_argument("--images", type=int, default=8)
    p.add_argument("--in-flight", type=int, default=4)
    p.add_argument("--diffusers", default=None, help="local diffusers pipeline folder (default: synthetic source)")
    a = p.parse_args(argv)
    generate = diffusers_generator(a.diffusers) if a.diffusers else synthetic_generator()
    return asyncio.run(run(a.orchestrator, a.images, a.in_flight, generate))


if __name__ == "__main__":
    sys.exit(main())
