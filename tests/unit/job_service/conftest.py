"""Fixtures for job_service core tests: a domain on a fresh database and a real gRPC server.

The learning-data seam is replaced by :class:`FakeLearning` so the core is
tested on its own; it writes a marker row per accepted result so tests can
see business rows commit or roll back with the job.

Every test runs on SQLite and, with ``TEST_MYSQL_URL``, again on MariaDB (the
``db_url`` fixture is parametrized), as River's driver suite runs on every
driver: one body per operation, the same tests on both databases.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from sqlalchemy import false, insert, select

from airuntime_common import metadata
from airuntime_common.db import make_sessionmaker
from airuntime_common.errors import AppError, ErrorCode
from airuntime_common.outputs import validate_output
from job_service.app import JobServiceApp, serve
from job_service.learning import tables as learning_models  # noqa: F401  (all tables on one metadata)
from job_service.maintenance import breaker as breaker_mod
from job_service.services.domain import JobDomain
from job_service.services.inputs import CreateJobInput
from job_service.services.ports import AllowAllCredentials, SnapshotRead, SnapshotsRead
from job_service.settings import JobServiceSettings
from job_service.store.base import Base
from job_service.store.cache import Sql, stable
from job_service.store.clock import DbClock
from job_service.store.engine import make_job_engine
from job_service.store.records import JobRecord
from job_service.store.tables import workers
from zhixi.airuntime.job.v1 import service_pb2_grpc

TOKEN = "test-token"

ANALYSIS_OUTPUT: dict[str, Any] = {
    "summary": "steady progress",
    "masteryLevel": 0.5,
    "strengths": ["reading"],
    "risks": [],
    "evidence": [],
}


@dataclass(frozen=True)
class FakeSnapshot:
    snapshot_id: str
    schema_version: str
    target_type: str
    target_id: str
    payload: dict[str, Any]
    content_hash: str


@dataclass(frozen=True)
class FakePrepared:
    """A validated output's writes: one marker business row (in ``ai_runtime_workers``)."""

    job_id: str

    def statements(self, clock: Any = None) -> list[Sql]:
        row = {"instance_id": f"biz-{self.job_id}", "capabilities": [], "in_flight": 0,
               "last_seen_at": _epoch()}  # fmt: skip
        return [Sql(("fake_business_row",), lambda: insert(workers), row)]


@dataclass
class FakeLearning:
    """Stand-in for the learning-data module (snapshots, plans, business rows)."""

    snapshots: dict[str, FakeSnapshot] = field(default_factory=dict)
    plans: list[str] = field(default_factory=list)
    #: per user, the ids ``targets_of`` answers, oldest first
    materials: dict[str, list[str]] = field(default_factory=dict)

    async def build_snapshot(self, session: Any, **kw: Any) -> str:
        if kw["target_id"].startswith("missing"):
            raise AppError(ErrorCode.NOT_FOUND, "target not found", {"targetId": kw["target_id"]})
        sid = uuid.uuid4().hex
        self.snapshots[sid] = FakeSnapshot(
            sid, "v1", kw["target_type"], kw["target_id"], {"userId": kw["user_id"]}, "h" * 64
        )
        return sid

    async def build_snapshots(self, session: Any, **kw: Any) -> list[str]:
        targets = kw.pop("targets")
        for _, target_id in targets:  # the first missing one: nothing built
            if target_id.startswith("missing"):
                raise AppError(ErrorCode.NOT_FOUND, "target not found", {"targetId": target_id})
        return [
            await self.build_snapshot(session, target_type=t, target_id=i, **kw) for t, i in targets
        ]

    async def targets_of(
        self, session: Any, user_id: str, target_type: str, material_id: str | None, limit: int
    ) -> list[str]:
        """``targetsOf``: the user's "materials" are those ``materials[user_id]`` names."""
        return list(self.materials.get(user_id, []))[:limit]

    def snapshot_read(self, snapshot_id: str) -> SnapshotRead:
        def missing() -> Exception:
            return AppError(ErrorCode.NOT_FOUND, "snapshot not found", {"snapshotId": snapshot_id})

        return SnapshotRead(
            view=self.snapshots.get(snapshot_id),
            sql=Sql(
                ("fake_snapshot_read",), lambda: select(workers.c.instance_id).where(false()), {}
            ),
            exists=_NO_SNAPSHOT_ROW,
            from_row=lambda row: self.snapshots[snapshot_id],
            not_found=missing,
        )

    def snapshots_read(self, snapshot_ids: Sequence[str]) -> SnapshotsRead:
        views = {sid: self.snapshots[sid] for sid in snapshot_ids if sid in self.snapshots}
        missing = [sid for sid in snapshot_ids if sid not in views]
        nothing = Sql(
            ("fake_snapshot_read",), lambda: select(workers.c.instance_id).where(false()), {}
        )
        return SnapshotsRead(
            views=views,
            sql=nothing if missing else None,
            from_row=lambda row: self.snapshots[str(row[0])],
        )

    async def snapshot_stored(self, db: Any, snapshot_id: str) -> bool:
        return snapshot_id in self.snapshots

    async def erase_user(self, db: Any, user_id: str, job_ids: Sequence[str]) -> None:
        """The user's learning data goes: here, every snapshot of their jobs."""
        for snapshot in [s for s in self.snapshots.values() if s.payload.get("userId") == user_id]:
            del self.snapshots[snapshot.snapshot_id]

    def generation_plan(self, clock: Any, **kw: Any) -> Sql | None:
        if kw["job_type"] in ("quiz_generation", "flashcard_generation"):
            self.plans.append(kw["job_id"])
        return None

    async def prepare_result(self, db: Any, **kw: Any) -> FakePrepared:
        validate_output(kw["job_type"], kw["output_schema_version"], kw["output"])
        if kw["output"].get("summary") == "forbidden":
            raise AppError(ErrorCode.INVALID_SCHEMA, "cites a block outside the snapshot", None)
        return FakePrepared(kw["job_id"])


#: A snapshot missing from the fake is missing from the database too.
_NO_SNAPSHOT_ROW = stable(false())


def _epoch() -> Any:
    from datetime import datetime

    return datetime(2000, 1, 1)


async def business_rows(domain: JobDomain, job_id: str) -> int:
    """How many marker business rows FakeLearning wrote for a job."""
    async with domain.sessions() as s:
        rows = (
            await s.execute(
                select(workers.c.instance_id).where(workers.c.instance_id == f"biz-{job_id}")
            )
        ).all()
    return len(rows)


def make_settings(url: str, **overrides: Any) -> JobServiceSettings:
    """Short leases and a fast reaper for tests."""
    values: dict[str, Any] = {
        "DATABASE_URL": url,
        "RUNTIME_SERVICE_TOKEN": TOKEN,
        "JOB_SERVICE_LISTEN": "127.0.0.1:0",
        "JOB_SERVICE_METRICS_PORT": 0,
        "LOCK_LEASE_SECONDS": 30,
        "REAPER_INTERVAL_SECONDS": 3600,
        "RETRY_BACKOFF_BASE_SECONDS": 0,
        "RETRY_BACKOFF_MAX_SECONDS": 0,
        "JOB_SERVICE_MIGRATE_ON_START": False,
    }
    values.update(overrides)
    return JobServiceSettings(**values)


async def create_schema(url: str) -> None:
    engine = make_job_engine(url)
    async with engine.begin() as conn:
        await conn.run_sync(Base.metadata.create_all)
    await engine.dispose()


@pytest.fixture(params=["sqlite", pytest.param("mariadb", marks=pytest.mark.mysql)])
def db_url(request: pytest.FixtureRequest, sqlite_url: str) -> str:
    """A fresh database: SQLite, then MariaDB (its own database; skipped without
    ``TEST_MYSQL_URL``)."""
    if request.param == "sqlite":
        return sqlite_url
    return str(request.getfixturevalue("mysql_url"))


@pytest.fixture
async def make_domain(db_url: str) -> AsyncIterator[Callable[..., Any]]:
    """Factory: a :class:`JobDomain` on a fresh schema, with settings overrides."""
    engines: list[Any] = []
    await create_schema(db_url)

    async def factory(**overrides: Any) -> JobDomain:
        settings = make_settings(db_url, **overrides)
        engine = make_job_engine(db_url)
        engines.append(engine)
        sessions = make_sessionmaker(engine)
        clock = DbClock(engine.dialect.name)
        async with sessions() as s, s.begin():
            await breaker_mod.ensure_row(s, clock)
        return JobDomain(sessions, clock, settings, FakeLearning(), AllowAllCredentials())

    yield factory
    for engine in engines:
        await engine.dispose()


@pytest.fixture
async def domain(make_domain: Callable[..., Any]) -> JobDomain:
    return await make_domain()  # type: ignore[no-any-return]


async def new_job(domain: JobDomain, **kw: Any) -> JobRecord:
    """Create an analysis job for user ``u1`` (overridable)."""
    args: dict[str, Any] = {
        "user_id": "u1",
        "job_type": "learning_state_analysis",
        "target_type": "user",
        "target_id": "",
    }
    args.update(kw)
    job, _ = await domain.create(CreateJobInput(**args))
    return job


@dataclass
class Server:
    app: JobServiceApp
    channel: grpc.aio.Channel
    stub: service_pb2_grpc.JobServiceStub
    learning: FakeLearning
    credentials: AllowAllCredentials

    def md(self, instance: str | None = None) -> tuple[tuple[str, str], ...]:
        return metadata.outgoing(TOKEN, instance)

    @property
    def domain(self) -> JobDomain:
        return self.app.domain


@pytest.fixture
async def make_server(db_url: str) -> AsyncIterator[Callable[..., Any]]:
    """Factory: a real job_service gRPC server on an ephemeral port."""
    started: list[Server] = []
    await create_schema(db_url)

    async def factory(**overrides: Any) -> Server:
        learning = FakeLearning()
        creds = AllowAllCredentials()
        app = await serve(make_settings(db_url, **overrides), learning=learning, credentials=creds)
        channel = grpc.aio.insecure_channel(app.address)
        srv = Server(app, channel, service_pb2_grpc.JobServiceStub(channel), learning, creds)
        started.append(srv)
        return srv

    yield factory
    for srv in started:
        await srv.channel.close()
        await srv.app.stop(grace=0.1)


@pytest.fixture
async def server(make_server: Callable[..., Any]) -> Server:
    return await make_server()  # type: ignore[no-any-return]


async def wait_until(pred: Callable[[], Any], within: float = 5.0, step: float = 0.05) -> None:
    """Poll an async predicate until true (fails the test on timeout)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + within
    while True:
        if await pred():
            return
        if loop.time() > end:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(step)
