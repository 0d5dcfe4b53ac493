"""Overload and memory: many ``negt2i submit`` runs at once against one orchestrator, and large images.

    .venv/bin/python benchmarks/bench_overload.py [--clients 16] [--prompts 24] [--samples 2]
        [--large-streams 2] [--large-images 32] [--large-size 4096] [--memory-limit 2GiB]

Part 1 (back-pressure): ``--clients`` concurrent ``negt2i submit`` processes, each of the demo folder
(``--prompts`` x ``--samples`` images), against one orchestrator over the four stage services (synthetic
backends, real processes on 127.0.0.1). Prints per run: exit code, items ok / error lines, retried sends;
in total: items ok / retried / failed (not judged), and the orchestrator's peak RSS. Every run must exit 0
with every image judged (the results must equal ``negt2i evaluate``'s).

Part 2 (bounded memory, skipped with ``--large-streams 0``): ``--large-streams`` concurrent streams of
``--large-images`` images of ``--large-size`` px, against an orchestrator whose in-flight byte budget is
the default for ``--memory-limit`` (half of what it leaves after the reserve for messages being received,
as ``orchestrator.admission.default_budget`` derives it from the cgroup limit in Kubernetes). Prints the
peak RSS against the limit.

After a ``machine:`` line (CPU model, core count, load average), part 1's figure line reads::

    N concurrent negt2i submit runs of M images each, S s (R images/s)

``--smoke``: 2 clients of 2 images, one large stream of 2 images of 256 px, the four stages served from one
light process (``tests/services/light_stages.py``, where ``bentoml serve`` takes 20-30 s to start): seconds.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.machine import describe  # noqa: E402
from tests.services.light_stages import start_light_stages  # noqa: E402
from tests.services.live import (  # noqa: E402
    Proc,
    base_env,
    start_orchestrator,
    start_stage,
    wait_health,
    wait_ready,
)

STAGES = ("detector", "segmenter", "attributes", "depth")
GIB = 1024**3


class PeakRss:
    """Samples a process's RSS every ``interval`` seconds on a thread; ``peak`` in bytes."""

    def __init__(self, pid: int, interval: float = 0.05) -> None:
        import psutil

        self.proc = psutil.Process(pid)
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, int(self.proc.memory_info().rss))
            except Exception:
                return
            self._stop.wait(self.interval)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


@dataclass
class OverloadResult:
    """What ``run_submits`` measured."""

    exits: list[int] = field(default_factory=list)
    ok: int = 0
    errors: int = 0
    retried: int = 0
    failed: int = 0
    peak_rss: int = 0
    seconds: float = 0.0
    outputs: list[Path] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)


def run_submits(target: str, images: Path, out_dir: Path, clients: int, orchestrator_pid: int,
                extra_args: tuple[str, ...] = (), timeout: float = 600) -> OverloadResult:  # fmt: skip
    """``clients`` concurrent ``negt2i submit`` processes of ``images``; counts from their results files."""
    result = OverloadResult()
    env = base_env(out_dir)
    procs = []
    start = time.monotonic()
    with PeakRss(orchestrator_pid) as rss:
        for k in range(clients):
            out = out_dir / f"submit-{k}.jsonl"
            result.outputs.append(out)
            cmd = [sys.executable, "-m", "negt2i", "submit", str(images), "--orchestrator", target, "--out", str(out),
                   "--no-progress", *extra_args]  # fmt: skip
            procs.append(subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True))  # fmt: skip
        for p in procs:
            _, err = p.communicate(timeout=timeout)
            result.exits.append(p.returncode)
            result.stderr.append(err)
            m = re.search(r"(\d+) sends were retries", err)
            result.retried += int(m.group(1)) if m else 0
            m = re.search(r"(\d+) images were not judged", err)
            result.failed += int(m.group(1)) if m else 0
    result.seconds = time.monotonic() - start
    result.peak_rss = rss.peak
    for out in result.outputs:
        for line in out.read_text().splitlines() if out.exists() else []:
            if json.loads(line)["status"] == "ok":
                result.ok += 1
            else:
                result.errors += 1
    return result


def start_stages(tmp: Path, light: bool = False) -> dict[str, Proc]:
    """The four stage services (synthetic backends), ready; ``light``: from one light process."""
    procs = start_light_stages(tmp) if light else {s: start_stage(s, tmp) for s in STAGES}
    for p in procs.values():
        wait_ready(p)
    return procs


def _png(size: int, seed: int) -> bytes:
    from negt2i.stages.synthetic import SceneObject, render_scene
    from negt2i.wire import adapter

    s = size

    def box(x0: float, y0: float, x1: float, y1: float) -> tuple[int, int, int, int]:
        return int(s * x0), int(s * y0), int(s * x1), int(s * y1)

    objs = [SceneObject("dog", box(0.1, 0.5, 0.4, 0.9), "ellipse"), SceneObject("horse", box(0.55, 0.1, 0.95, 0.6))]
    image = render_scene(objs, (s, s))
    image[seed % s, :, 0] ^= 1  # distinct bytes per image
    return adapter.encode_png(image)


def run_large(urls: Mapping[str, str], tmp: Path, streams: int, images: int, size: int, limit: int) -> dict[str, Any]:
    """``streams`` concurrent ``negt2i submit`` runs of a folder of ``images`` images of ``size`` px; the
    orchestrator's peak RSS (its in-flight budget the default for a memory limit of ``limit`` bytes)."""
    from orchestrator import guard
    from orchestrator.admission import default_budget
    from orchestrator.settings import Settings

    budget = default_budget(limit=limit, reserve=guard.reception_reserve(Settings()))
    env = {"NEGT2I_MAX_INFLIGHT_BYTES": str(budget)}
    folder = tmp / "large"
    samples = folder / "00000" / "samples"
    samples.mkdir(parents=True)
    record = {"id": "big", "category": "directional", "prompt": "a dog not left of a horse",
              "include": [{"class": "dog"}, {"class": "horse"}],
              "statements": [{"kind": "relation", "subject": 0, "target": 1, "predicate": "left of",
                              "polarity": "negated"}]}  # fmt: skip
    (folder / "00000" / "metadata.jsonl").write_text(json.dumps(record) + "\n")
    data = [_png(size, k) for k in range(min(images, 4))]
    for k in range(images):
        (samples / f"{k:04d}.png").write_bytes(data[k % len(data)])
    orch = start_orchestrator(urls, tmp, env=env)
    try:
        assert wait_health(orch.target, "SERVING", timeout=60) == "SERVING", orch.tail()
        out = tmp / "large-out"
        out.mkdir()
        r = run_submits(orch.target, folder, out, streams, orch.popen.pid, ("--item-timeout", "3600"), timeout=7200)
        encoded = sum(len(d) for d in data) // len(data)
        return {"budget": budget, "peak_rss": r.peak_rss, "seconds": r.seconds, "exits": r.exits, "ok": r.ok,
                "errors": r.errors, "retried": r.retried, "encoded": encoded}  # fmt: skip
    finally:
        orch.kill()


def _size(text: str) -> int:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMG]i?B?)?", text.strip(), re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r}")
    unit = (m.group(2) or "").upper()[:1]
    return int(float(m.group(1)) * {"": 1, "K": 1024, "M": 1024**2, "G": GIB}[unit])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--prompts", type=int, default=24)
    p.add_argument("--samples", type=int, default=2)
    p.add_argument("--large-streams", type=int, default=2)
    p.add_argument("--large-images", type=int, default=32)
    p.add_argument("--large-size", type=int, default=4096)
    p.add_argument("--memory-limit", type=_size, default=2 * GIB, help="the orchestrator's memory limit (k8s)")
    p.add_argument("--smoke", action="store_true", help="2 clients x 2 images, 1 x 2 large of 256 px: seconds")
    a = p.parse_args(argv)
    if a.smoke:
        a.clients, a.prompts, a.samples = 2, 2, 1
        a.large_streams, a.large_images, a.large_size = 1, 2, 256
    print(describe())

    from negt2i.stages.demo_data import write_demo

    tmp = Path(tempfile.mkdtemp(prefix="bench-overload-"))
    stages = start_stages(tmp, light=a.smoke)
    urls = {s: proc.url for s, proc in stages.items()}
    rc = 0
    try:
        demo = tmp / "demo"
        write_demo(demo, prompts=a.prompts, samples=a.samples, seed=7)
        n = a.prompts * a.samples
        if a.clients > 0:
            rc |= _overload(a, tmp, urls, demo, n)
        if a.large_streams > 0:
            rc |= _large(a, tmp, urls)
    finally:
        for proc in stages.values():
            proc.kill()
    return rc


def _overload(a: argparse.Namespace, tmp: Path, urls: dict[str, str], demo: Path, n: int) -> int:
    """Part 1: ``a.clients`` concurrent submits of the demo folder; 1 unless all exit 0 with every image judged."""
    orch = start_orchestrator(urls, tmp)
    try:
        assert wait_health(orch.target, "SERVING", timeout=60) == "SERVING", orch.tail()
        r = run_submits(orch.target, demo, tmp, a.clients, orch.popen.pid)
    finally:
        orch.kill()
    print(f"{a.clients} concurrent negt2i submit runs of {n} images each, {r.seconds:.1f} s "
          f"({a.clients * n / r.seconds:.1f} images/s)")  # fmt: skip
    print(f"  exit codes: {sorted(r.exits)}")
    print(f"  items ok {r.ok} (of {a.clients * n}), error lines {r.errors}, retried {r.retried}, failed {r.failed}")
    print(f"  orchestrator peak RSS {r.peak_rss / 2**20:.0f} MiB")
    if any(r.exits) or r.ok + r.errors != a.clients * n:
        for err in r.stderr:
            if err.strip():
                print(io.StringIO(err).read()[-2000:], file=sys.stderr)
        return 1
    return 0


def _large(a: argparse.Namespace, tmp: Path, urls: dict[str, str]) -> int:
    """Part 2: large images; 1 when the orchestrator's peak RSS reached the memory limit."""
    big = run_large(urls, tmp, a.large_streams, a.large_images, a.large_size, a.memory_limit)
    print(f"{a.large_streams} streams x {a.large_images} images of {a.large_size} px "
          f"({big['encoded'] / 2**20:.1f} MiB encoded each), in-flight budget {big['budget'] / 2**20:.0f} MiB "
          f"(memory limit {a.memory_limit / 2**20:.0f} MiB), {big['seconds']:.1f} s")  # fmt: skip
    print(f"  exit codes {big['exits']}, items ok {big['ok']}, error lines {big['errors']}, retried {big['retried']}")
    print(f"  orchestrator peak RSS {big['peak_rss'] / 2**20:.0f} MiB "
          f"({'under' if big['peak_rss'] < a.memory_limit else 'OVER'} the limit)")  # fmt: skip
    return int(big["peak_rss"] >= a.memory_limit or any(big["exits"]))


if __name__ == "__main__":
    sys.exit(main())
