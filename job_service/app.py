"""job_service process: migrations, the gRPC server, the reaper, the prompt guard, metrics,
graceful stop.

``serve(settings)`` returns a running :class:`JobServiceApp` handle, so tests can
run the real server in-process on an ephemeral port (``JOB_SERVICE_LISTEN=127.0.0.1:0``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field

from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from airuntime_common import tracing
from airuntime_common.db import make_sessionmaker
from airuntime_common.grpc_server import GrpcServer
from airuntime_common.settings import require
from job_service.learning.port import LearningModulePort
from job_service.maintenance import breaker as breaker_mod
from job_service.maintenance.parking import ParkingLot
from job_service.maintenance.reaper import Reaper
from job_service.migrate import upgrade_head_async
from job_service.rpc import JobServiceServicer
from job_service.services.domain import JobDomain
from job_service.services.ports import CredentialChecker, GrpcCredentialChecker, LearningPort
from job_service.settings import JobServiceSettings
from job_service.store.clock import DbClock
from job_service.store.engine import make_job_engine
from zhixi.airuntime.job.v1 import service_pb2_grpc

log = logging.getLogger(__name__)

SERVICE_NAME = "zhixi.airuntime.job.v1.JobService"


@dataclass
class JobServiceApp:
    """A running job_service: server, reaper task and the objects tests may poke at."""

    settings: JobServiceSettings
    engine: AsyncEngine
    sessions: async_sessionmaker[AsyncSession]
    domain: JobDomain
    server: GrpcServer
    reaper: Reaper
    stop_event: asyncio.Event = field(default_factory=asyncio.Event)
    reaper_task: asyncio.Task[None] | None = None
    gauges_task: asyncio.Task[None] | None = None
    parking_task: asyncio.Task[None] | None = None
    #: the prompt guard's loop (reference §10.4)
    guard_task: asyncio.Task[None] | None = None

    @property
    def port(self) -> int:
        """The bound gRPC port."""
        return int(self.server.port)

    @property
    def address(self) -> str:
        """``127.0.0.1:<port>`` for in-process clients."""
        return f"127.0.0.1:{self.port}"

    async def stop(self, grace: float = 2.0) -> None:
        """NOT_SERVING, stop the reaper, drain in-flight RPCs, close the pool."""
        self.stop_event.set()
        await self.domain.changes.aclose()  # ends the watch streams, so the drain is short
        await self.server.stop(grace)
        if self.reaper_task is not None:
            await self.reaper_task
        if self.parking_task is not None:
            await self.parking_task
        if self.gauges_task is not None:
            await self.gauges_task
        if self.guard_task is not None:
            await self.guard_task
        close = getattr(self.domain.credentials, "close", None)
        if close is not None:
            await close()
        await self.engine.dispose()


async def serve(
    settings: JobServiceSettings,
    *,
    learning: LearningPort | None = None,
    credentials: CredentialChecker | None = None,
    start_metrics: bool = True,
) -> JobServiceApp:
    """Migrate, then start the gRPC server and the reaper.

    Args:
        settings: configuration (``RUNTIME_SERVICE_TOKEN`` required).
        learning: snapshot/result delegate (default: the learning-data modules).
        credentials: credential service client (default: gRPC to ``CREDENTIAL_SERVICE_ADDR``).
        start_metrics: serve Prometheus on ``JOB_SERVICE_METRICS_PORT`` (if > 0).

    Raises:
        MissingSetting: without ``RUNTIME_SERVICE_TOKEN``.
    """
    require(settings, "RUNTIME_SERVICE_TOKEN")
    # first: the servers and channels built below take the process's tracing (reference §9.5)
    tracing.setup("job_service")
    if settings.JOB_SERVICE_MIGRATE_ON_START:
        await upgrade_head_async(settings.DATABASE_URL)
    engine = make_job_engine(settings.DATABASE_URL)
    sessions = make_sessionmaker(engine)
    clock = DbClock(engine.dialect.name)
    async with sessions() as session, session.begin():
        await breaker_mod.ensure_rows(session, clock, settings.providers().names)
    if credentials is None:
        credentials = GrpcCredentialChecker(
            settings.CREDENTIAL_SERVICE_ADDR,
            settings.RUNTIME_SERVICE_TOKEN,
            settings.GRPC_TLS_CA_FILE,
        )
    domain = JobDomain(sessions, clock, settings, learning or LearningModulePort(), credentials)
    servicer = JobServiceServicer(domain)
    server = GrpcServer(
        token=settings.RUNTIME_SERVICE_TOKEN,
        address=settings.JOB_SERVICE_LISTEN,
        service_names=[SERVICE_NAME],
        register=lambda s: service_pb2_grpc.add_JobServiceServicer_to_server(servicer, s),
        tls_cert_file=settings.GRPC_TLS_CERT_FILE,
        tls_key_file=settings.GRPC_TLS_KEY_FILE,
    )
    if start_metrics and settings.JOB_SERVICE_METRICS_PORT > 0:
        from prometheus_client import start_http_server

        try:
            start_http_server(settings.JOB_SERVICE_METRICS_PORT)
        except OSError:
            log.warning(
                "metrics port busy", extra={"fields": {"port": settings.JOB_SERVICE_METRICS_PORT}}
            )
    await server.start()
    reaper = Reaper(domain.core)
    app = JobServiceApp(settings, engine, sessions, domain, server, reaper)
    app.reaper_task = asyncio.create_task(reaper.run(app.stop_event), name="reaper")
    parking = ParkingLot(domain.core)
    app.parking_task = asyncio.create_task(parking.run(app.stop_event), name="parking")
    app.gauges_task = asyncio.create_task(_refresh_gauges(app), name="metrics-gauges")
    app.guard_task = asyncio.create_task(
        domain.prompts.guard.run(app.stop_event), name="prompt-guard"
    )
    log.info(
        "job_service serving",
        extra={"fields": {"port": server.port, "database": engine.url.render_as_string()}},
    )
    return app


async def _refresh_gauges(app: JobServiceApp) -> None:
    """Re-read queue depth and breaker state every ``METRICS_REFRESH_SECONDS`` until stop."""
    interval = app.settings.METRICS_REFRESH_SECONDS
    while not app.stop_event.is_set():
        try:
            await app.domain.refresh_gauges()
        except Exception:
            log.warning("metrics gauge refresh failed", exc_info=True)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(app.stop_event.wait(), timeout=interval)
