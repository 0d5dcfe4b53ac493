"""An empty Kubernetes API server, just enough for `kubectl apply --dry-run=client`.

It answers API discovery (legacy, non-aggregated) for the kinds the manifests use and 404
for every object, so kubectl reads the files exactly as it would against a cluster, maps
every object to its resource and reports what it would create. Nothing is stored. A kind
missing from RESOURCES fails kubectl with "no matches for kind": add it here.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

RESOURCES: dict[str, list[tuple[str, str, bool]]] = {
    # group/version: (plural, kind, namespaced)
    "v1": [
        ("namespaces", "Namespace", False),
        ("configmaps", "ConfigMap", True),
        ("services", "Service", True),
        ("serviceaccounts", "ServiceAccount", True),
        ("persistentvolumeclaims", "PersistentVolumeClaim", True),
        ("pods", "Pod", True),
    ],
    "apps/v1": [("deployments", "Deployment", True)],
    "batch/v1": [("jobs", "Job", True)],
    "autoscaling/v2": [("horizontalpodautoscalers", "HorizontalPodAutoscaler", True)],
    "policy/v1": [("poddisruptionbudgets", "PodDisruptionBudget", True)],
    "networking.k8s.io/v1": [("networkpolicies", "NetworkPolicy", True)],
}
VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]


def _discovery(path: str) -> dict[str, Any] | None:
    if path == "/api":
        return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
    if path == "/apis":
        groups = []
        for group_version in RESOURCES:
            if "/" in group_version:
                group, version = group_version.split("/")
                entry = {"groupVersion": group_version, "version": version}
                groups.append({"name": group, "versions": [entry], "preferredVersion": entry})
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}
    group_version = path.removeprefix("/api/").removeprefix("/apis/")
    if path in ("/api/v1", f"/apis/{group_version}") and group_version in RESOURCES:
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": group_version,
            "resources": [
                {"name": plural, "singularName": "", "namespaced": namespaced, "kind": kind, "verbs": VERBS}
                for plural, kind, namespaced in RESOURCES[group_version]
            ],
        }
    if path == "/version":
        return {"major": "1", "minor": "33", "gitVersion": "v1.33.0"}
    return None


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = _discovery(self.path.split("?")[0])
        if body is None:
            self._send(
                404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404}
            )
        else:
            self._send(200, body)

    def _send(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass


@contextmanager
def empty_cluster(folder: Path) -> Iterator[Path]:
    """Run the server on a free port of 127.0.0.1; yield a kubeconfig that points kubectl at it."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "empty", "cluster": {"server": f"http://127.0.0.1:{server.server_port}"}}],
        "users": [{"name": "empty", "user": {"token": "none"}}],
        "contexts": [{"name": "empty", "context": {"cluster": "empty", "user": "empty"}}],
        "current-context": "empty",
    }
    kubeconfig = folder / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(config))
    try:
        yield kubeconfig
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
