"""Wiring: settings → client, provider, worker, status server; run until stopped.

``python -m runtime_worker`` calls :func:`run` with a stop event set by
SIGTERM/SIGINT. Tests use :class:`WorkerApp` directly (ephemeral ports).
"""

from __future__ import annotations

import asyncio
import logging
import socket

from airuntime_common import tracing
from airuntime_common.grpc_server import GrpcServer
from runtime_worker.client import RuntimeClient
from runtime_worker.providers.base import ModelProvider
from runtime_worker.providers.deepseek import DeepSeekProvider
from runtime_worker.settings import WorkerSettings
from runtime_worker.status import SERVICE_NAME, WorkerStatusService
from runtime_worker.worker import Worker
from zhixi.airuntime.worker.v1 import service_pb2_grpc as wgrpc

log = logging.getLogger(__name__)


def _advertised(settings: WorkerSettings, port: int) -> str:
    if settings.RUNTIME_WORKER_ADVERTISE_ADDR:
        return settings.RUNTIME_WORKER_ADVERTISE_ADDR
    host = settings.RUNTIME_WORKER_LISTEN.rsplit(":", 1)[0].strip("[]")
    if host in ("", "::", "0.0.0.0"):
        host = socket.gethostname()
    return f"{host}:{port}"


class WorkerApp:
    """The whole worker process in one object.

    With tracing configured (reference §9.5, :func:`airuntime_common.tracing.setup`) each
    attempt's spans join its job's trace (:mod:`runtime_worker.spans`), every gRPC
    call is a client span and the DeepSeek provider's HTTP calls are aiohttp client spans.

    Args:
        settings: worker settings (checked by :meth:`start`).
        provider: model provider; DeepSeek over aiohttp when omitted.

    Raises:
        InvalidSetting: an unsupported OpenTelemetry exporter or protocol.
    """

    def __init__(self, settings: WorkerSettings, provider: ModelProvider | None = None) -> None:
        self.settings = settings
        self.tracing = tracing.setup("runtime_worker")
        self._own_provider = provider is None
        self.provider: ModelProvider = provider or DeepSeekProvider(
            max_connections=settings.WORKER_CONCURRENCY,
            max_response_bytes=settings.MODEL_MAX_RESPONSE_BYTES,
        )
        if self.tracing is not None and isinstance(self.provider, DeepSeekProvider):
            self.provider.add_trace_config(self.tracing.aiohttp_trace_config())
        self.client = RuntimeClient(
            job_target=settings.JOB_SERVICE_ADDR,
            credential_target=settings.CREDENTIAL_SERVICE_ADDR,
            token=settings.RUNTIME_SERVICE_TOKEN,
            instance_id=settings.RUNTIME_INSTANCE_ID,
            rpc_timeout=settings.RPC_TIMEOUT_SECONDS,
            retry_seconds=settings.RPC_RETRY_SECONDS,
            heartbeat_retry_seconds=settings.HEARTBEAT_INTERVAL_SECONDS,
            ca_file=settings.GRPC_TLS_CA_FILE,
            tracing=self.tracing,
        )
        self.status_address = ""
        self.worker = Worker(
            settings,
            self.client,
            self.provider,
            status_address=lambda: self.status_address,
            on_draining=self._not_serving,
            tracing=self.tracing,
        )
        self.server: GrpcServer | None = None
        self._metrics_started = False

    async def _not_serving(self) -> None:
        if self.server is not None:
            await self.server.set_serving(False)

    @property
    def port(self) -> int:
        """Bound port of the status server (after :meth:`start`)."""
        return self.server.port if self.server is not None else 0

    async def start(self) -> None:
        """Check settings, serve status, start the loop.

        Raises:
            MissingSetting: a required or unsafe setting (reference §7, case L2).
        """
        self.settings.check()
        status = WorkerStatusService(self.worker)
        self.server = GrpcServer(
            token=self.settings.RUNTIME_SERVICE_TOKEN,
            address=self.settings.RUNTIME_WORKER_LISTEN,
            service_names=[SERVICE_NAME],
            register=lambda s: wgrpc.add_WorkerStatusServiceServicer_to_server(status, s),
            tls_cert_file=self.settings.GRPC_TLS_CERT_FILE,
            tls_key_file=self.settings.GRPC_TLS_KEY_FILE,
            tracing=self.tracing,
        )
        await self.server.start()
        self.status_address = _advertised(self.settings, self.server.port)
        self._start_metrics()
        self.worker.start()
        log.info(
            "runtime worker started",
            extra={
                "fields": {
                    "runtimeInstanceId": self.settings.RUNTIME_INSTANCE_ID,
                    "statusAddress": self.status_address,
                    "capabilities": self.worker.capabilities,
                    "concurrency": self.settings.WORKER_CONCURRENCY,
                }
            },
        )

    def _start_metrics(self) -> None:
        port = self.settings.WORKER_METRICS_PORT
        if not port or self._metrics_started:
            return
        from runtime_worker import metrics

        try:
            metrics.serve(port, self.worker)
            self._metrics_started = True
        except OSError as exc:
            log.warning("metrics port %s unavailable: %s", port, exc)

    async def stop(self, grace_seconds: float | None = None) -> None:
        """Graceful stop: NOT_SERVING, drain in-flight jobs, close everything."""
        await self.worker.shutdown(grace_seconds)
        if self.server is not None:
            await self.server.stop(1.0)
        await self.client.close()
        if self._own_provider and isinstance(self.provider, DeepSeekProvider):
            await self.provider.aclose()
        log.info(
            "runtime worker stopped", extra={"fields": {"counters": dict(self.worker.counters)}}
        )


async def run(
    settings: WorkerSettings,
    stop_event: asyncio.Event,
    provider: ModelProvider | None = None,
) -> None:
    """Run a worker until ``stop_event`` is set, then shut down gracefully.

    Args:
        settings: worker settings; refused at start if unsafe (reference §7).
        stop_event: set it (SIGTERM) to stop claiming and drain.
        provider: optional model provider override (tests).

    Raises:
        MissingSetting: the configuration was refused.
    """
    settings.check()
    app = WorkerApp(settings, provider)
    try:
        await app.start()
        await stop_event.wait()
    finally:
        await app.stop()
