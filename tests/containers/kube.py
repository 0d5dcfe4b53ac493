"""``make container-test-kube``: the Kubernetes manifests themselves through ``podman kube play``.

Renders ``k8s/overlays/cpu-dev`` (the manifests a laptop cluster runs) and applies a test overlay to the
rendered objects, then plays each Deployment as a pod on a private network:

- the images: the ones ``make image-<name>`` builds (the same builds as ``make container-test``);
- synthetic backends (each stage Deployment's ``NEGT2I_<STAGE>_BACKEND``), everything else as rendered:
  the ConfigMaps (rules, URLs ``http://<stage>:3000``), the init container that waits for the weights
  (its marker is put in the weights volume first, as the weights-fetch Job would), probes, security
  contexts (read-only roots, uid 10001), volumes;
- per Deployment a distinct 127.0.0.1 host port, and the Deployment's name as its network alias (podman
  has no Services);
- every name prefixed with this run's id (pods, volumes, network), so parallel runs never collide.

Then the demo folder is submitted from the host and every line must equal ``negt2i evaluate``'s. podman
ignores Services, HPAs, PDBs, NetworkPolicies and Jobs (``../shared/containers/README.md``): this is a
smoke test of the pods, their probes and configuration, not of cluster behaviour. Everything it created is
removed by name (``KEEP_IMAGES=1`` keeps the images).
"""

from __future__ import annotations

import argparse
import copy
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import yaml

from tests.containers.stack import (
    REPO,
    STAGES,
    Docker,
    Failed,
    build,
    check,
    demo_and_embedded,
    log,
    served_stage,
    step,
    submit_and_compare,
    wait_health,
    wait_http,
)

OVERLAY = "k8s/overlays/cpu-dev"


def free_port() -> int:
    """A port the kernel hands out on 127.0.0.1 (its ephemeral range: never the fixed ranges the test suite's
    services use, ``tests.services.live.free_port``, which may run beside this)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def render() -> list[dict[str, Any]]:
    kubectl = Path(sys.executable).parent / "kubectl"
    out = subprocess.run([str(kubectl), "kustomize", str(REPO / OVERLAY)], capture_output=True, text=True,
                         check=True, timeout=120).stdout  # fmt: skip
    return [o for o in yaml.safe_load_all(out) if o]


def test_overlay(objs: list[dict[str, Any]], images: dict[str, str], prefix: str) -> dict[str, dict[str, Any]]:
    """Per Deployment name: the kube file's objects (its ConfigMaps and the Deployment) and its host ports."""
    configmaps = []
    for o in objs:
        if o["kind"] == "ConfigMap":
            cm = copy.deepcopy(o)
            cm["metadata"].pop("namespace", None)
            configmaps.append(cm)
    out: dict[str, dict[str, Any]] = {}
    for o in objs:
        if o["kind"] != "Deployment":
            continue
        d = copy.deepcopy(o)
        name = d["metadata"]["name"]
        d["metadata"].pop("namespace", None)
        d["metadata"]["name"] = f"{prefix}-{name}"
        d["spec"]["replicas"] = 1
        pod = d["spec"]["template"]["spec"]
        ports: dict[int, int] = {}
        for c in [*pod.get("initContainers", []), *pod["containers"]]:
            repo = c["image"].rsplit(":", 1)[0].rsplit("/", 1)[1]
            c["image"] = images[repo]
            c["imagePullPolicy"] = "Never"
            for e in c.get("env", []):
                if e["name"] == f"NEGT2I_{name.upper()}_BACKEND":
                    e["value"] = "synthetic"
            for port in c.get("ports", []):
                port["hostIP"] = "127.0.0.1"
                port["hostPort"] = ports.setdefault(port["containerPort"], free_port())
        for volume in pod.get("volumes", []):
            claim = volume.get("persistentVolumeClaim")
            if claim:
                claim["claimName"] = f"{prefix}-{claim['claimName']}"
        out[name] = {"objects": [*configmaps, d], "ports": ports}
    check(set(out) == {*STAGES, "orchestrator"}, f"the overlay renders Deployments {sorted(out)}")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--docker", default=os.environ.get("DOCKER", "docker"))
    p.add_argument("--registry", default="localhost/negt2i-container-test")
    p.add_argument("--tag", default="test")
    p.add_argument("--keep-images", action="store_true", default=os.environ.get("KEEP_IMAGES") == "1")
    a = p.parse_args(argv)
    if shutil.which(shlex.split(a.docker)[0]) is None:
        print(f"container-test-kube: no {a.docker!r} on PATH (podman, or its docker shim)", file=sys.stderr)
        return 2
    docker = Docker(a.docker, a.keep_images)
    prefix = f"negt2i-kt-{uuid.uuid4().hex[:6]}"
    tmp = Path(tempfile.mkdtemp(prefix="negt2i-kube-test-"))
    played: list[Path] = []
    volumes: list[str] = []
    t0 = time.monotonic()
    try:
        with step("build the images (make image-<stage>, make image-orchestrator)"):
            images = build(docker, a.registry, a.tag, {"build_s": {}, "size_bytes": {}})
        with step(f"render {OVERLAY} and apply the test overlay"):
            files = test_overlay(render(), images, prefix)
        network = f"{prefix}-net"
        docker.networks.append(network)
        docker("network", "create", network)
        with step("the weights volume, marked complete as the weights-fetch Job leaves it"):
            deployments = [o for f in files.values() for o in f["objects"] if o["kind"] == "Deployment"]
            claims = {
                v["persistentVolumeClaim"]["claimName"]
                for d in deployments
                for v in d["spec"]["template"]["spec"].get("volumes", [])
                if "persistentVolumeClaim" in v
            }
            for claim in sorted(claims):
                volumes.append(claim)
                docker("volume", "create", claim)
            weights = f"{prefix}-negt2i-weights"
            check(weights in claims, f"no weights claim among {claims}")
            marker = f"{prefix}-marker"
            docker.containers.append(marker)
            docker("run", "--name", marker, "--user", "0", "-v", f"{weights}:/weights", images["detector"], "sh", "-c",
                   "touch /weights/.negt2i-complete && chmod -R a+rX /weights")  # fmt: skip
        with step("podman kube play, one Deployment at a time (stages first), aliases for the Services"):
            for name in (*STAGES, "orchestrator"):
                path = tmp / f"{name}.yaml"
                path.write_text(yaml.safe_dump_all(files[name]["objects"]))
                played.append(path)
                play(docker, network, name, path)
            for stage in STAGES:
                url = f"http://127.0.0.1:{files[stage]['ports'][3000]}"
                pod = f"{prefix}-{stage}-pod-0"
                end = time.monotonic() + 300
                while True:
                    try:
                        wait_http(f"{url}/readyz", 5, docker, pod)
                        break
                    except Failed:
                        check(time.monotonic() < end, f"{stage} pod not ready:\n{pod_logs(docker, pod)}")
                model = served_stage(url)
                check(model["stage"] == stage and model["backend"] == "synthetic", f"{stage} pod serves {model}")
            target = f"127.0.0.1:{files['orchestrator']['ports'][50051]}"
            wait_health(target, "SERVING", 180)
        with step("submit the demo folder from the host; parity with negt2i evaluate"):
            demo, embedded = demo_and_embedded(tmp)
            n = submit_and_compare(target, demo, embedded, tmp / "submitted.jsonl", "synthetic-palette-v1")
            log(f"  {n}/{n} lines identical to negt2i evaluate")
        log(f"PASSED in {time.monotonic() - t0:.0f} s")
        return 0
    except (Failed, subprocess.TimeoutExpired, subprocess.CalledProcessError) as exc:
        log(f"FAILED: {exc}")
        return 1
    finally:
        for path in reversed(played):
            docker("kube", "down", str(path), check=False, timeout=120)
        docker.cleanup()
        for volume in volumes:
            docker("volume", "rm", "-f", volume, check=False)
        log(f"removed {len(played)} pods, {len(volumes)} volumes")
        shutil.rmtree(tmp, ignore_errors=True)


def play(docker: Docker, network: str, name: str, path: Path) -> None:
    """``podman kube play`` of one Deployment with its network alias. podman 4.3 sometimes fails to remove a
    finished init container it still sees running ("failed to remove once init container"): that pod is
    played again (``--replace``) after a pause, at most three more times."""
    for attempt in range(4):
        try:
            docker("kube", "play", *(["--replace"] if attempt else []), "--network", f"{network}:alias={name}",
                   str(path), timeout=600)  # fmt: skip
            return
        except Failed as exc:
            if "remove once init container" not in str(exc) or attempt == 3:
                raise
            log(f"  {name}: podman's init-container race, playing it again")
            time.sleep(10)


def pod_logs(docker: Docker, pod: str) -> str:
    names = docker("ps", "-a", "--filter", f"pod={pod}", "--format", "{{.Names}}", check=False).split()
    return "\n".join(f"--- {n} ---\n{docker.logs(n, 15)}" for n in names)


if __name__ == "__main__":
    sys.exit(main())
