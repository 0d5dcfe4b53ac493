"""Orchestrator settings: environment variables (``docs/architecture.md``), overridden by flags."""

from __future__ import annotations

import argparse
import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from negt2i.stage_identity import strict_from_env
from negt2i.stage_types import STAGES

DEFAULT_URLS: Final[dict[str, str]] = {
    "detector": "http://127.0.0.1:3001",
    "segmenter": "http://127.0.0.1:3002",
    "attributes": "http://127.0.0.1:3003",
    "depth": "http://127.0.0.1:3004",
}
"""Stage service base URLs on one machine (ports 3001-3004)."""

MIB: Final = 1024 * 1024


def _token(env: dict[str, str]) -> str:
    """``NEGT2I_AUTH_TOKEN``, or the first line of the file ``NEGT2I_AUTH_TOKEN_FILE`` (a mounted Secret)."""
    path = env.get("NEGT2I_AUTH_TOKEN_FILE", "")
    if path:
        return Path(path).read_text(encoding="utf-8").strip()
    return env.get("NEGT2I_AUTH_TOKEN", "").strip()


@dataclass(frozen=True)
class Settings:
    """Everything the orchestrator is configured with."""

    host: str = "127.0.0.1"
    """Address to bind: loopback by default (Kubernetes sets ``NEGT2I_HOST=0.0.0.0`` explicitly)."""
    port: int = 50051
    urls: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_URLS))
    rules: str = "current"
    corpus: str = "data/negt2ibench.jsonl"
    max_message_bytes: int = 32 * MIB
    """gRPC receive / send limit per message (gRPC itself answers RESOURCE_EXHAUSTED above it)."""
    max_image_bytes: int = 24 * MIB
    """Largest encoded image (INVALID_ARGUMENT above it)."""
    max_pixels: int = 4096 * 4096
    """Largest decoded image (INVALID_ARGUMENT above it)."""
    stage_concurrency: int = 8
    """Calls in flight per stage."""
    stage_queue: int = 256
    """Calls waiting per stage beyond ``stage_concurrency``; more get RESOURCE_EXHAUSTED."""
    stream_window: int = 32
    """Items of one stream judged concurrently (the stream is read no faster)."""
    call_timeout_s: float = 60.0
    """Timeout of one HTTP call to a stage (always cut to the request's remaining deadline)."""
    item_timeout_s: float = 300.0
    """Deadline of one item when the caller set none (or a longer one on a stream)."""
    retries: int = 3
    """Extra attempts of a stage call after a connection error, 502/503/504 or timeout (calls are idempotent)."""
    backoff_s: float = 0.1
    """First retry delay; doubles each attempt (capped at 2 s)."""
    health_interval_s: float = 1.0
    """How often stage readiness is polled."""
    depth_encoding: str = "float16"
    """How the depth stage packs disparity: ``float16`` (half the bytes) or ``float32`` (bit-exact)."""
    stage_bodies: str = "auto"
    """Stage call bodies: ``auto`` (binary protobuf to a stage whose ``/info`` lists it, else JSON) or ``json``."""
    max_inflight_bytes: int = 0
    """Global in-flight byte budget of admitted items (``orchestrator.admission``); 0: half the memory limit."""
    max_active: int = 64
    """Items judged at once over all streams and calls; more wait for admission."""
    max_waiting: int = 1024
    """Items waiting for admission; more get RESOURCE_EXHAUSTED at once."""
    max_wait_s: float = 60.0
    max_calls: int = 256
    """Open calls at once (unary and streams; health checks excepted): ``orchestrator.guard.CallLimit``."""
    """Longest wait for admission (cut to the item's deadline); then RESOURCE_EXHAUSTED."""
    tls_cert: str = ""
    """PEM server certificate (chain); with ``tls_key`` the port speaks TLS."""
    tls_key: str = ""
    """PEM private key of ``tls_cert``."""
    tls_client_ca: str = ""
    """PEM CA bundle: clients must present a certificate signed by it (mutual TLS)."""
    auth_token: str = ""
    """Bearer token every call except health checks must carry (``authorization: Bearer <token>``)."""
    reflection: bool = False
    """Serve gRPC reflection (opt-in: it lists the API to anyone who can connect)."""
    strict_stages: bool = False
    """Refuse a stage whose ``/info`` leaves its rule constants or operating point unstated (a stage of the
    contract before them); off: accepted with a warning (``negt2i.stage_identity``, docs/stage-contract.md)."""

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Settings:
        """Read ``NEGT2I_*`` variables."""
        e = dict(os.environ if env is None else env)
        urls = {s: e.get(f"NEGT2I_{s.upper()}_URL", DEFAULT_URLS[s]).rstrip("/") for s in STAGES}
        d = cls()
        return cls(
            host=e.get("NEGT2I_HOST", d.host),
            port=int(e.get("NEGT2I_PORT", d.port)),
            urls=urls,
            rules=e.get("NEGT2I_RULES", d.rules),
            corpus=e.get("NEGT2I_CORPUS", d.corpus),
            max_message_bytes=int(e.get("NEGT2I_MAX_MESSAGE_BYTES", d.max_message_bytes)),
            max_image_bytes=int(e.get("NEGT2I_MAX_IMAGE_BYTES", d.max_image_bytes)),
            max_pixels=int(e.get("NEGT2I_MAX_PIXELS", d.max_pixels)),
            stage_concurrency=int(e.get("NEGT2I_STAGE_CONCURRENCY", d.stage_concurrency)),
            stage_queue=int(e.get("NEGT2I_STAGE_QUEUE", d.stage_queue)),
            stream_window=int(e.get("NEGT2I_STREAM_WINDOW", d.stream_window)),
            call_timeout_s=float(e.get("NEGT2I_CALL_TIMEOUT_S", d.call_timeout_s)),
            item_timeout_s=float(e.get("NEGT2I_ITEM_TIMEOUT_S", d.item_timeout_s)),
            retries=int(e.get("NEGT2I_RETRIES", d.retries)),
            backoff_s=float(e.get("NEGT2I_BACKOFF_S", d.backoff_s)),
            health_interval_s=float(e.get("NEGT2I_HEALTH_INTERVAL_S", d.health_interval_s)),
            depth_encoding=e.get("NEGT2I_DEPTH_ENCODING", d.depth_encoding),
            stage_bodies=e.get("NEGT2I_STAGE_BODIES", d.stage_bodies),
            max_inflight_bytes=int(e.get("NEGT2I_MAX_INFLIGHT_BYTES", d.max_inflight_bytes)),
            max_active=int(e.get("NEGT2I_MAX_ACTIVE", d.max_active)),
            max_waiting=int(e.get("NEGT2I_MAX_WAITING", d.max_waiting)),
            max_wait_s=float(e.get("NEGT2I_MAX_WAIT_S", d.max_wait_s)),
            max_calls=int(e.get("NEGT2I_MAX_CALLS", d.max_calls)),
            tls_cert=e.get("NEGT2I_TLS_CERT", d.tls_cert),
            tls_key=e.get("NEGT2I_TLS_KEY", d.tls_key),
            tls_client_ca=e.get("NEGT2I_TLS_CLIENT_CA", d.tls_client_ca),
            auth_token=_token(e),
            reflection=e.get("NEGT2I_REFLECTION", "0").strip().lower() in {"1", "true", "yes", "on"},
            strict_stages=strict_from_env(e),
        )

    @classmethod
    def from_args(cls, argv: list[str] | None = None) -> Settings:
        """Environment first, then flags."""
        base = cls.from_env()
        p = argparse.ArgumentParser(prog="python -m orchestrator", description="The negt2i.v1.Evaluator gRPC server.")
        p.add_argument("--host", default=base.host)
        p.add_argument("--port", type=int, default=base.port)
        for s in STAGES:
            p.add_argument(f"--{s}-url", default=base.urls[s], help=f"{s} service base URL")
        p.add_argument("--rules", default=base.rules, help="rule preset or JSON file")
        p.add_argument("--corpus", default=base.corpus, help="corpus JSONL that prompt ids refer to")
        p.add_argument("--max-message-bytes", type=int, default=base.max_message_bytes)
        p.add_argument("--max-image-bytes", type=int, default=base.max_image_bytes)
        p.add_argument("--stage-concurrency", type=int, default=base.stage_concurrency)
        p.add_argument("--stage-queue", type=int, default=base.stage_queue)
        p.add_argument("--stream-window", type=int, default=base.stream_window)
        p.add_argument("--call-timeout-s", type=float, default=base.call_timeout_s)
        p.add_argument("--retries", type=int, default=base.retries)
        p.add_argument("--depth-encoding", choices=("float16", "float32"), default=base.depth_encoding)
        p.add_argument("--stage-bodies", choices=("auto", "json"), default=base.stage_bodies,
                       help="binary protobuf stage bodies where a stage lists them (auto), or JSON only")  # fmt: skip
        p.add_argument("--max-inflight-bytes", type=int, default=base.max_inflight_bytes)
        p.add_argument("--max-active", type=int, default=base.max_active)
        p.add_argument("--tls-cert", default=base.tls_cert, help="PEM server certificate [NEGT2I_TLS_CERT]")
        p.add_argument("--tls-key", default=base.tls_key, help="PEM server key [NEGT2I_TLS_KEY]")
        p.add_argument("--tls-client-ca", default=base.tls_client_ca, help="require client certs signed by this CA")
        p.add_argument("--reflection", action="store_true", default=base.reflection, help="serve gRPC reflection")
        p.add_argument("--strict-stages", action=argparse.BooleanOptionalAction, default=base.strict_stages,
                       help="refuse stages that leave their rules or operating point unstated "
                       "[NEGT2I_STRICT_STAGES]")  # fmt: skip
        a = p.parse_args(argv)
        return dataclasses.replace(
            base,
            max_inflight_bytes=a.max_inflight_bytes,
            max_active=a.max_active,
            tls_cert=a.tls_cert,
            tls_key=a.tls_key,
            tls_client_ca=a.tls_client_ca,
            reflection=a.reflection,
            strict_stages=a.strict_stages,
            host=a.host,
            port=a.port,
            urls={s: getattr(a, f"{s}_url").rstrip("/") for s in STAGES},
            rules=a.rules,
            corpus=a.corpus,
            max_message_bytes=a.max_message_bytes,
            max_image_bytes=a.max_image_bytes,
            stage_concurrency=a.stage_concurrency,
            stage_queue=a.stage_queue,
            stream_window=a.stream_window,
            call_timeout_s=a.call_timeout_s,
            retries=a.retries,
            depth_encoding=a.depth_encoding,
            stage_bodies=a.stage_bodies,
        )
