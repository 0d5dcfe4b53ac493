"""Orchestrator settings: each declared once, as a field with its metadata; the readers follow from them.

``Settings`` lists every setting once: its default, its environment variable (``docs/architecture.md``,
``docs/services.md``), what it means and which values are valid (``Setting``: a range or a list of
choices). ``Settings.from_env`` (the ``NEGT2I_*`` variables) and ``Settings.from_args`` (one flag per
setting, ``--stage-queue`` for ``stage_queue``, over the environment) are derived from those fields,
and every value, however it arrived (a variable, a flag, ``dataclasses.replace``), is checked when the
``Settings`` is made: a value outside its range or choices, or one that does not parse, is refused with
a ``SettingsError`` naming the variable and the flag, never replaced by a default (a typo in
``NEGT2I_DEPTH_ENCODING`` is an error, not ``float16``).

Two settings are read specially: ``urls`` (one variable and one flag per stage, ``NEGT2I_<STAGE>_URL`` /
``--<stage>-url``) and ``auth_token`` (``NEGT2I_AUTH_TOKEN``, or the first line of the file
``NEGT2I_AUTH_TOKEN_FILE``; no flag, so the secret never shows in a process listing).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from negt2i.core.stage_identity import STRICT_ENV
from negt2i.core.stage_types import STAGES

DEFAULT_URLS: Final[dict[str, str]] = {
    "detector": "http://127.0.0.1:3001",
    "segmenter": "http://127.0.0.1:3002",
    "attributes": "http://127.0.0.1:3003",
    "depth": "http://127.0.0.1:3004",
}
"""Stage service base URLs on one machine (ports 3001-3004)."""

MIB: Final = 1024 * 1024

_TRUE: Final = frozenset({"1", "true", "yes", "on"})
_FALSE: Final = frozenset({"0", "false", "no", "off", ""})


class SettingsError(ValueError):
    """A setting's value is invalid (the message names the variable and the flag)."""


@dataclass(frozen=True)
class Setting:
    """What a ``Settings`` field means and accepts (its ``metadata["setting"]``)."""

    env: str
    """The environment variable (``""``: read specially, see the module docstring)."""
    help: str
    at_least: float | None = None
    """Smallest valid value (numbers)."""
    above: float | None = None
    """Valid values are greater than this (numbers)."""
    at_most: float | None = None
    """Largest valid value (numbers)."""
    choices: tuple[str, ...] = ()
    """The valid values (strings); empty: any."""
    flag: bool = True
    """Whether ``python -m orchestrator`` has a flag for it."""

    def check(self, name: str, value: Any) -> None:
        """Raise ``SettingsError`` unless ``value`` is valid for the setting ``name``."""
        if self.choices and value not in self.choices:
            raise SettingsError(f"{self.where(name)}: {value!r} is not one of {', '.join(self.choices)}")
        if isinstance(value, bool) or not isinstance(value, int | float):
            return
        if self.at_least is not None and value < self.at_least:
            raise SettingsError(f"{self.where(name)}: {value!r} is below the minimum {self.at_least:g}")
        if self.above is not None and value <= self.above:
            raise SettingsError(f"{self.where(name)}: {value!r} must be greater than {self.above:g}")
        if self.at_most is not None and value > self.at_most:
            raise SettingsError(f"{self.where(name)}: {value!r} is above the maximum {self.at_most:g}")

    def where(self, name: str) -> str:
        """How a user sets it: ``NEGT2I_STAGE_QUEUE / --stage-queue``."""
        names = [self.env] if self.env else []
        if self.flag:
            names.append(flag_of(name))
        return " / ".join(names) or name


def setting(default: Any, env: str, help: str, **check: Any) -> Any:
    """A ``Settings`` field: its default and its ``Setting`` metadata."""
    return field(default=default, metadata={"setting": Setting(env, help, **check)})


def flag_of(name: str) -> str:
    """The flag of the setting ``name``: ``--stage-queue`` for ``stage_queue``."""
    return "--" + name.replace("_", "-")


def _token(env: Mapping[str, str]) -> str:
    """``NEGT2I_AUTH_TOKEN``, or the first line of the file ``NEGT2I_AUTH_TOKEN_FILE`` (a mounted Secret)."""
    path = env.get("NEGT2I_AUTH_TOKEN_FILE", "")
    if path:
        return Path(path).read_text(encoding="utf-8").strip()
    return env.get("NEGT2I_AUTH_TOKEN", "").strip()


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in _TRUE | _FALSE:
        return value in _TRUE
    raise ValueError(f"{text!r} is not a yes/no value (1, true, yes, on / 0, false, no, off)")


def _url(stage: str, text: str) -> str:
    url = text.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise SettingsError(f"NEGT2I_{stage.upper()}_URL / --{stage}-url: {text!r} is not an http:// or https:// URL")
    return url


@dataclass(frozen=True)
class Settings:
    """Everything the orchestrator is configured with (each field's metadata says its variable and range)."""

    host: str = setting(
        "127.0.0.1",
        "NEGT2I_HOST",
        "address to bind: loopback by default (Kubernetes sets NEGT2I_HOST=0.0.0.0 explicitly)",
    )
    port: int = setting(50051, "NEGT2I_PORT", "gRPC port (0: any free port)", at_least=0, at_most=65535)
    urls: dict[str, str] = field(
        default_factory=lambda: dict(DEFAULT_URLS),
        metadata={"setting": Setting("", "stage service base URLs", flag=False)},
    )
    rules: str = setting("current", "NEGT2I_RULES", "rule preset or JSON file")
    corpus: str = setting("data/negt2ibench.jsonl", "NEGT2I_CORPUS", "corpus JSONL that prompt ids refer to")
    max_message_bytes: int = setting(
        32 * MIB,
        "NEGT2I_MAX_MESSAGE_BYTES",
        "gRPC receive / send limit per message (RESOURCE_EXHAUSTED above it)",
        at_least=1,
    )
    max_image_bytes: int = setting(
        24 * MIB, "NEGT2I_MAX_IMAGE_BYTES", "largest encoded image (INVALID_ARGUMENT above it)", at_least=1
    )
    max_pixels: int = setting(
        4096 * 4096, "NEGT2I_MAX_PIXELS", "largest decoded image (INVALID_ARGUMENT above it)", at_least=1
    )
    stage_concurrency: int = setting(8, "NEGT2I_STAGE_CONCURRENCY", "calls in flight per stage", at_least=1)
    stage_queue: int = setting(
        256,
        "NEGT2I_STAGE_QUEUE",
        "calls waiting per stage beyond stage_concurrency; more get RESOURCE_EXHAUSTED",
        at_least=0,
    )
    stream_window: int = setting(
        32, "NEGT2I_STREAM_WINDOW", "items of one stream judged concurrently (the stream is read no faster)", at_least=1
    )
    call_timeout_s: float = setting(
        60.0,
        "NEGT2I_CALL_TIMEOUT_S",
        "timeout of one HTTP call to a stage (cut to the request's remaining deadline)",
        above=0,
    )
    item_timeout_s: float = setting(
        300.0,
        "NEGT2I_ITEM_TIMEOUT_S",
        "deadline of one item when the caller set none (or a longer one on a stream)",
        above=0,
    )
    retries: int = setting(
        3,
        "NEGT2I_RETRIES",
        "extra attempts of a stage call after a connection error, 502/503/504 or timeout",
        at_least=0,
    )
    backoff_s: float = setting(
        0.1, "NEGT2I_BACKOFF_S", "first retry delay; doubles each attempt (capped at 2 s)", at_least=0
    )
    health_interval_s: float = setting(1.0, "NEGT2I_HEALTH_INTERVAL_S", "how often stage readiness is polled", above=0)
    depth_encoding: str = setting(
        "float16",
        "NEGT2I_DEPTH_ENCODING",
        "how the depth stage packs disparity: float16 (half the bytes) or float32 (bit-exact)",
        choices=("float16", "float32"),
    )
    stage_bodies: str = setting(
        "auto",
        "NEGT2I_STAGE_BODIES",
        "stage call bodies: auto (binary protobuf to a stage whose /info lists it, else JSON) or json",
        choices=("auto", "json"),
    )
    max_inflight_bytes: int = setting(
        0,
        "NEGT2I_MAX_INFLIGHT_BYTES",
        "global in-flight byte budget of admitted items; 0: half of the memory limit less the reception reserve",
        at_least=0,
    )
    max_active: int = setting(
        64, "NEGT2I_MAX_ACTIVE", "items judged at once over all streams and calls; more wait for admission", at_least=1
    )
    max_waiting: int = setting(
        1024, "NEGT2I_MAX_WAITING", "items waiting for admission; more get RESOURCE_EXHAUSTED at once", at_least=0
    )
    max_wait_s: float = setting(
        60.0,
        "NEGT2I_MAX_WAIT_S",
        "longest wait for admission (cut to the item's deadline); then RESOURCE_EXHAUSTED",
        at_least=0,
    )
    max_calls: int = setting(
        256, "NEGT2I_MAX_CALLS", "open calls at once (unary and streams; health checks excepted)", at_least=1
    )
    max_receiving: int = setting(
        2,
        "NEGT2I_MAX_RECEIVING",
        "unary request messages received at once (each up to the transport limit, 2 x max_message_bytes); more "
        "calls wait unread, each holding at most call_buffer_bytes",
        at_least=1,
    )
    max_stream_receiving: int = setting(
        4,
        "NEGT2I_MAX_STREAM_RECEIVING",
        "stream request messages received at once (a stream takes a place for each read, and waits for one; "
        "each message up to the transport limit)",
        at_least=1,
    )
    receive_timeout_s: float = setting(
        30.0,
        "NEGT2I_RECEIVE_TIMEOUT_S",
        "longest time a unary call's message may take to arrive once its reception started (DEADLINE_EXCEEDED); "
        "a stream silent this long with nothing in flight gives its place up to a waiting stream (it ends "
        "RESOURCE_EXHAUSTED)",
        above=0,
    )
    call_buffer_bytes: int = setting(
        64 * 1024,
        "NEGT2I_CALL_BUFFER_BYTES",
        "HTTP/2 stream window: bytes gRPC accepts on a call before the server reads its message (0: gRPC's "
        "automatic window, which grows to several MiB per call)",
        at_least=0,
    )
    tls_cert: str = setting("", "NEGT2I_TLS_CERT", "PEM server certificate (chain); with tls_key the port speaks TLS")
    tls_key: str = setting("", "NEGT2I_TLS_KEY", "PEM private key of tls_cert")
    tls_client_ca: str = setting(
        "", "NEGT2I_TLS_CLIENT_CA", "PEM CA bundle: clients must present a certificate signed by it (mutual TLS)"
    )
    auth_token: str = field(default="", repr=False, metadata={"setting": Setting(
        "", "bearer token every call except health checks must carry (NEGT2I_AUTH_TOKEN or NEGT2I_AUTH_TOKEN_FILE)",
        flag=False)})  # fmt: skip
    reflection: bool = setting(
        False, "NEGT2I_REFLECTION", "serve gRPC reflection (opt-in: it lists the API to anyone who can connect)"
    )
    strict_stages: bool = setting(
        False,
        STRICT_ENV,
        "refuse a stage whose /info leaves its rule constants or operating point unstated (a stage of the contract "
        "before them); off: accepted with a warning (negt2i.core.stage_identity, docs/stage-contract.md)",
    )

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            spec(f).check(f.name, getattr(self, f.name))
        for stage in STAGES:
            _url(stage, self.urls.get(stage, ""))

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read the ``NEGT2I_*`` variables (unset: the default); an invalid value is a ``SettingsError``."""
        e = dict(os.environ if env is None else env)
        values: dict[str, Any] = {
            "urls": {s: _url(s, e.get(f"NEGT2I_{s.upper()}_URL", DEFAULT_URLS[s])) for s in STAGES},
            "auth_token": _token(e),
        }
        for f in _plain_fields():
            meta = spec(f)
            if meta.env in e:
                try:
                    values[f.name] = _parser(f)(e[meta.env])
                except ValueError as exc:
                    raise SettingsError(f"{meta.where(f.name)}: {exc}") from None
        return cls(**values)

    @classmethod
    def from_args(cls, argv: list[str] | None = None) -> Settings:
        """Environment first, then flags (``python -m orchestrator --help`` lists them with their variables)."""
        base = cls.from_env()
        p = argparse.ArgumentParser(prog="python -m orchestrator", description="The negt2i.v1.Evaluator gRPC server.")
        for s in STAGES:
            p.add_argument(f"--{s}-url", default=base.urls[s], help=f"{s} service base URL [NEGT2I_{s.upper()}_URL]")
        for f in _plain_fields():
            meta = spec(f)
            if not meta.flag:
                continue
            dest, default, text = f.name, getattr(base, f.name), f"{meta.help} [{meta.env}]"
            if isinstance(f.default, bool):
                p.add_argument(flag_of(f.name), dest=dest, action=argparse.BooleanOptionalAction, default=default,
                               help=text)  # fmt: skip
            else:
                p.add_argument(flag_of(f.name), dest=dest, type=_parser(f), default=default,
                               choices=meta.choices or None, help=text)  # fmt: skip
        a = p.parse_args(argv)
        try:
            return dataclasses.replace(
                base,
                urls={s: _url(s, getattr(a, f"{s}_url")) for s in STAGES},
                **{f.name: getattr(a, f.name) for f in _plain_fields() if spec(f).flag},
            )
        except SettingsError as exc:
            p.error(str(exc))


def spec(f: dataclasses.Field[Any]) -> Setting:
    """The ``Setting`` of a ``Settings`` field."""
    meta: Setting = f.metadata["setting"]
    return meta


def _plain_fields() -> list[dataclasses.Field[Any]]:
    """The fields read from their own variable (all but ``urls`` and ``auth_token``)."""
    return [f for f in dataclasses.fields(Settings) if spec(f).env]


def _parser(f: dataclasses.Field[Any]) -> Callable[[str], Any]:
    """How a variable's text becomes the field's value (by the type of its default)."""
    kind: type[Any] = type(f.default)
    if kind is bool:
        return _bool
    if kind is int:
        return int
    if kind is float:
        return float
    return str
