"""Clients spread calls over every replica a target lists (``insecure_or_tls_channel``)."""

from __future__ import annotations

from collections import Counter

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from airuntime_common.grpc_server import insecure_or_tls_channel


class _CountingHealth(health.aio.HealthServicer):  # type: ignore[misc]
    def __init__(self, name: str, seen: Counter[str]) -> None:
        super().__init__()
        self._name = name
        self._seen = seen

    async def Check(self, request: object, context: object) -> health_pb2.HealthCheckResponse:
        self._seen[self._name] += 1
        return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)


async def _replica(name: str, seen: Counter[str]) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(_CountingHealth(name, seen), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


async def test_calls_go_round_robin_over_listed_replicas_and_skip_a_dead_one() -> None:
    seen: Counter[str] = Counter()
    a, port_a = await _replica("a", seen)
    b, port_b = await _replica("b", seen)
    channel = insecure_or_tls_channel(f"ipv4:127.0.0.1:{port_a},127.0.0.1:{port_b}")
    stub = health_pb2_grpc.HealthStub(channel)
    try:
        for _ in range(20):
            await stub.Check(health_pb2.HealthCheckRequest(), timeout=5, wait_for_ready=True)
        # round robin: each replica answers about half (pick_first would send all to one)
        assert seen["a"] >= 5 and seen["b"] >= 5, seen
        await b.stop(None)
        seen.clear()
        for _ in range(10):
            await stub.Check(health_pb2.HealthCheckRequest(), timeout=5, wait_for_ready=True)
        assert seen == Counter({"a": 10})
    finally:
        await channel.close()
        await a.stop(None)
        await b.stop(None)


async def test_a_single_address_target_still_works() -> None:
    seen: Counter[str] = Counter()
    server, port = await _replica("only", seen)
    channel = insecure_or_tls_channel(f"127.0.0.1:{port}")
    try:
        reply = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=5
        )
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        assert seen["only"] == 1
    finally:
        await channel.close()
        await server.stop(None)
