"""The control set: one prompt per corpus prompt that names the same objects and nothing else (Appendix F).

The paper measures whether negated content is *absent*, not whether the model
understood the negation: a model that ignores "non-red" still passes whenever
it happens not to draw red. A control prompt that omits the tested attribute or
relation separates the two: how often the image shows "red" (or "left of")
when the prompt does not mention it is the base rate a negated prompt must be
compared with (``negt2i.metrics.probes``).

For each corpus prompt ``p`` the control prompt

- has id ``control-<p.id>`` and ``source_id = p.id``; the same category and tag;
- names ``p``'s objects (same classes, counts and order) with the templates'
  object phrase and nothing else: ``a photo of a <o1>, a <o2>, and a <o3>``
  (``templates.PREFIX`` + ``join_list`` of ``a <class>``), i.e. the attribute
  template without its values and the relation template without its
  ``where`` clause;
- has no statements (so ``correct`` = every object present with a valid count,
  setting ``pos0_neg0``) and keeps ``p``'s statements verbatim as ``probes``:
  they are judged on the image and recorded per probe, never part of correctness;
- carries ``same_text_as: <id>`` when an earlier line (the first one) has the
  same text: many corpus prompts differ only in their values or predicates, so
  their controls coincide. Generate images for the lines *without*
  ``same_text_as`` and reuse them for the others (``docs/corpus.md``).

``stray_words`` is the check that a control text names no value, relation or
negation: it removes the named classes' phrases first, so a class that is also a
value word ("orange", "wine glass") is not mistaken for one.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Final

from negt2i import __version__
from negt2i.core.spec import Prompt, dumps_prompt
from negt2i.core.vocab import COLOR_ANSWERS, MATERIALS, PREDICATES
from negt2i.corpus.templates import PREFIX, join_list

FORMAT: Final[str] = "negt2ibench-control/1"
ID_PREFIX: Final[str] = "control-"
SAME_TEXT_KEY: Final[str] = "same_text_as"

VALUE_WORDS: Final[frozenset[str]] = frozenset((*COLOR_ANSWERS, *MATERIALS, "wood", "colored", "coloured", "color"))
"""Attribute words a control text must not contain (every color answer incl. gray, every material)."""

RELATION_WORDS: Final[frozenset[str]] = frozenset(
    {w for names in PREDICATES.values() for p in names for w in p.split()} - {"of", "from", "than", "in"}
    | {"where", "next", "beside", "under", "over", "beneath", "larger", "closer", "farther"}
)
"""Relation words a control text must not contain (the predicates' content words and their near synonyms)."""

NEGATION_WORDS: Final[frozenset[str]] = frozenset({"not", "non", "no", "never", "without", "isn't", "aren't", "nor"})
"""Negation words a control text must not contain (``non-`` counts as ``non``)."""

_WORD = re.compile(r"[a-z]+(?:'[a-z]+)?")


def control_id(source_id: str) -> str:
    """``control-<source id>``."""
    return ID_PREFIX + source_id


def control_text(class_names: Sequence[str]) -> str:
    """``a photo of a <o1>, a <o2>, and a <o3>``: the templates' object phrase, nothing else."""
    return PREFIX + join_list([f"a {name}" for name in class_names])


def control_prompt(source: Prompt) -> Prompt:
    """The control prompt of one corpus prompt (without ``same_text_as``; see ``build_control``)."""
    if source.category is None or not source.statements:
        raise ValueError(f"{source.id}: only prompts with a category and statements have a control prompt")
    return Prompt(
        id=control_id(source.id),
        prompt=control_text([o.class_name for o in source.objects]),
        category=source.category,
        tag=source.tag,
        objects=source.objects,
        statements=(),
        probes=source.statements,
        source_id=source.id,
    )


def build_control(sources: Iterable[Prompt]) -> list[Prompt]:
    """One control prompt per source prompt, in source order; repeated texts marked ``same_text_as`` the first."""
    first: dict[str, str] = {}
    out: list[Prompt] = []
    for source in sources:
        prompt = control_prompt(source)
        if prompt.prompt in first:
            prompt = prompt.model_copy(update={"extra": {SAME_TEXT_KEY: first[prompt.prompt]}})
        else:
            first[prompt.prompt] = prompt.id
        out.append(prompt)
    return out


def stray_words(text: str, class_names: Iterable[str]) -> list[str]:
    """Value, relation and negation words of ``text`` outside the named classes' phrases, in order.

    The class names are removed first (longest first, as whole words), so "a photo of
    a orange" and "a photo of a wine glass" are clean although "orange" is a color and
    "glass" a material.
    """
    rest = text.lower()
    for name in sorted(set(class_names), key=len, reverse=True):
        rest = re.sub(rf"(?<![a-z]){re.escape(name.lower())}(?![a-z])", " ", rest)
    rest = rest.replace("non-", " non ")
    words = _WORD.findall(rest)
    return [w for w in words if w in VALUE_WORDS or w in RELATION_WORDS or w in NEGATION_WORDS or w.endswith("n't")]


def unique_texts(prompts: Sequence[Prompt]) -> int:
    """How many distinct texts a set has (the images to generate are ``unique_texts x images per prompt``)."""
    return len({p.prompt for p in prompts})


def set_bytes(prompts: Sequence[Prompt]) -> bytes:
    """The JSONL bytes of a prompt set."""
    return "".join(dumps_prompt(p) + "\n" for p in prompts).encode("utf-8")


def file_sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def control_metadata(prompts: Sequence[Prompt], source: str | Path) -> dict[str, Any]:
    """What made a control set: the source corpus (path, SHA-256), sizes, and the file's SHA-256."""
    return {
        "format": FORMAT,
        "negt2i_version": __version__,
        "source": {"path": Path(source).as_posix(), "sha256": file_sha256(source)},
        "prompts": len(prompts),
        "unique_texts": unique_texts(prompts),
        "sha256": hashlib.sha256(set_bytes(prompts)).hexdigest(),
    }


__all__ = [
    "FORMAT",
    "NEGATION_WORDS",
    "RELATION_WORDS",
    "SAME_TEXT_KEY",
    "VALUE_WORDS",
    "build_control",
    "control_id",
    "control_metadata",
    "control_prompt",
    "control_text",
    "set_bytes",
    "stray_words",
    "unique_texts",
]
