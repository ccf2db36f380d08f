"""The FastAPI application of the gateway (SPEC §3, §3.1)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpc
from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from airuntime_common import tracing
from api_gateway import errors
from api_gateway.backends import Backends
from api_gateway.middleware import GatewayMetrics, GatewayMiddleware
from api_gateway.routes import admin, health, internal, public
from api_gateway.settings import GatewaySettings


def create_app(
    settings: GatewaySettings,
    *,
    job_channel: grpc.aio.Channel | None = None,
    credential_channel: grpc.aio.Channel | None = None,
) -> FastAPI:
    """Build the gateway app.

    Args:
        settings: gateway settings; ``RUNTIME_SERVICE_TOKEN`` and ``JWT_SECRET`` required.
        job_channel, credential_channel: channels to use instead of connecting to
            ``JOB_SERVICE_ADDR`` / ``CREDENTIAL_SERVICE_ADDR`` in the lifespan
            (tests inject them; the caller keeps ownership). Give both or neither.

    Returns:
        The ASGI app. Without injected channels the backends connect on startup.
        With tracing configured (SPEC §9.5, :func:`airuntime_common.tracing.setup`)
        every request but the probes has a server span and the backends' calls
        carry its trace context.

    Raises:
        MissingSetting: a required secret is unset (the variable is named).
        InvalidSetting: an unsupported OpenTelemetry exporter or protocol.
    """
    settings.check()
    telemetry = tracing.setup("api_gateway")
    injected: Backends | None = None
    if job_channel is not None or credential_channel is not None:
        if job_channel is None or credential_channel is None:
            raise ValueError("inject both job_channel and credential_channel, or neither")
        injected = Backends(
            settings, job_channel, credential_channel, owns_channels=False, tracing=telemetry
        )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        backends = injected or Backends.connect(settings, tracing=telemetry)
        app.state.backends = backends
        try:
            yield
        finally:
            await backends.aclose()

    app = FastAPI(
        title="AI Runtime gateway",
        version="1.0.0",
        description="Public, admin and runtime REST of AI Runtime (asynchronous AI jobs).",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.backends = injected
    metrics = GatewayMetrics()
    app.state.metrics = metrics
    errors.install(app)
    app.include_router(health.router)
    app.include_router(public.router)
    app.include_router(admin.router)
    app.include_router(internal.router)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST", "PUT", "DELETE"],
            allow_headers=["Authorization", "Content-Type", "Idempotency-Key", "X-Request-Id"],
            expose_headers=["Idempotent-Replayed", "X-Request-Id"],
        )
    app.add_middleware(
        GatewayMiddleware,
        max_body_bytes=settings.MAX_BODY_BYTES,
        max_json_depth=settings.MAX_JSON_DEPTH,
        metrics=metrics,
    )
    if telemetry is not None:
        telemetry.instrument_fastapi(app)
    return app
