"""Policies as code over the rendered manifests: resources, probes, security, GPUs, tags,
the Service/HPA/PDB trio, network isolation, the swap overlay and the sweep Job."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.k8s.helpers import (
    EXTERNAL_DETECTOR_IMAGE,
    GPU_RESOURCE,
    JOBS,
    K8S,
    KUSTOMIZATIONS,
    NAMESPACE,
    ORCHESTRATOR_PORT,
    OVERLAYS,
    REPO,
    STAGE_PORT,
    STAGES,
    Endpoint,
    by_kind,
    connection_allowed,
    containers,
    ingress_allowed,
    key,
    load_file,
    pod_specs,
    release,
    rendered,
    selector_matches,
)

GPU = "nvidia.com/gpu"
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def _all_pods() -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    return [(name, w, t) for name in KUSTOMIZATIONS for w, t in pod_specs(rendered(name))]


def _pod_id(item: tuple[str, dict[str, Any], dict[str, Any]]) -> str:
    return f"{item[0]}:{item[1]['kind']}/{item[1]['metadata']['name']}"


ALL_PODS = _all_pods()


@pytest.mark.parametrize("item", ALL_PODS, ids=_pod_id)
def test_every_container_has_cpu_and_memory_requests_and_limits(item: tuple[str, dict, dict]) -> None:
    for c in containers(item[2]):
        resources = c.get("resources", {})
        for kind in ("requests", "limits"):
            missing = {"cpu", "memory"} - set(resources.get(kind, {}))
            assert not missing, f"container {c['name']}: no {kind} for {sorted(missing)}"


@pytest.mark.parametrize("item", ALL_PODS, ids=_pod_id)
def test_every_pod_runs_non_root_and_locked_down(item: tuple[str, dict, dict]) -> None:
    pod = item[2]["spec"]
    ctx = pod.get("securityContext", {})
    assert ctx.get("runAsNonRoot") is True
    assert ctx.get("runAsUser", 0) != 0 and ctx.get("runAsGroup", 0) != 0
    assert ctx.get("seccompProfile", {}).get("type") == "RuntimeDefault"
    assert pod.get("automountServiceAccountToken") is False
    assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC")
    for c in containers(item[2]):
        sc = c.get("securityContext", {})
        assert sc.get("runAsNonRoot", True) is True, c["name"]
        assert sc.get("runAsUser", 1) != 0, c["name"]
        assert sc.get("allowPrivilegeEscalation") is False, c["name"]
        assert sc.get("readOnlyRootFilesystem") is True, c["name"]
        assert sc.get("capabilities", {}).get("drop") == ["ALL"], c["name"]
        assert not sc.get("capabilities", {}).get("add"), c["name"]
        assert not sc.get("privileged"), c["name"]


@pytest.mark.parametrize("item", [i for i in ALL_PODS if i[1]["kind"] == "Deployment"], ids=_pod_id)
def test_long_running_containers_have_probes(item: tuple[str, dict, dict]) -> None:
    # Job pods run to completion: readiness means nothing there, so only Deployments are held to this.
    for c in item[2]["spec"]["containers"]:
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            assert probe in c, f"container {c['name']} has no {probe}"
    name = item[1]["metadata"]["name"]
    c = item[2]["spec"]["containers"][0]
    if name in STAGES:
        # BentoML: /livez answers once the server runs, /readyz only after the model loaded.
        assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
        assert c["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "http"}
        assert c["ports"] == [{"name": "http", "containerPort": STAGE_PORT, "protocol": "TCP"}]
    else:
        assert name == "orchestrator"
        # grpc.health.v1 turns NOT_SERVING whenever a stage is down (orchestrator/server.py): a
        # liveness probe on it would restart a healthy orchestrator during every stage rollout.
        assert c["livenessProbe"]["tcpSocket"] == {"port": "grpc"}
        assert c["startupProbe"]["tcpSocket"] == {"port": "grpc"}
        assert c["readinessProbe"]["grpc"] == {"port": ORCHESTRATOR_PORT, "service": "negt2i.v1.Evaluator"}


@pytest.mark.parametrize("overlay", [o for o, r in GPU_RESOURCE.items() if r is not None])
def test_gpu_overlays_give_each_stage_one_gpu_unit_and_the_orchestrator_none(overlay: str) -> None:
    resource = GPU_RESOURCE[overlay]
    objs = rendered(f"overlays/{overlay}")
    for name, deployment in by_kind(objs, "Deployment").items():
        main = deployment["spec"]["template"]["spec"]["containers"][0]
        requests, limits = main["resources"]["requests"], main["resources"]["limits"]
        gpu_kinds = {r for r in (*requests, *limits) if r.startswith("nvidia.com/")}
        if name in STAGES:
            # One unit of this overlay's GPU resource (whole GPU, MIG slice or shared GPU), nothing else.
            assert gpu_kinds == {resource}, name
            assert str(requests[resource]) == "1" and str(limits[resource]) == "1", name
            tolerations = deployment["spec"]["template"]["spec"].get("tolerations", [])
            assert {"key": GPU, "operator": "Exists", "effect": "NoSchedule"} in tolerations
        else:
            assert not gpu_kinds, name
    config = next(o for o in objs if o["metadata"]["name"].startswith("negt2i-config-"))
    assert config["data"]["NEGT2I_DEVICE"] == "cuda"


def test_cpu_overlay_requests_no_gpu_anywhere() -> None:
    objs = rendered("overlays/cpu-dev")
    for _, template in pod_specs(objs):
        for c in containers(template):
            assert not any(r.startswith("nvidia.com/") for kind in ("requests", "limits") for r in c["resources"][kind])
        assert "tolerations" not in template["spec"]
    config = next(o for o in objs if o["metadata"]["name"].startswith("negt2i-config-"))
    assert config["data"]["NEGT2I_DEVICE"] == "cpu"
    assert config["data"]["NEGT2I_GPUS"] == "0"  # BentoML must not reserve a GPU either


@pytest.mark.parametrize("overlay", [f"overlays/{o}" for o in OVERLAYS])
def test_every_deployment_has_a_service_an_hpa_and_a_pdb(overlay: str) -> None:
    objs = rendered(overlay)
    deployments = by_kind(objs, "Deployment")
    assert sorted(deployments) == sorted([*STAGES, "orchestrator"])
    services, hpas, pdbs = (
        by_kind(objs, "Service"),
        by_kind(objs, "HorizontalPodAutoscaler"),
        by_kind(objs, "PodDisruptionBudget"),
    )
    for name, deployment in deployments.items():
        template = deployment["spec"]["template"]
        labels = template["metadata"]["labels"]
        assert selector_matches(deployment["spec"]["selector"], labels)
        ports = {p["name"]: p["containerPort"] for c in template["spec"]["containers"] for p in c.get("ports", [])}

        service = [s for s in services.values() if s["spec"]["selector"].items() <= labels.items()]
        assert len(service) == 1, f"{name}: {len(service)} Services select it"
        for port in service[0]["spec"]["ports"]:
            assert port["targetPort"] in ports, f"{name}: Service targets unknown port {port['targetPort']}"

        hpa = [
            h
            for h in hpas.values()
            if h["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": name}
        ]
        assert len(hpa) == 1, f"{name}: {len(hpa)} HPAs"
        assert 1 <= hpa[0]["spec"]["minReplicas"] <= hpa[0]["spec"]["maxReplicas"]
        # The HPA owns the replica count; a `replicas:` in the manifest would reset it on every apply.
        assert "replicas" not in deployment["spec"], name

        pdb = [p for p in pdbs.values() if selector_matches(p["spec"]["selector"], labels)]
        assert len(pdb) == 1, f"{name}: {len(pdb)} PDBs"
        # A PDB must never block node drains outright.
        if "minAvailable" in pdb[0]["spec"]:
            assert pdb[0]["spec"]["minAvailable"] < hpa[0]["spec"]["minReplicas"], name


def test_stage_services_and_config_urls_agree() -> None:
    objs = rendered("overlays/gpu")
    services = by_kind(objs, "Service")
    config = next(o for o in objs if o["metadata"]["name"].startswith("negt2i-config-"))["data"]
    for stage in STAGES:
        assert config[f"NEGT2I_{stage.upper()}_URL"] == f"http://{stage}:{STAGE_PORT}"
        assert services[stage]["spec"]["ports"][0]["port"] == STAGE_PORT
    orchestrator = services["orchestrator"]["spec"]
    assert orchestrator["clusterIP"] == "None", "headless: gRPC clients balance across pods themselves"
    assert orchestrator["ports"][0]["port"] == ORCHESTRATOR_PORT


@pytest.mark.parametrize("overlay", [f"overlays/{o}" for o in OVERLAYS])
def test_hpas_scale_stages_on_load_and_cpu_overlay_falls_back_to_cpu(overlay: str) -> None:
    for name, hpa in by_kind(rendered(overlay), "HorizontalPodAutoscaler").items():
        (metric,) = hpa["spec"]["metrics"]
        if name in STAGES and overlay != "overlays/cpu-dev":
            assert metric["type"] == "Pods"
            assert metric["pods"]["metric"]["name"] == "bentoml_service_request_in_progress"
            assert metric["pods"]["target"]["type"] == "AverageValue"
        else:
            assert metric["type"] == "Resource" and metric["resource"]["name"] == "cpu"
            assert metric["resource"]["target"]["type"] == "Utilization"


def test_the_release_names_an_explicit_registry_and_the_project_version() -> None:
    registry, tag = release()
    # An explicit registry host: a bare `negt2i/detector` would silently resolve to Docker Hub.
    host = registry.split("/")[0]
    assert "." in host or ":" in host or host == "localhost", registry
    # One release: the tag committed is the package version the images are built from.
    assert tag == VERSION and tag != "latest"


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_images_are_pinned_release_tags(name: str) -> None:
    registry, tag = release()
    for workload, template in pod_specs(rendered(name)):
        for c in containers(template):
            image = c["image"]
            if name == "overlays/detector-external" and workload["metadata"]["name"] == "detector":
                assert image == EXTERNAL_DETECTOR_IMAGE  # the template's placeholder
                continue
            match = re.fullmatch(rf"{re.escape(registry)}/([a-z0-9-]+):{re.escape(tag)}", image)
            assert match, f"{image!r} is not {registry}/<image>:{tag} (k8s/components/release)"
            assert c.get("imagePullPolicy", "IfNotPresent") != "Always"


@pytest.mark.parametrize("overlay", [f"overlays/{o}" for o in OVERLAYS])
def test_config_references_resolve(overlay: str) -> None:
    objs = rendered(overlay)
    configmaps, claims = by_kind(objs, "ConfigMap"), by_kind(objs, "PersistentVolumeClaim")
    for _, template in pod_specs(objs):
        for c in containers(template):
            for source in c.get("envFrom", []):
                assert source["configMapRef"]["name"] in configmaps
        for volume in template["spec"].get("volumes", []):
            if "configMap" in volume:
                assert volume["configMap"]["name"] in configmaps
            if "persistentVolumeClaim" in volume:
                assert volume["persistentVolumeClaim"]["claimName"] in claims


@pytest.mark.parametrize("job", [f"jobs/{j}" for j in JOBS])
def test_jobs_use_the_platform_volumes(job: str) -> None:
    claims = by_kind(rendered("overlays/gpu"), "PersistentVolumeClaim")
    for _, template in pod_specs(rendered(job)):
        for volume in template["spec"].get("volumes", []):
            if "persistentVolumeClaim" in volume:
                assert volume["persistentVolumeClaim"]["claimName"] in claims


def test_weights_are_read_only_for_every_stage_and_written_only_by_the_fetch_job() -> None:
    for _, template in pod_specs(rendered("overlays/gpu")):
        for volume in template["spec"]["volumes"]:
            if volume.get("persistentVolumeClaim", {}).get("claimName") == "negt2i-weights":
                assert volume["persistentVolumeClaim"]["readOnly"] is True
        for c in containers(template):
            for mount in c.get("volumeMounts", []):
                if mount["name"] == "weights":
                    assert mount == {"name": "weights", "mountPath": "/weights", "readOnly": True}
    (fetch,) = by_kind(rendered("jobs/weights-fetch"), "Job").values()
    (container,) = fetch["spec"]["template"]["spec"]["containers"]
    assert "negt2i weights fetch" in container["command"][-1]
    assert ".negt2i-complete" in container["command"][-1]  # what the stages' init containers wait for


@pytest.mark.parametrize("overlay", ["overlays/detector-swap", "overlays/detector-external"])
def test_swap_overlays_change_only_the_detector_deployment(overlay: str) -> None:
    gpu = {key(o): o for o in rendered("overlays/gpu")}
    swap = {key(o): o for o in rendered(overlay)}
    assert gpu.keys() == swap.keys(), "the swap must not add, remove or rename objects (e.g. a ConfigMap hash)"
    changed = [k for k in gpu if gpu[k] != swap[k]]
    assert changed == [("Deployment", "detector")]


def _apply(live: dict[tuple[str, str], dict], objs: list[dict]) -> dict[tuple[str, str], dict]:
    """The objects after `kubectl apply -f` of complete objects: each replaces its namesake."""
    return {**live, **{key(o): o for o in objs}}


def _mounted_configmaps(template: dict) -> set[str]:
    names = {v["configMap"]["name"] for v in template["spec"].get("volumes", []) if "configMap" in v}
    for c in containers(template):
        names |= {s["configMapRef"]["name"] for s in c.get("envFrom", []) if "configMapRef" in s}
        names |= {
            e["valueFrom"]["configMapKeyRef"]["name"]
            for e in c.get("env", [])
            if "configMapKeyRef" in e.get("valueFrom", {})
        }
    return names


@pytest.mark.parametrize("swap", sorted((K8S / "swap").glob("*.yaml")), ids=lambda p: p.name)
def test_a_swap_file_applied_with_kubectl_apply_f_rolls_only_the_detector(swap: Path) -> None:
    platform = {key(o): o for o in load_file(K8S / "negt2i.yaml")}
    objs = load_file(swap)
    after = _apply(platform, objs)
    # Nothing is created (no new ConfigMap hash, no second Deployment): the file only replaces.
    assert after.keys() == platform.keys()
    changed = {k for k in platform if platform[k] != after[k]}
    assert changed == {("Deployment", "detector")}, changed
    deployments = {k[1]: o for k, o in platform.items() if k[0] == "Deployment"}
    for name, deployment in deployments.items():
        if name == "detector":
            continue
        # No other pod template changes, and no ConfigMap another Deployment reads changes.
        assert after["Deployment", name]["spec"]["template"] == deployment["spec"]["template"], name
        for configmap in _mounted_configmaps(deployment["spec"]["template"]):
            assert after["ConfigMap", configmap] == platform["ConfigMap", configmap], configmap
    # The swapped detector still reads the platform's ConfigMaps and volumes, and stays a stage
    # (same labels: Service, HPA, PDB and NetworkPolicies keep selecting it).
    detector = after["Deployment", "detector"]
    assert _mounted_configmaps(detector["spec"]["template"]) <= {k[1] for k in platform if k[0] == "ConfigMap"}
    assert detector["spec"]["selector"] == platform["Deployment", "detector"]["spec"]["selector"]
    assert (
        detector["spec"]["template"]["metadata"]["labels"]
        == platform["Deployment", "detector"]["spec"]["template"]["metadata"]["labels"]
    )
    # Rolling back is applying the platform file again.
    assert _apply(after, list(platform.values())) == platform


def test_the_maskrcnn_swap_sets_only_the_backend() -> None:
    platform = by_kind(tuple(load_file(K8S / "negt2i.yaml")), "Deployment")["detector"]
    (swap,) = load_file(K8S / "swap" / "detector-maskrcnn.yaml")

    def backend(deployment: dict) -> str:
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        return next(e["value"] for e in container["env"] if e["name"] == "NEGT2I_DETECTOR_BACKEND")

    assert (backend(platform), backend(swap)) == ("rfdetr-seg-xl", "maskrcnn-r50")
    # The backend is registered with weights the fetch Job downloads.
    from negt2i.weights import WEIGHTS

    assert {"rfdetr-seg-xl", "maskrcnn-r50"} <= set(WEIGHTS)


def test_the_external_detector_template_keeps_the_stage_contract() -> None:
    (template,) = load_file(K8S / "swap" / "detector-external.yaml")
    platform = by_kind(tuple(load_file(K8S / "negt2i.yaml")), "Deployment")["detector"]
    (container,) = template["spec"]["template"]["spec"]["containers"]
    assert container["image"] == EXTERNAL_DETECTOR_IMAGE
    assert not template["spec"]["template"]["spec"].get("initContainers")  # no shell needed in the image
    shipped = platform["spec"]["template"]["spec"]["containers"][0]
    for field in ("ports", "readinessProbe", "livenessProbe", "startupProbe", "securityContext", "resources"):
        assert container[field] == shipped[field], field
    assert (
        template["spec"]["template"]["spec"]["securityContext"]
        == platform["spec"]["template"]["spec"]["securityContext"]
    )


# --- network isolation, evaluated as traffic between labelled pods -------------------------


def _labels(objs: tuple, kind: str, name: str) -> dict[str, str]:
    return by_kind(objs, kind)[name]["spec"]["template"]["metadata"]["labels"]


@pytest.mark.parametrize("overlay", [f"overlays/{o}" for o in OVERLAYS])
def test_network_policies_let_only_the_orchestrator_reach_the_stages(overlay: str) -> None:
    objs = rendered(overlay)
    policies = [o for o in objs if o["kind"] == "NetworkPolicy"]
    sweep = Endpoint(_labels(rendered("jobs/sweep"), "Job", "negt2i-sweep"))
    fetch_objs = rendered("jobs/weights-fetch")
    fetch = Endpoint(_labels(fetch_objs, "Job", "negt2i-weights-fetch"))
    orchestrator = Endpoint(_labels(objs, "Deployment", "orchestrator"))
    prometheus = Endpoint({"app.kubernetes.io/name": "prometheus"}, namespace="monitoring")
    stranger_here = Endpoint({"app": "debug"})
    same_app = Endpoint({"app.kubernetes.io/part-of": "negt2ibench", "app.kubernetes.io/name": "debug"})
    stranger_elsewhere = Endpoint({"app.kubernetes.io/name": "orchestrator"}, namespace="other")
    internet = Endpoint(namespace=None, ip="203.0.113.7")
    dns = Endpoint({"k8s-app": "kube-dns"}, namespace="kube-system")

    for stage in STAGES:
        pod = Endpoint(_labels(objs, "Deployment", stage))
        assert connection_allowed(policies, orchestrator, pod, STAGE_PORT)
        assert not connection_allowed(policies, orchestrator, pod, 22)
        assert connection_allowed(policies, prometheus, pod, STAGE_PORT)  # /metrics for the HPA
        other_stage = Endpoint(_labels(objs, "Deployment", "depth" if stage != "depth" else "detector"))
        for intruder in (sweep, fetch, stranger_here, stranger_elsewhere, other_stage, same_app):
            assert not connection_allowed(policies, intruder, pod, STAGE_PORT), (intruder, stage)
            # Also by the stage's ingress rules alone, not only thanks to the intruder's egress rules.
            assert not ingress_allowed(policies, intruder, pod, STAGE_PORT), (intruder, stage)
        # Stages need no egress but DNS: weights come from the volume.
        assert not connection_allowed(policies, pod, internet, 443)
        assert not connection_allowed(policies, pod, orchestrator, ORCHESTRATOR_PORT)
        assert connection_allowed(policies, pod, dns, 53, "UDP")

    # Sweep pods reach the orchestrator; nobody else in or out of the namespace does.
    assert connection_allowed(policies, sweep, orchestrator, ORCHESTRATOR_PORT)
    for intruder in (
        stranger_here,
        stranger_elsewhere,
        prometheus,
        same_app,
        Endpoint(_labels(objs, "Deployment", "detector")),
    ):
        assert not connection_allowed(policies, intruder, orchestrator, ORCHESTRATOR_PORT), intruder
        assert not ingress_allowed(policies, intruder, orchestrator, ORCHESTRATOR_PORT), intruder
    assert not connection_allowed(policies, orchestrator, internet, 443)
    assert not connection_allowed(policies, sweep, internet, 443)

    # Only the weights-fetch Job (with its own policy) leaves the cluster, and only for HTTPS.
    with_fetch = policies + [o for o in fetch_objs if o["kind"] == "NetworkPolicy"]
    assert connection_allowed(with_fetch, fetch, internet, 443)
    assert not connection_allowed(with_fetch, fetch, internet, 80)
    assert not connection_allowed(with_fetch, fetch, Endpoint(_labels(objs, "Deployment", "detector")), STAGE_PORT)


def test_every_policy_lives_in_the_namespace_and_default_denies() -> None:
    policies = by_kind(rendered("overlays/gpu"), "NetworkPolicy")
    assert policies["default-deny"]["spec"] == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
    assert all(p["metadata"]["namespace"] == NAMESPACE for p in policies.values())


# --- the sweep ------------------------------------------------------------------------------


def test_sweep_is_an_indexed_job_whose_shard_count_agrees_everywhere() -> None:
    objs = rendered("jobs/sweep")
    jobs = by_kind(objs, "Job")
    sweep, report = jobs["negt2i-sweep"], jobs["negt2i-report"]
    (config,) = [o for o in objs if o["kind"] == "ConfigMap"]
    shards = int(config["data"]["SWEEP_SHARDS"])
    assert sweep["spec"]["completionMode"] == "Indexed"
    assert sweep["spec"]["completions"] == sweep["spec"]["parallelism"] == shards
    assert sweep["spec"]["template"]["spec"]["restartPolicy"] == "Never"  # required by backoffLimitPerIndex

    (submit,) = sweep["spec"]["template"]["spec"]["containers"]
    script = submit["command"][-1]
    assert '--shard "$JOB_COMPLETION_INDEX/$SWEEP_SHARDS"' in script
    assert "negt2i submit" in script and 'touch "$out.done"' in script
    # The client balances over the headless orchestrator Service itself.
    assert config["data"]["NEGT2I_ORCHESTRATOR"] == f"dns:///orchestrator:{ORCHESTRATOR_PORT}"
    assert '--orchestrator "$NEGT2I_ORCHESTRATOR"' in script

    # The report waits for exactly those shards, then merges them in index order.
    for c in containers(report["spec"]["template"]):
        assert c["envFrom"] == [{"configMapRef": {"name": config["metadata"]["name"]}}]
    (wait,) = report["spec"]["template"]["spec"]["initContainers"]
    assert 'shard-*-of-"$SWEEP_SHARDS".done' in wait["command"][-1]
    (merge,) = report["spec"]["template"]["spec"]["containers"]
    assert 'negt2i report "$SWEEP_MODEL=$SWEEP_RESULTS/results.jsonl"' in merge["command"][-1]
    assert "$SWEEP_RESULTS/shard-$i-of-$SWEEP_SHARDS.jsonl" in merge["command"][-1]


def test_the_adapter_rules_serve_the_metric_the_hpas_read() -> None:
    values = yaml.safe_load((REPO / "k8s" / "monitoring" / "prometheus-adapter-values.yaml").read_text())
    served = {rule["name"]["as"] for rule in values["rules"]["custom"]}
    for rule in values["rules"]["custom"]:
        # BentoML counts the kubelet's probe requests in this gauge: they must not count as load.
        assert 'endpoint!~"/livez|/readyz|/healthz|/metrics"' in rule["metricsQuery"]
        assert "<<.LabelMatchers>>" in rule["metricsQuery"] and "by (<<.GroupBy>>)" in rule["metricsQuery"]
    for name, hpa in by_kind(rendered("overlays/gpu"), "HorizontalPodAutoscaler").items():
        for metric in hpa["spec"]["metrics"]:
            if metric["type"] == "Pods":
                assert metric["pods"]["metric"]["name"] in served, name
    # Prometheus finds the pods by these annotations and may reach them (see the NetworkPolicy test).
    for stage in STAGES:
        annotations = by_kind(rendered("overlays/gpu"), "Deployment")[stage]["spec"]["template"]["metadata"][
            "annotations"
        ]
        assert annotations == {
            "prometheus.io/scrape": "true",
            "prometheus.io/port": str(STAGE_PORT),
            "prometheus.io/path": "/metrics",
        }


def test_the_orchestrators_concurrency_lets_every_stage_hpa_reach_its_maximum() -> None:
    # In-flight stage calls come only from the orchestrators, at most NEGT2I_STAGE_CONCURRENCY
    # per orchestrator pod and stage; an HPA target the orchestrators can never load would
    # leave maxReplicas unreachable.
    objs = rendered("overlays/gpu")
    config = next(o for o in objs if o["metadata"]["name"].startswith("negt2i-config-"))["data"]
    hpas = by_kind(objs, "HorizontalPodAutoscaler")
    most_in_flight = int(config["NEGT2I_STAGE_CONCURRENCY"]) * hpas["orchestrator"]["spec"]["minReplicas"]
    for stage in STAGES:
        (metric,) = hpas[stage]["spec"]["metrics"]
        target = int(metric["pods"]["target"]["averageValue"])
        assert most_in_flight / target >= hpas[stage]["spec"]["maxReplicas"], stage


@pytest.mark.parametrize("overlay", [f"overlays/{o}" for o in OVERLAYS])
def test_thread_pools_follow_each_containers_cpu_limit(overlay: str) -> None:
    # torch / OpenBLAS default to the node's core count; above the CPU quota that only throttles.
    for name, deployment in by_kind(rendered(overlay), "Deployment").items():
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        (threads,) = [e for e in container.get("env", []) if e["name"] == "OMP_NUM_THREADS"]
        assert threads["valueFrom"] == {"resourceFieldRef": {"resource": "limits.cpu", "divisor": "1"}}, name


# --- sharing GPUs: MIG slices and time-slicing ---------------------------------------------

STAGE_GPU_MEMORY_GIB_ESTIMATE = {"detector": 2.0, "segmenter": 2.0, "attributes": 6.5, "depth": 1.5}
"""ESTIMATED peak GPU memory of one stage pod (docs/deployment.md, "Sizing"; no GPU has measured it):
fp32 weights, 4 bytes x the paper's parameter counts (RF-DETR-Seg-XL 38.1 M = 0.14 GiB, SAM 2.1
hiera-small 46.1 M = 0.17 GiB, SigLIP 2 SO400M 1,136.0 M = 4.23 GiB, Depth-Anything V2 Small 24.8 M =
0.09 GiB), plus activations of one adaptive batch (up to 16 items: <= 1 GiB, 1.5 GiB for SigLIP 2,
0.5 GiB for depth), plus ~0.5 GiB of CUDA context per process; rounded up. The paper measures 6.3 GiB
for all four models in one process without batching, consistent with the weights' 4.6 GiB."""
MIG_1G_SLICES_PER_GPU = 7
"""A 1g MIG profile splits an A100 / H100 / H200 into seven slices."""
SMALLEST_SHARED_GPU_GIB = 80e9 / 2**30
"""Time-slicing is sized for an 80 GB GPU (H100 80GB; an H200 has 141 GB)."""


def test_each_stage_fits_its_mig_slice_and_a_stage_set_fits_one_gpu() -> None:
    (resource,) = {GPU_RESOURCE["gpu-mig"]}
    match = re.fullmatch(r"nvidia\.com/mig-(\d)g\.(\d+)gb", resource)
    assert match, resource
    slice_gib = int(match.group(2)) * 1e9 / 2**30
    for stage, estimate in STAGE_GPU_MEMORY_GIB_ESTIMATE.items():
        assert estimate <= slice_gib, f"{stage}: ~{estimate} GiB does not fit {resource} ({slice_gib:.1f} GiB)"
    assert match.group(1) == "1" and len(STAGES) <= MIG_1G_SLICES_PER_GPU  # the four stages on one GPU


def _time_slicing_config() -> dict[str, Any]:
    (configmap,) = load_file(K8S / "gpu-sharing" / "time-slicing-config.yaml")
    (config,) = configmap["data"].values()
    return yaml.safe_load(config)


def test_time_slicing_config_matches_the_overlay_and_fits_gpu_memory() -> None:
    sharing = _time_slicing_config()["sharing"]["timeSlicing"]
    (shared,) = sharing["resources"]
    assert shared["name"] == GPU
    # renameByDefault: the shared GPUs are advertised as <name>.shared, what the overlay requests.
    assert sharing["renameByDefault"] is True
    assert GPU_RESOURCE["gpu-time-slicing"] == f"{GPU}.shared"
    assert sharing["failRequestsGreaterThanOne"] is True
    # One GPU holds a whole stage set, and even `replicas` copies of the largest stage fit its memory
    # (time-slicing does not isolate memory).
    assert shared["replicas"] >= len(STAGES)
    largest = max(STAGE_GPU_MEMORY_GIB_ESTIMATE.values())
    assert shared["replicas"] * largest <= SMALLEST_SHARED_GPU_GIB


def test_stage_memory_estimates_agree_with_the_paper_measurement() -> None:
    # The per-stage weights alone add up to the paper's model size (1.24 B parameters, 6.3 GiB peak in one process).
    parameters = {"detector": 38.1e6, "segmenter": 46.1e6, "attributes": 1136.0e6, "depth": 24.8e6}
    weights_gib = {s: 4 * p / 2**30 for s, p in parameters.items()}
    assert sum(weights_gib.values()) < 6.3 < sum(STAGE_GPU_MEMORY_GIB_ESTIMATE.values())
    for stage, estimate in STAGE_GPU_MEMORY_GIB_ESTIMATE.items():
        assert weights_gib[stage] + 0.5 < estimate, stage  # weights + CUDA context + room for a batch


# --- the sweep: bounded in time, retried per shard (issue 12) --------------------------------


def test_the_sweep_is_bounded_in_time_and_retries_each_shard_on_its_own() -> None:
    jobs = by_kind(rendered("jobs/sweep"), "Job")
    sweep, report = jobs["negt2i-sweep"]["spec"], jobs["negt2i-report"]["spec"]
    assert sweep["completionMode"] == "Indexed"
    assert 1 <= sweep["backoffLimitPerIndex"] <= 5
    assert "backoffLimit" not in sweep  # per index only: one bad shard does not use up the others' retries
    assert sweep["template"]["spec"]["restartPolicy"] == "Never"
    assert 0 < sweep["activeDeadlineSeconds"] <= 7 * 86400
    # The report starts with the sweep and waits for it: it must outlive the sweep's deadline by
    # the time the merge and the report take.
    assert report["activeDeadlineSeconds"] >= sweep["activeDeadlineSeconds"] + 3600


@pytest.mark.parametrize("job", [f"jobs/{j}" for j in JOBS])
def test_every_job_is_bounded_in_time_and_retries(job: str) -> None:
    for name, obj in by_kind(rendered(job), "Job").items():
        spec = obj["spec"]
        assert spec.get("activeDeadlineSeconds", 0) > 0, name
        assert "backoffLimit" in spec or "backoffLimitPerIndex" in spec, name
