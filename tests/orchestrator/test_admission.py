"""``orchestrator.admission``: the in-flight byte budget, the bound on items at once, FIFO waiting, refusals,
and the default budget from the cgroup memory limit."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import pytest

from negt2i.wire import adapter
from orchestrator.admission import (
    BYTES_PER_PIXEL,
    MIN_BUDGET,
    Admission,
    Overloaded,
    cgroup_memory_limit,
    default_budget,
    image_pixels,
    item_cost,
)
from orchestrator.settings import Settings

MIB = 1024 * 1024


def test_item_cost_reads_the_header_only() -> None:
    png = adapter.encode_png(np.zeros((300, 200, 3), np.uint8))
    assert image_pixels(png) == 300 * 200
    assert item_cost(png) == len(png) + BYTES_PER_PIXEL * 300 * 200
    assert image_pixels(b"not an image") is None and item_cost(b"not an image") == 12


def test_budget_and_active_bounds_and_fifo() -> None:
    async def run() -> None:
        adm = Admission(budget_bytes=100, max_active=3, max_waiting=10, max_wait_s=5)
        a = await adm.acquire(60)
        b = await adm.acquire(30)
        assert (adm.in_use, adm.active) == (90, 2)
        order: list[str] = []

        async def wait(name: str, cost: int) -> None:
            t = await adm.acquire(cost)
            order.append(name)
            await asyncio.sleep(0.01)
            adm.release(t)

        big = asyncio.create_task(wait("big", 80))  # waits for 80 bytes
        await asyncio.sleep(0.01)
        small = asyncio.create_task(wait("small", 5))  # fits now, but must not overtake the big one
        await asyncio.sleep(0.01)
        assert order == [] and adm.waiting == 2
        adm.release(a)
        adm.release(a)  # idempotent
        await asyncio.sleep(0.01)
        assert order == []  # 30 + 80 > 100: still waiting
        adm.release(b)
        await asyncio.gather(big, small)
        assert order == ["big", "small"]
        assert (adm.in_use, adm.active, adm.waiting) == (0, 0, 0)
        assert adm.stats.peak_bytes <= 100 and adm.stats.peak_active <= 3

    asyncio.run(run())


def test_refusals_when_the_queue_is_full_or_the_wait_runs_out() -> None:
    async def run() -> None:
        adm = Admission(budget_bytes=10, max_active=1, max_waiting=1, max_wait_s=0.2)
        held = await adm.acquire(1)
        start = time.monotonic()
        waiter = asyncio.create_task(adm.acquire(1))
        await asyncio.sleep(0)  # the waiter queues
        assert adm.waiting == 1
        with pytest.raises(Overloaded, match="at capacity"):
            await adm.acquire(1)  # one already waits: refused at once, without waiting
        assert adm.waiting == 1 and not waiter.done()
        with pytest.raises(Overloaded, match=r"no capacity within 0\.2 s"):
            await asyncio.wait_for(waiter, 30)  # 30 s: a guard against a hang
        assert time.monotonic() - start >= 0.2  # it waited out max_wait_s (a lower bound: no machine is too slow)
        # a deadline shorter than max_wait_s cuts the wait
        with pytest.raises(Overloaded):
            await adm.acquire(1, deadline=time.monotonic() + 0.01)
        adm.release(held)
        assert adm.stats.refused == 3 and (adm.in_use, adm.active) == (0, 0)
        # a cost above the whole budget runs alone instead of never
        t = await adm.acquire(10**9)
        assert t.cost == 10 and adm.in_use == 10
        adm.release(t)

    asyncio.run(run())


def test_cancelled_waiters_leave_nothing_behind() -> None:
    async def run() -> None:
        adm = Admission(budget_bytes=10, max_active=1, max_waiting=5, max_wait_s=5)
        held = await adm.acquire(10)
        waiters = [asyncio.create_task(adm.acquire(5)) for _ in range(3)]
        await asyncio.sleep(0.01)
        for w in waiters:
            w.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
        adm.release(held)
        assert (adm.in_use, adm.active) == (0, 0)
        t = await adm.acquire(10)
        adm.release(t)

    asyncio.run(run())


def test_default_budget_follows_the_cgroup_limit(tmp_path: Path) -> None:
    (tmp_path / "memory.max").write_text(f"{2 * 1024 * MIB}\n")
    assert cgroup_memory_limit(tmp_path) == 2 * 1024 * MIB
    assert default_budget(limit=2 * 1024 * MIB) == 1024 * MIB
    (tmp_path / "memory.max").write_text("max\n")
    assert cgroup_memory_limit(tmp_path) is None
    v1 = tmp_path / "v1"
    (v1 / "memory").mkdir(parents=True)
    (v1 / "memory" / "memory.limit_in_bytes").write_text(f"{512 * MIB}")
    assert cgroup_memory_limit(v1) == 512 * MIB
    assert default_budget(limit=None, total_memory=64 * 1024 * MIB) == 4 * 1024 * MIB  # capped
    assert default_budget(limit=None, total_memory=1024 * MIB) == 256 * MIB
    assert default_budget(limit=16 * MIB) == MIN_BUDGET


def test_secure_defaults() -> None:
    s = Settings.from_env({})
    assert s.host == "127.0.0.1" and not s.reflection and not s.auth_token and not s.tls_cert
    assert Settings.from_env({"NEGT2I_HOST": "0.0.0.0", "NEGT2I_REFLECTION": "1"}).reflection
    assert Settings.from_env({"NEGT2I_MAX_INFLIGHT_BYTES": "1048576"}).max_inflight_bytes == MIB


def test_the_k8s_deployment_sets_the_bind_address() -> None:
    manifest = (Path(__file__).resolve().parents[2] / "k8s" / "base" / "orchestrator.yaml").read_text()
    assert "name: NEGT2I_HOST" in manifest and 'value: "0.0.0.0"' in manifest


def test_received_bytes_of_waiting_items_count_in_the_budget() -> None:
    """Waiting items hold their messages: an item whose message would take the waiting items' received bytes
    over the budget is refused at once (issue 31), whatever max_waiting allows; the first waiter always waits."""

    async def run() -> None:
        adm = Admission(budget_bytes=100, max_active=1, max_waiting=100, max_wait_s=5)
        held = await adm.acquire(1, held=90)
        first = asyncio.create_task(adm.acquire(1, held=60))
        second = asyncio.create_task(adm.acquire(1, held=30))
        await asyncio.sleep(0.01)
        assert adm.waiting == 2 and adm.waiting_bytes == 90
        with pytest.raises(Overloaded, match="received"):
            await adm.acquire(1, held=20)  # 90 + 20 > 100
        adm.release(held)
        adm.release(await first)
        adm.release(await second)
        assert adm.waiting_bytes == 0 and adm.in_use == 0

    asyncio.run(run())
