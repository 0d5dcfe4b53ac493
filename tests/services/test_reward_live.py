"""negt2i.reward against the real orchestrator and stage services: the same rewards as in-process, in input
order, every input form, explicit failures, the async form."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from negt2i.core.spec import parse_prompt
from negt2i.reward import AsyncRewardClient, RewardClient, RewardDetails, RewardError, RewardFailure, RewardJudge
from negt2i.stages.demo_data import demo_entries
from negt2i.wire import adapter
from tests.services.live import REPO, Proc

pytestmark = pytest.mark.xdist_group("services")

SYNTH = dict.fromkeys(("detector", "segmenter", "attributes", "depth"), "synthetic")


@pytest.fixture(scope="module")
def batch() -> tuple[list[dict], list[np.ndarray]]:
    records, images = [], []
    for record, imgs in demo_entries(prompts=8, samples=2, seed=11, size=96):
        records += [record] * len(imgs)
        images += imgs
    return records, images


@pytest.fixture(scope="module")
def local() -> RewardJudge:
    return RewardJudge("cpu", backends=SYNTH, corpus=Path(REPO) / "data" / "negt2ibench.jsonl")


def test_served_rewards_are_the_in_process_rewards_in_input_order(orchestrator: Proc, batch, local) -> None:
    records, images = batch
    want = local.score(images, records)
    with RewardClient(orchestrator.target, window=4) as reward:  # a window smaller than the batch
        assert reward.score(images, records) == want
        pngs = [adapter.encode_png(im) for im in images]
        assert reward.score(pngs[::-1], records[::-1]) == want[::-1]
        details = reward.score(
            images[:3], [adapter.prompt_to_proto(parse_prompt(r)) for r in records[:3]], details=True
        )
        assert 0 < reward.last_max_in_flight <= 4
    assert all(isinstance(d, RewardDetails) for d in details) and [d.score for d in details] == want[:3]
    assert [d.verdict.to_json() for d in details] == [
        d.verdict.to_json() for d in local.score(images[:3], records[:3], details=True)
    ]
    assert any(0 < s < 1 for s in want)


def test_failures_are_explicit_and_the_rest_is_scored(orchestrator: Proc, batch) -> None:
    records, images = batch
    inputs = [images[0], b"\x89PNG\r\n\x1a\n truncated", images[1], images[2]]
    prompts = [records[0], records[1], "no-such-prompt", {"prompt": "x", "include": [{"class": "unicorn"}]}]
    with RewardClient(orchestrator.target) as reward:
        got = reward.score(inputs, prompts, on_error="return")
        with pytest.raises(RewardError, match=r"3 of 4 images got no reward: image 1: INVALID_ARGUMENT") as err:
            reward.score(inputs, prompts)
    assert isinstance(got[0], float)
    assert [(f.index, f.code, f.retryable) for f in got[1:]] == [
        (1, "INVALID_ARGUMENT", False), (2, "NOT_FOUND", False), (3, "INVALID_ARGUMENT", False)
    ]  # fmt: skip
    assert got[2].message.startswith("prompt_id: no prompt 'no-such-prompt' in the corpus")  # an id: sent as one
    assert "unicorn" in got[3].message
    assert err.value.results[0] == got[0] and [f.index for f in err.value.failures] == [1, 2, 3]
    assert all(isinstance(f, RewardFailure) for f in err.value.failures)


def test_the_async_client(orchestrator: Proc, batch, local) -> None:
    records, images = batch

    async def run() -> list[list[float]]:
        async with AsyncRewardClient(orchestrator.target, window=8) as reward:
            return list(
                await asyncio.gather(reward.score(images[:4], records[:4]), reward.score(images[4:8], records[4:8]))
            )

    first, second = asyncio.run(run())
    assert first + second == local.score(images[:8], records[:8])
