"""Waiting across job_service replicas (reference §9.1), every service a real process on
MariaDB: a change committed through one replica reaches a held ``waitSeconds`` GET and
an event stream on the gateway, whose watch is on the *other* replica, within 1 s.

The worker takes only ``flashcard_generation`` jobs here, so the analysis job under
test moves only when the test moves it, through the replica of its choice.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from airuntime_common import metadata
from tests.e2e.conftest import RunningSystem
from tests.integration.waiting_support import SseReader
from zhixi.airuntime.job.v1 import request_response_pb2 as rr
from zhixi.airuntime.job.v1 import service_pb2_grpc as job_grpc

pytestmark = [pytest.mark.mysql, pytest.mark.timeout(240)]


def _watchers(metrics_port: str) -> float:
    """``airt_job_watchers`` of one replica (its open WatchJobs streams)."""
    text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text
    for line in text.splitlines():
        if line.startswith("airt_job_watchers "):
            return float(line.split()[1])
    return 0.0


async def _watched_replica(replicas: list[Any], within: float = 15.0) -> int:
    """The index of the replica the gateway's one watch is on."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        counts = [
            await asyncio.to_thread(_watchers, s.env["JOB_SERVICE_METRICS_PORT"]) for s in replicas
        ]
        if sorted(counts) == [0.0, 1.0]:
            return counts.index(1.0)
        await asyncio.sleep(0.1)
    raise AssertionError(f"no single replica holds the gateway's watch: {counts}")


async def _scenario(running: RunningSystem) -> None:
    replicas = [s for s in running.launcher.plan.services if s.kind == "job_service"]
    assert len(replicas) == 2
    user = "e2e-waiter"
    token = running.token(user)
    job = running.create_job(token, user)
    job_id = job["jobId"]
    async with httpx.AsyncClient(
        base_url=running.gateway_url,
        headers={"Authorization": f"Bearer {token}"},
        timeout=60.0,
        trust_env=False,
    ) as http:
        first = await http.get(f"/v1/ai/jobs/{job_id}")
        etag = first.headers["ETag"]
        async with http.stream("GET", f"/v1/ai/jobs/{job_id}/events") as stream:
            sse = SseReader(stream)
            opening = await sse.next(10)
            assert opening is not None and opening.id == etag.strip('"')
            held = asyncio.create_task(
                http.get(
                    f"/v1/ai/jobs/{job_id}",
                    params={"waitSeconds": 30},
                    headers={"If-None-Match": etag},
                )
            )
            watched = await _watched_replica(replicas)
            other = replicas[1 - watched]
            address = other.env["JOB_SERVICE_LISTEN"]
            async with grpc.aio.insecure_channel(address) as channel:
                stub = job_grpc.JobServiceStub(channel)
                md = metadata.outgoing(running.internal_token, "e2e-runtime")
                await asyncio.sleep(0.3)  # the held GET is waiting by now
                assert not held.done()
                lock = await stub.LockJob(rr.LockJobRequest(job_id=job_id), metadata=md)
                committed = time.monotonic()
                reply = await asyncio.wait_for(held, 5)
                got_reply = time.monotonic() - committed
                event = await sse.next(5)
                got_event = time.monotonic() - committed
                assert reply.status_code == 200, reply.text
                assert reply.json()["status"] == "locked"
                assert event is not None and json.loads(event.data)["status"] == "locked"
                assert event.id == reply.headers["ETag"].strip('"')
                assert got_reply < 1.0 and got_event < 1.0, (got_reply, got_event)

                await stub.FailJob(
                    rr.FailJobRequest(
                        job_id=job_id,
                        attempt_no=lock.attempt_no,
                        error_code="INVALID_SNAPSHOT",
                        error_message="e2e: final",
                    ),
                    metadata=md,
                )
                committed = time.monotonic()
                last = await sse.next(5)
                assert last is not None and json.loads(last.data)["status"] == "failed"
                assert time.monotonic() - committed < 1.0
                assert await sse.next(5) is None  # the stream ends after the terminal event
            await sse.close()


def test_a_change_through_one_replica_reaches_waiters_on_the_other(
    mysql_url: str, tmp_path: Path
) -> None:
    running = RunningSystem.start(
        tmp_path,
        {
            "DATABASE_URL": mysql_url,
            "CREDENTIAL_DATABASE_URL": mysql_url,
            "WORKER_CAPABILITIES": "flashcard_generation",
        },
        metrics=True,
        job_services=2,
    )
    try:
        asyncio.run(_scenario(running))
    except BaseException:
        print(running.diagnostics())
        raise
    finally:
        running.close()
