"""The test overlay of ``make container-test-kube`` (tests/containers/kube.py), checked without podman: it
must change only what it says (images, pull policy, backends, host ports, names, claims, the Jobs' pods)
and keep everything else of the rendered manifests, so that what podman plays is what a cluster runs."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.containers.kube import JOBS, OVERLAY, overlay_deployments, overlay_jobs

from .helpers import KUBERNETES_VERSIONS, REPO, STAGES, kubernetes_validate, rendered

PREFIX = "negt2i-kt-abc123"
IMAGES = {name: f"localhost/test/{name}:t" for name in (*STAGES, "orchestrator")}


def _rendered(path: str) -> list[dict[str, Any]]:
    return copy.deepcopy(list(rendered(path.removeprefix("k8s/"))))


def _configmaps_used(spec: dict[str, Any]) -> set[str]:
    names = {v["configMap"]["name"] for v in spec.get("volumes", []) if "configMap" in v}
    for c in [*spec.get("initContainers", []), *spec["containers"]]:
        names |= {e["configMapRef"]["name"] for e in c.get("envFrom", []) if "configMapRef" in e}
        names |= {e["valueFrom"]["configMapKeyRef"]["name"] for e in c.get("env", [])
                  if "configMapKeyRef" in e.get("valueFrom", {})}  # fmt: skip
    return names


def _configmaps_in(objects: list[dict[str, Any]]) -> set[str]:
    names = {o["metadata"]["name"] for o in objects if o["kind"] == "ConfigMap"}
    # podman keeps a ConfigMap mounted as a volume in a podman volume of its name: prefixed by the run
    assert all(n.startswith(f"{PREFIX}-negt2i-") for n in names), names
    return names


def _strip(spec: dict[str, Any]) -> dict[str, Any]:
    """A pod spec without what the overlay may change."""
    spec = copy.deepcopy(spec)
    spec.pop("restartPolicy", None)
    for c in [*spec.get("initContainers", []), *spec["containers"]]:
        for k in ("image", "imagePullPolicy"):
            c.pop(k, None)
        c["env"] = [e for e in c.get("env", []) if e["name"] != "JOB_COMPLETION_INDEX" and "BACKEND" not in e["name"]]
        for port in c.get("ports", []):
            port.pop("hostIP", None)
            port.pop("hostPort", None)
    for c in [*spec.get("initContainers", []), *spec["containers"]]:
        for e in c.get("envFrom", []):
            if "configMapRef" in e:
                e["configMapRef"]["name"] = e["configMapRef"]["name"].removeprefix(f"{PREFIX}-")
    for v in spec.get("volumes", []):
        if "configMap" in v:
            v["configMap"]["name"] = v["configMap"]["name"].removeprefix(f"{PREFIX}-")
        if "persistentVolumeClaim" in v:
            v["persistentVolumeClaim"]["claimName"] = v["persistentVolumeClaim"]["claimName"].removeprefix(f"{PREFIX}-")
    return spec


@pytest.mark.parametrize("init_restart_bug", [False, True])
def test_deployments_keep_the_manifests_but_images_backends_ports_and_names(init_restart_bug: bool) -> None:
    objs = _rendered(OVERLAY)
    files = overlay_deployments(objs, IMAGES, PREFIX, init_restart_bug=init_restart_bug)
    assert set(files) == {*STAGES, "orchestrator"}
    original = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Deployment"}
    host_ports = []
    for name, f in files.items():
        (d,) = [o for o in f["objects"] if o["kind"] == "Deployment"]
        assert d["metadata"]["name"] == f"{PREFIX}-{name}" and "namespace" not in d["metadata"]
        pod = d["spec"]["template"]["spec"]
        assert _strip(pod) == _strip(original[name]["spec"]["template"]["spec"])
        # podman < 4.4 restarts an init container with its pod's policy (Always): OnFailure there only
        assert pod.get("restartPolicy") == ("OnFailure" if init_restart_bug else original[name]["spec"]["template"]
                                            ["spec"].get("restartPolicy"))  # fmt: skip
        for c in [*pod.get("initContainers", []), *pod["containers"]]:
            assert c["image"] in IMAGES.values() and c["imagePullPolicy"] == "Never"
            for port in c.get("ports", []):
                assert port["hostIP"] == "127.0.0.1"
                host_ports.append(port["hostPort"])
        if name in STAGES:
            env = {e["name"]: e.get("value") for c in pod["containers"] for e in c.get("env", [])}
            assert env[f"NEGT2I_{name.upper()}_BACKEND"] == "synthetic"
            assert pod["containers"][0]["image"] == IMAGES[name]
            assert pod["initContainers"], "the stage pods keep their wait-for-weights init container"
        claims = [
            v["persistentVolumeClaim"]["claimName"] for v in pod.get("volumes", []) if "persistentVolumeClaim" in v
        ]
        assert all(c.startswith(f"{PREFIX}-negt2i-") for c in claims)
        assert _configmaps_used(pod) <= _configmaps_in(f["objects"]), "podman reads ConfigMaps from the kube file"
    assert len(host_ports) == len(set(host_ports)) == len(files), "one distinct host port per Deployment"


def test_jobs_become_the_pods_their_controller_would_create() -> None:
    objs = _rendered(JOBS)
    jobs = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Job"}
    played = overlay_jobs(objs, IMAGES, PREFIX)
    (settings,) = [o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("negt2i-sweep")]
    assert played["shards"] == int(settings["data"]["SWEEP_SHARDS"]) == jobs["negt2i-sweep"]["spec"]["completions"]
    assert len(played["sweep"]) == played["shards"]
    indexes = []
    for i, objects in enumerate(played["sweep"]):
        (cm,) = [o for o in objects if o["kind"] == "ConfigMap"]
        assert cm["data"] == settings["data"], "each sweep pod reads the sweep's settings unchanged"
        (pod,) = [o for o in objects if o["kind"] == "Pod"]
        assert _configmaps_used(pod["spec"]) == _configmaps_in(objects)
        assert pod["metadata"]["name"] == f"{PREFIX}-negt2i-sweep-{i}"
        assert _strip(pod["spec"]) == _strip(jobs["negt2i-sweep"]["spec"]["template"]["spec"])
        assert pod["spec"]["restartPolicy"] == "Never"
        (c,) = pod["spec"]["containers"]
        assert c["image"] == IMAGES["orchestrator"]
        indexes += [e["value"] for e in c["env"] if e["name"] == "JOB_COMPLETION_INDEX"]
        claims = {
            v["persistentVolumeClaim"]["claimName"] for v in pod["spec"]["volumes"] if "persistentVolumeClaim" in v
        }
        assert claims == {f"{PREFIX}-negt2i-images", f"{PREFIX}-negt2i-results"}
    assert indexes == [str(i) for i in range(played["shards"])]
    (report,) = [o for o in played["report"] if o["kind"] == "Pod"]
    assert report["metadata"]["name"] == f"{PREFIX}-negt2i-report"
    assert _strip(report["spec"]) == _strip(jobs["negt2i-report"]["spec"]["template"]["spec"])
    assert [c["name"] for c in report["spec"]["initContainers"]] == ["wait-for-shards"]
    assert _configmaps_used(report["spec"]) == _configmaps_in(played["report"])


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_the_played_objects_are_valid_kubernetes(version: str) -> None:
    kv = kubernetes_validate()
    files = overlay_deployments(_rendered(OVERLAY), IMAGES, PREFIX, init_restart_bug=True)
    played = overlay_jobs(_rendered(JOBS), IMAGES, PREFIX)
    objects = [o for f in files.values() for o in f["objects"]]
    objects += [o for f in [*played["sweep"], played["report"]] for o in f]
    for obj in objects:
        kv.validate(obj, version, strict=True)


def test_the_container_tests_run_from_the_repository() -> None:
    assert (REPO / OVERLAY / "kustomization.yaml").is_file() and (REPO / JOBS / "kustomization.yaml").is_file()
