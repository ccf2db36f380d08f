"""Error bodies and exception handlers (SPEC §4).

Every error answer is ``{"code", "message", "details"}`` with the HTTP status of
its code: :class:`AppError` as raised, request validation as 400
``INVALID_ARGUMENT`` (never FastAPI's 422), Starlette's own HTTP errors by
status, and anything unexpected as 500 ``INTERNAL`` with no stack trace.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import compile_path

from airuntime_common.errors import AppError, ErrorCode

log = logging.getLogger(__name__)

_STATUS_CODES: dict[int, str] = {
    400: ErrorCode.INVALID_ARGUMENT,
    401: ErrorCode.UNAUTHENTICATED,
    403: ErrorCode.PERMISSION_DENIED,
    404: ErrorCode.NOT_FOUND,
    405: ErrorCode.INVALID_ARGUMENT,
    413: ErrorCode.PAYLOAD_TOO_LARGE,
    415: ErrorCode.INVALID_ARGUMENT,
    503: ErrorCode.UNAVAILABLE,
}


def error_response(
    err: AppError, status: int | None = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    """The JSON answer for ``err`` with the HTTP status of its code (SPEC §4)."""
    return JSONResponse(err.body(), status_code=status or err.http_status, headers=headers)


def validation_details(errors: Any) -> dict[str, Any]:
    """Offending fields of a validation failure, without echoing the input values.

    Returns:
        ``{"fields": [{"field": "jobType", "in": "body", "message": "...", "type": "..."}]}``
    """
    fields: list[dict[str, Any]] = []
    for e in errors:
        loc = [str(p) for p in e.get("loc", ())]
        where = loc[0] if loc else ""
        path = ".".join(loc[1:]) if len(loc) > 1 else where
        fields.append(
            {
                "field": path,
                "in": where,
                "message": str(e.get("msg", "invalid")),
                "type": str(e.get("type", "value_error")),
            }
        )
    return {"fields": fields}


async def _app_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, AppError)
    return error_response(exc)


async def _validation_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    err = AppError(
        ErrorCode.INVALID_ARGUMENT, "request validation failed", validation_details(exc.errors())
    )
    return error_response(err)


def allowed_methods(request: Request) -> list[str]:
    """Every method the API documents at this request's path (for ``Allow`` on a 405)."""
    table: list[tuple[re.Pattern[str], set[str]]] | None = getattr(
        request.app.state, "allow_table", None
    )
    if table is None:
        table = []
        for template, operations in request.app.openapi().get("paths", {}).items():
            regex, _, _ = compile_path(template)
            table.append((regex, {m.upper() for m in operations}))
        request.app.state.allow_table = table
    path = request.url.path
    return sorted({m for regex, methods in table if regex.match(path) for m in methods})


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = _STATUS_CODES.get(exc.status_code, ErrorCode.INTERNAL)
    message = exc.detail if isinstance(exc.detail, str) else code
    headers = dict(exc.headers or {})
    if exc.status_code == 405:
        headers["Allow"] = ", ".join(allowed_methods(request))
    return error_response(AppError(code, message), status=exc.status_code, headers=headers)


async def _unicode_error(_request: Request, exc: Exception) -> JSONResponse:
    return error_response(
        AppError(ErrorCode.INVALID_ARGUMENT, "text must be valid UTF-8 without lone surrogates")
    )


def install(app: FastAPI) -> None:
    """Register every exception handler on ``app``."""
    app.add_exception_handler(AppError, _app_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(UnicodeError, _unicode_error)
