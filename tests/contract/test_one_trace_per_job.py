"""One trace per job across the four services (reference §9.5).

gateway, job_service, credential_service and a worker run in this process against
the DeepSeek stand-in, each with its own tracing (its own ``service.name``) into
one in-memory exporter. A job created through the public API fails its first
attempt (the stand-in answers 503) and succeeds its second: the create's request
and both attempts (claim, resolve, model call, fail / result) must be one trace,
holding spans of all four services, and no key, prompt text, JWT or service token.

job_service is set up first: it is the process's tracing, which its servers and
channels take (its start-up passes none).
"""

from __future__ import annotations

import asyncio
import base64
import os
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from opentelemetry.sdk.trace import ReadableSpan

from airuntime_common.grpc_server import insecure_or_tls_channel
from api_gateway.app import create_app
from api_gateway.settings import GatewaySettings
from credential_service.app import ServiceHandle
from credential_service.app import serve as serve_credentials
from credential_service.settings import CredentialSettings
from job_service.app import JobServiceApp
from job_service.app import serve as serve_jobs
from job_service.services.ports import GrpcCredentialChecker
from launcher.token import mint_token
from model_standin import StandIn, run_standin
from runtime_worker.app import WorkerApp
from runtime_worker.settings import WorkerSettings
from runtime_worker.spans import JOB_ATTEMPT, JOB_ID
from tests.contract.conftest import JWT_SECRET, TOKEN, LateCredentials
from tests.tracing_support import Capture, capture, leaks, service_of
from tests.unit.job_service.conftest import create_schema, make_settings

__all__ = ["capture"]


PLATFORM_KEY = "sk-canary-platform-" + secrets.token_hex(10)
CANARY_SENTENCE = "Purple herons of the canary marsh nest only in the winter rain."
SERVICES = {"api_gateway", "job_service", "credential_service", "runtime_worker"}


@dataclass
class Stack:
    standin: StandIn
    jobs: JobServiceApp
    credentials: ServiceHandle
    gateway: FastAPI
    http: httpx.AsyncClient
    worker: WorkerApp


@pytest.fixture
async def stack(tmp_path: Path, capture: Capture) -> AsyncIterator[Stack]:
    capture.setup("job_service")
    capture.setup("credential_service")
    gateway_tracing = capture.setup("api_gateway")
    capture.setup("runtime_worker")
    job_url = f"sqlite+aiosqlite:///{tmp_path / 'jobs.db'}"
    await create_schema(job_url)
    async with run_standin(port=0) as standin:
        checker = LateCredentials()
        jobs = await serve_jobs(
            make_settings(job_url, RUNTIME_SERVICE_TOKEN=TOKEN, LOCK_LEASE_SECONDS=10),
            credentials=checker,
            start_metrics=False,
        )
        credentials = await serve_credentials(
            CredentialSettings(
                CREDENTIAL_DATABASE_URL=f"sqlite+aiosqlite:///{tmp_path / 'credentials.db'}",
                CREDENTIAL_ENCRYPTION_KEYS=f"k1:{base64.b64encode(os.urandom(32)).decode()}",
                DEEPSEEK_API_KEY=PLATFORM_KEY,
                DEEPSEEK_BASE_URL=standin.base_url,
                RUNTIME_SERVICE_TOKEN=TOKEN,
                CREDENTIAL_SERVICE_LISTEN="127.0.0.1:0",
                CREDENTIAL_SERVICE_METRICS_PORT=0,
                JOB_SERVICE_ADDR=jobs.address,
            )
        )
        cred_addr = f"127.0.0.1:{credentials.port}"
        checker.inner = GrpcCredentialChecker(cred_addr, TOKEN)
        job_channel = insecure_or_tls_channel(jobs.address, tracing=gateway_tracing)
        cred_channel = insecure_or_tls_channel(cred_addr, tracing=gateway_tracing)
        gateway = create_app(
            GatewaySettings(RUNTIME_SERVICE_TOKEN=TOKEN, JWT_SECRET=JWT_SECRET),
            job_channel=job_channel,
            credential_channel=cred_channel,
        )
        http = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=gateway), base_url="http://gateway"
        )
        worker = WorkerApp(
            WorkerSettings(
                RUNTIME_SERVICE_TOKEN=TOKEN,
                JOB_SERVICE_ADDR=jobs.address,
                CREDENTIAL_SERVICE_ADDR=cred_addr,
                RUNTIME_WORKER_LISTEN="127.0.0.1:0",
                RUNTIME_INSTANCE_ID="trace-worker",
                WORKER_METRICS_PORT=0,
                LOCK_LEASE_SECONDS=10,
                HEARTBEAT_INTERVAL_SECONDS=1,
                POLL_INTERVAL_MS=50,
                LONG_POLL_WAIT_MS=200,
                SHUTDOWN_GRACE_SECONDS=1,
            )
        )
        await worker.start()
        try:
            yield Stack(standin, jobs, credentials, gateway, http, worker)
        finally:
            await worker.stop(0.5)
            await http.aclose()
            await job_channel.close()
            await cred_channel.close()
            await credentials.stop(grace=0.1)
            await jobs.stop(grace=0.1)


async def wait_until_terminal(http: httpx.AsyncClient, job_id: str, user: dict[str, str]) -> Any:
    async with asyncio.timeout(30):
        while True:
            job = (await http.get(f"/v1/ai/jobs/{job_id}", headers=user)).json()
            if job["status"] in ("succeeded", "failed", "cancelled"):
                return job
            await asyncio.sleep(0.05)


def in_trace(spans: list[ReadableSpan], trace_id: int) -> list[ReadableSpan]:
    return [s for s in spans if s.context is not None and s.context.trace_id == trace_id]


async def test_a_jobs_create_and_every_attempt_are_one_trace_over_four_services(
    stack: Stack, capture: Capture
) -> None:
    jwt = mint_token(JWT_SECRET, sub="u-trace")
    user = {"Authorization": f"Bearer {jwt}"}
    material = await stack.http.post(
        "/v1/materials",
        json={"title": "Herons", "content": f"{CANARY_SENTENCE}\n\nHerons wade in shallow water."},
        headers=user,
    )
    assert material.status_code == 201, material.text
    stack.standin.add_faults([{"kind": "status", "status": 503}])  # attempt 1 fails, retried
    created = await stack.http.post(
        "/v1/ai/jobs",
        json={
            "jobType": "flashcard_generation",
            "targetType": "material",
            "targetId": material.json()["materialId"],
            "params": {"count": 2},
        },
        headers=user,
    )
    assert created.status_code == 201, created.text
    job_id = created.json()["jobId"]
    job = await wait_until_terminal(stack.http, job_id, user)
    assert job["status"] == "succeeded" and job["attemptNo"] == 2
    await stack.worker.stop(0.5)

    create = capture.one("POST /v1/ai/jobs")
    assert create.context is not None
    spans = in_trace(capture.spans(), create.context.trace_id)
    assert {service_of(s) for s in spans} == SERVICES
    by_id = {s.context.span_id: s for s in spans if s.context is not None}
    attempts = sorted(
        (s for s in spans if s.name == "attempt" and (s.attributes or {}).get(JOB_ID) == job_id),
        key=lambda s: (s.attributes or {})[JOB_ATTEMPT],
    )
    assert [(s.attributes or {})[JOB_ATTEMPT] for s in attempts] == [1, 2]
    for attempt in attempts:
        # each attempt hangs under the create: the gateway's CreateJob call or
        # job_service's CreateJob span, whichever the stored traceparent names
        assert attempt.parent is not None
        parent = by_id[attempt.parent.span_id]
        assert parent.name == "/zhixi.airuntime.job.v1.JobService/CreateJob"
        steps = {s.name for s in spans if s.parent and s.parent.span_id == attempt.context.span_id}  # type: ignore[union-attr]
        assert {"claim", "resolve", "model call"} <= steps
    assert "fail" in {
        s.name
        for s in spans
        if s.parent and s.parent.span_id == attempts[0].context.span_id  # type: ignore[union-attr]
    }
    # the resolve reached credential_service, whose lease check reached job_service
    names = {(service_of(s), s.name) for s in spans}
    assert (
        "credential_service",
        "/zhixi.airuntime.credential.v1.CredentialService/ResolveCredential",
    ) in names
    assert ("job_service", "/zhixi.airuntime.job.v1.JobService/SubmitResult") in names

    found = leaks(capture.spans(), [PLATFORM_KEY, CANARY_SENTENCE, jwt, TOKEN])
    assert not found, found
