"""Policies as code over the rendered manifests: resources, probes, security, GPUs, tags,
the Service/HPA/PDB trio, network isolation, the swap overlay and the sweep Job."""

from __future__ import annotations

import re
import tomllib
from typing import Any

import pytest
import yaml

from tests.k8s.helpers import (
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
    pod_specs,
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


@pytest.mark.parametrize("overlay", ["overlays/gpu", "overlays/detector-swap"])
def test_gpu_overlays_give_each_stage_one_gpu_and_the_orchestrator_none(overlay: str) -> None:
    deployments = by_kind(rendered(overlay), "Deployment")
    for name, deployment in deployments.items():
        main = deployment["spec"]["template"]["spec"]["containers"][0]
        requests, limits = main["resources"]["requests"], main["resources"]["limits"]
        if name in STAGES:
            assert str(requests.get(GPU)) == "1" and str(limits.get(GPU)) == "1", name
            tolerations = deployment["spec"]["template"]["spec"].get("tolerations", [])
            assert {"key": GPU, "operator": "Exists", "effect": "NoSchedule"} in tolerations
        else:
            assert GPU not in requests and GPU not in limits, name
    config = next(o for o in rendered(overlay) if o["metadata"]["name"].startswith("negt2i-config-"))
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


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_images_are_pinned_release_tags(name: str) -> None:
    for _, template in pod_specs(rendered(name)):
        for c in containers(template):
            image = c["image"]
            names = "detector|segmenter|attributes|depth|orchestrator|generate"
            match = re.fullmatch(rf"(?:\S+/)?({names}):([\w.-]+)", image)
            assert match, f"unexpected image {image!r}"
            assert match.group(2) != "latest"
            # One release: the tag is the package version the images are built from (Makefile).
            assert match.group(2) == VERSION, f"{image}: tag is not the project version {VERSION}"
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


@pytest.mark.parametrize("job", ["jobs/weights-fetch", "jobs/sweep", "jobs/generate"])
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


def test_swap_overlay_changes_only_the_detector_deployment() -> None:
    gpu = {key(o): o for o in rendered("overlays/gpu")}
    swap = {key(o): o for o in rendered("overlays/detector-swap")}
    assert gpu.keys() == swap.keys(), "the swap must not add, remove or rename objects (e.g. a ConfigMap hash)"
    changed = [k for k in gpu if gpu[k] != swap[k]]
    assert changed == [("Deployment", "detector")]

    def backend(objs: dict) -> str:
        container = objs["Deployment", "detector"]["spec"]["template"]["spec"]["containers"][0]
        return next(e["value"] for e in container["env"] if e["name"] == "NEGT2I_DETECTOR_BACKEND")

    assert (backend(gpu), backend(swap)) == ("rfdetr-seg-xl", "maskrcnn-r50")


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
