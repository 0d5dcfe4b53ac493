"""Admission control: how many items the orchestrator judges at once, how many bytes they hold, and who waits.

Every item (a unary ``Evaluate`` or one item of an ``EvaluateStream``) is admitted before any work is done
on it, and releases its admission when its answer is sent:

- **cost** of an item = ``len(encoded image) + BYTES_PER_PIXEL x H x W`` (``H x W`` from the image header,
  read without decoding by ``negt2i.core.images.header_size``, never by Pillow; an unreadable header costs only its
  bytes: the decoder rejects it right after). Reading a header walks a JPEG's marker segments, which for a
  valid JPEG padded with thousands of segments up to the image limit is real work: the server computes the
  cost on a worker thread (``item_cost`` is plain, the caller moves it off the event loop).
  ``BYTES_PER_PIXEL`` (16) covers the decoded RGB image (3 B/px), the detector's and segmenter's bool masks,
  the float32 disparity (4 B/px) and the judge's distance transforms. A cost above the whole budget is cut
  to the budget (such an item runs alone).
- an item is **admitted** when fewer than ``max_active`` items are being judged and its cost fits in what is
  left of ``budget_bytes`` (the global in-flight byte budget);
- otherwise it **waits**, first come first served (a large item is never starved by small ones), for at most
  ``max_wait_s`` (cut to its deadline);
- when ``max_waiting`` items already wait, or its wait runs out, it is **refused** with RESOURCE_EXHAUSTED
  (the client retries it with backoff);
- a waiting item holds its received message (``held``, its bytes): those bytes count against the same
  budget, so an item whose message would take the waiting items' received bytes over ``budget_bytes`` is
  refused at once. Item data held by the server is then at most twice the budget (admitted costs, waiting
  messages), whatever ``max_waiting`` is.

A stream's reader waits for the admission of its current item before it reads the next one, so a waiting
stream holds one unadmitted message and the transport's flow control holds the client back; with the
client keeping at most ``stream_window`` items unanswered (the grant it reads from ``ServiceInfo.limits``
and the stream's initial metadata), nothing piles up in the server.

The default budget follows the memory limit of the process (``default_budget``): half of what is left of
the cgroup limit (Kubernetes ``resources.limits.memory``) after the process's own memory and the bounds of
messages being received (``orchestrator.guard.reception_reserve``), or a quarter of the machine's memory
(at most 4 GiB) when there is no limit; ``NEGT2I_MAX_INFLIGHT_BYTES`` sets it.
"""

from __future__ import annotations

import asyncio
import collections
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

BYTES_PER_PIXEL: Final = 16
"""Working memory per image pixel while an item is judged (see the module docstring)."""

MIB: Final = 1024 * 1024
MIN_BUDGET: Final = 64 * MIB
"""The smallest default budget."""

_UNLIMITED: Final = 1 << 60


class Overloaded(Exception):
    """The item was not admitted (RESOURCE_EXHAUSTED); ``message`` says why."""

    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__(message)


def cgroup_memory_limit(root: str | Path = "/sys/fs/cgroup") -> int | None:
    """The memory limit of this process's cgroup in bytes (v2 ``memory.max`` or v1 ``memory.limit_in_bytes``),
    None when there is none."""
    base = Path(root)
    for name in ("memory.max", "memory/memory.limit_in_bytes", "memory.limit_in_bytes"):
        try:
            text = (base / name).read_text().strip()
        except OSError:
            continue
        if text == "max":
            return None
        try:
            value = int(text)
        except ValueError:
            continue
        return None if value >= _UNLIMITED else value
    return None


def default_budget(limit: int | None = None, total_memory: int | None = None, reserve: int = 0) -> int:
    """The in-flight budget when ``NEGT2I_MAX_INFLIGHT_BYTES`` is not set, at least ``MIN_BUDGET``:

        (limit - reserve) / 2                        under a memory limit (admitted + waiting <= 2 x budget)
        min(total_memory / 4, 4 GiB)                 without one

    ``reserve`` is what the process holds outside the budget (``orchestrator.guard.reception_reserve``), so
    that the reserve and twice the budget together fit the limit."""
    if limit is None:
        limit = cgroup_memory_limit()
    if limit is not None:
        return max(MIN_BUDGET, (limit - reserve) // 2)
    if total_memory is None:
        try:
            total_memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            total_memory = 8 * 1024 * MIB
    return max(MIN_BUDGET, min(total_memory // 4, 4 * 1024 * MIB))


def image_pixels(data: bytes) -> int | None:
    """H x W from the image header (``negt2i.core.images.header_size``: no pixel decoded, no Pillow); None when the
    header is not readable (the decoder rejects such an image with the reason)."""
    from negt2i.core.images import header_size

    size = header_size(data)
    return None if size is None else int(size[0]) * int(size[1])


def item_cost(data: bytes) -> int:
    """Bytes an item holds while it is judged: ``len(data) + BYTES_PER_PIXEL x H x W``."""
    pixels = image_pixels(data) or 0
    return len(data) + BYTES_PER_PIXEL * pixels


@dataclass
class Ticket:
    """An admitted item's share; give it back with ``Admission.release``."""

    cost: int
    released: bool = False


@dataclass
class AdmissionStats:
    """Counters (for logs, tests and benchmarks)."""

    admitted: int = 0
    waited: int = 0
    refused: int = 0
    peak_bytes: int = 0
    peak_active: int = 0
    peak_waiting: int = 0


class Admission:
    """The global admission of one orchestrator process (see the module docstring). Not thread-safe: use it
    from the event loop only."""

    def __init__(self, budget_bytes: int, max_active: int, max_waiting: int, max_wait_s: float) -> None:
        if budget_bytes <= 0 or max_active <= 0 or max_waiting < 0:
            raise ValueError("the budget and max_active must be positive, max_waiting not negative")
        self.budget = int(budget_bytes)
        self.max_active = int(max_active)
        self.max_waiting = int(max_waiting)
        self.max_wait_s = float(max_wait_s)
        self.in_use = 0
        self.active = 0
        self.waiting_bytes = 0
        """Received bytes of the items waiting now."""
        self._waiters: collections.deque[tuple[int, asyncio.Future[Ticket]]] = collections.deque()
        self.stats = AdmissionStats()

    @property
    def waiting(self) -> int:
        """Items waiting now."""
        return len(self._waiters)

    def _fits(self, cost: int) -> bool:
        return self.active < self.max_active and self.in_use + cost <= self.budget

    def _grant(self, cost: int) -> Ticket:
        self.in_use += cost
        self.active += 1
        self.stats.admitted += 1
        self.stats.peak_bytes = max(self.stats.peak_bytes, self.in_use)
        self.stats.peak_active = max(self.stats.peak_active, self.active)
        return Ticket(cost)

    def _wake(self) -> None:
        while self._waiters:
            cost, fut = self._waiters[0]
            if fut.done():
                self._waiters.popleft()
                continue
            if not self._fits(cost):
                return
            self._waiters.popleft()
            fut.set_result(self._grant(cost))

    async def acquire(self, cost: int, deadline: float | None = None, held: int = 0) -> Ticket:
        """Admit an item of ``cost`` bytes whose message holds ``held`` received bytes, waiting FIFO; raises
        ``Overloaded`` (see the module docstring)."""
        cost = max(0, min(int(cost), self.budget))
        held = max(0, int(held))
        if not self._waiters and self._fits(cost):
            return self._grant(cost)
        if len(self._waiters) >= self.max_waiting or (self._waiters and self.waiting_bytes + held > self.budget):
            self.stats.refused += 1
            raise Overloaded(
                f"the server is at capacity ({self.active} items in progress, {len(self._waiters)} waiting "
                f"with {self.waiting_bytes >> 20} MiB received); retry with backoff"
            )
        wait = self.max_wait_s if deadline is None else min(self.max_wait_s, deadline - time.monotonic())
        fut: asyncio.Future[Ticket] = asyncio.get_running_loop().create_future()
        self._waiters.append((cost, fut))
        self.waiting_bytes += held
        self.stats.waited += 1
        self.stats.peak_waiting = max(self.stats.peak_waiting, len(self._waiters))
        try:
            return await asyncio.wait_for(asyncio.shield(fut), max(wait, 0.0))
        except TimeoutError:
            if fut.done() and not fut.cancelled():  # granted at the last moment: keep it
                return fut.result()
            fut.cancel()
            self.stats.refused += 1
            raise Overloaded(
                f"no capacity within {max(wait, 0.0):.1f} s ({self.active} items in progress, "
                f"{len(self._waiters)} waiting); retry with backoff"
            ) from None
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release(fut.result())
            fut.cancel()
            raise
        finally:
            self.waiting_bytes -= held
            self._wake()

    def release(self, ticket: Ticket) -> None:
        """Give an admitted item's share back (idempotent)."""
        if ticket.released:
            return
        ticket.released = True
        self.in_use -= ticket.cost
        self.active -= 1
        self._wake()
