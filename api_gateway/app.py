"""The FastAPI application of the gateway (reference §3, §3.1, §9.3)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import grpc
from fastapi import FastAPI
from fastapi.routing import APIRoute
from fastapi.staticfiles import StaticFiles
from fastapi_offline import FastAPIOffline

from airuntime_common import tracing
from api_gateway import errors, openapi
from api_gateway.backends import Backends
from api_gateway.cors import GatewayCORS
from api_gateway.gate import check_routes
from api_gateway.middleware import GatewayMetrics, GatewayMiddleware
from api_gateway.routes import admin, batches, health, internal, prompts, public
from api_gateway.settings import GatewaySettings

#: Where the docs pages' scripts, stylesheets and icon are served from (reference §9.3:
#: ``/docs`` works with no internet; the files come from the ``fastapi-offline`` package).
DOCS_ASSETS_PATH = "/docs/assets"
#: Swagger UI settings: no call to the public validator service.
SWAGGER_UI_PARAMETERS = {"validatorUrl": None}


def operation_id(route: APIRoute) -> str:
    """The OpenAPI ``operationId`` of a route: its handler's name in lowerCamelCase.

    ``create_material`` → ``createMaterial``, ``get_ai_job`` → ``getAiJob``. A client
    generated from ``/openapi.json`` names its functions after these (FastAPI's default
    appends the path and method: ``get_ai_job_v1_ai_jobs__jobId__get``). Handler names
    are unique across the gateway's routers (admin ones start with ``admin_``), so the
    ids are too.
    """
    first, *rest = route.name.split("_")
    return first + "".join(word[:1].upper() + word[1:] for word in rest)


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
        ``/docs`` (Swagger UI) and ``/redoc`` load every script and stylesheet from
        the gateway itself; a path with a trailing slash is 404, never a redirect.
        With tracing configured (reference §9.5, :func:`airuntime_common.tracing.setup`)
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
            hub = getattr(app.state, "hub", None)
            if hub is not None:
                await hub.aclose()
            await backends.aclose()

    app = FastAPIOffline(
        title="AI Runtime gateway",
        version="1.0.0",
        description="Public, admin and runtime REST of AI Runtime (asynchronous AI jobs).",
        lifespan=lifespan,
        static_url=DOCS_ASSETS_PATH,
        swagger_ui_parameters=SWAGGER_UI_PARAMETERS,
        # one URL per resource: "/v1/ai/jobs/" is 404 (with a hint), not a 307 to an
        # absolute http:// URL of whatever Host the request named
        redirect_slashes=False,
        generate_unique_id_function=operation_id,
    )
    app.state.settings = settings
    app.state.backends = injected
    app.state.hub = None  # the job watch (reference §9.1), made on first use
    _assemble(app, settings, telemetry)
    return app


def _assemble(app: FastAPI, settings: GatewaySettings, telemetry: Any) -> None:
    """The error handlers, routers, the console's assets and the middleware, in order
    (CORS outermost, so the gateway's own refusals carry its headers too). Every route
    that needs a caller checks it before it reads the request (:mod:`api_gateway.gate`)."""
    metrics = GatewayMetrics()
    app.state.metrics = metrics
    errors.install(app)
    openapi.install(app)
    app.include_router(health.router)
    app.include_router(public.router)
    app.include_router(batches.router)
    app.include_router(admin.router)
    app.include_router(prompts.router)
    app.mount(
        admin.CONSOLE_ASSETS_PATH,
        StaticFiles(directory=admin.CONSOLE_DIR),
        name="console-assets",
    )
    app.include_router(internal.router)
    check_routes(app.routes)
    app.add_middleware(GatewayMiddleware, metrics=metrics)
    if telemetry is not None:
        telemetry.instrument_fastapi(app)
    if settings.cors_origins:
        app.add_middleware(GatewayCORS, origins=settings.cors_origins)
