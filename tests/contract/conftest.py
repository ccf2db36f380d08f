"""Contract test fixtures.

* JobService-only tests reuse the job_service core fixtures (``server``).
* The runtime contract suite (``test_runtime_contract.py``) runs against a
  :class:`RuntimeStack`: the real job_service (real learning-data modules) and
  credential_service served in-process on ephemeral ports, and the real
  api_gateway app wired to them through ``httpx.ASGITransport``. The ``rt``
  fixture is parametrized ``["grpc", "session", "rest"]`` (``session``: the runtime
  calls over one ``RuntimeSession`` stream, as the worker sends them): ``rt("w1")`` is a
  :class:`~tests.contract.transports.RuntimeTransport` for instance ``w1`` over
  that transport, so every test runs once per transport.

Settings of a stack can be overridden per test with
``@pytest.mark.stack_settings(LOCK_LEASE_SECONDS=..., ...)`` (job_service
variables). ``contract_db`` picks the job database: SQLite by default; tests
parametrize it indirectly with ``"mysql"`` for MariaDB (skipped without
``TEST_MYSQL_URL``).
"""

from __future__ import annotations

import asyncio
import base64
import os
import shutil
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import update

from airuntime_common import metadata
from airuntime_common.enums import API_KEY_MODE, JOB_TYPE, TARGET_TYPE
from api_gateway.app import create_app
from api_gateway.settings import GatewaySettings
from credential_service.app import ServiceHandle
from credential_service.app import serve as serve_credentials
from credential_service.settings import CredentialSettings
from job_service.app import JobServiceApp
from job_service.app import serve as serve_jobs
from job_service.services.ports import GrpcCredentialChecker
from job_service.store.tables import jobs, workers
from runtime_worker.session import RuntimeSession
from tests.contract.transports import (
    GrpcTransport,
    RestTransport,
    RuntimeTransport,
    SessionTransport,
    job_json,
    to_json,
)
from tests.unit.job_service.conftest import (  # noqa: F401
    create_schema,
    db_url,
    make_server,
    make_settings,
    server,
)
from zhixi.airuntime.credential.v1 import request_response_pb2 as cred_rr
from zhixi.airuntime.credential.v1 import service_pb2_grpc as cred_grpc
from zhixi.airuntime.job.v1 import request_response_pb2 as rr
from zhixi.airuntime.job.v1 import service_pb2_grpc as job_grpc

TOKEN = "contract-token-0123456789abcdef"
JWT_SECRET = "contract-jwt-secret-0123456789abcdef"
PLATFORM_KEY = "sk-contract-platform-key-1234"
BASE_URL = "http://127.0.0.1:9/v1"
USER = "u1"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "stack_settings(**kw): job_service settings of the contract stack"
    )


@dataclass
class RuntimeStack:
    """job_service + credential_service + the gateway app, in-process."""

    jobs: JobServiceApp
    credentials: ServiceHandle
    job_channel: grpc.aio.Channel
    credential_channel: grpc.aio.Channel
    gateway: FastAPI
    http: httpx.AsyncClient
    sessions: list[RuntimeSession] = field(default_factory=list)

    @property
    def stub(self) -> job_grpc.JobServiceStub:
        return job_grpc.JobServiceStub(self.job_channel)

    @property
    def cred_stub(self) -> cred_grpc.CredentialServiceStub:
        return cred_grpc.CredentialServiceStub(self.credential_channel)

    def transport(self, kind: str, instance: str) -> RuntimeTransport:
        """A transport of ``kind`` (``grpc`` | ``session`` | ``rest``) bound to runtime
        ``instance``."""
        if kind == "grpc":
            return GrpcTransport(self.job_channel, self.credential_channel, TOKEN, instance)
        if kind == "session":
            made = SessionTransport(self.job_channel, self.credential_channel, TOKEN, instance)
            self.sessions.append(made.session)
            return made
        return RestTransport(self.http, TOKEN, instance)

    async def create(
        self,
        *,
        job_type: str = "learning_state_analysis",
        user_id: str = USER,
        api_key_mode: str = "platform_key",
        **kw: Any,
    ) -> dict[str, Any]:
        """Create a job through ``JobService.CreateJob``; returns its ``Job`` JSON.

        ``kw`` may set ``priority``, ``max_retry_count``, ``timeout_seconds``,
        ``target_type``/``target_id`` (default: the user itself) and ``params``.
        """
        params = kw.pop("params", None)
        req = rr.CreateJobRequest(
            user_id=user_id,
            job_type=JOB_TYPE.to_proto(job_type),  # type: ignore[arg-type]
            target_type=TARGET_TYPE.to_proto(kw.pop("target_type", "user")),  # type: ignore[arg-type]
            target_id=kw.pop("target_id", user_id),
            api_key_mode=API_KEY_MODE.to_proto(api_key_mode),  # type: ignore[arg-type]
            actor=f"admin:{user_id}",
            **kw,
        )
        if params is not None:
            req.params.update(params)
        resp = await self.stub.CreateJob(req, metadata=metadata.outgoing(TOKEN))
        return job_json(resp.job)

    async def put_key(self, api_key: str, user_id: str = USER, provider: str = "deepseek") -> str:
        """Store the user's key for ``provider``; returns the credential id."""
        resp = await self.cred_stub.PutCredential(
            cred_rr.PutCredentialRequest(user_id=user_id, provider=provider, api_key=api_key),
            metadata=metadata.outgoing(TOKEN),
        )
        return str(resp.credential.credential_id)

    async def delete_key(self, user_id: str = USER) -> None:
        """Delete the user's stored key."""
        await self.cred_stub.DeleteCredential(
            cred_rr.DeleteCredentialRequest(user_id=user_id), metadata=metadata.outgoing(TOKEN)
        )

    async def get(self, job_id: str) -> dict[str, Any]:
        """The job's current ``Job`` JSON (admin view)."""
        resp = await self.stub.GetJob(
            rr.GetJobRequest(job_id=job_id), metadata=metadata.outgoing(TOKEN)
        )
        return job_json(resp.job)

    async def history(self, job_id: str) -> list[tuple[str | None, str | None, str | None]]:
        """``(fromStatus, toStatus, errorCode)`` of every event, oldest first."""
        resp = await self.stub.GetJob(
            rr.GetJobRequest(job_id=job_id, include_history=True),
            metadata=metadata.outgoing(TOKEN),
        )
        return [(e["fromStatus"], e["toStatus"], e["errorCode"]) for e in map(to_json, resp.events)]

    async def invocations(self, job_id: str) -> list[dict[str, Any]]:
        """The job's invocation logs (admin view)."""
        resp = await self.stub.GetJob(
            rr.GetJobRequest(job_id=job_id, include_history=True),
            metadata=metadata.outgoing(TOKEN),
        )
        return [to_json(i) for i in resp.invocations]

    async def cancel(self, job_id: str) -> dict[str, Any]:
        """Cancel as the owner (pending → cancelled; leased → cancelRequested)."""
        resp = await self.stub.CancelJob(
            rr.CancelJobRequest(job_id=job_id, user_id=USER, actor=f"user:{USER}"),
            metadata=metadata.outgoing(TOKEN),
        )
        return job_json(resp.job)

    async def lapse_lease(self, job_id: str) -> None:
        """Move the job's ``lockUntil`` into the past (on the DB clock), as if time passed."""
        domain = self.jobs.domain
        async with domain.sessions() as session, session.begin():
            await session.execute(
                update(jobs).where(jobs.c.job_id == job_id).values(lock_until=domain.clock.plus(-5))
            )

    async def sweep(self) -> int:
        """One reaper pass (the background reaper is configured not to run)."""
        return await self.jobs.reaper.sweep()

    async def age_workers(self, seconds: float) -> None:
        """Make every registered runtime instance look last seen ``seconds`` ago."""
        domain = self.jobs.domain
        async with domain.sessions() as session, session.begin():
            await session.execute(update(workers).values(last_seen_at=domain.clock.plus(-seconds)))


class LateCredentials:
    """job_service's credential checker, connected once credential_service is up.

    job_service starts first (credential_service verifies leases with it), so
    the real :class:`GrpcCredentialChecker` is plugged in afterwards.
    """

    def __init__(self) -> None:
        self.inner: GrpcCredentialChecker | None = None

    async def check(self, user_id: str, api_key_mode: str) -> str | None:
        assert self.inner is not None
        return await self.inner.check(user_id, api_key_mode)

    async def mark_invalid(self, credential_id: str, reason: str) -> None:
        assert self.inner is not None
        await self.inner.mark_invalid(credential_id, reason)

    async def close(self) -> None:
        if self.inner is not None:
            await self.inner.close()


@dataclass(frozen=True)
class Templates:
    """Empty, fully migrated SQLite databases, copied for each stack (schema DDL is slow)."""

    jobs: Path
    credentials: Path


async def make_templates(directory: Path) -> Templates:
    """Build the job schema and migrate the credential schema once, in ``directory``."""
    from credential_service import migrate as credential_migrate

    templates = Templates(directory / "jobs.db", directory / "credentials.db")
    await create_schema(f"sqlite+aiosqlite:///{templates.jobs}")
    await credential_migrate.upgrade(f"sqlite+aiosqlite:///{templates.credentials}")
    return templates


async def start_stack(
    tmp: Path,
    job_url: str,
    templates: Templates | None = None,
    *,
    credential_overrides: dict[str, Any] | None = None,
    **overrides: Any,
) -> RuntimeStack:
    """Start the three parts; the caller stops them with :func:`stop_stack`.

    Args:
        tmp: a directory for this stack's SQLite files.
        job_url: the job database (SQLite under ``tmp`` or a fresh MariaDB database).
        templates: copy these schemas instead of building them (SQLite only).
        credential_overrides: credential_service settings (e.g. ``MODEL_PROVIDERS``).
        overrides: job_service settings.
    """
    credential_db = tmp / "credentials.db"
    if templates is not None:
        shutil.copyfile(templates.credentials, credential_db)
    sqlite_prefix = "sqlite+aiosqlite:///"
    if templates is not None and job_url.startswith(sqlite_prefix):
        shutil.copyfile(templates.jobs, job_url[len(sqlite_prefix) :])
    else:
        await create_schema(job_url)
    values: dict[str, Any] = {
        "RUNTIME_SERVICE_TOKEN": TOKEN,
        "LOCK_LEASE_SECONDS": 30,
        "RETRY_BACKOFF_BASE_SECONDS": 0,
        "RETRY_BACKOFF_MAX_SECONDS": 0,
        "POLL_INTERVAL_MS": 1000,
    }
    values.update(overrides)
    checker = LateCredentials()
    jobs_app = await serve_jobs(
        make_settings(job_url, **values), credentials=checker, start_metrics=False
    )
    cred_values: dict[str, Any] = {
        "CREDENTIAL_DATABASE_URL": f"sqlite+aiosqlite:///{credential_db}",
        "CREDENTIAL_ENCRYPTION_KEYS": f"k1:{base64.b64encode(os.urandom(32)).decode()}",
        "DEEPSEEK_API_KEY": PLATFORM_KEY,
        "DEEPSEEK_BASE_URL": BASE_URL,
        "RUNTIME_SERVICE_TOKEN": TOKEN,
        "CREDENTIAL_SERVICE_LISTEN": "127.0.0.1:0",
        "CREDENTIAL_SERVICE_METRICS_PORT": 0,
        "JOB_SERVICE_ADDR": jobs_app.address,
    }
    cred_values.update(credential_overrides or {})
    cred_settings = CredentialSettings(**cred_values)
    creds = await serve_credentials(cred_settings, run_migrations=templates is None)
    checker.inner = GrpcCredentialChecker(f"127.0.0.1:{creds.port}", TOKEN)
    job_channel = grpc.aio.insecure_channel(jobs_app.address)
    cred_channel = grpc.aio.insecure_channel(f"127.0.0.1:{creds.port}")
    gateway = create_app(
        GatewaySettings(
            RUNTIME_SERVICE_TOKEN=TOKEN,
            JWT_SECRET=JWT_SECRET,
            JOB_SERVICE_ADDR=jobs_app.address,
            CREDENTIAL_SERVICE_ADDR=f"127.0.0.1:{creds.port}",
        ),
        job_channel=job_channel,
        credential_channel=cred_channel,
    )
    http = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=gateway, raise_app_exceptions=False),
        base_url="http://gateway",
    )
    return RuntimeStack(jobs_app, creds, job_channel, cred_channel, gateway, http)


async def stop_stack(stack: RuntimeStack) -> None:
    for session in stack.sessions:
        await session.close()
    await stack.http.aclose()
    await stack.job_channel.close()
    await stack.credential_channel.close()
    await stack.credentials.stop(grace=0.1)
    await stack.jobs.stop(grace=0.1)


@pytest.fixture(scope="session")
def contract_templates(tmp_path_factory: pytest.TempPathFactory) -> Templates:
    """The schema templates, built once per test session."""
    directory = tmp_path_factory.mktemp("contract-templates")
    return asyncio.run(make_templates(directory))


@pytest.fixture(params=["sqlite"])
def contract_db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The job database URL: SQLite unless parametrized ``"mysql"`` (indirect)."""
    if request.param == "mysql":
        url: str = request.getfixturevalue("mysql_url")
        return url
    return f"sqlite+aiosqlite:///{tmp_path / 'jobs.db'}"


@pytest.fixture
async def stack(
    request: pytest.FixtureRequest,
    contract_db: str,
    contract_templates: Templates,
    tmp_path: Path,
) -> AsyncIterator[RuntimeStack]:
    """A running :class:`RuntimeStack` (settings from ``@pytest.mark.stack_settings``)."""
    marker = request.node.get_closest_marker("stack_settings")
    overrides = dict(marker.kwargs) if marker else {}
    started = await start_stack(tmp_path, contract_db, contract_templates, **overrides)
    try:
        yield started
    finally:
        await stop_stack(started)


@pytest.fixture(params=["grpc", "session", "rest"])
def transport_kind(request: pytest.FixtureRequest) -> str:
    """Which transport this run of the test uses."""
    kind: str = request.param
    return kind


@pytest.fixture
def rt(stack: RuntimeStack, transport_kind: str) -> Callable[[str], RuntimeTransport]:
    """``rt(instance)`` → the parametrized transport bound to that runtime instance."""

    def make(instance: str = "w1") -> RuntimeTransport:
        return stack.transport(transport_kind, instance)

    return make
