"""Assembling and serving credential_service (``python -m credential_service``).

:func:`serve` validates settings, runs migrations, builds the keyring, the store, the
job_service client and the gRPC server (auth, health, reflection), starts it, and
returns a :class:`ServiceHandle` — tests run it in-process on port 0.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

import grpc
from sqlalchemy.ext.asyncio import AsyncEngine

from airuntime_common import tracing
from airuntime_common.db import make_engine, make_sessionmaker, opening_database
from airuntime_common.grpc_server import GrpcServer, install_stop_signals
from credential_service import SERVICE_NAME, migrate
from credential_service.domain import CredentialStore
from credential_service.lease import GrpcLeaseVerifier, LeaseVerifier
from credential_service.servicer import CredentialServiceServicer
from credential_service.settings import CredentialSettings
from credential_service.vault import Keyring
from zhixi.airuntime.credential.v1 import service_pb2_grpc

log = logging.getLogger(__name__)


@dataclass
class ServiceHandle:
    """A running credential_service.

    Attributes:
        port: the bound gRPC port (useful with a ``:0`` listen address).
        server: the :class:`GrpcServer`.
        store: the domain object (tests use it directly).
        engine: the database engine.
    """

    port: int
    server: GrpcServer
    store: CredentialStore
    engine: AsyncEngine
    _verifier: GrpcLeaseVerifier | None = None
    _metrics: Any = None
    _stopped: bool = field(default=False)

    async def stop(self, grace: float = 2.0) -> None:
        """NOT_SERVING, stop the server, close the job_service channel and the engine."""
        if self._stopped:
            return
        self._stopped = True
        await self.server.stop(grace)
        if self._verifier is not None:
            await self._verifier.close()
        if self._metrics is not None:
            self._metrics.shutdown()
            self._metrics.server_close()
        await self.engine.dispose()


def _start_metrics(port: int) -> Any:
    if port <= 0:
        return None
    from prometheus_client import start_http_server

    server, _thread = start_http_server(port)
    return server


async def serve(
    settings: CredentialSettings,
    *,
    verifier: LeaseVerifier | None = None,
    run_migrations: bool = True,
) -> ServiceHandle:
    """Start credential_service and return its handle.

    Args:
        settings: the environment (``CREDENTIAL_SERVICE_LISTEN`` may use port 0).
        verifier: lease verifier override; by default a gRPC client of ``JOB_SERVICE_ADDR``.
        run_migrations: upgrade the database to head first (as production serve does).

    With tracing configured (reference §9.5, :func:`airuntime_common.tracing.setup`) every
    call gets a server span, joined to its caller's trace, and the lease checks
    with job_service carry it on.

    Raises:
        MissingSetting: missing token or missing/malformed master keys (clear message).
        InvalidSetting: an unsupported OpenTelemetry exporter or protocol.
    """
    settings.validate_for_serve()
    telemetry = tracing.setup("credential_service")
    keyring = Keyring.from_env_value(settings.CREDENTIAL_ENCRYPTION_KEYS.get_secret_value())
    if run_migrations:
        await migrate.upgrade(settings.CREDENTIAL_DATABASE_URL)
    engine = make_engine(settings.CREDENTIAL_DATABASE_URL)
    owned_verifier: GrpcLeaseVerifier | None = None
    if verifier is None:
        owned_verifier = GrpcLeaseVerifier(
            settings.JOB_SERVICE_ADDR,
            settings.RUNTIME_SERVICE_TOKEN,
            timeout_seconds=settings.VERIFY_LEASE_TIMEOUT_SECONDS,
            ca_file=settings.GRPC_TLS_CA_FILE,
            tracing=telemetry,
        )
        verifier = owned_verifier
    store = CredentialStore(make_sessionmaker(engine), keyring, settings, verifier)

    def register(server: grpc.aio.Server) -> None:
        service_pb2_grpc.add_CredentialServiceServicer_to_server(
            CredentialServiceServicer(store), server
        )

    server = GrpcServer(
        token=settings.RUNTIME_SERVICE_TOKEN,
        address=settings.CREDENTIAL_SERVICE_LISTEN,
        service_names=[SERVICE_NAME],
        register=register,
        tls_cert_file=settings.GRPC_TLS_CERT_FILE,
        tls_key_file=settings.GRPC_TLS_KEY_FILE,
        tracing=telemetry,
    )
    await server.start()
    metrics_server = _start_metrics(settings.CREDENTIAL_SERVICE_METRICS_PORT)
    log.info(
        "credential_service serving",
        extra={
            "fields": {
                "port": server.port,
                "currentKeyId": keyring.current_kid,
                "keyIds": list(keyring.key_ids),
                "platformKey": store.platform_providers(),
            }
        },
    )
    return ServiceHandle(
        port=server.port,
        server=server,
        store=store,
        engine=engine,
        _verifier=owned_verifier,
        _metrics=metrics_server,
    )


async def run_forever(settings: CredentialSettings) -> None:
    """Serve until SIGTERM/SIGINT, then stop gracefully."""
    async with opening_database("credential_service", "CREDENTIAL_DATABASE_URL"):
        handle = await serve(settings)
    stop = asyncio.Event()
    install_stop_signals(stop)
    try:
        await stop.wait()
    finally:
        log.info("credential_service stopping")
        await handle.stop(grace=5.0)
