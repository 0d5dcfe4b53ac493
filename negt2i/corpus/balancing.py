"""Usage counters and least-used selection (paper, Appendix A.1 "balancing").

Balancing takes priority over selector preference: among the combinations a
selector allows, the builder takes the least-used object / value / predicate,
breaking ties with a seeded random rank, never by vocabulary order (which would
favour the first classes). ``most_even`` is the reference the statistics compare
object counts against.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Hashable, Sequence
from typing import TypeVar

T = TypeVar("T", bound=Hashable)


def _ordered(items: Sequence[T]) -> Sequence[T]:
    if isinstance(items, (set, frozenset)):
        raise TypeError("pass an ordered sequence, not a set (set order is not reproducible)")
    return items


def random_ranks(items: Sequence[T], rng: random.Random) -> dict[T, float]:
    """A seeded tie-break rank per item, drawn in the order given.

    ``items`` must be a sequence: a set's order depends on ``PYTHONHASHSEED``.
    """
    _ordered(items)
    return {item: rng.random() for item in items}


def least_used(
    candidates: Sequence[T], key: Callable[[T], tuple[float, ...]], rng: random.Random, k: int = 1
) -> list[T]:
    """The ``k`` candidates with the smallest ``key``; ties broken by a seeded random rank."""
    items = list(_ordered(candidates))
    ranks = random_ranks(items, rng)
    return sorted(items, key=lambda c: (*key(c), ranks[c]))[:k]


def most_even(draws: int, n: int) -> list[int]:
    """The most even allocation of ``draws`` over ``n`` items, largest first."""
    if n <= 0:
        raise ValueError("n must be positive")
    base, extra = divmod(draws, n)
    return [base + 1] * extra + [base] * (n - extra)


def off_even(counts: Sequence[int], n: int) -> int:
    """How many draws would have to move to reach the most even allocation over ``n`` items.

    ``counts`` lists the used items' counts (missing items count 0). 0 means the
    allocation is already as even as it can be.
    """
    if len(counts) > n:
        raise ValueError(f"{len(counts)} counts for {n} items")
    observed = sorted([*counts, *([0] * (n - len(counts)))], reverse=True)
    target = most_even(sum(observed), n)
    return sum(abs(a - b) for a, b in zip(observed, target, strict=True)) // 2


__all__ = ["least_used", "most_even", "off_even", "random_ranks"]
