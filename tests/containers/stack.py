"""``make container-test``: the stack in its own images, as an operator runs it.

Builds the four stage images and the orchestrator image with the project's Dockerfiles and Makefile
targets (through ``docker``: Docker, or podman's ``docker`` shim, ``../shared/containers/README.md``), then,
on a private network, with read-only root filesystems and the images' non-root user:

1. checks each image: distinct stage images (label ``io.negt2i.stage`` and ``/info``'s served stage), the four
   sharing every layer, the generate image's ``torch`` stage the same layers as the stage images', no build
   leftovers (``/tmp`` empty, no ``/build`` or ``/src``);
2. runs the four stages (synthetic backends, ``NEGT2I_BACKEND``) and the orchestrator (its published port must
   answer: the image listens on every interface), submits the demo folder from the host (``negt2i submit``)
   and requires the verdicts of ``negt2i evaluate --backend synthetic``, line for line;
3. blue/green detector swap under load: a second detector (the plug-in ``tests/containers/green_backend.py``,
   another model name) joins the ``detector`` alias, the first one is stopped; no request fails, and the
   results name the new model;
4. hard detector swap: the detector is killed (health NOT_SERVING, requests fail with a clear UNAVAILABLE),
   a new one started: SERVING again, and the results name its model;

and removes every container, network and image it created, by name (``KEEP_IMAGES=1`` keeps the images for
a faster rerun). Prints each step with its time, and the build times and image sizes at the end
(docs/deployment.md records them).

    make container-test                                   # or: .venv/bin/python -m tests.containers.stack
    DOCKER=podman make container-test                     # another client than `docker`
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
STAGES = ("detector", "segmenter", "attributes", "depth")
UID = "10001:10001"
GREEN = Path(__file__).resolve().parent / "green_backend.py"


class Failed(Exception):
    """A check of the container test failed."""


def check(condition: object, message: str) -> None:
    if not condition:
        raise Failed(message)


def log(message: str) -> None:
    print(f"[container-test {time.strftime('%H:%M:%S')}] {message}", flush=True)


class Docker:
    """The ``docker`` client, and everything this run created (removed by name in ``cleanup``)."""

    def __init__(self, client: str, keep_images: bool) -> None:
        self.client = shlex.split(client)
        self.keep_images = keep_images
        self.containers: list[str] = []
        self.networks: list[str] = []
        self.images: list[str] = []

    def __call__(self, *args: str, timeout: float = 120, check: bool = True, quiet: bool = False) -> str:
        cmd = [*self.client, *args]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        if check and result.returncode != 0:
            raise Failed(f"{shlex.join(cmd)} exited with {result.returncode}:\n{result.stderr[-3000:]}")
        return result.stdout.strip()

    def run(self, name: str, image: str, *args: str, network: str, alias: str = "") -> str:
        """``docker run -d`` with the operator's hardening: read-only root, the non-root user, no capabilities,
        /tmp as the only writable path (an emptyDir in Kubernetes), ports on 127.0.0.1 only."""
        self.containers.append(name)
        aliases = ["--network-alias", alias] if alias else []
        return self("run", "-d", "--name", name, "--network", network, *aliases, "--read-only",
                    "--tmpfs", "/tmp:rw,size=1g,mode=1777", "--user", UID, "--cap-drop", "ALL",
                    "--security-opt", "no-new-privileges", *args, image)  # fmt: skip

    def port(self, name: str, port: int) -> int:
        out = self("port", name, f"{port}/tcp")
        return int(out.splitlines()[0].rsplit(":", 1)[1])

    def logs(self, name: str, lines: int = 40) -> str:
        return self("logs", "--tail", str(lines), name, check=False)

    def cleanup(self) -> None:
        for name in reversed(self.containers):
            self("rm", "-f", "-t", "2", name, check=False, timeout=60)
        for net in self.networks:
            self("network", "rm", "-f", net, check=False, timeout=60)
        if not self.keep_images:
            for image in self.images:
                self("rmi", image, check=False, timeout=120)
        log(f"removed {len(self.containers)} containers, {len(self.networks)} networks"
            + ("" if self.keep_images else f", {len(self.images)} images"))  # fmt: skip


@contextmanager
def step(name: str) -> Iterator[None]:
    t0 = time.monotonic()
    log(f"{name} ...")
    yield
    log(f"{name}: ok ({time.monotonic() - t0:.1f} s)")


def build(docker: Docker, registry: str, tag: str, figures: dict[str, Any]) -> dict[str, str]:
    """``make image-<name>`` for the four stages and the orchestrator; returns the image names."""
    images = {name: f"{registry}/{name}:{tag}" for name in (*STAGES, "orchestrator")}
    env = {**os.environ, "REGISTRY": registry, "TAG": tag}
    for name, image in images.items():
        t0 = time.monotonic()
        docker.images.append(image)
        result = subprocess.run(["make", "--no-print-directory", f"image-{name}", f"REGISTRY={registry}",
                                 f"TAG={tag}"], cwd=REPO, env=env, capture_output=True, text=True,
                                timeout=3600, check=False)  # fmt: skip
        if result.returncode != 0:
            raise Failed(f"make image-{name} failed:\n{(result.stdout + result.stderr)[-4000:]}")
        size = int(docker("image", "inspect", "--format", "{{.Size}}", image))
        figures["build_s"][name] = round(time.monotonic() - t0, 1)
        figures["size_bytes"][name] = size
        log(f"  built {image} in {time.monotonic() - t0:.0f} s, {size / 1e9:.2f} GB")
    return images


def inspect(docker: Docker, image: str, fmt: str) -> Any:
    return json.loads(docker("image", "inspect", "--format", f"{{{{json {fmt}}}}}", image))


def check_images(docker: Docker, images: dict[str, str], registry: str, tag: str) -> None:
    """Distinct stage images with one stage label each, sharing every layer; no build leftovers; the
    generate image's torch stage is the stage images' (built from docker/generate.Dockerfile --target torch,
    it must come entirely from the cache: the same layers)."""
    ids = {}
    layers = {}
    for stage in STAGES:
        labels = inspect(docker, images[stage], ".Config.Labels") or {}
        check(labels.get("io.negt2i.stage") == stage, f"{images[stage]}: label io.negt2i.stage is "
              f"{labels.get('io.negt2i.stage')!r}, not {stage!r}")  # fmt: skip
        check(labels.get("org.opencontainers.image.title") == f"negt2i-{stage}", f"{images[stage]}: title {labels}")
        env = inspect(docker, images[stage], ".Config.Env") or []
        check(f"NEGT2I_STAGE={stage}" in env, f"{images[stage]}: NEGT2I_STAGE is not {stage}: {env}")
        ids[stage] = docker("image", "inspect", "--format", "{{.Id}}", images[stage])
        layers[stage] = inspect(docker, images[stage], ".RootFS.Layers")
    check(len(set(ids.values())) == 4, f"the four stage images are not distinct: {ids}")
    check(all(layers[s] == layers["detector"] for s in STAGES), "the stage images do not share every layer")
    for name, image in images.items():
        out = docker("run", "--rm", "--read-only", "--user", UID, "--entrypoint", "sh", image, "-c",
                     "ls -A /tmp; ls -d /build /src 2>/dev/null; true")  # fmt: skip
        check(out == "", f"{image}: build leftovers: {out!r}")
    for dockerfile, name in (("services/Dockerfile", "torch-stage"), ("docker/generate.Dockerfile", "torch-generate")):
        image = f"{registry}/{name}:{tag}"
        docker.images.append(image)
        docker("build", "-q", "-f", dockerfile, "--target", "torch", "-t", image, str(REPO), timeout=3600)
    torch_stage = inspect(docker, f"{registry}/torch-stage:{tag}", ".RootFS.Layers")
    torch_generate = inspect(docker, f"{registry}/torch-generate:{tag}", ".RootFS.Layers")
    check(torch_stage == torch_generate, "the generate image's torch stage has other layers than the stage images'")
    check(layers["detector"][: len(torch_stage)] == torch_stage, "the stage images are not built on the torch stage")
    log(f"  4 distinct stage images over {len(layers['detector'])} shared layers; torch stage "
        f"({len(torch_stage)} layers) shared with the generate image; no build leftovers")  # fmt: skip


def wait_http(url: str, timeout: float, docker: Docker, name: str) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if httpx.get(url, timeout=2, trust_env=False).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        state = docker("inspect", "--format", "{{.State.Status}}", name, check=False)
        check(state in ("running", "created", ""), f"{name} is {state}:\n{docker.logs(name)}")
        time.sleep(0.5)
    raise Failed(f"{url} not 200 after {timeout:.0f} s:\n{docker.logs(name)}")


def start_stage(docker: Docker, prefix: str, network: str, image: str, stage: str, *, name: str = "",
                alias: str = "", env: Sequence[str] = (), mounts: Sequence[str] = ()) -> tuple[str, str]:  # fmt: skip
    """A stage container (synthetic backend through NEGT2I_BACKEND); returns (name, host URL)."""
    name = name or f"{prefix}-{stage}"
    args = ["-p", "127.0.0.1::3000", "-e", "NEGT2I_BACKEND=synthetic", "-e", "NEGT2I_GPUS=0",
            "-e", "NEGT2I_DEVICE=cpu", "-e", "OMP_NUM_THREADS=1"]  # fmt: skip
    for e in env:
        args += ["-e", e]
    for m in mounts:
        args += ["-v", m]
    docker.run(name, image, *args, network=network, alias=alias or stage)
    return name, f"http://127.0.0.1:{docker.port(name, 3000)}"


def served_stage(url: str) -> dict[str, Any]:
    info = httpx.get(f"{url}/info", timeout=5, trust_env=False).json()
    return dict(info["model"])


def negt2i(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEGT2I_")}
    return subprocess.run([str(BIN / "negt2i"), *args], cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          check=False, env=env)  # fmt: skip


def rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def demo_and_embedded(tmp: Path) -> tuple[Path, Path]:
    """The demo folder (``tmp/demo``) and its in-process verdicts (``tmp/embedded.jsonl``, synthetic backends):
    what every container run compares its submitted lines with."""
    demo, embedded = tmp / "demo", tmp / "embedded.jsonl"
    made = subprocess.run([sys.executable, "-m", "negt2i.stages.demo_data", str(demo)], cwd=REPO,
                          capture_output=True, text=True, check=False)  # fmt: skip
    check(made.returncode == 0, made.stderr)
    result = negt2i("evaluate", str(demo), "--backend", "synthetic", "--out", str(embedded), "--no-progress")
    check(result.returncode == 0, result.stderr)
    return demo, embedded


def submit_and_compare(target: str, demo: Path, embedded: Path, out: Path, detector_model: str) -> int:
    """``negt2i submit`` of the demo folder; every line the embedded run's verdict, each naming
    ``detector_model`` as its detector and the in-network stage URLs as its services."""
    result = negt2i("submit", str(demo), "--orchestrator", target, "--out", str(out), "--no-progress")
    check(result.returncode == 0, f"negt2i submit failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return compare_lines(rows(out), rows(embedded), detector_model)


def compare_lines(got: list[dict[str, Any]], want: list[dict[str, Any]], detector_model: str) -> int:
    """Every submitted line (in the embedded run's order) equals the embedded run's, apart from the
    stage identities: the detector must be ``detector_model``, the services the in-network stage URLs."""
    check(len(got) == len(want) > 0, f"{len(got)} submitted lines, {len(want)} embedded")
    for g, w in zip(got, want, strict=True):
        services = g.pop("services", {})
        models = g.pop("models", {})
        w.pop("models", None)
        check(g == w, f"verdict differs for {g.get('filename')}:\nsubmit:   {g}\nevaluate: {w}")
        if g["status"] == "ok":
            check(models.get("detector", {}).get("model") == detector_model,
                  f"{g['filename']}: detector {models.get('detector')} instead of {detector_model}")  # fmt: skip
            check(all(services.get(s) == f"http://{s}:3000" for s in STAGES if s in services), services)
    return len(got)


class Load:
    """Unary Evaluate calls from the host, one after another, while a swap happens (bounded: ``limit_s``)."""

    def __init__(self, target: str, image: bytes, prompt: Any, limit_s: float = 120.0) -> None:
        self.target, self.image, self.prompt, self.limit_s = target, image, prompt, limit_s
        self.ok = 0
        self.errors: list[str] = []
        self.models: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        from negt2i.client import ClientError, EvaluatorClient

        end = time.monotonic() + self.limit_s
        # one send per call (no client retries): every failure the stack lets through is counted
        with EvaluatorClient(self.target, timeout=30, attempts=1) as client:
            while not self._stop.is_set() and time.monotonic() < end:
                try:
                    result = client.evaluate(self.image, prompt=self.prompt)
                    self.ok += 1
                    self.models += [s.model.model for s in result.stages if s.model.stage == "detector"]
                except ClientError as exc:
                    self.errors.append(f"{exc.code}: {exc.details[:200]}")
                time.sleep(0.05)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(60)


def wait_health(target: str, want: str, timeout: float) -> float:
    """Seconds until the orchestrator's overall health is ``want``."""
    from negt2i.client import EvaluatorClient

    t0 = time.monotonic()
    with EvaluatorClient(target) as client:
        while time.monotonic() - t0 < timeout:
            try:
                if client.health(timeout=2) == want:
                    return time.monotonic() - t0
            except Exception:
                pass
            time.sleep(0.1)
    raise Failed(f"the orchestrator at {target} did not turn {want} within {timeout:.0f} s")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--docker", default=os.environ.get("DOCKER", "docker"), help="the docker client (default: docker)")
    p.add_argument("--registry", default="localhost/negt2i-container-test")
    p.add_argument("--tag", default="test")
    p.add_argument("--keep-images", action="store_true", default=os.environ.get("KEEP_IMAGES") == "1")
    p.add_argument("--figures", type=Path, help="write the build times and image sizes (JSON) here")
    a = p.parse_args(argv)

    if shutil.which(shlex.split(a.docker)[0]) is None:
        print(f"container-test: no {a.docker!r} on PATH: install Docker (or podman and its docker shim: "
              "docs/deployment.md)", file=sys.stderr)  # fmt: skip
        return 2
    docker = Docker(a.docker, a.keep_images)
    prefix = f"negt2i-ct-{uuid.uuid4().hex[:6]}"
    figures: dict[str, Any] = {"build_s": {}, "size_bytes": {}}
    t_start = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="negt2i-container-test-"))
    try:
        with step("build the images (make image-<stage>, make image-orchestrator)"):
            images = build(docker, a.registry, a.tag, figures)
        with step("check the images"):
            check_images(docker, images, a.registry, a.tag)

        network = f"{prefix}-net"
        docker.networks.append(network)
        docker("network", "create", network)
        with step("start the four stages and the orchestrator (read-only roots, uid 10001)"):
            urls = {}
            for stage in STAGES:
                _, urls[stage] = start_stage(docker, prefix, network, images[stage], stage)
            orch = f"{prefix}-orchestrator"
            stage_env = [x for s in STAGES for x in ("-e", f"NEGT2I_{s.upper()}_URL=http://{s}:3000")]
            docker.run(orch, images["orchestrator"], "-p", "127.0.0.1::50051", "-e", "NEGT2I_HEALTH_INTERVAL_S=0.5",
                       *stage_env, network=network)  # fmt: skip
            target = f"127.0.0.1:{docker.port(orch, 50051)}"
            for stage in STAGES:
                wait_http(f"{urls[stage]}/readyz", 300, docker, f"{prefix}-{stage}")
                model = served_stage(urls[stage])
                check(model["stage"] == stage and model["backend"] == "synthetic",
                      f"{images[stage]} serves {model} (NEGT2I_BACKEND=synthetic, stage {stage})")  # fmt: skip
            wait_health(target, "SERVING", 120)
            figures["stack_up_s"] = round(time.monotonic() - t_start - sum(figures["build_s"].values()), 1)

        with step("submit the demo folder from the host; parity with negt2i evaluate"):
            demo, embedded = demo_and_embedded(tmp)
            n = submit_and_compare(target, demo, embedded, tmp / "submitted.jsonl", "synthetic-palette-v1")
            log(f"  {n}/{n} lines identical to negt2i evaluate")

        from negt2i.core.spec import parse_prompt

        first = json.loads((demo / "00000" / "metadata.jsonl").read_text().splitlines()[0])
        image = sorted((demo / "00000" / "samples").iterdir())[0].read_bytes()
        prompt = parse_prompt(first)

        with step("blue/green detector swap under load"):
            green_name, green_url = start_stage(
                docker, prefix, network, images["detector"], "detector", name=f"{prefix}-detector-green",
                alias="detector-green", env=["NEGT2I_DETECTOR_BACKEND=synthetic-green", "PYTHONPATH=/plugins",
                                             "NEGT2I_BACKEND_MODULES=green_backend"],
                mounts=[f"{GREEN}:/plugins/green_backend.py:ro"],
            )  # fmt: skip
            wait_http(f"{green_url}/readyz", 300, docker, green_name)
            check(served_stage(green_url)["model"] == "synthetic-palette-green", "the green detector's /info")
            with Load(target, image, prompt) as load:
                time.sleep(2)
                # green joins the `detector` name, then blue leaves it (stopped gracefully)
                docker("network", "disconnect", network, green_name)
                docker("network", "connect", "--alias", "detector", network, green_name)
                time.sleep(2)
                docker("stop", "-t", "30", f"{prefix}-detector", timeout=90)
                time.sleep(4)
            check(not load.errors, f"{len(load.errors)} requests failed during the blue/green swap: {load.errors[:5]}")
            check(load.ok > 0 and load.models[-1] == "synthetic-palette-green", f"after the swap: {load.models[-3:]}")
            n = submit_and_compare(target, demo, embedded, tmp / "green.jsonl", "synthetic-palette-green")
            figures["blue_green"] = {"requests": load.ok, "errors": len(load.errors)}
            log(f"  {load.ok} requests during the swap, 0 errors; {n}/{n} verdicts again, naming the new model")

        with step("hard detector swap"):
            with Load(target, image, prompt) as load:
                time.sleep(1)
                t_kill = time.monotonic()
                docker("rm", "-f", "-t", "0", green_name, timeout=60)
                down = wait_health(target, "NOT_SERVING", 30)
                time.sleep(1)
                failed_while_down = len(load.errors)
                name, url = start_stage(docker, prefix, network, images["detector"], "detector",
                                        name=f"{prefix}-detector-2")  # fmt: skip
                t_new = time.monotonic()
                wait_http(f"{url}/readyz", 300, docker, name)
                wait_health(target, "SERVING", 120)
                up = time.monotonic() - t_new
                time.sleep(1)
            check(failed_while_down > 0, "no request failed while the detector was gone")
            unclear = [e for e in load.errors if not e.startswith("UNAVAILABLE") or "detector" not in e]
            check(not unclear, f"unclear errors while the detector was gone: {unclear[:5]}")
            check(load.models[-1] == "synthetic-palette-v1", f"after the hard swap: {load.models[-3:]}")
            n = submit_and_compare(target, demo, embedded, tmp / "hard.jsonl", "synthetic-palette-v1")
            figures["hard_swap"] = {
                "not_serving_after_s": round(down, 1),
                "errors": len(load.errors),
                "serving_after_new_container_s": round(up, 1),
                "requests_ok": load.ok,
                "kill_to_serving_s": round(t_new + up - t_kill, 1),
            }
            log(f"  NOT_SERVING {down:.1f} s after the kill, {len(load.errors)} clear UNAVAILABLE, SERVING again "
                f"{up:.1f} s after the new container started; {n}/{n} verdicts, naming the new model")  # fmt: skip
        figures["total_s"] = round(time.monotonic() - t_start, 1)
        log(f"PASSED in {figures['total_s']:.0f} s: " + json.dumps(figures))
        if a.figures:
            a.figures.write_text(json.dumps(figures, indent=2) + "\n")
        return 0
    except (Failed, subprocess.TimeoutExpired) as exc:
        log(f"FAILED: {exc}")
        for name in docker.containers:
            tail = docker.logs(name, 15)
            if tail:
                print(f"--- {name} (last lines) ---\n{tail}", file=sys.stderr)
        return 1
    finally:
        docker.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
