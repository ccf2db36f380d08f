"""Fixtures of credential_service tests: master keys, a fake JobService on an
ephemeral port, and a real credential_service served in-process on SQLite."""

from __future__ import annotations

import base64
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from airuntime_common import metadata
from airuntime_common.enums import API_KEY_MODE
from airuntime_common.errors import AppError, ErrorCode
from airuntime_common.grpc_errors import abort
from airuntime_common.grpc_server import GrpcServer
from credential_service.app import ServiceHandle, serve
from credential_service.settings import CredentialSettings
from zhixi.airuntime.credential.v1 import service_pb2_grpc as cred_grpc
from zhixi.airuntime.job.v1 import request_response_pb2 as job_rr
from zhixi.airuntime.job.v1 import service_pb2_grpc as job_grpc

TOKEN = "test-internal-token-0123456789"
INSTANCE = "worker-a"

ENV_VARS = (
    "CREDENTIAL_DATABASE_URL",
    "CREDENTIAL_ENCRYPTION_KEYS",
    "DEEPSEEK_API_KEY",
    "DEEPSEEK_BASE_URL",
    "MODEL_PROVIDERS",
    "ALLOW_PLATFORM_KEY_STANDIN",
    "RUNTIME_SERVICE_TOKEN",
    "CREDENTIAL_SERVICE_LISTEN",
    "CREDENTIAL_SERVICE_METRICS_PORT",
    "JOB_SERVICE_ADDR",
)


def make_key(kid: str) -> str:
    """A fresh ``kid:base64key`` entry with a random 32-byte key."""
    return f"{kid}:{base64.b64encode(os.urandom(32)).decode()}"


def flip(stored: str) -> str:
    """Tamper with a stored (base64) ciphertext: flip one bit of its first byte."""
    raw = base64.b64decode(stored)
    return base64.b64encode(bytes([raw[0] ^ 0x01]) + raw[1:]).decode()


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)


@dataclass
class Lease:
    user_id: str
    api_key_mode: str = "user_deepseek_key"
    credential_id: str | None = None
    model_provider: str = "deepseek"
    model_name: str = "deepseek-chat"


class FakeJobService(job_grpc.JobServiceServicer):  # type: ignore[misc]
    """Answers VerifyLease from a table of held leases ``(job, instance, attempt)``."""

    def __init__(self) -> None:
        self.jobs: set[str] = set()
        self.leases: dict[tuple[str, str, int], Lease] = {}
        self.calls: list[dict[str, Any]] = []

    def hold(self, job_id: str, instance: str, attempt_no: int, lease: Lease) -> None:
        self.jobs.add(job_id)
        self.leases[(job_id, instance, attempt_no)] = lease

    async def VerifyLease(
        self, request: job_rr.VerifyLeaseRequest, context: Any
    ) -> job_rr.VerifyLeaseResponse:
        self.calls.append(
            {
                "job_id": request.job_id,
                "instance": request.runtime_instance_id,
                "attempt_no": request.attempt_no,
                "md_instance": metadata.get(context, metadata.RUNTIME_INSTANCE_ID),
            }
        )
        if request.job_id not in self.jobs:
            await abort(context, AppError(ErrorCode.JOB_NOT_FOUND, "no such job"))
        lease = self.leases.get((request.job_id, request.runtime_instance_id, request.attempt_no))
        if lease is None:
            await abort(context, AppError(ErrorCode.LOCK_NOT_HELD, "lease not held"))
        reply = job_rr.VerifyLeaseResponse(
            user_id=lease.user_id,
            api_key_mode=API_KEY_MODE.to_proto(lease.api_key_mode),  # type: ignore[arg-type]
            model_provider=lease.model_provider,
            model_name=lease.model_name,
        )
        if lease.credential_id is not None:
            reply.credential_id = lease.credential_id
        return reply


@dataclass
class Env:
    """A running credential_service with its fake job_service and a client stub."""

    handle: ServiceHandle
    settings: CredentialSettings
    fake: FakeJobService
    stub: cred_grpc.CredentialServiceStub
    channel: grpc.aio.Channel
    db_path: Path
    extra: list[Any] = field(default_factory=list)

    def md(self, instance: str | None = INSTANCE) -> tuple[tuple[str, str], ...]:
        return metadata.outgoing(TOKEN, instance)


def settings_for(db_path: Path, keys: str, **overrides: Any) -> CredentialSettings:
    values: dict[str, Any] = {
        "CREDENTIAL_DATABASE_URL": f"sqlite+aiosqlite:///{db_path}",
        "CREDENTIAL_ENCRYPTION_KEYS": keys,
        "RUNTIME_SERVICE_TOKEN": TOKEN,
        "CREDENTIAL_SERVICE_LISTEN": "127.0.0.1:0",
        "CREDENTIAL_SERVICE_METRICS_PORT": 0,
        "DEEPSEEK_BASE_URL": "http://127.0.0.1:9/standin",
    }
    values.update(overrides)
    return CredentialSettings(**values)


StartFn = Callable[..., Awaitable[Env]]


@pytest.fixture
async def start_env(tmp_path: Path) -> AsyncIterator[StartFn]:
    """Start (fake job_service, credential_service) pairs; all stopped at teardown.

    Call ``await start_env(keys=..., db_name=..., **settings_overrides)``.
    """
    job_servers: list[GrpcServer] = []
    envs: list[Env] = []
    default_keys = ",".join([make_key("k1")])

    async def start(keys: str | None = None, db_name: str = "cred.db", **overrides: Any) -> Env:
        fake = FakeJobService()
        job_server = GrpcServer(
            token=TOKEN,
            address="127.0.0.1:0",
            service_names=["zhixi.airuntime.job.v1.JobService"],
            register=lambda s: job_grpc.add_JobServiceServicer_to_server(fake, s),
        )
        await job_server.start()
        job_servers.append(job_server)
        db_path = tmp_path / db_name
        overrides.setdefault("JOB_SERVICE_ADDR", f"127.0.0.1:{job_server.port}")
        settings = settings_for(db_path, keys or default_keys, **overrides)
        handle = await serve(settings)
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{handle.port}")
        env = Env(
            handle=handle,
            settings=settings,
            fake=fake,
            stub=cred_grpc.CredentialServiceStub(channel),
            channel=channel,
            db_path=db_path,
        )
        envs.append(env)
        return env

    yield start
    for env in reversed(envs):
        await env.channel.close()
        await env.handle.stop(grace=0.5)
    for job_server in job_servers:
        await job_server.stop(grace=0.5)


@pytest.fixture
async def env(start_env: StartFn) -> Env:
    """One running service with a single master key ``k1``."""
    return await start_env()
