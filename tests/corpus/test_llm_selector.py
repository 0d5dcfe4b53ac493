"""The LLM selector against a real HTTP server on 127.0.0.1 (fake OpenAI chat completions, real httpx)."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest

from negt2i.cli import COMMANDS, corpus_cmd
from negt2i.core.spec import AttributeStatement, Prompt, RelationStatement, read_prompts
from negt2i.core.vocab import BENCHMARK_CLASSES, COLORS, PREDICATES, Category
from negt2i.corpus.build import build_corpus, corpus_bytes
from negt2i.corpus.selectors import (
    DEFAULT_MODEL,
    LLMSelector,
    MalformedAnswer,
    SelectorError,
    parse_content,
    validate_pairs,
    validate_values,
)
from negt2i.corpus.validate import validate_prompts

from .fake_openai import serve

CATS = (Category.COLOR, Category.COMPARATIVE)
COW_PAIRS = [
    {"predicate": "bigger than", "target": "dog"},
    {"predicate": "Bigger Than", "target": " sheep "},  # case and spaces are normalised: valid
    {"predicate": "smaller than", "target": "bus"},
    {"predicate": "taller than", "target": "cat"},
    {"predicate": "shorter than", "target": "giraffe"},
    {"predicate": "on top of", "target": "dog"},  # predicate not allowed
    {"predicate": "bigger than", "target": "person"},  # not a candidate
    {"predicate": "bigger than", "target": "cow"},  # the subject itself
    {"predicate": "bigger than", "target": "dog", "why": "big"},  # wrong shape for a pair
    "bigger than cat",  # not an object
]
SCRIPT = {
    # out-of-vocabulary values: only "black" survives
    "Object: zebra\nAllowed colors": [(200, json.dumps({"values": ["Black ", "striped", "gray"]}))],
    # malformed first (not JSON), then a fenced valid answer
    "Object: apple\nAllowed colors": [
        (200, "Sure! An apple can be red or green."),
        (200, '```json\n{"values": ["red", "green"]}\n```'),
    ],
    # HTTP 500, then the wrong shape, then valid
    "Object: banana\nAllowed colors": [
        (500, '{"error": "overloaded"}'),
        (200, json.dumps({"values": "yellow"})),
        (200, "<think>bananas are yellow</think>" + json.dumps({"values": ["yellow"]})),
    ],
    'Subject: cow\nAllowed predicates: "bigger than"': [(200, json.dumps({"pairs": COW_PAIRS}))],
}
COW_VALID = {("bigger than", "dog"), ("bigger than", "sheep"), ("smaller than", "bus"), ("taller than", "cat"),
             ("shorter than", "giraffe")}  # fmt: skip


def _build(url: str, cache: Path, **kw: object) -> tuple[list[Prompt], LLMSelector]:
    with LLMSelector(base_url=url, cache_dir=cache, pool_size=78, concurrency=4, **kw) as selector:  # type: ignore[arg-type]
        return build_corpus(selector, seed=0, per_cell=10, categories=CATS), selector


def test_build_with_llm_rejects_bad_answers_and_rebuilds_from_cache(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    with serve(SCRIPT) as fake:
        prompts, selector = _build(fake.url, cache, api_key="sk-test")
        url = fake.url
    # what reached the server: the OpenAI protocol
    assert set(fake.paths) == {"/v1/chat/completions"}
    body = fake.requests[0]
    assert body["model"] == DEFAULT_MODEL and body["temperature"] == 0.0
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert body["response_format"] == {"type": "json_object"}
    assert all(h.get("Authorization") == "Bearer sk-test" for h in fake.headers)
    # 79 attribute requests (plus 1 retry for apple and 2 for banana), then relation requests asked during
    # balancing, each with the candidate pool the balancer drew (Appendix A.1): the target_pool (8)
    # least-used targets, doubled only when a pool holds no plausible pair
    texts = [r["messages"][1]["content"] for r in fake.requests]
    relation = [t for t in texts if t.startswith("Subject: ")]
    assert len(texts) - len(relation) == 79 + 3 == selector.stats.requests - len(relation)
    assert selector.stats.requests == len(fake.requests) and selector.stats.malformed == 3
    pools = [re.search(r"Candidate targets: (.*)\n", t).group(1).count('"') // 2 for t in relation]  # type: ignore[union-attr]
    assert relation and set(pools) <= {8, 16, 32, 64, 78} and pools.count(8) > len(pools) / 2
    assert selector.stats.rejected_items >= 79  # every table answer carries out-of-list items

    assert len(prompts) == 160
    assert validate_prompts([(None, p) for p in prompts], partial=True) == []
    colors: dict[str, set[str]] = {}
    cow_pairs: set[tuple[str, str]] = set()
    for p in prompts:
        assert all(o.class_name in BENCHMARK_CLASSES for o in p.objects)
        for st in p.statements:
            if isinstance(st, AttributeStatement):
                assert st.value in COLORS
                colors.setdefault(p.objects[st.object].class_name, set()).add(st.value)
            elif isinstance(st, RelationStatement):
                assert st.predicate in PREDICATES[Category.COMPARATIVE]
                if p.objects[st.subject].class_name == "cow":
                    cow_pairs.add((st.predicate, p.objects[st.target].class_name))
    assert colors["zebra"] == {"black"}
    assert colors["apple"] <= {"red", "green"}
    assert colors["banana"] == {"yellow"}
    assert cow_pairs and cow_pairs <= COW_VALID

    # the cache: one file per request, raw answer and rejected items kept for review
    files = sorted(cache.glob("*.json"))
    unique = len(set(texts))
    assert len(files) == unique
    entries = [json.loads(f.read_text()) for f in files]
    zebra = next(e for e in entries if "Object: zebra\nAllowed colors" in e["request"]["messages"][1]["content"])
    assert zebra["rejected"] == ["striped", "gray"]
    assert not any("Sure!" in e["content"] for e in entries)  # malformed answers are never cached

    # rebuild: the server is gone, every answer comes from the cache, byte-identical output
    again, selector2 = _build(url, cache)
    asked = selector.stats.requests - selector.stats.malformed + selector.stats.cache_hits  # a pool can recur
    assert selector2.stats.requests == 0 and selector2.stats.cache_hits == asked
    assert corpus_bytes(again) == corpus_bytes(prompts)
    offline, _ = _build("http://127.0.0.1:9/v1", cache, offline=True)
    assert corpus_bytes(offline) == corpus_bytes(prompts)


def test_offline_miss_and_persistent_garbage_fail(tmp_path: Path) -> None:
    with pytest.raises(SelectorError, match="no cached answer"):
        _build("http://127.0.0.1:9/v1", tmp_path / "empty", offline=True)
    with serve({"Object: cup\nAllowed colors": [(200, "[1, 2, 3]")]}) as fake:
        with pytest.raises(SelectorError, match=r"no valid answer after 3 attempts \(expected a JSON object"):
            _build(fake.url, tmp_path / "c", retries=2)
    assert sum("Object: cup\n" in r["messages"][1]["content"] for r in fake.requests) == 3


def test_cli_build_with_llm(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "negt2i.cli.corpus_cmd" in COMMANDS
    parser = argparse.ArgumentParser()
    corpus_cmd.register(parser.add_subparsers())
    out = tmp_path / "llm.jsonl"
    argv = ["corpus", "build", "--selector", "llm", "--categories", "color", "--per-cell", "3",
            "--out", str(out), "--llm-cache", str(tmp_path / "cache")]  # fmt: skip
    with serve({"Object: tie\nAllowed colors": [(200, "nonsense")]}) as fake:
        args = parser.parse_args([*argv, "--llm-url", fake.url, "--llm-retries", "1"])
        assert args.func(args) == 1  # tie never gets a valid answer: no corpus is written
        assert not out.exists()
        assert "no valid answer after 2 attempts" in capsys.readouterr().err
    with serve() as fake:
        args = parser.parse_args([*argv, "--llm-url", fake.url, "--llm-no-json-mode"])
        assert args.func(args) == 0
        assert "response_format" not in fake.requests[0]
    assert len(read_prompts(out)) == 24
    meta = json.loads(out.with_suffix(".meta.json").read_text())
    assert meta["selector"]["name"] == "llm" and meta["selector"]["model"] == DEFAULT_MODEL
    assert "requests" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("content", "expected", "rejected"),
    [
        ('{"values": ["red", "RED", "teal"]}', ("red",), ["teal"]),
        ('```json\n{"values": ["blue", "red"]}\n```', ("red", "blue"), []),  # vocabulary order
        ('<think>hmm</think>{"values": []}', (), []),
    ],
)
def test_validate_values(content: str, expected: tuple[str, ...], rejected: list[str]) -> None:
    assert validate_values(content, COLORS) == (expected, rejected)


@pytest.mark.parametrize(
    ("content", "match"),
    [("red, green", "not JSON"), ('["red"]', "expected a JSON object"), ('{"colors": ["red"]}', "values"),
     ('{"values": [1]}', "expected a string")],
)  # fmt: skip
def test_malformed_attribute_answers(content: str, match: str) -> None:
    with pytest.raises(MalformedAnswer, match=match):
        validate_values(content, COLORS)


def test_validate_pairs_keeps_only_allowed_pairs() -> None:
    content = json.dumps({"pairs": COW_PAIRS})
    preds = PREDICATES[Category.COMPARATIVE]
    pairs, rejected = validate_pairs(content, preds, ["dog", "sheep", "bus", "cat", "giraffe", "cow"], "cow")
    assert set(pairs) == COW_VALID and len(pairs) == 5
    assert len(rejected) == 5
    with pytest.raises(MalformedAnswer, match="pairs"):
        validate_pairs('{"pairs": {}}', preds, ["dog"], "cow")
    assert parse_content('```\n{"a": 1}\n```') == {"a": 1}


class PoolRecorder:
    """A per-pool selector (like the LLM one) answering from the offline table, recording every pool."""

    asks_per_pool = True
    name = "recorder"

    def __init__(self) -> None:
        from negt2i.corpus.selectors import TableSelector

        self.table = TableSelector()
        self.pools: list[tuple[str, tuple[str, ...]]] = []

    def describe(self) -> dict[str, str]:
        return {"name": self.name}

    def attribute_values(self, category: Category, objects: list[str]) -> dict[str, tuple[str, ...]]:
        return self.table.attribute_values(category, objects)

    def relation_pairs(self, category: Category, subject: str, candidates: list[str]) -> tuple[tuple[str, str], ...]:
        self.pools.append((subject, tuple(candidates)))
        return self.table.relation_pairs(category, subject, candidates)


def test_the_selector_sees_the_balancers_candidate_pool() -> None:
    """Appendix A.1: the selector receives the shared subject and a pool of least-used targets; the chosen
    targets come from that pool. The offline table path is unchanged (the committed corpus is its output)."""
    from collections import Counter

    from negt2i.corpus.build import build_category
    from negt2i.corpus.selectors import TableSelector

    recorder = PoolRecorder()
    prompts = build_category(Category.DIRECTIONAL, recorder, seed=0, per_cell=10, target_pool=8)  # type: ignore[arg-type]
    assert len(prompts) == 80 and recorder.pools
    assert all(subject not in pool and len(pool) in (8, 16, 32, 64, 78) for subject, pool in recorder.pools)
    # the first pool of the category: nothing is used yet, so any 8 targets; later pools avoid heavy users
    first_subject, first_pool = recorder.pools[0]
    first = next(p for p in prompts if p.objects[0].class_name == first_subject)
    assert first.objects[1].class_name in first_pool
    used: Counter[str] = Counter()
    for p in prompts:
        used.update(o.class_name for o in p.objects[1:])
    # balancing: 360 targets over 79 classes stay close to even (least-used pools)
    assert max(used.values()) - min(used.values()) <= 3 and len(used) == 79
    table = build_category(Category.DIRECTIONAL, TableSelector(), seed=0, per_cell=10, target_pool=8)
    assert all(p.prompt for p in table)  # the table path still builds (and is what the committed corpus holds)
