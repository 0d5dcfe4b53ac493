"""Plausibility selectors: which values and (predicate, target) pairs the builder may use.

One interface, two implementations:

- ``TableSelector`` (default, offline, deterministic): the reviewable table in
  ``negt2i.corpus.plausibility``.
- ``LLMSelector``: asks an OpenAI-compatible chat-completions endpoint (the paper
  uses vLLM serving ``Qwen/Qwen3-30B-A3B-Instruct-2507``) with httpx. Every answer
  is validated against the allowed lists before use: a malformed answer (HTTP
  error, not JSON, wrong shape) is retried and then fails the build; an answer
  naming values, predicates or targets outside the request's lists has those
  items dropped (recorded as ``rejected`` in the cache entry) and they never
  reach the corpus. Validated answers are cached on disk, one JSON file per
  request keyed by the SHA-256 of the request, and a cached request never goes
  to the network again, so a rebuild with the same cache is byte-identical (and
  works offline).

The selector only filters; the builder balances among what it returns ("among
valid combinations, balancing takes priority over selector preference").
Attributes are asked once per (category, object). Relations: the table selector
answers for the whole vocabulary up front; the LLM selector (``asks_per_pool``)
is asked by the builder *during* balancing with the subject and the candidate
pool the balancer drew (the least-used targets, Appendix A.1), as the paper's
selector is, so its requests depend on the seed; each is cached like any other,
and a rebuild with the same seed and cache replays them offline.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx

from negt2i.core.vocab import PREDICATES, VALUES, Category
from negt2i.corpus import plausibility

log = logging.getLogger(__name__)

Pair = tuple[str, str]
"""A (predicate, target) pair for a shared subject."""

DEFAULT_MODEL = "Qwen/Qwen3-30B-A3B-Instruct-2507"
DEFAULT_URL = "http://127.0.0.1:8000/v1"


class SelectorError(RuntimeError):
    """A selector could not give a valid answer (after retries), or a cache-only miss."""


class PlausibilitySelector(Protocol):
    """What the builder asks. Answers must only use the lists they were given."""

    @property
    def name(self) -> str:
        """Short name recorded in the corpus metadata (``table``, ``llm``)."""
        ...

    def describe(self) -> dict[str, Any]:
        """Everything that determines the answers (recorded beside the corpus)."""
        ...

    def attribute_values(self, category: Category, objects: Sequence[str]) -> dict[str, tuple[str, ...]]:
        """For each object, the plausible values of ``category`` (a subset of ``VALUES[category]``)."""
        ...

    def relation_pairs(self, category: Category, subject: str, candidates: Sequence[str]) -> tuple[Pair, ...]:
        """The plausible (predicate, target) pairs, predicates from ``PREDICATES[category]``, targets from
        ``candidates``."""
        ...


class TableSelector:
    """The default selector: the offline plausibility table (see ``plausibility``)."""

    asks_per_pool = False
    """The builder asks for the whole vocabulary once (the answers do not depend on the pool)."""

    @property
    def name(self) -> str:
        return "table"

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "table_sha256": table_digest()}

    def attribute_values(self, category: Category, objects: Sequence[str]) -> dict[str, tuple[str, ...]]:
        return {obj: plausibility.attribute_values(category, obj) for obj in objects}

    def relation_pairs(self, category: Category, subject: str, candidates: Sequence[str]) -> tuple[Pair, ...]:
        return tuple(
            (pred, target)
            for target in candidates
            for pred in PREDICATES[category]
            if target != subject and plausibility.relation_plausible(pred, subject, target)
        )


def table_digest() -> str:
    """SHA-256 of the plausibility table's contents (changes whenever a row changes)."""
    rows = {
        name: [r.group.value, r.size, r.height, r.ground, list(r.colors), list(r.materials)]
        for name, r in plausibility.TABLE.items()
    }
    return hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()


# --------------------------------------------------------------------------- LLM selector

SYSTEM_PROMPT = (
    "You help build a text-to-image benchmark about negation. For each request you receive fixed lists; "
    "keep only the combinations that are plausible, or unusual but still possible to depict in a photo, "
    "in their positive form. Answer with a single JSON object and nothing else. Use only the exact "
    "strings from the lists you are given."
)


def attribute_request_text(category: Category, obj: str) -> str:
    """The user message asking for the plausible values of one object."""
    values = ", ".join(VALUES[category])
    noun = "colors" if category is Category.COLOR else "materials"
    return (
        f"Object: {obj}\nAllowed {noun}: {values}\n"
        f"Which of these {noun} can a {obj} plausibly have, or have in an unusual but depictable way "
        f'(e.g. a toy, a painted or carved one)? Answer as {{"values": ["<{noun[:-1]}>", ...]}}.'
    )


def relation_request_text(category: Category, subject: str, candidates: Sequence[str]) -> str:
    """The user message asking for the plausible (predicate, target) pairs of one subject."""
    preds = ", ".join(f'"{p}"' for p in PREDICATES[category])
    targets = ", ".join(f'"{c}"' for c in candidates)
    return (
        f"Subject: {subject}\nAllowed predicates: {preds}\nCandidate targets: {targets}\n"
        f'For each candidate target and predicate, keep the pair if "the {subject} is <predicate> the '
        f'<target>" is plausible or unusual but depictable in one photo. Answer as '
        f'{{"pairs": [{{"predicate": "<predicate>", "target": "<target>"}}, ...]}}.'
    )


_FENCE = re.compile(r"^\s*```(?:json)?\s*(.*?)\s*```\s*$", re.DOTALL)
_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)


class MalformedAnswer(ValueError):
    """The endpoint's answer is not a JSON object of the requested shape."""


def _norm(value: Any) -> str:
    if not isinstance(value, str):
        raise MalformedAnswer(f"expected a string, got {type(value).__name__}")
    return " ".join(value.lower().split())


def parse_content(content: str) -> dict[str, Any]:
    """The JSON object in a chat answer (tolerates a code fence and a ``<think>`` block)."""
    text = _THINK.sub("", content).strip()
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group(1)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise MalformedAnswer(f"not JSON: {exc.msg}") from None
    if not isinstance(data, dict):
        raise MalformedAnswer(f"expected a JSON object, got {type(data).__name__}")
    return data


def validate_values(content: str, allowed: Sequence[str]) -> tuple[tuple[str, ...], list[str]]:
    """Valid values (vocabulary order, deduplicated) and the rejected raw items of an attribute answer.

    Case and surrounding whitespace are normalised; anything else outside ``allowed`` is rejected.
    """
    data = parse_content(content)
    items = data.get("values")
    if not isinstance(items, list):
        raise MalformedAnswer('expected {"values": [...]}')
    keep: set[str] = set()
    rejected: list[str] = []
    for item in items:
        value = _norm(item)
        if value in allowed:
            keep.add(value)
        else:
            rejected.append(str(item))
    return tuple(v for v in allowed if v in keep), rejected


def validate_pairs(
    content: str, predicates: Sequence[str], candidates: Sequence[str], subject: str
) -> tuple[tuple[Pair, ...], list[str]]:
    """Valid (predicate, target) pairs (request order, deduplicated) and the rejected raw items."""
    data = parse_content(content)
    items = data.get("pairs")
    if not isinstance(items, list):
        raise MalformedAnswer('expected {"pairs": [...]}')
    keep: set[Pair] = set()
    rejected: list[str] = []
    for item in items:
        if not isinstance(item, dict) or set(item) != {"predicate", "target"}:
            rejected.append(json.dumps(item))
            continue
        pred, target = _norm(item["predicate"]), _norm(item["target"])
        if pred in predicates and target in candidates and target != subject:
            keep.add((pred, target))
        else:
            rejected.append(json.dumps(item))
    ordered = tuple((p, t) for t in candidates for p in predicates if (p, t) in keep)
    return ordered, rejected


@dataclass
class LLMStats:
    """What an ``LLMSelector`` did (for logs and tests)."""

    requests: int = 0
    cache_hits: int = 0
    malformed: int = 0
    rejected_items: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, **counts: int) -> None:
        with self._lock:
            for key, n in counts.items():
                setattr(self, key, getattr(self, key) + n)


class LLMSelector:
    """Plausibility from an OpenAI-compatible chat endpoint, validated and cached on disk.

    ``base_url`` is the API root (``.../v1``); the request goes to
    ``{base_url}/chat/completions``. ``cache_dir`` holds one ``<sha256>.json`` per
    request (model, messages and sampling parameters; not the URL). With
    ``offline=True`` only the cache is used and a miss raises ``SelectorError``.
    """

    def __init__(
        self,
        *,
        base_url: str = DEFAULT_URL,
        model: str = DEFAULT_MODEL,
        cache_dir: str | Path,
        api_key: str | None = None,
        pool_size: int = 13,
        retries: int = 2,
        timeout_s: float = 120.0,
        concurrency: int = 8,
        json_mode: bool = True,
        offline: bool = False,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if pool_size < 1:
            raise ValueError("pool_size must be at least 1")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.cache_dir = Path(cache_dir)
        self.pool_size = pool_size
        self.retries = retries
        self.concurrency = max(1, concurrency)
        self.json_mode = json_mode
        self.offline = offline
        self.stats = LLMStats()
        key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY", "")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._client = httpx.Client(timeout=timeout_s, headers=headers, transport=transport)

    def close(self) -> None:
        """Close the HTTP client."""
        self._client.close()

    def __enter__(self) -> LLMSelector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    asks_per_pool = True
    """The builder asks during balancing, with the candidate pool it drew (``negt2i.corpus.build``)."""

    @property
    def name(self) -> str:
        return "llm"

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "model": self.model,
            "relation_queries": "the balancer's candidate pool per clause",
            "pool_size": self.pool_size,
            "json_mode": self.json_mode,
            "system_prompt_sha256": hashlib.sha256(SYSTEM_PROMPT.encode()).hexdigest(),
        }

    # -- requests ------------------------------------------------------------------

    def _payload(self, user: str) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}],
            "temperature": 0.0,
            "seed": 0,
        }
        if self.json_mode:
            payload["response_format"] = {"type": "json_object"}
        return payload

    @staticmethod
    def cache_key(payload: Mapping[str, Any]) -> str:
        """SHA-256 of the canonical JSON of a request payload."""
        return hashlib.sha256(json.dumps(payload, sort_keys=True, ensure_ascii=False).encode()).hexdigest()

    def _cache_path(self, key: str) -> Path:
        return self.cache_dir / f"{key}.json"

    def _post(self, payload: dict[str, Any]) -> str:
        response = self._client.post(f"{self.base_url}/chat/completions", json=payload)
        if response.status_code != 200:
            raise MalformedAnswer(f"HTTP {response.status_code}: {response.text[:200]}")
        try:
            body = response.json()
            content = body["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise MalformedAnswer("not an OpenAI chat-completions response") from None
        if not isinstance(content, str):
            raise MalformedAnswer("message content is not a string")
        return content

    def _ask(self, user: str, validate: Any) -> Any:
        """Cached, validated answer to one user message; ``validate(content) -> (answer, rejected)``."""
        payload = self._payload(user)
        key = self.cache_key(payload)
        path = self._cache_path(key)
        if path.exists():
            entry = json.loads(path.read_text(encoding="utf-8"))
            try:
                answer, _ = validate(entry["content"])
            except (MalformedAnswer, KeyError):
                log.warning("ignoring malformed cache entry %s", path)
            else:
                self.stats.add(cache_hits=1)
                return answer
        if self.offline:
            raise SelectorError(f"no cached answer for request {key} (cache {self.cache_dir}, offline)")
        problems: list[str] = []
        for _attempt in range(self.retries + 1):
            self.stats.add(requests=1)
            try:
                content = self._post(payload)
                answer, rejected = validate(content)
            except (MalformedAnswer, httpx.HTTPError) as exc:
                self.stats.add(malformed=1)
                problems.append(str(exc) or type(exc).__name__)
                continue
            if rejected:
                self.stats.add(rejected_items=len(rejected))
                log.warning("rejected %d out-of-list items: %s", len(rejected), ", ".join(rejected[:5]))
            self._store(path, {"request": payload, "content": content, "rejected": rejected})
            return answer
        raise SelectorError(
            f"{self.base_url}: no valid answer after {self.retries + 1} attempts ({'; '.join(problems)})"
        )

    def _store(self, path: Path, entry: dict[str, Any]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps(entry, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        tmp.replace(path)

    # -- the selector interface -------------------------------------------------------

    def attribute_values(self, category: Category, objects: Sequence[str]) -> dict[str, tuple[str, ...]]:
        allowed = VALUES[category]

        def one(obj: str) -> tuple[str, ...]:
            values: tuple[str, ...] = self._ask(
                attribute_request_text(category, obj), lambda c: validate_values(c, allowed)
            )
            return values

        with ThreadPoolExecutor(self.concurrency) as pool:
            answers = list(pool.map(one, objects))
        return dict(zip(objects, answers, strict=True))

    def relation_pairs(self, category: Category, subject: str, candidates: Sequence[str]) -> tuple[Pair, ...]:
        preds = PREDICATES[category]
        others = [c for c in candidates if c != subject]
        slices = [others[i : i + self.pool_size] for i in range(0, len(others), self.pool_size)]

        def one(pool: list[str]) -> tuple[Pair, ...]:
            pairs: tuple[Pair, ...] = self._ask(
                relation_request_text(category, subject, pool), lambda c: validate_pairs(c, preds, pool, subject)
            )
            return pairs

        with ThreadPoolExecutor(self.concurrency) as pool:
            answers = list(pool.map(one, slices))
        return tuple(pair for answer in answers for pair in answer)


__all__ = [
    "DEFAULT_MODEL",
    "DEFAULT_URL",
    "SYSTEM_PROMPT",
    "LLMSelector",
    "LLMStats",
    "MalformedAnswer",
    "Pair",
    "PlausibilitySelector",
    "SelectorError",
    "TableSelector",
    "attribute_request_text",
    "parse_content",
    "relation_request_text",
    "table_digest",
    "validate_pairs",
    "validate_values",
]
