"""The ``waiting`` scenario (reference §9.1): commit-to-event delivery across replicas, and
what 1,000 open event streams cost one gateway.

Two job_service replicas and one gateway (no worker) on a fresh MariaDB database:

1. **Delivery**: one ``GET /v1/ai/events`` stream is open; jobs are created and then
   cancelled through gRPC (round robin over both replicas, so about half the commits
   go through the replica the gateway does not watch). For each commit: the seconds
   from the RPC's answer to the event's arrival on the stream (p50/p99; target p99
   ≤ 250 ms).
2. **Streams**: ``POST /v1/ai/jobs`` p50/p99 from the load process
   (:mod:`bench.load`) without streams, then with ``wait_streams`` streams open
   (5 per user, the users the load creates jobs for, so every create is fanned out to
   5 streams), and the gateway's resident memory before and with them.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from bench.harness import System, cpu_seconds, fresh_database, run_load_process, summary_ms
from launcher.token import mint_token
from zhixi.airuntime.job.v1 import request_response_pb2 as rr

if TYPE_CHECKING:
    from bench.scenarios import Params

#: Streams each user holds in the streams phase (SSE_MAX_STREAMS_PER_USER's default).
STREAMS_PER_USER = 5
#: Pause between two measured commits (s): independent changes, not a burst.
PACE_SECONDS = 0.02


def _rss_mb(pid: int) -> float:
    """Current resident set size (VmRSS) of a live process, in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def _read_events(
    response: httpx.Response, arrivals: asyncio.Queue[tuple[str, float]] | None = None
) -> int:
    """Read a stream; put each event's job id and arrival time in ``arrivals``.

    Returns:
        How many events came (when the stream ends).
    """
    count = 0
    async for line in response.aiter_lines():
        if line.startswith("data:"):
            count += 1
            if arrivals is not None:
                arrivals.put_nowait((json.loads(line[5:])["jobId"], time.perf_counter()))
    return count


async def _delivery(system: System, client: httpx.AsyncClient, n: int) -> dict[str, Any]:
    """Phase 1: commit-to-event seconds of ``n`` creates and ``n`` cancels."""
    assert system.stub is not None
    secret = system.launcher.env["JWT_SECRET"]
    user = "wait-bench-user"
    headers = {"Authorization": f"Bearer {mint_token(secret, sub=user)}"}
    arrivals: asyncio.Queue[tuple[str, float]] = asyncio.Queue()
    latencies: list[float] = []
    async with client.stream("GET", "/v1/ai/events", headers=headers) as response:
        reader = asyncio.create_task(_read_events(response, arrivals))
        await asyncio.sleep(1.0)  # the gateway's watch is open

        async def arrival(job_id: str, committed: float) -> None:
            try:
                async with asyncio.timeout(10):
                    while True:
                        got, at = await arrivals.get()
                        if got == job_id:  # (it may come before the RPC's answer)
                            latencies.append(max(0.0, at - committed))
                            return
            except TimeoutError:
                pass  # not delivered: counted by "delivered" < "commits"

        for _ in range(n):
            job_id = await system.create_job(user)
            await arrival(job_id, time.perf_counter())
            await system.stub.CancelJob(
                rr.CancelJobRequest(job_id=job_id, user_id=user, actor=f"user:{user}"),
                metadata=system.md(),
                timeout=30,
            )
            await arrival(job_id, time.perf_counter())
            await asyncio.sleep(PACE_SECONDS)
        reader.cancel()
    return {"commits": 2 * n, "delivered": len(latencies), "delivery": summary_ms(latencies)}


def _load(system: System, p: Params, users: int) -> dict[str, Any]:
    """One run of the gateway load process (POST /v1/ai/jobs), with the gateway's CPU
    milliseconds per request during it (the load process and the stream readers share
    the machine, so latency alone mixes in their CPU)."""
    pid = system.launcher.pids()["api_gateway"]
    cpu0 = cpu_seconds(pid)
    result = run_load_process(
        system, p.gateway_requests, p.gateway_concurrency, "--users", str(users)
    )
    result["gateway_cpu_ms_per_request"] = round(
        (cpu_seconds(pid) - cpu0) * 1000 / max(1, p.gateway_requests), 3
    )
    return result


async def _streams(system: System, p: Params) -> dict[str, Any]:
    """Phase 2: create latency and gateway memory without and with the streams open."""
    secret = system.launcher.env["JWT_SECRET"]
    users = max(1, p.wait_streams // STREAMS_PER_USER)
    pid = system.launcher.pids()["api_gateway"]
    without = await asyncio.to_thread(_load, system, p, users)
    rss_before = _rss_mb(pid)
    limits = httpx.Limits(max_connections=p.wait_streams + 10, max_keepalive_connections=0)
    received: list[int] = []
    async with httpx.AsyncClient(
        base_url=system.launcher.gateway_url, limits=limits, timeout=None, trust_env=False
    ) as client:
        opened: list[Any] = []
        statuses: dict[int, int] = {}

        async def hold(i: int, ready: asyncio.Event, done: asyncio.Event) -> None:
            token = mint_token(secret, sub=f"gw-user-{i % users}")
            async with client.stream(
                "GET", "/v1/ai/events", headers={"Authorization": f"Bearer {token}"}
            ) as response:
                statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
                ready.set()
                reader = asyncio.create_task(_read_events(response))
                await done.wait()
                reader.cancel()
                received.append(0)

        done = asyncio.Event()
        for i in range(p.wait_streams):
            ready = asyncio.Event()
            opened.append(asyncio.create_task(hold(i, ready, done)))
            await asyncio.wait_for(ready.wait(), 30)
        await asyncio.sleep(2.0)
        rss_open = _rss_mb(pid)
        with_streams = await asyncio.to_thread(_load, system, p, users)
        await asyncio.sleep(1.0)
        rss_load = _rss_mb(pid)
        done.set()
        await asyncio.gather(*opened, return_exceptions=True)
    return {
        "streams": p.wait_streams,
        "stream_statuses": {str(k): v for k, v in sorted(statuses.items())},
        "users": users,
        "create_without_streams": without,
        "create_with_streams": with_streams,
        "gateway_rss_mb": {
            "before_streams": round(rss_before, 1),
            "streams_open": round(rss_open, 1),
            "streams_open_after_load": round(rss_load, 1),
        },
        "streams_closed": len(received),
    }


async def waiting(p: Params) -> dict[str, Any]:
    """Scenario: reference §9.1 delivery latency and the cost of open streams (module doc)."""
    env = {"SSE_MAX_STREAMS_PER_USER": str(STREAMS_PER_USER)}
    with fresh_database(p.base_url) as url:
        async with System(
            url,
            workers=0,
            job_services=2,
            only=["job_service", "credential_service", "api_gateway"],
            extra_env=env,
        ) as system:
            async with httpx.AsyncClient(
                base_url=system.launcher.gateway_url, timeout=None, trust_env=False
            ) as client:
                delivery = await _delivery(system, client, p.wait_changes)
            streams = await _streams(system, p)
    return {
        "params": {
            "job_services": 2,
            "changes": p.wait_changes,
            "streams": p.wait_streams,
            "requests": p.gateway_requests,
            "concurrency": p.gateway_concurrency,
        },
        **delivery,
        **streams,
    }
