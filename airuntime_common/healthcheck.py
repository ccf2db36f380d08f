"""Container health probe: ``python -m airuntime_common.healthcheck grpc HOST:PORT`` or
``python -m airuntime_common.healthcheck http URL``.

Exits 0 when the target is SERVING (gRPC ``grpc.health.v1.Health/Check`` with the
overall service name ``""``) or answers HTTP 2xx; 1 otherwise. Used by the
compose file and the Kubernetes manifests; needs no token (health is open).
When ``GRPC_TLS_CA_FILE`` is set (as for every other gRPC client, reference §7) the
probe dials TLS and trusts that CA; otherwise plaintext.
"""

from __future__ import annotations

import os
import sys
import urllib.request
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def check_grpc(target: str, timeout: float = 3.0, ca_file: str | None = None) -> bool:
    """True when ``target``'s overall health is SERVING.

    Args:
        target: ``host:port``.
        timeout: seconds.
        ca_file: PEM CA to dial TLS with; None dials plaintext.
    """
    channel = (
        grpc.secure_channel(target, grpc.ssl_channel_credentials(Path(ca_file).read_bytes()))
        if ca_file
        else grpc.insecure_channel(target)
    )
    with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout)
        except grpc.RpcError:
            return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def check_http(url: str, timeout: float = 3.0) -> bool:
    """True when ``url`` answers 2xx."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:
            return 200 <= int(reply.status) < 300
    except OSError:
        return False


def main(argv: list[str]) -> int:
    """Entry point; see the module docstring."""
    if len(argv) != 2 or argv[0] not in ("grpc", "http"):
        print(
            "usage: python -m airuntime_common.healthcheck grpc HOST:PORT | http URL",
            file=sys.stderr,
        )
        return 2
    ca_file = os.environ.get("GRPC_TLS_CA_FILE") or None
    ok = check_grpc(argv[1], ca_file=ca_file) if argv[0] == "grpc" else check_http(argv[1])
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
