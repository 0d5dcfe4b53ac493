"""Orchestrator memory under concurrent large calls and streams, before and after (issue 31, item 6).

    .venv/bin/python benchmarks/bench_memory.py [--calls 16] [--mb 60] [--before REV] [--image PNG]

Starts orchestrators on 127.0.0.1 (stage URLs point nowhere: nothing here reaches a stage) and measures
the server's resident memory (``VmRSS``; the peak from ``VmHWM``, reset after start-up) for:

- ``unauthenticated``: a token is configured; ``--calls`` concurrent calls of ``--mb`` MB each, sent without
  it, on one connection (where gRPC's automatic flow-control window grows most);
- ``health``: the same calls to ``grpc.health.v1.Health/Check`` (which needs no token), one connection each;
- ``authenticated``: the same calls with the token, one connection each (the messages, over
  ``max_message_bytes`` but under the transport limit, are received and answered MESSAGE_TOO_LARGE);
- ``streams``: ``--calls`` concurrent ``EvaluateStream`` calls with the token, one connection each, each
  sending one such message (received ``NEGT2I_MAX_STREAM_RECEIVING`` at a time, answered MESSAGE_TOO_LARGE);
- ``throughput``: a 4096 x 4096 PNG (``--image``, else one of about 20 MiB is drawn) sent 16 times, 4 calls at
  once, with the token: MiB/s through a real socket, up to admission (the prompt id is unknown, so no stage
  is called); ``stream throughput``: the same PNG sent 32 times over 8 streams at once (4 each, one
  connection), twice the default stream places.

Each case runs against this tree (``after``) and, with ``--before REV`` (default: the commit before the
change; ``--before ''`` skips it), against ``git archive REV`` of ``negt2i/`` and ``orchestrator/`` in a
temporary directory (``before``), in the same run; ratios are after / before. The documented figures
(docs/services.md, "Memory") are printed next to the measured ones, after a ``machine:`` line (CPU model, core
count, load average); the throughput figure lines read::

    throughput         after        N   (N, N, N)

``--smoke``: 2 calls of 1 MB, no ``before`` tree, one throughput run with a 256 px PNG, short settling times
(seconds; the figures mean nothing). The helpers (``start``, ``burst``, ``measure``) are what
``tests/reliability/test_memory.py`` uses.
"""

from __future__ import annotations

import argparse
import collections
import functools
import io
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.machine import describe  # noqa: E402

BEFORE = "0b80ddd"
"""main before the change (issue 31, item 6)."""
MIB = 1 << 20
METHOD = "/negt2i.v1.Evaluator/Evaluate"
STREAM = "/negt2i.v1.Evaluator/EvaluateStream"
HEALTH = "/grpc.health.v1.Health/Check"
TOKEN = "bench-token"


@dataclass
class Server:
    """A started orchestrator."""

    popen: subprocess.Popen[bytes]
    target: str
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def tail(self, n: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])


def _status(pid: int) -> dict[str, int]:
    out: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) * 1024
    return out


def rss(pid: int) -> int:
    """Resident bytes of ``pid`` now."""
    return _status(pid)["VmRSS"]


def measure(pid: int, load: Callable[[], object], settle_s: float = 1.5) -> tuple[float, float, object]:
    """(peak growth MiB, growth MiB ``settle_s`` after ``load`` returned, what ``load`` returned): growth of
    ``pid``'s resident memory over its level just before, the peak from ``VmHWM`` (reset first through
    ``/proc/PID/clear_refs``, so start-up does not count)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    base = rss(pid)
    result = load()
    peak = _status(pid)["VmHWM"]
    time.sleep(settle_s)
    return (peak - base) / MIB, (rss(pid) - base) / MIB, result


@contextmanager
def start(env: Mapping[str, str], tmp: Path, tree: Path = REPO) -> Iterator[Server]:
    """``python -m orchestrator`` from ``tree`` on a free port, with ``env`` over defaults that need no stage;
    killed (its whole process group) on exit."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("NEGT2I_")}
    e.update({f"NEGT2I_{s}_URL": "http://127.0.0.1:9" for s in ("DETECTOR", "SEGMENTER", "ATTRIBUTES", "DEPTH")})
    e.update({"NEGT2I_CORPUS": str(tmp / "no-corpus.jsonl"), "PYTHONPATH": str(tree), **dict(env)})
    log = tmp / f"orchestrator-{time.monotonic_ns()}.log"
    with log.open("wb") as fh:
        popen = subprocess.Popen(
            [sys.executable, "-m", "orchestrator", "--host", "127.0.0.1", "--port", "0"],
            cwd=tree, env=e, stdout=subprocess.PIPE, stderr=fh, start_new_session=True,
        )  # fmt: skip
    try:
        assert popen.stdout is not None
        line = popen.stdout.readline().decode()
        if "listening on" not in line:
            raise RuntimeError(f"orchestrator did not start:\n{log.read_text(errors='replace')[-3000:]}")
        yield Server(popen, line.strip().rsplit(" ", 1)[1], log)
    finally:
        with suppress(ProcessLookupError):
            os.killpg(popen.pid, signal.SIGKILL)
        popen.wait()


def request_bytes(size: int, request_id: str = "big", prompt_id: str = "bench-none") -> bytes:
    """An encoded ``EvaluateRequest`` whose image is ``size`` bytes (encoded once, sent as is by ``burst``)."""
    from negt2i.wire.v1 import evaluator_pb2

    req = evaluator_pb2.EvaluateRequest(request_id=request_id, prompt_id=prompt_id)
    req.image.data = b"\x89PNG" + bytes(max(0, size - 4))
    return req.SerializeToString()


def _fan_out(target: str, connections: int, workers: int, work: Callable[[list[Any], int], None]) -> None:
    """``work(channels, i)`` for i in 0..``workers``-1, on as many threads at once, with ``connections`` channels
    to ``target`` (no message size limits, one connection each), closed afterwards."""
    import grpc

    options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1),
               ("grpc.use_local_subchannel_pool", 1)]  # fmt: skip
    channels = [grpc.insecure_channel(target, options=options) for _ in range(max(1, connections))]
    threads = [threading.Thread(target=work, args=(channels, i)) for i in range(workers)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for ch in channels:
            ch.close()


def burst(target: str, message: bytes, calls: int, *, token: str = "", connections: int = 1, at_once: int = 0,
          timeout: float = 120.0, method: str = METHOD) -> collections.Counter[str]:  # fmt: skip
    """``calls`` unary calls of ``method`` (Evaluate) with the encoded ``message``, ``at_once`` at a time (0:
    all), spread over ``connections`` connections; the count of each answer's status code."""
    import grpc

    metadata = (("authorization", f"Bearer {token}"),) if token else None
    codes: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()
    left = list(range(calls))

    def worker(channels: list[Any], _: int) -> None:
        while True:
            with lock:
                if not left:
                    return
                i = left.pop()
            call = channels[i % len(channels)].unary_unary(method)
            try:
                call(message, timeout=timeout, metadata=metadata)
                code = "OK"
            except grpc.RpcError as exc:
                code = exc.code().name
            with lock:
                codes[code] += 1

    _fan_out(target, connections, at_once or calls, worker)
    return codes


def stream_burst(target: str, message: bytes, streams: int, *, token: str = "", connections: int = 1,
                 timeout: float = 120.0, messages: int = 1) -> collections.Counter[str]:  # fmt: skip
    """``streams`` concurrent ``EvaluateStream`` calls, each sending the encoded ``message`` ``messages`` times and
    half-closing, spread over ``connections`` connections; the count of each item answer's code (``OK`` for a
    verdict) and of each stream's final status other than OK (``stream:CODE``)."""
    import grpc

    from negt2i.wire.v1 import evaluator_pb2

    metadata = (("authorization", f"Bearer {token}"),) if token else None
    codes: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()

    def worker(channels: list[Any], i: int) -> None:
        call = channels[i % len(channels)].stream_stream(STREAM)
        found: list[str] = []
        try:
            sent = (_with_id(message, f"{i}-{k}") for k in range(messages))
            for raw in call(sent, timeout=timeout, metadata=metadata):
                found.append(_code_name(evaluator_pb2.EvaluateStreamResponse.FromString(raw)))
        except grpc.RpcError as exc:
            found.append(f"stream:{exc.code().name}")
        with lock:
            codes.update(found)

    _fan_out(target, connections, streams, worker)
    return codes


def _with_id(message: bytes, request_id: str) -> bytes:
    """``message`` (an encoded ``EvaluateRequest``) with its ``request_id`` replaced (a later field wins)."""
    from negt2i.wire.v1 import evaluator_pb2

    return message + evaluator_pb2.EvaluateRequest(request_id=request_id).SerializeToString()


def _code_name(resp: Any) -> str:
    """The code of a stream answer: OK for a verdict, else its ``ItemError``'s code name."""
    from negt2i.core.failures import Code

    return Code.of(resp.error.code).name if resp.HasField("error") else "OK"


def png_4096(side: int = 4096) -> bytes:
    """A 4096 x 4096 RGB PNG of about 20 MiB (noise in its top 1,700 rows, flat below); ``side`` scales it."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    noisy = side * 1700 // 4096
    pixels = np.zeros((side, side, 3), np.uint8)
    pixels[:noisy] = rng.integers(0, 256, (noisy, side, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


def documented(calls: int, size: int, *, max_message_bytes: int = 32 * MIB, max_receiving: int = 2,
               max_stream_receiving: int = 4, window: int = 64 * 1024) -> dict[str, float]:  # fmt: skip
    """The bounds of docs/services.md ("Memory") on the growth ``calls`` concurrent calls of ``size`` bytes can
    cause, MiB (defaults: the default settings): ``unauthenticated`` (Evaluator calls without the token: one
    stream window each, plus 4 MiB), ``health`` (health checks, which need no token: one message at a time, 4 x
    its size, the 128 MiB of free heap kept before a trim and 16 MiB), ``authenticated`` (unary calls with the
    token: ``3 x max_receiving + 1`` messages of up to the transport limit, the 64 MiB of free heap kept before
    a trim, a window per waiting call and 16 MiB), ``streams`` (``calls`` streams sending one message each:
    ``max_stream_receiving`` messages in gRPC's buffers, one flat copy and one Python bytes being parsed, the
    free heap, a window per waiting stream and 16 MiB)."""
    message = min(size, 2 * max_message_bytes)
    streams = (min(calls, max_stream_receiving) + 2) * message
    return {
        "unauthenticated": (4 * MIB + calls * window) / MIB,
        "health": (4 * message + 128 * MIB + 16 * MIB) / MIB,
        "authenticated": ((3 * min(calls, max_receiving) + 1) * message + 128 * MIB + calls * window + 16 * MIB) / MIB,
        "streams": (streams + 128 * MIB + calls * window + 16 * MIB) / MIB,
    }


def _tree(rev: str, into: Path) -> Path:
    """``negt2i/`` and ``orchestrator/`` of ``rev`` under ``into``."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, "negt2i", "orchestrator"],
                             check=True, capture_output=True).stdout  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=16)
    p.add_argument("--mb", type=float, default=60.0, help="message size, MB (10^6 bytes)")
    p.add_argument("--before", default=BEFORE, help="git revision to compare with ('' : none)")
    p.add_argument("--reps", type=int, default=3, help="throughput runs per tree")
    p.add_argument("--image", type=Path, help="a PNG for the throughput case (default: a drawn 4096 px one)")
    p.add_argument("--smoke", action="store_true", help="2 calls of 1 MB, this tree only, small image: seconds")
    a = p.parse_args(argv)
    started_s, settle_s = 1.0, 1.5
    if a.smoke:
        a.calls, a.mb, a.before, a.reps = 2, 1.0, "", 1
        started_s, settle_s = 0.1, 0.1
    print(describe())
    size = int(a.mb * 1e6)
    message = request_bytes(size)
    image = a.image.read_bytes() if a.image else png_4096(256 if a.smoke else 4096)
    legit = request_bytes(0)
    from negt2i.wire.v1 import evaluator_pb2

    req = evaluator_pb2.EvaluateRequest.FromString(legit)
    req.image.data = image
    legit = req.SerializeToString()
    env = {"NEGT2I_AUTH_TOKEN": TOKEN}
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp_name:
        tmp = Path(tmp_name)
        trees = {"after": REPO}
        if a.before:
            (tmp / "before").mkdir()
            trees["before"] = _tree(a.before, tmp / "before")
        rows: dict[str, dict[str, tuple[float, float, str]]] = {name: {} for name in trees}
        for name, tree in trees.items():
            cases = (("unauthenticated", "", 1, METHOD), ("health", "", a.calls, HEALTH),
                     ("authenticated", TOKEN, a.calls, METHOD), ("streams", TOKEN, a.calls, STREAM))  # fmt: skip
            for case, token, connections, method in cases:
                with start(env, tmp, tree) as server:
                    time.sleep(started_s)
                    if method == STREAM:
                        load = functools.partial(stream_burst, server.target, message, a.calls, token=token,
                                                 connections=connections)  # fmt: skip
                    else:
                        load = functools.partial(burst, server.target, message, a.calls, token=token,
                                                 connections=connections, method=method)  # fmt: skip
                    peak, after, codes = measure(server.pid, load, settle_s)
                    rows[name][case] = (peak, after, str(dict(codes)))  # type: ignore[call-overload]
        rates: dict[str, list[float]] = {name: [] for name in trees}
        stream_rates: dict[str, list[float]] = {name: [] for name in trees}
        answers: dict[str, collections.Counter[str]] = {name: collections.Counter() for name in trees}
        for _ in range(a.reps):  # interleaved: a loaded machine slows both trees alike
            for name, tree in trees.items():
                with start(env, tmp, tree) as server:
                    burst(server.target, legit, 1, token=TOKEN)  # warm up
                    t0 = time.perf_counter()
                    answers[name] += burst(server.target, legit, 16, token=TOKEN, at_once=4)
                    rates[name].append(16 * len(image) / MIB / (time.perf_counter() - t0))
                    t0 = time.perf_counter()
                    answers[name] += stream_burst(server.target, legit, 8, token=TOKEN, messages=4)
                    stream_rates[name].append(32 * len(image) / MIB / (time.perf_counter() - t0))
    bound = documented(a.calls, size)
    print(f"{a.calls} concurrent calls of {a.mb:g} MB; orchestrator resident memory growth, MiB")
    print(f"{'case':<16} {'tree':<7} {'peak':>8} {'after':>8} {'documented':>11}  answers")
    for case in ("unauthenticated", "health", "authenticated", "streams"):
        for name in rows:
            peak, after, codes = rows[name][case]
            doc = f"{bound[case]:.0f}" if name == "after" else ""
            print(f"{case:<16} {name:<7} {peak:>8.0f} {after:>8.0f} {doc:>11}  {codes}")
    print(f"throughput: {len(image) / MIB:.1f} MiB PNG x 16, 4 at once; MiB/s, median of {a.reps} runs (all runs)")
    for label, table in (("throughput", rates), ("stream throughput", stream_rates)):
        for name in trees:
            runs = ", ".join(f"{r:.0f}" for r in table[name])
            print(f"{label:<18} {name:<7} {statistics.median(table[name]):>8.0f}   ({runs})")
    print("answers:", {name: dict(answers[name]) for name in trees})
    if "before" in rows:
        r = {
            c: rows["after"][c][0] / max(rows["before"][c][0], 1e-9)
            for c in ("unauthenticated", "health", "authenticated", "streams")
        }
        t = statistics.median(rates["after"]) / statistics.median(rates["before"])
        ts = statistics.median(stream_rates["after"]) / statistics.median(stream_rates["before"])
        print(f"ratios after/before: peak unauthenticated {r['unauthenticated']:.2f}, health {r['health']:.2f}, "
              f"authenticated {r['authenticated']:.2f}, streams {r['streams']:.2f}, throughput {t:.2f}, "
              f"stream throughput {ts:.2f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
