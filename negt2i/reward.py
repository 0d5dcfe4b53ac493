"""The judge as a reward for training generators (docs/reward.md).

``RewardClient(target).score(images, prompts)`` returns one reward per image, in input order: the
verdict's continuous ``score`` (the share of satisfied elements, ``negt2i.core.verdict``; 0.0 for an image
that omits an object a negated statement refers to: no reward for omission). ``RewardJudge`` is the
same in-process, for trainers that keep the judge on the generator's GPU; ``AsyncRewardClient`` is
the asyncio form of the client.

Inputs (``images[i]`` is judged against ``prompts[i]``; the two lists must have the same length):

- an image: a ``PIL.Image.Image`` (converted to RGB), a numpy ``uint8`` array ``(H, W, 3)`` (or
  ``(H, W)`` grey), or encoded PNG / JPEG / WebP bytes (sent as they are; decoded by the one decoder);
- a prompt: a ``negt2i.core.spec.Prompt``, a corpus record (a dict as in ``data/negt2ibench.jsonl`` or a
  training split, ``negt2i corpus build --split train``), a ``negt2i.v1.PromptSpec`` message, or a
  prompt id string (resolved by the orchestrator in its corpus; by ``RewardJudge`` in its ``corpus``).

Outputs: ``score(...)`` gives ``list[float]``; ``details=True`` gives ``list[RewardDetails]`` (the score,
``correct`` and every element's outcome, with the verdict). A failed item never becomes a default
reward: with ``on_error="raise"`` (the default) ``score`` raises ``RewardError`` after the whole batch,
listing every failure (``RewardError.failures``, and ``RewardError.results`` with the rewards that
did succeed); with ``on_error="return"`` the failed positions hold a ``RewardFailure`` (never a float)
and the caller decides (e.g. drop the sample's group from the update).

Transport: the client is one more driver of the run loop's stream submitter
(``negt2i.run.stream.StreamSubmitter``, the one ``negt2i submit`` and ``negt2i generate --score`` use): it
streams over ``EvaluateStream`` with the back-pressure window, keeps input order, and sends again only
what the API marks retryable (``RESOURCE_EXHAUSTED`` other than ``MESSAGE_TOO_LARGE``, ``UNAVAILABLE``; a
dropped stream is reopened), with the submitter's one retry policy (``RetryPolicy``) and stall watchdog.
An image still without a final answer when the policy runs out is a ``RewardFailure`` with
``retryable=True``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal, TypeAlias

import numpy as np

from negt2i.core.config import CURRENT, RuleConfig
from negt2i.core.failures import Code, Failure, FailureKind
from negt2i.core.spec import Prompt, SpecError, parse_prompt
from negt2i.core.verdict import Verdict

if TYPE_CHECKING:
    from PIL.Image import Image as PILImage

    from negt2i.client import EvaluatorClient
    from negt2i.pipeline import Pipeline
    from negt2i.run.stream import RetryPolicy
    from negt2i.wire.v1 import evaluator_pb2

RewardImage: TypeAlias = "bytes | np.ndarray[Any, Any] | PILImage"
RewardPrompt: TypeAlias = "Prompt | Mapping[str, Any] | evaluator_pb2.PromptSpec | str"
OnError = Literal["raise", "return"]
DEFAULT_WINDOW: Final = 32
"""Images in flight per stream (the orchestrator's ``max_in_flight_per_stream`` is the upper bound)."""


@dataclass(frozen=True)
class RewardFailure:
    """An image that got no reward: where, and why (``code``: the gRPC status name; ``INVALID_ARGUMENT`` for an
    input refused before sending). ``retryable``: the API marks it retryable and the retry policy ran out."""

    index: int
    code: str
    message: str
    retryable: bool = False

    def __str__(self) -> str:
        return f"image {self.index}: {self.code}: {self.message}"


class RewardError(RuntimeError):
    """Some images of a batch got no reward (``on_error="raise"``). ``failures``: every failed image;
    ``results``: the batch's outcomes in input order (a float / ``RewardDetails``, or the ``RewardFailure``)."""

    def __init__(self, failures: list[RewardFailure], results: list[Any]) -> None:
        self.failures = failures
        self.results = results
        more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
        super().__init__(f"{len(failures)} of {len(results)} images got no reward: {failures[0]}{more}")


@dataclass(frozen=True)
class RewardDetails:
    """One image's reward with its evidence: ``elements`` maps ``object:<i>`` / ``statement:<k>`` to whether that
    element is satisfied (``score`` is their mean); ``verdict`` is the full verdict (docs/results.md)."""

    score: float
    correct: bool
    elements: dict[str, bool]
    verdict: Verdict = field(repr=False)

    @classmethod
    def of(cls, verdict: Verdict) -> RewardDetails:
        elements = {f"object:{o.index}": o.ok for o in verdict.objects}
        elements |= {f"statement:{s.index}": s.passed for s in verdict.statements}
        return cls(verdict.score, verdict.correct, elements, verdict)


# --------------------------------------------------------------------------- inputs


def encode_image(image: RewardImage) -> bytes:
    """Encoded bytes of an input image: bytes as given, arrays and PIL images as lossless PNG."""
    from negt2i.wire.adapter import encode_png

    if isinstance(image, bytes | bytearray | memoryview):
        return bytes(image)
    return encode_png(image_array(image))


def image_array(image: RewardImage) -> np.ndarray[Any, Any]:
    """RGB ``uint8`` ``(H, W, 3)`` pixels of an input image (bytes through the one decoder, ``negt2i.core.images``).

    Raises ``ValueError`` naming what is wrong."""
    from negt2i.core.images import decode_image

    if isinstance(image, bytes | bytearray | memoryview):
        return decode_image(bytes(image))
    if isinstance(image, np.ndarray):
        arr = image
    elif hasattr(image, "convert") and hasattr(image, "size"):  # a PIL image
        arr = np.asarray(image.convert("RGB"))
    else:
        raise ValueError(f"an image must be PIL, a numpy array or encoded bytes, got {type(image).__name__}")
    if arr.ndim == 2:
        arr = np.repeat(arr[:, :, None], 3, axis=2)
    if arr.ndim != 3 or arr.shape[2] != 3 or arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError(f"an image array must be (H, W, 3) or (H, W), got shape {arr.shape}")
    if arr.dtype != np.uint8:
        raise ValueError(f"an image array must be uint8 (0..255), got {arr.dtype}")
    return np.ascontiguousarray(arr)


def resolve_prompt(prompt: RewardPrompt, corpus: Mapping[str, Prompt] | None = None) -> Prompt | str:
    """A ``Prompt``, or a prompt id left for the orchestrator (``corpus`` None) / looked up in ``corpus``.

    Raises ``ValueError`` naming what is wrong."""
    from negt2i.wire.v1 import evaluator_pb2

    if isinstance(prompt, Prompt):
        return prompt
    if isinstance(prompt, str):
        if corpus is None:
            return prompt
        if prompt not in corpus:
            raise ValueError(f"unknown prompt id {prompt!r} (not in the judge's corpus)")
        return corpus[prompt]
    if isinstance(prompt, evaluator_pb2.PromptSpec):
        from negt2i.wire import adapter

        return adapter.prompt_from_proto(prompt)
    if isinstance(prompt, Mapping):
        try:
            return parse_prompt(prompt, default_id="inline")  # a record without an id is judged as "inline"
        except SpecError as exc:
            raise ValueError(f"invalid prompt record: {exc}") from None
    raise ValueError(f"a prompt must be a Prompt, a corpus record, a PromptSpec or an id, got {type(prompt).__name__}")


def _check_lengths(images: Sequence[Any], prompts: Sequence[Any]) -> None:
    if len(images) != len(prompts):
        raise ValueError(f"{len(images)} images but {len(prompts)} prompts; pass one prompt per image")


def _finish(outcomes: list[Any], on_error: OnError) -> list[Any]:
    failures = [o for o in outcomes if isinstance(o, RewardFailure)]
    if failures and on_error == "raise":
        raise RewardError(failures, outcomes)
    return outcomes


def _check_on_error(on_error: str) -> OnError:
    if on_error not in ("raise", "return"):
        raise ValueError(f"on_error must be 'raise' or 'return', got {on_error!r}")
    return on_error  # type: ignore[return-value]


def _outcome(verdict: Verdict, details: bool) -> float | RewardDetails:
    return RewardDetails.of(verdict) if details else verdict.score


# --------------------------------------------------------------------------- the client


@dataclass(frozen=True)
class _Job:
    index: int
    image: RewardImage
    prompt: RewardPrompt


class RewardClient:
    """Rewards from an orchestrator (``host:port``, or an open ``EvaluatorClient``); see the module docstring.

    ``window``: images in flight; ``policy``: the stream submitter's ``RetryPolicy`` (default: its default);
    ``timeout``: seconds per ``score`` call (None: none); ``on_error``: the default of ``score``;
    ``client_options`` (``tls``, ``token``, ``max_message_bytes``) open the channel when ``target`` is a string.
    """

    def __init__(
        self,
        target: str | EvaluatorClient,
        *,
        window: int = DEFAULT_WINDOW,
        policy: RetryPolicy | None = None,
        timeout: float | None = None,
        on_error: OnError = "raise",
        **client_options: Any,
    ) -> None:
        from negt2i.client import EvaluatorClient

        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self._own = isinstance(target, str)
        self.client = EvaluatorClient(target, timeout=None, **client_options) if isinstance(target, str) else target
        self.window = window
        self.policy = policy
        self.timeout = timeout
        self.on_error = _check_on_error(on_error)
        self.last_stats: Any = None
        """The stream submitter's ``StreamStats`` of the last ``score`` (answers, retried, streams, ...)."""
        self.last_max_in_flight = 0
        """The most images in flight at once during the last ``score`` (at most ``window``)."""

    def __enter__(self) -> RewardClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the channel, if this client opened it."""
        if self._own:
            self.client.close()

    @staticmethod
    def _prepare(job: _Job) -> evaluator_pb2.EvaluateRequest | Failure:
        from negt2i.client import make_request

        try:
            data = encode_image(job.image)
        except ValueError as exc:
            return Failure(FailureKind.UNREADABLE_IMAGE, str(exc), field="image", code=Code.INVALID_ARGUMENT)
        try:
            prompt = resolve_prompt(job.prompt)
        except ValueError as exc:
            return Failure(FailureKind.INVALID_METADATA, str(exc), field="prompt", code=Code.INVALID_ARGUMENT)
        if isinstance(prompt, str):
            return make_request(data, prompt_id=prompt)
        return make_request(data, prompt=prompt)

    def score(
        self,
        images: Sequence[RewardImage],
        prompts: Sequence[RewardPrompt],
        *,
        details: bool = False,
        on_error: OnError | None = None,
    ) -> list[Any]:
        """One reward per image, in input order (``list[float]``; ``details=True``: ``list[RewardDetails]``)."""
        from negt2i.run.stream import StreamSubmitter
        from negt2i.wire import adapter

        _check_lengths(images, prompts)
        mode = self.on_error if on_error is None else _check_on_error(on_error)
        jobs = [_Job(i, im, p) for i, (im, p) in enumerate(zip(images, prompts, strict=True))]
        submitter: StreamSubmitter[_Job] = StreamSubmitter(
            self.client, self._prepare, window=self.window, policy=self.policy, timeout=self.timeout
        )
        outcomes: list[Any] = []
        for answer in submitter.run(jobs):
            index = answer.index
            if answer.failure is not None:  # refused before sending
                outcomes.append(RewardFailure(index, answer.failure.code, answer.failure.details()))
            elif answer.response is None:  # left by a stopped run (stall, stream error, timeout)
                outcomes.append(RewardFailure(index, "UNAVAILABLE", answer.left or "no answer", retryable=True))
            elif answer.response.HasField("error"):  # final: retryable ones only after the policy's attempts
                failure = adapter.failure_from_proto(answer.response.error)
                message = failure.details().removeprefix(f"{failure.code}: ")
                outcomes.append(RewardFailure(index, failure.code, message, retryable=bool(answer.left)))
            else:
                try:
                    verdict = adapter.verdict_from_proto(answer.response.result.verdict)
                except ValueError as exc:  # e.g. a score that contradicts its elements: no reward from it
                    outcomes.append(RewardFailure(index, "DATA_LOSS", f"invalid verdict from the server: {exc}"))
                    continue
                outcomes.append(_outcome(verdict, details))
        self.last_stats = submitter.stats
        self.last_max_in_flight = submitter.stats.max_in_flight
        return _finish(outcomes, mode)


class AsyncRewardClient:
    """``RewardClient`` for asyncio trainers: ``await score(...)`` runs the blocking stream submitter on a worker
    thread (``asyncio.to_thread``), so the event loop is never blocked; calls may overlap (one stream each)."""

    def __init__(self, target: str | EvaluatorClient, **options: Any) -> None:
        self.sync = RewardClient(target, **options)

    async def __aenter__(self) -> AsyncRewardClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        await asyncio.to_thread(self.sync.close)

    async def score(
        self,
        images: Sequence[RewardImage],
        prompts: Sequence[RewardPrompt],
        *,
        details: bool = False,
        on_error: OnError | None = None,
    ) -> list[Any]:
        """``RewardClient.score``, awaited."""
        return await asyncio.to_thread(self.sync.score, images, prompts, details=details, on_error=on_error)


# --------------------------------------------------------------------------- in-process


class RewardJudge:
    """Rewards computed in this process (the models on ``device``, e.g. the generator's GPU), by the same
    pipeline as ``negt2i evaluate``: the same verdicts, so the same scores, as the services.

    ``dtype``: ``fp32`` (default), ``bf16`` or ``fp16`` for every stage, or per stage
    (``detector=fp32,segmenter=bf16``; ``negt2i evaluate --dtype``); ``backends``: stage -> backend name
    (default: the paper's models, which need their weights: ``negt2i weights fetch``); ``corpus``: a JSONL
    file whose ids may be given as prompts; ``batch_size``: images per model call.
    """

    def __init__(
        self,
        device: str = "cpu",
        *,
        dtype: str = "fp32",
        backends: Mapping[str, str] | None = None,
        weights_dir: str | Path | None = None,
        config: RuleConfig = CURRENT,
        corpus: str | Path | None = None,
        batch_size: int = 16,
        on_error: OnError = "raise",
        pipeline: Pipeline | None = None,
    ) -> None:
        from negt2i.core.spec import read_prompts
        from negt2i.core.stage_types import STAGES
        from negt2i.pipeline import Pipeline, Stages
        from negt2i.stages.torch_support import parse_dtypes

        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.dtypes = parse_dtypes(dtype, STAGES)
        self.batch_size = batch_size
        self.on_error = _check_on_error(on_error)
        self.corpus = {p.id: p for p in read_prompts(corpus)} if corpus is not None else {}
        if pipeline is None:
            from negt2i import weights
            from negt2i.stages.registry import DEFAULT_BACKENDS

            names = {**DEFAULT_BACKENDS, **dict(backends or {})}
            weights.require(names.values(), weights_dir)  # one clear message naming every missing weight
            stages = Stages.create(
                names,
                {stage: {"dtype": d} for stage, d in self.dtypes.items()},
                device=device,
                weights_dir=weights_dir,
                config=config,
            )
            pipeline = Pipeline(stages, config)
        self.pipeline = pipeline

    def models(self) -> dict[str, dict[str, Any]]:
        """Stage -> model record (backend, weights, dtype), as a results line names them."""
        return self.pipeline.stages.models()

    def score(
        self,
        images: Sequence[RewardImage],
        prompts: Sequence[RewardPrompt],
        *,
        details: bool = False,
        on_error: OnError | None = None,
    ) -> list[Any]:
        """One reward per image, in input order (as ``RewardClient.score``)."""
        _check_lengths(images, prompts)
        mode = self.on_error if on_error is None else _check_on_error(on_error)
        outcomes: list[Any] = [None] * len(images)
        todo: list[tuple[int, Prompt, np.ndarray[Any, Any]]] = []
        for i, (image, prompt) in enumerate(zip(images, prompts, strict=True)):
            try:
                arr = image_array(image)
            except ValueError as exc:
                outcomes[i] = RewardFailure(i, "INVALID_ARGUMENT", f"image: {exc}")
                continue
            try:
                resolved = resolve_prompt(prompt, self.corpus)
            except ValueError as exc:
                outcomes[i] = RewardFailure(i, "INVALID_ARGUMENT", f"prompt: {exc}")
                continue
            if isinstance(resolved, str):  # unreachable: with a corpus mapping ids resolve or raise
                raise TypeError(resolved)
            todo.append((i, resolved, arr))
        for start in range(0, len(todo), self.batch_size):
            chunk = todo[start : start + self.batch_size]
            results = self.pipeline.run([p for _, p, _ in chunk], [a for _, _, a in chunk])
            for (i, _, _), result in zip(chunk, results, strict=True):
                if result.verdict is None:
                    failure = result.failure
                    code = failure.code if failure is not None else "INTERNAL"
                    outcomes[i] = RewardFailure(i, code, result.error or "no verdict")
                else:
                    outcomes[i] = _outcome(result.verdict, details)
        return _finish(outcomes, mode)


__all__ = [
    "DEFAULT_WINDOW",
    "AsyncRewardClient",
    "RewardClient",
    "RewardDetails",
    "RewardError",
    "RewardFailure",
    "RewardJudge",
    "encode_image",
    "image_array",
    "resolve_prompt",
]
