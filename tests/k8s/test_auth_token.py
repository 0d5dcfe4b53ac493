"""The auth-token component (k8s/components/auth-token): server and clients agree on one mounted Secret.

Each kustomization that talks gRPC (the platform overlay, the sweep and generate Jobs) is rendered
with the component added, as docs/deployment.md tells an operator to do. The checks read the rendered
pods the way the programs would: the variables the server and the clients actually read
(``orchestrator.settings`` / ``negt2i.transport``) point at the mounted file, the file is readable by
the pod's user, and the token the server expects is the one the clients send.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from negt2i.transport import token_from_env
from orchestrator.settings import Settings

from .helpers import K8S, KUBERNETES_VERSIONS, by_kind, containers, kubernetes_validate, kustomize

COMPONENT = K8S / "components" / "auth-token"
SECRET = "negt2i-auth"
WORKLOADS = {
    "overlays/gpu": ("Deployment", "orchestrator", "orchestrator", "server"),
    "jobs/sweep": ("Job", "negt2i-sweep", "submit", "client"),
    "jobs/generate": ("Job", "negt2i-generate", "generate", "client"),
}


def _with_component(tmp_path: Path, name: str) -> tuple[dict[str, Any], ...]:
    """``k8s/<name>`` rendered with the component added (a kustomization that includes both)."""
    root = tmp_path / name.replace("/", "-")
    root.mkdir()
    (root / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [os.path.relpath(K8S / name, root)],
                "components": [os.path.relpath(COMPONENT, root)],
            }
        )
    )
    return tuple(kustomize(root))


def _pod(objs: tuple[dict[str, Any], ...], kind: str, name: str) -> dict[str, Any]:
    return by_kind(objs, kind)[name]["spec"]["template"]


def _env_and_file(pod: dict[str, Any], container: str, tmp_path: Path, token: str) -> dict[str, str]:
    """The container's literal env, with every Secret mount re-rooted under ``tmp_path`` holding ``token``."""
    spec = pod["spec"]
    (c,) = [c for c in containers(pod) if c["name"] == container]
    env = {e["name"]: e["value"] for e in c.get("env", []) if "value" in e}
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    for mount in c.get("volumeMounts", []):
        secret = volumes[mount["name"]].get("secret")
        if secret is None:
            continue
        assert secret["secretName"] == SECRET and mount.get("readOnly") is True
        local = tmp_path / mount["mountPath"].lstrip("/")
        for item in secret["items"]:
            (local / item["path"]).parent.mkdir(parents=True, exist_ok=True)
            (local / item["path"]).write_text(token + "\n")
        env = {k: v.replace(mount["mountPath"], str(local)) for k, v in env.items()}
    return env


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_the_token_reaches_the_program_that_reads_it(name: str, tmp_path: Path) -> None:
    kind, workload, container, role = WORKLOADS[name]
    pod = _pod(_with_component(tmp_path, name), kind, workload)
    env = _env_and_file(pod, container, tmp_path, "s3cret-token")
    if role == "server":
        assert Settings.from_env(env).auth_token == "s3cret-token"
    else:
        assert token_from_env(env) == "s3cret-token"


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_the_secret_file_is_readable_by_the_pod_user_only(name: str, tmp_path: Path) -> None:
    kind, workload, _, _ = WORKLOADS[name]
    spec = _pod(_with_component(tmp_path, name), kind, workload)["spec"]
    (volume,) = [v for v in spec["volumes"] if v.get("secret", {}).get("secretName") == SECRET]
    mode = volume["secret"]["defaultMode"]
    ctx = spec["securityContext"]
    assert mode & 0o007 == 0, "the token must not be world-readable"
    assert mode & 0o040 and ctx.get("fsGroup") == ctx["runAsGroup"], "group-readable by the pod's group"
    assert "optional" not in volume["secret"], "a missing Secret must stop the pod, not open the port"


def test_without_the_component_nothing_needs_the_secret(tmp_path: Path) -> None:
    """`kubectl apply -f k8s/` must work on a cluster without the Secret: the default renders none of it."""
    for name, (kind, workload, _, _) in WORKLOADS.items():
        text = yaml.safe_dump(_pod(tuple(kustomize(K8S / name)), kind, workload))
        assert SECRET not in text and "TOKEN_FILE" not in text


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_rendered_with_the_component_validates_strictly(version: str, tmp_path: Path) -> None:
    kv = kubernetes_validate()
    for name in WORKLOADS:
        for obj in _with_component(tmp_path, name):
            kv.validate(obj, version, strict=True)
