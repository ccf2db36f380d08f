"""Liveness, readiness and metrics (reference §3.1)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from airuntime_common.errors import AppError, ErrorCode
from api_gateway.deps import get_backends
from api_gateway.errors import error_response
from api_gateway.gate import GatedRoute
from api_gateway.retry_after import RETRY_AFTER_HEADER
from api_gateway.schemas import ErrorBody

router = APIRouter(tags=["health"], route_class=GatedRoute)


@router.get("/healthz")
async def healthz() -> dict[str, Any]:
    """Liveness: the process answers."""
    return {"status": "ok"}


@router.get(
    "/readyz",
    responses={
        503: {
            "model": ErrorBody,
            "description": "a backend is not SERVING",
            "headers": RETRY_AFTER_HEADER,
        }
    },
)
async def readyz(request: Request) -> JSONResponse:
    """Readiness: 200 when job_service and credential_service report SERVING, else 503."""
    try:
        backends = get_backends(request)
    except AppError as err:
        return error_response(err)
    checks = await backends.serving()
    if all(v == "SERVING" for v in checks.values()):
        return JSONResponse({"status": "ready", "checks": checks})
    return error_response(AppError(ErrorCode.UNAVAILABLE, "backends not ready", {"checks": checks}))


@router.get("/metrics", response_class=Response)
async def metrics(request: Request) -> Response:
    """Prometheus text: request counts and latency by route template and status."""
    registry = request.app.state.metrics.registry
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
