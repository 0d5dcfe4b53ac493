"""``negt2i submit``: judge a folder (or a manifest) through the gRPC orchestrator, a thin driver.

The jobs (``negt2i.run.jobs``), the results run (``negt2i.run.output``: resume by content, the
lines, the tally) and the stream (``negt2i.run.stream.StreamSubmitter``: back-pressure, the one
retry policy, the stall watchdog) are the run loop's; this module only wires them: it reads the
orchestrator's rules and models, plans the run, streams the images and writes each answer's line
in job order. The results file is the one ``negt2i evaluate`` writes for the same images (the
same verdicts; the models and services that served each image are recorded). Items that failed
for a transient reason get no line at all, so a rerun judges exactly those.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from negt2i.core.failures import Code, Failure, FailureKind
from negt2i.run.jobs import Job, Loaded, read_job
from negt2i.run.output import Line, ResultsRun, SubmitOutcome, error_line, response_line
from negt2i.run.remote import needed_stages, served
from negt2i.run.stream import DEFAULT_ITEM_TIMEOUT_S, RetryPolicy, StreamSubmitter
from negt2i.transport import DEFAULT_ATTEMPTS

if TYPE_CHECKING:
    from negt2i.client import EvaluatorClient
    from negt2i.wire.v1 import evaluator_pb2

DEFAULT_WINDOW = 32
"""Items in flight when the orchestrator does not say (``ServiceInfo.limits.max_in_flight_per_stream``)."""


def submit(
    jobs: Sequence[Job],
    out: str | Path,
    target: str,
    *,
    limit: int | None = None,
    timeout: float | None = None,
    item_timeout: float = DEFAULT_ITEM_TIMEOUT_S,
    attempts: int = DEFAULT_ATTEMPTS,
    progress: bool = True,
    client: EvaluatorClient | None = None,
    save_perception: str | Path | None = None,
    retry_errors: bool = False,
    replace_changed: bool = False,
) -> SubmitOutcome:
    """Stream ``jobs`` (the first ``limit``) to the orchestrator at ``target`` and write ``out`` like
    ``negt2i evaluate`` (see the module docstring). ``save_perception`` as for ``negt2i evaluate`` (the
    orchestrator is asked for the perception with ``include_perception``).

    At most ``ServiceInfo.limits.max_in_flight_per_stream`` items are in flight; retries (``attempts``
    sends, ``item_timeout`` from an item's first send, the whole run's ``timeout``) and the stall watchdog
    (no answer for ``item_timeout`` seconds stops the run with ``stream_error``) are the stream submitter's
    (``negt2i.run.stream``). What was not judged gets no line (a rerun judges it).

    The results file is locked before anything is sent, refused unless new or ours, and resumed by content
    exactly like ``negt2i evaluate`` (``retry_errors``, ``replace_changed``); each image is read, hashed and
    checked by the one decoder (``negt2i.run.jobs.read_job``) before it is sent.
    """
    from tqdm import tqdm

    from negt2i.client import ClientError, EvaluatorClient, make_request

    run = ResultsRun(out, save_perception=save_perception)  # the one writer, locked before anything is sent
    own = client is None
    try:
        cl = client or EvaluatorClient(target)
    except BaseException:
        run.close()
        raise
    try:
        info = cl.info()
        selected = list(jobs[:limit] if limit is not None else jobs)
        # only the stages these jobs' categories need must be known (a colour-only folder runs with the
        # segmenter down); the results lines record the models of the stages the orchestrator has reached
        need = needed_stages(selected, served(info).config)
        refused = {s.stage: s.refused for s in info.stages if s.refused and s.stage in need}
        if refused and ("detector" in refused or len(refused) == len(need)):  # nothing could be judged
            raise ClientError(Code.UNAVAILABLE, "the orchestrator refuses " + "; ".join(
                f"the {stage}: {why}" for stage, why in refused.items()))  # fmt: skip
        for s in info.stages:  # a stage accepted on assumptions (e.g. of the contract before ModelInfo.rules)
            for warning in s.warnings if s.stage in need else ():
                print(f"warning: the {s.stage} {warning}", file=sys.stderr)
        missing = [s.stage for s in info.stages if not s.model.model and s.stage in need]
        if "detector" in missing or len(missing) == len(need):  # nothing could be judged
            raise ClientError(Code.UNAVAILABLE, f"the orchestrator has not reached {', '.join(missing)} yet; retry")
        if missing:  # the items that need them are answered UNAVAILABLE at once and left for a rerun
            print(f"warning: the orchestrator has not reached {', '.join(missing)}: images that need it are left "
                  "for a rerun", file=sys.stderr)  # fmt: skip
        seen = served(info, [s for s in info.stages if s.model.model])
        todo = run.plan(selected, seen.config, seen.models, retry_errors=retry_errors, replace_changed=replace_changed)
        max_image = int(info.limits.max_image_bytes)
        hashes: dict[str, str | None] = {}

        def prepare(job: Job) -> evaluator_pb2.EvaluateRequest | Failure:
            try:  # the same read, hash and decoder check (and message) as negt2i evaluate
                loaded = read_job(job)
            except Exception as exc:  # never let one image end the stream for all the others
                why = f"{job.filename}: {type(exc).__name__}: {exc}"
                loaded = Loaded(None, error=Failure(FailureKind.UNREADABLE_IMAGE, why))
            hashes[job.filename] = loaded.sha256
            if loaded.error is None and 0 < max_image < len(loaded.data):
                # what the orchestrator would refuse, refused here: a message over its transport limit would
                # end the whole stream
                why = f"{job.filename}: image of {len(loaded.data)} bytes exceeds the limit of {max_image}"
                return Failure(FailureKind.UNREADABLE_IMAGE, why, field="image.data")
            if loaded.error is not None or job.prompt is None:
                return loaded.error or Failure(FailureKind.MISSING_METADATA, "no prompt")
            return make_request(loaded.data, prompt=job.prompt, include_perception=save_perception is not None)

        window = int(info.limits.max_in_flight_per_stream) or DEFAULT_WINDOW
        policy = RetryPolicy(attempts=max(1, attempts), item_timeout=item_timeout)
        submitter = StreamSubmitter(cl, prepare, window=window, policy=policy, timeout=timeout)
        outcome = run.outcome
        with tqdm(total=len(todo), unit="img", disable=not progress, dynamic_ncols=True, desc="submit") as bar:
            for answer in submitter.run(todo):
                job = answer.item
                sha256 = hashes.pop(job.filename, None)
                if answer.failure is not None:
                    run.write(Line(error_line(job, answer.failure, seen.config, seen.models, sha256)))
                elif answer.left or answer.response is None:
                    run.leave(job.filename, answer.left if answer.response is not None else None)
                else:
                    line = response_line(answer.response, job, seen, sha256=sha256,
                                         perception=save_perception is not None)  # fmt: skip
                    assert line is not None  # a transient answer is left
                    run.write(line)
                bar.update(1)
                if submitter.stats.retried != outcome.retried:
                    outcome.retried = submitter.stats.retried
                    bar.set_postfix(retried=outcome.retried, refresh=False)
        outcome.retried = submitter.stats.retried
        outcome.answers = submitter.stats.answers
        outcome.stream_error = submitter.stats.stream_error
        run.finish()
        return outcome
    finally:
        run.close()
        if own:
            cl.close()
