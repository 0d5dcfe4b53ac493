"""Container HEALTHCHECK for the NegT2IBench images.

    healthcheck.py http://127.0.0.1:3000/readyz        exit 0 iff the URL answers HTTP 200
    healthcheck.py grpc://127.0.0.1:50051 [SERVICE]     exit 0 iff grpc.health.v1 reports SERVING

The HTTP form uses the standard library only (the stage images carry no curl);
the gRPC form imports grpcio and grpcio-health-checking (orchestrator image).
Kubernetes does not use this file: its probes are declared in k8s/ (httpGet and
native grpc probes); this is for `docker run` and Compose.
"""

from __future__ import annotations

import sys
import urllib.error
import urllib.request

TIMEOUT_S = 4.0


def check_http(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
            return 0 if response.status == 200 else 1
    except (urllib.error.URLError, OSError) as error:
        print(f"healthcheck: {url}: {error}", file=sys.stderr)
        return 1


def check_grpc(target: str, service: str) -> int:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=TIMEOUT_S)
        except grpc.RpcError as error:
            print(f"healthcheck: {target}: {error.code().name}", file=sys.stderr)
            return 1
    return 0 if reply.status == health_pb2.HealthCheckResponse.SERVING else 1


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    target = argv[0]
    if target.startswith("grpc://"):
        return check_grpc(target.removeprefix("grpc://"), argv[1] if len(argv) > 1 else "")
    return check_http(target)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
