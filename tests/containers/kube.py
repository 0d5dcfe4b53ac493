"""``make container-test-kube``: the Kubernetes manifests themselves through ``podman kube play``.

Renders ``k8s/overlays/cpu-dev`` (the manifests a laptop cluster runs) and ``k8s/jobs/sweep`` (the scoring
sweep and its report), applies a test overlay to the rendered objects, and plays them as pods on a private
network:

- the images: the ones ``make image-<name>`` builds (the same builds as ``make container-test``), never pulled;
- synthetic backends (each stage Deployment's ``NEGT2I_<STAGE>_BACKEND``), everything else as rendered:
  the ConfigMaps (rules, URLs ``http://<stage>:3000``, the sweep's settings), the init containers, probes,
  security contexts (read-only roots, uid 10001), volumes;
- per Deployment a distinct 127.0.0.1 host port, and the Deployment's name as its network alias (podman
  has no Services: the sweep reaches ``dns:///orchestrator:50051`` through the alias);
- the persistent volume claims as podman volumes, prepared as the platform leaves them: the weights volume
  marked complete (as the weights-fetch Job leaves it, so the real wait-for-weights init containers pass),
  the demo folder on the images volume (the user's upload), the results volume group-owned by the pods'
  ``fsGroup`` (what the kubelet does; podman ignores ``fsGroup``);
- the Jobs as pods (podman ignores ``kind: Job``): the Indexed sweep Job as one pod per completion index
  with ``JOB_COMPLETION_INDEX`` set (what the Job controller injects), the report Job as one pod, each the
  Job's pod template unchanged but for the images and claim names; played together, as
  ``kubectl apply -k k8s/jobs/sweep`` creates them, so the report pod waits in its init container until
  every shard is in;
- every name prefixed with this run's id (pods, volumes, network), so parallel runs never collide.

Checks: the demo folder submitted from the host gives ``negt2i evaluate``'s lines; each sweep pod exits 0
having written its shard (the images ``i % N == I``), every line again ``negt2i evaluate``'s; the report pod
merges the shards into ``results.jsonl`` and writes a report from exactly that file, equal to the report of
``negt2i evaluate``'s results. podman ignores Services, HPAs, PDBs and NetworkPolicies
(``../shared/containers/README.md``): this is a test of the pods, their probes and configuration, not of
cluster behaviour. Everything it created is removed by name (``KEEP_IMAGES=1`` keeps the images).

podman before 4.4 gives a pod's init containers the pod's restart policy (podman commit 10e020c6, issue
16343): under a Deployment's ``Always`` the init container is restarted the moment it exits, and ``kube play``
then fails to remove it ("failed to remove once init container ... as it is running"), every time. There the
Deployments' pods are played with ``OnFailure``, which gives their init containers Kubernetes' semantics
(restarted only when they fail) and their serving containers a restart when they crash.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
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
    compare_lines,
    demo_and_embedded,
    log,
    negt2i,
    rows,
    served_stage,
    step,
    submit_and_compare,
    wait_health,
    wait_http,
)

OVERLAY = "k8s/overlays/cpu-dev"
JOBS = "k8s/jobs/sweep"
INIT_RESTART_FIXED = (4, 4)
"""The podman release whose ``kube play`` stops giving init containers the pod's restart policy."""
DETECTOR_MODEL = "synthetic-palette-v1"


def free_port() -> int:
    """A port the kernel hands out on 127.0.0.1 (its ephemeral range: never the fixed ranges the test suite's
    services use, ``tests.services.live.free_port``, which may run beside this)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def render(path: str) -> list[dict[str, Any]]:
    kubectl = Path(sys.executable).parent / "kubectl"
    out = subprocess.run([str(kubectl), "kustomize", str(REPO / path)], capture_output=True, text=True,
                         check=True, timeout=120).stdout  # fmt: skip
    return [o for o in yaml.safe_load_all(out) if o]


def podman_version(docker: Docker) -> tuple[int, ...]:
    out = docker("version", "--format", "{{.Client.Version}}")
    return tuple(int(n) for n in re.findall(r"\d+", out)[:3])


def configmaps(objs: list[dict[str, Any]], prefix: str) -> list[dict[str, Any]]:
    """The ConfigMaps, named with this run's prefix: podman keeps a ConfigMap mounted as a volume in a podman
    volume named after it, and reuses one that exists (stale keys included)."""
    out = []
    for o in objs:
        if o["kind"] == "ConfigMap":
            cm = copy.deepcopy(o)
            cm["metadata"].pop("namespace", None)
            cm["metadata"]["name"] = f"{prefix}-{cm['metadata']['name']}"
            out.append(cm)
    return out


def retarget(pod: dict[str, Any], images: dict[str, str], prefix: str) -> None:
    """A pod spec's containers run the built images (never pulled); its claims and ConfigMaps are this run's."""
    for c in [*pod.get("initContainers", []), *pod["containers"]]:
        repo = c["image"].rsplit(":", 1)[0].rsplit("/", 1)[1]
        c["image"] = images[repo]
        c["imagePullPolicy"] = "Never"
        refs = [e["configMapRef"] for e in c.get("envFrom", []) if "configMapRef" in e]
        refs += [
            e["valueFrom"]["configMapKeyRef"] for e in c.get("env", []) if "configMapKeyRef" in e.get("valueFrom", {})
        ]
        for ref in refs:
            ref["name"] = f"{prefix}-{ref['name']}"
    for volume in pod.get("volumes", []):
        claim = volume.get("persistentVolumeClaim")
        if claim:
            claim["claimName"] = f"{prefix}-{claim['claimName']}"
        if "configMap" in volume:
            volume["configMap"]["name"] = f"{prefix}-{volume['configMap']['name']}"
        for source in volume.get("projected", {}).get("sources", []):
            if "configMap" in source:
                source["configMap"]["name"] = f"{prefix}-{source['configMap']['name']}"


def overlay_deployments(objs: list[dict[str, Any]], images: dict[str, str], prefix: str, *,
                        init_restart_bug: bool) -> dict[str, dict[str, Any]]:  # fmt: skip
    """Per Deployment name: the kube file's objects (its ConfigMaps and the Deployment) and its host ports.
    ``init_restart_bug``: podman older than 4.4 (see the module's docstring): the pods restart ``OnFailure``."""
    maps = configmaps(objs, prefix)
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
        if init_restart_bug:
            pod["restartPolicy"] = "OnFailure"
        retarget(pod, images, prefix)
        ports: dict[int, int] = {}
        for c in [*pod.get("initContainers", []), *pod["containers"]]:
            for e in c.get("env", []):
                if e["name"] == f"NEGT2I_{name.upper()}_BACKEND":
                    e["value"] = "synthetic"
            for port in c.get("ports", []):
                port["hostIP"] = "127.0.0.1"
                port["hostPort"] = ports.setdefault(port["containerPort"], free_port())
        out[name] = {"objects": [*maps, d], "ports": ports}
    check(set(out) == {*STAGES, "orchestrator"}, f"the overlay renders Deployments {sorted(out)}")
    return out


def job_as_pod(job: dict[str, Any], name: str, images: dict[str, str], prefix: str,
               env: dict[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    """The Pod a Job's controller would create from its template: the same spec (restart policy, security
    context, init containers, volumes), the built images and this run's claims, ``env`` added to every
    container."""
    template = job["spec"]["template"]
    spec = copy.deepcopy(template["spec"])
    retarget(spec, images, prefix)
    for c in spec["containers"]:
        c.setdefault("env", []).extend({"name": k, "value": v} for k, v in (env or {}).items())
    labels = {**template.get("metadata", {}).get("labels", {}), "job-name": job["metadata"]["name"]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels}, "spec": spec}


def overlay_jobs(objs: list[dict[str, Any]], images: dict[str, str], prefix: str) -> dict[str, Any]:
    """The sweep Job as one pod per completion index and the report Job as one pod, each in a kube file with
    the sweep's ConfigMap: ``{"shards": N, "sweep": [[objects], ...], "report": [objects]}``."""
    maps = configmaps(objs, prefix)
    jobs = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Job"}
    check(set(jobs) == {"negt2i-sweep", "negt2i-report"}, f"{JOBS} renders Jobs {sorted(jobs)}")
    sweep = jobs["negt2i-sweep"]
    (ref,) = {e["configMapRef"]["name"] for c in sweep["spec"]["template"]["spec"]["containers"]
              for e in c.get("envFrom", []) if "configMapRef" in e}  # fmt: skip
    (settings,) = [m for m in maps if m["metadata"]["name"] == f"{prefix}-{ref}"]
    shards = int(settings["data"]["SWEEP_SHARDS"])
    spec = sweep["spec"]
    check(spec.get("completionMode") == "Indexed" and spec["completions"] == shards == spec["parallelism"],
          f"the sweep Job does not run SWEEP_SHARDS={shards} indexed pods")  # fmt: skip
    pods = [
        [*maps, job_as_pod(sweep, f"{prefix}-negt2i-sweep-{i}", images, prefix, {"JOB_COMPLETION_INDEX": str(i)})]
        for i in range(shards)
    ]
    report = [*maps, job_as_pod(jobs["negt2i-report"], f"{prefix}-negt2i-report", images, prefix)]
    return {"shards": shards, "settings": settings["data"], "sweep": pods, "report": report}


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
    played: list[tuple[Path, str]] = []  # kube files played, with their pods' names
    volumes: list[str] = []
    figures: dict[str, Any] = {"build_s": {}, "size_bytes": {}}
    pool = ThreadPoolExecutor(1)
    t0 = time.monotonic()
    try:
        with step("build the images (make image-<stage>, make image-orchestrator)"):
            images = build(docker, a.registry, a.tag, figures)
        t_run = time.monotonic()
        with step(f"render {OVERLAY} and {JOBS}, apply the test overlay"):
            version = podman_version(docker)
            init_restart_bug = version < INIT_RESTART_FIXED
            if init_restart_bug:
                log(f"  podman {'.'.join(map(str, version))} restarts init containers with their pod: the "
                    "Deployments' pods restart OnFailure")  # fmt: skip
            files = overlay_deployments(render(OVERLAY), images, prefix, init_restart_bug=init_restart_bug)
            jobs = overlay_jobs(render(JOBS), images, prefix)
            demo, embedded = demo_and_embedded(tmp)
        network = f"{prefix}-net"
        docker.networks.append(network)
        docker("network", "create", network)
        with step("the volumes, as the platform leaves them (weights fetched, images uploaded, fsGroup)"):
            pods = [o for f in files.values() for o in f["objects"] if o["kind"] == "Deployment"]
            pods = [d["spec"]["template"] for d in pods] + [f[-1] for f in [*jobs["sweep"], jobs["report"]]]
            claims = {v["persistentVolumeClaim"]["claimName"] for pod in pods
                      for v in pod["spec"].get("volumes", []) if "persistentVolumeClaim" in v}  # fmt: skip
            weights, data, results = (f"{prefix}-negt2i-{n}" for n in ("weights", "images", "results"))
            check(claims == {weights, data, results}, f"claims {sorted(claims)}")
            for claim in sorted(claims):
                volumes.append(claim)
                docker("volume", "create", claim)
            # the volumes kube play makes for the ConfigMaps mounted as volumes: removed by name too
            volumes += sorted({v["configMap"]["name"] for pod in pods for v in pod["spec"].get("volumes", [])
                               if "configMap" in v})  # fmt: skip
            prepare = f"{prefix}-prepare"
            docker.containers.append(prepare)
            docker("run", "--name", prepare, "--user", "0", "-v", f"{weights}:/weights", "-v", f"{data}:/images",
                   "-v", f"{results}:/results", "-v", f"{demo}:/demo:ro", images["orchestrator"], "sh", "-c",
                   "touch /weights/.negt2i-complete && chmod -R a+rX /weights"
                   " && cp -R /demo/. /images/ && chmod -R a+rX /images"
                   " && chgrp 10001 /results && chmod 2775 /results", timeout=300)  # fmt: skip
        with step("podman kube play, one Deployment at a time (stages first), aliases for the Services"):
            for name in (*STAGES, "orchestrator"):
                played.append((write(tmp / f"{name}.yaml", files[name]["objects"]), f"{prefix}-{name}-pod-0"))
                play(docker, played[-1][0], network, alias=name)
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
            figures["stack_up_s"] = round(time.monotonic() - t_run, 1)
        with step("submit the demo folder from the host; parity with negt2i evaluate"):
            n = submit_and_compare(target, demo, embedded, tmp / "submitted.jsonl", DETECTOR_MODEL)
            log(f"  {n}/{n} lines identical to negt2i evaluate")
        shards = jobs["shards"]
        with step(f"the Jobs as pods: the report pod, then the sweep's {shards} indexed pods"):
            t_jobs = time.monotonic()
            played.append((write(tmp / "report.yaml", jobs["report"]), f"{prefix}-negt2i-report"))
            report_play: Future[None] = pool.submit(play, docker, played[-1][0], network)
            time.sleep(2)  # the report pod first, as the manifests' order: it waits for the shards
            for i, objects in enumerate(jobs["sweep"]):
                played.append((write(tmp / f"sweep-{i}.yaml", objects), f"{prefix}-negt2i-sweep-{i}"))
                play(docker, played[-1][0], network)
            # the last sweep pod has only just started: its shard cannot be in, so the report pod must still
            # be in its init container (kube play returns once that has passed)
            if report_play.done():
                report_play.result()  # its error, if it failed
                raise Failed("the report pod started before the sweep's shards were in")
            for i in range(shards):
                wait_exit(docker, f"{prefix}-negt2i-sweep-{i}-submit", 900)
            figures["sweep_s"] = round(time.monotonic() - t_jobs, 1)
            report_play.result(timeout=600)  # kube play returns once the init container saw every shard
            figures["report_waited_s"] = round(time.monotonic() - t_jobs, 1)
            wait_exit(docker, f"{prefix}-negt2i-report-report", 600)
            figures["sweep_and_report_s"] = round(time.monotonic() - t_jobs, 1)
        with step("the sweep's shards and the report pod's report, from the results volume"):
            out = fetch_volume(docker, results, tmp / "results")
            check_sweep(out / jobs["settings"]["SWEEP_RESULTS"].removeprefix("/results/"), rows(embedded), shards, tmp)
        figures["run_s"] = round(time.monotonic() - t_run, 1)
        figures["total_s"] = round(time.monotonic() - t0, 1)
        log(f"PASSED in {figures['total_s']:.0f} s: " + json.dumps(figures))
        return 0
    except (Failed, subprocess.TimeoutExpired, subprocess.CalledProcessError, TimeoutError) as exc:
        log(f"FAILED: {exc}")
        for _, pod in played:
            print(pod_logs(docker, pod), file=sys.stderr)
        return 1
    finally:
        for path, _ in reversed(played):
            docker("kube", "down", str(path), check=False, timeout=120)
        pool.shutdown(wait=True, cancel_futures=True)
        docker.cleanup()
        for volume in volumes:
            docker("volume", "rm", "-f", volume, check=False)
        log(f"removed {len(played)} pods, {len(volumes)} volumes")
        shutil.rmtree(tmp, ignore_errors=True)


def write(path: Path, objects: list[dict[str, Any]]) -> Path:
    path.write_text(yaml.safe_dump_all(objects))
    return path


def play(docker: Docker, path: Path, network: str, alias: str = "") -> None:
    """``podman kube play`` of one kube file on the network (with ``alias``: a Service's name). It returns once
    the pod's init containers have run and its containers started."""
    net = f"{network}:alias={alias}" if alias else network
    docker("kube", "play", "--network", net, str(path), timeout=600)


def wait_exit(docker: Docker, name: str, timeout: float) -> None:
    """Until the container ``name`` (a Job pod's) has exited; it must exit 0."""
    end = time.monotonic() + timeout
    while True:
        status, code = docker("inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", name).split()
        if status in ("exited", "stopped"):
            check(code == "0", f"{name} exited with {code}:\n{docker.logs(name)}")
            return
        check(time.monotonic() < end, f"{name} still {status} after {timeout:.0f} s:\n{docker.logs(name)}")
        time.sleep(1)


def fetch_volume(docker: Docker, volume: str, dest: Path) -> Path:
    """The volume's files, copied to ``dest`` (``podman volume export``)."""
    tar = dest.with_suffix(".tar")
    docker("volume", "export", volume, "--output", str(tar), timeout=300)
    dest.mkdir()
    with tarfile.open(tar) as t:
        t.extractall(dest, filter="data")
    return dest


def check_sweep(run: Path, want: list[dict[str, Any]], shards: int, tmp: Path) -> None:
    """Shard I holds the lines of images ``i % shards == I``, each ``negt2i evaluate``'s, and its ``.done``
    marker; ``results.jsonl`` is the shards in index order; the report was made from exactly that file and
    equals the report of ``negt2i evaluate``'s results (apart from the input files' names and digests)."""
    merged = b""
    for i in range(shards):
        shard = run / f"shard-{i}-of-{shards}.jsonl"
        done = run / f"shard-{i}-of-{shards}.done"
        check(shard.is_file() and done.is_file(), f"shard {i}: {sorted(p.name for p in run.iterdir())}")
        got, expected = rows(shard), copy.deepcopy(want[i::shards])
        check([g["filename"] for g in got] == [w["filename"] for w in expected],
              f"shard {i} holds {[g['filename'] for g in got]}")  # fmt: skip
        compare_lines(got, expected, DETECTOR_MODEL)
        merged += shard.read_bytes()
    results = (run / "results.jsonl").read_bytes()
    check(results == merged, "results.jsonl is not the shards in index order")
    log(f"  {shards} shards, {len(want)}/{len(want)} lines identical to negt2i evaluate; results.jsonl merged")
    report = json.loads((run / "report" / "report.json").read_text())
    for name in ("report.md", "report.html", "table3.csv"):
        check((run / "report" / name).is_file(), f"the report has no {name}: {sorted((run / 'report').iterdir())}")
    (model,) = report["inputs"].values()
    check([f["sha256"] for f in model["files"]] == [hashlib.sha256(results).hexdigest()]
          and sum(model["lines_per_file"].values()) == len(want), f"the report's inputs: {model}")  # fmt: skip
    name = next(iter(report["inputs"]))
    ref = tmp / "report-of-evaluate"
    made = negt2i("report", f"{name}={tmp / 'embedded.jsonl'}", "--out", str(ref))
    check(made.returncode == 0, made.stderr)
    expected_report = json.loads((ref / "report.json").read_text())
    for r in (report, expected_report):
        for m in r["inputs"].values():
            m.pop("files")
            m.pop("lines_per_file")
    check(report == expected_report, "the report pod's report.json differs from the report of negt2i evaluate's "
          f"results:\npod: {json.dumps(report)[:2000]}\nevaluate: {json.dumps(expected_report)[:2000]}")  # fmt: skip
    acc = report["models"][name]
    log(f"  the report pod's report: from results.jsonl ({len(want)} lines), equal to negt2i evaluate's "
        f"({acc['correct_images']}/{acc['images']} images correct)")  # fmt: skip


def pod_logs(docker: Docker, pod: str) -> str:
    names = docker("ps", "-a", "--filter", f"pod={pod}", "--format", "{{.Names}}", check=False).split()
    return "\n".join(f"--- {n} ---\n{docker.logs(n, 15)}" for n in names)


if __name__ == "__main__":
    sys.exit(main())
