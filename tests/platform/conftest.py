"""Fixtures of the platform tests: two job_service replicas on one database.

``replicas`` starts two real ``job_service.app.serve`` servers (their own
engines, pools and reapers) on the same database — a SQLite file, or a fresh
MariaDB database from ``mysql_url`` (skipped when ``TEST_MYSQL_URL`` is unset).
The schema comes from the models (``create_all``) or, with ``migrate=True``,
from the shipped Alembic migrations run by the first replica. Learning data and credentials are the core tests' fakes.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any, cast

import grpc
import pytest
from sqlalchemy.engine import make_url

from airuntime_common import metadata
from airuntime_common.db import mysql_async_driver
from airuntime_common.enums import API_KEY_MODE, BREAKER_STATE, JOB_TYPE, TARGET_TYPE
from airuntime_common.errors import AppError
from airuntime_common.grpc_errors import from_rpc_error
from job_service.app import JobServiceApp, serve
from job_service.services.ports import AllowAllCredentials
from tests.unit.job_service.conftest import TOKEN, FakeLearning, create_schema, make_settings
from zhixi.airuntime.job.v1 import request_response_pb2 as rr
from zhixi.airuntime.job.v1 import service_pb2_grpc

LSA = "learning_state_analysis"
ANALYSIS: dict[str, Any] = {
    "summary": "steady progress",
    "masteryLevel": 0.5,
    "strengths": ["reading"],
    "risks": [],
    "evidence": [],
}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "stack_settings(**kw): job_service settings of the in-process stack"
    )


@dataclass
class Replica:
    """One running job_service and a gRPC stub to it."""

    name: str
    app: JobServiceApp
    channel: grpc.aio.Channel
    stub: service_pb2_grpc.JobServiceStub

    def md(
        self, instance: str | None = None, request_id: str | None = None
    ) -> tuple[tuple[str, str], ...]:
        return metadata.outgoing(TOKEN, instance, request_id)

    async def create(
        self,
        user_id: str = "u1",
        *,
        mode: str = "platform_key",
        plan: str = "",
        key: str | None = None,
        priority: int | None = None,
    ) -> Any:
        """CreateJob of a learning-state analysis of the user (raises AppError on refusal)."""
        req = rr.CreateJobRequest(
            user_id=user_id,
            job_type=JOB_TYPE.to_proto(LSA),  # type: ignore[arg-type]
            target_type=TARGET_TYPE.to_proto("user"),  # type: ignore[arg-type]
            target_id=user_id,
            api_key_mode=API_KEY_MODE.to_proto(mode),  # type: ignore[arg-type]
            plan=plan,
        )
        if key is not None:
            req.idempotency_key = key
        if priority is not None:
            req.priority = priority
        try:
            return await self.stub.CreateJob(req, metadata=self.md(), timeout=30)
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error(exc) from None

    async def rerun(self, job_id: str) -> Any:
        """Admin re-run (raises AppError on refusal)."""
        try:
            return await self.stub.RerunJob(
                rr.RerunJobRequest(job_id=job_id, actor="admin"), metadata=self.md(), timeout=30
            )
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error(exc) from None

    async def breaker(self) -> tuple[str, int]:
        """``(state, consecutiveFailures)`` as this replica reports it."""
        resp = await self.stub.GetCircuitBreaker(
            rr.GetCircuitBreakerRequest(), metadata=self.md(), timeout=10
        )
        return BREAKER_STATE.to_str(resp.breaker.state), resp.breaker.consecutive_failures

    async def reset_breaker(self) -> str:
        resp = await self.stub.ResetCircuitBreaker(
            rr.ResetCircuitBreakerRequest(), metadata=self.md(), timeout=10
        )
        return BREAKER_STATE.to_str(resp.breaker.state)

    async def claim(self, limit: int = 50, instance: str = "w") -> list[Any]:
        resp = await self.stub.ClaimJobs(
            rr.ClaimJobsRequest(capabilities=[JOB_TYPE.to_proto(LSA)], limit=limit),  # type: ignore[list-item]
            metadata=self.md(instance),
            timeout=10,
        )
        return list(resp.jobs)

    async def claim_one(self, instance: str = "w") -> Any:
        """Claim exactly one pending job as ``instance``."""
        resp = await self.stub.ClaimJobs(
            rr.ClaimJobsRequest(capabilities=[JOB_TYPE.to_proto(LSA)], limit=1),  # type: ignore[list-item]
            metadata=self.md(instance),
            timeout=10,
        )
        assert len(resp.jobs) == 1, "expected one claimable job"
        return resp.jobs[0]

    async def fail(self, job: Any, code: str, instance: str = "w") -> Any:
        return await self.stub.FailJob(
            rr.FailJobRequest(
                job_id=job.job_id, attempt_no=job.attempt_no, error_code=code, error_message="x"
            ),
            metadata=self.md(instance),
            timeout=10,
        )

    async def succeed(self, job: Any, instance: str = "w") -> Any:
        from google.protobuf import struct_pb2

        out = struct_pb2.Struct()
        out.update(cast(Any, ANALYSIS))
        return await self.stub.SubmitResult(
            rr.SubmitResultRequest(
                job_id=job.job_id,
                attempt_no=job.attempt_no,
                prompt_version="learning_state_analysis.v1",
                output_schema_version="v1",
                output=out,
            ),
            metadata=self.md(instance),
            timeout=10,
        )


@dataclass
class Replicas:
    a: Replica
    b: Replica
    url: str

    def __iter__(self) -> Any:
        return iter((self.a, self.b))


async def expect_refused(coro: Any, code: str) -> AppError:
    """Await ``coro`` and assert it raised AppError ``code``."""
    with pytest.raises(AppError) as err:
        await coro
    assert err.value.code == code, err.value
    return err.value


#: Tables wiped between MariaDB tests (everything on the job database's metadata).
def _all_tables() -> list[str]:
    from job_service.learning import tables as learning_models  # noqa: F401  (every table)
    from job_service.store import tables as models  # noqa: F401
    from job_service.store.base import Base

    return [t.name for t in Base.metadata.sorted_tables]


@pytest.fixture(scope="session")
def mariadb_schema() -> Iterator[str]:
    """One MariaDB database with the job schema for the whole session (DDL is slow there)."""
    if not os.environ.get("TEST_MYSQL_URL"):
        pytest.skip("TEST_MYSQL_URL not set")
    from sqlalchemy import create_engine

    from job_service.store.base import Base

    _all_tables()
    name = f"airt_platform_{uuid.uuid4().hex[:10]}"
    base = make_url(os.environ["TEST_MYSQL_URL"])
    server = create_engine(base.set(drivername="mysql+pymysql")._replace(database=None))
    with server.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
    engine = create_engine(base.set(drivername="mysql+pymysql", database=name))
    Base.metadata.create_all(engine)
    engine.dispose()
    try:
        yield base.set(drivername=mysql_async_driver(str(base)), database=name).render_as_string(
            hide_password=False
        )
    finally:
        with server.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS `{name}`")
        server.dispose()


def _wipe_mariadb(url: str) -> None:
    from sqlalchemy import create_engine

    engine = create_engine(make_url(url).set(drivername="mysql+pymysql"))
    with engine.begin() as conn:
        conn.exec_driver_sql("SET FOREIGN_KEY_CHECKS=0")
        for table in _all_tables():
            conn.exec_driver_sql(f"DELETE FROM `{table}`")
        conn.exec_driver_sql("SET FOREIGN_KEY_CHECKS=1")
    engine.dispose()


@pytest.fixture(params=["sqlite", "mariadb"])
def shared_db(request: pytest.FixtureRequest) -> str:
    """One database URL both replicas use: a fresh SQLite file, or the session's MariaDB
    database with every table emptied (skipped when ``TEST_MYSQL_URL`` is unset)."""
    if request.param == "sqlite":
        return str(request.getfixturevalue("sqlite_url"))
    url = str(request.getfixturevalue("mariadb_schema"))
    _wipe_mariadb(url)
    return url


@pytest.fixture
async def make_replicas(shared_db: str) -> AsyncIterator[Callable[..., Any]]:
    """Factory: two job_service replicas on ``shared_db`` with the same settings overrides.

    ``migrate=True`` builds a SQLite schema with the shipped Alembic migrations
    (first replica at start) instead of ``create_all``.
    """
    started: list[Replica] = []

    is_sqlite = shared_db.startswith("sqlite")

    async def factory(*, migrate: bool = False, **overrides: Any) -> Replicas:
        migrate = migrate and is_sqlite  # the MariaDB schema is built once per session
        if is_sqlite and not migrate:
            await create_schema(shared_db)
        pair: list[Replica] = []
        for i, name in enumerate(("A", "B")):
            settings = make_settings(
                shared_db, JOB_SERVICE_MIGRATE_ON_START=migrate and i == 0, **overrides
            )
            app = await serve(settings, learning=FakeLearning(), credentials=AllowAllCredentials())
            channel = grpc.aio.insecure_channel(app.address)
            replica = Replica(name, app, channel, service_pb2_grpc.JobServiceStub(channel))
            started.append(replica)
            pair.append(replica)
        # Each replica's FakeLearning keeps the snapshots it built; share them so
        # either replica can serve any job's snapshot.
        shared = pair[0].app.domain.learning
        pair[1].app.domain.learning = shared
        return Replicas(pair[0], pair[1], shared_db)

    yield factory
    for replica in started:
        await replica.channel.close()
        await replica.app.stop(grace=0.1)


def unique_user() -> str:
    return f"u-{uuid.uuid4().hex[:8]}"


async def wait_until(pred: Callable[[], Any], within: float = 10.0, step: float = 0.05) -> None:
    """Poll an async predicate until true (fails the test on timeout)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + within
    while not await pred():
        if loop.time() > end:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(step)
