"""``negt2i submit IMAGES --orchestrator HOST:PORT --out results.jsonl``: judge through the gRPC orchestrator."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from negt2i.cli.common import EXIT_FAILED, EXIT_INPUT, add_results_args, perception_path


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "submit",
        help="stream a folder of generated images to the orchestrator and write negt2i evaluate's results file",
        description=(
            "Stream every image of IMAGES (GenEval layout or JSONL manifest, as for negt2i evaluate) to the "
            "orchestrator's EvaluateStream and append one JSON line per image to --out, in job order. Re-running "
            "resumes; items that failed transiently (a stage unavailable, a deadline, a full queue) get no line, "
            "so a rerun judges exactly those."
        ),
    )
    p.add_argument("images", help="GenEval-layout folder or JSONL manifest")
    p.add_argument(
        "--orchestrator",
        default=os.environ.get("NEGT2I_ORCHESTRATOR", "127.0.0.1:50051"),
        help="orchestrator HOST:PORT [NEGT2I_ORCHESTRATOR, default 127.0.0.1:50051]",
    )
    p.add_argument("--out", required=True, help="results JSONL (appended to; resumed when it exists)")
    p.add_argument("--prompts", default=None, help="prompt corpus JSONL resolving a manifest's prompt_id")
    add_results_args(p)
    p.add_argument("--limit", type=int, default=None, help="submit only the first N images (in job order)")
    p.add_argument("--timeout", type=float, default=None, help="deadline of the whole run in seconds (default: none)")
    p.add_argument(
        "--item-timeout",
        type=float,
        default=600.0,
        help="seconds an image may stay unanswered; then the run stops with an error (default 600)",
    )
    p.add_argument(
        "--attempts",
        type=int,
        default=10,
        help="sends of an image answered RESOURCE_EXHAUSTED / UNAVAILABLE, with backoff (default 10)",
    )
    p.add_argument(
        "--tls-ca",
        default=os.environ.get("NEGT2I_CLIENT_TLS_CA", ""),
        help="PEM CA bundle of the orchestrator's certificate: use TLS [NEGT2I_CLIENT_TLS_CA]",
    )
    p.add_argument(
        "--tls-cert",
        default=os.environ.get("NEGT2I_CLIENT_TLS_CERT", ""),
        help="PEM client certificate for mutual TLS [NEGT2I_CLIENT_TLS_CERT]",
    )
    p.add_argument(
        "--tls-key",
        default=os.environ.get("NEGT2I_CLIENT_TLS_KEY", ""),
        help="PEM key of --tls-cert [NEGT2I_CLIENT_TLS_KEY]",
    )
    p.add_argument(
        "--tls-server-name",
        default=os.environ.get("NEGT2I_CLIENT_TLS_SERVER_NAME", ""),
        help="name to check in the server certificate (default: the host of --orchestrator)",
    )
    p.add_argument("--token-file", default=os.environ.get("NEGT2I_TOKEN_FILE", ""),
                   help="file holding the bearer token [NEGT2I_TOKEN_FILE; or NEGT2I_TOKEN]")  # fmt: skip
    p.add_argument("--wait", type=float, default=60.0,
                   help="seconds to wait for the categories these images need to be SERVING")  # fmt: skip
    p.add_argument("--connect-timeout", type=float, default=5.0,
                   help="seconds without any answer (nothing listens, TLS mismatch) before giving up")  # fmt: skip
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from negt2i.client import ClientError, EvaluatorClient
    from negt2i.core.results import ResultsFileError
    from negt2i.core.spec import SpecError
    from negt2i.run.jobs import EvaluateError, discover, select_shard
    from negt2i.run.remote import needed_health
    from negt2i.submit import submit

    try:
        jobs = select_shard(discover(args.images, args.prompts), args.shard)
    except (EvaluateError, SpecError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not jobs:
        print(f"error: {args.images}: no images found", file=sys.stderr)
        return 2
    from negt2i.transport import Tls, token_from_env

    tls = None
    if args.tls_ca or args.tls_cert or args.tls_key:
        tls = Tls(args.tls_ca, args.tls_cert, args.tls_key, args.tls_server_name)
    try:
        token = token_from_env({"NEGT2I_TOKEN_FILE": args.token_file} if args.token_file else None)
        client_cm = EvaluatorClient(args.orchestrator, tls=tls, token=token)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    with client_cm as client:
        try:  # only the categories these jobs need (a colour-only folder runs while the segmenter is down)
            down = client.wait_serving(needed_health(jobs[: args.limit] if args.limit is not None else jobs),
                                       timeout=args.wait, connect_timeout=min(args.connect_timeout, args.wait),
                                       partial=True)  # fmt: skip
        except ClientError as exc:
            print(f"error: {exc.details}", file=sys.stderr)
            return 3
        if down:
            names = ", ".join(n.rsplit("/", 1)[-1] for n in down)
            said = "".join(f"; the {s} is {v}" for s, v in client.last_details.items() if not v.startswith("accepted"))
            print(f"warning: not SERVING: {names}{said}; their images are left for a rerun", file=sys.stderr)
        try:
            outcome = submit(
                jobs, args.out, args.orchestrator, limit=args.limit, timeout=args.timeout,
                item_timeout=args.item_timeout, attempts=args.attempts, progress=not args.no_progress, client=client,
                retry_errors=args.retry_errors, replace_changed=args.replace_changed,
                save_perception=perception_path(args),
            )  # fmt: skip
        except ResultsFileError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_INPUT
        except (ClientError, EvaluateError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_FAILED
    from negt2i.metrics.totals import plural

    print(outcome.summary.text())
    print(f"results: {args.out}")  # as negt2i evaluate and negt2i generate end
    if args.save_perception is not None:
        print(f"perception: {perception_path(args)}")
    if outcome.retried:
        were = "was a retry" if outcome.retried == 1 else "were retries"
        print(f"{plural(outcome.retried, 'send')} {were} after RESOURCE_EXHAUSTED / UNAVAILABLE", file=sys.stderr)
    if outcome.stream_error:
        print(f"error: the stream ended early: {outcome.stream_error}", file=sys.stderr)
    if outcome.retry:
        were = "was" if len(outcome.retry) == 1 else "were"
        print(
            f"{plural(len(outcome.retry), 'image')} {were} not judged (transient errors); run the same command again",
            file=sys.stderr,
        )
        return 1
    return 0
