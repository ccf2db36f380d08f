"""Error bodies and exception handlers (reference §4, §9.3).

Every error answer is ``{"code", "message", "details"}`` with the HTTP status of
its code: :class:`AppError` as raised, request validation as 400
``INVALID_ARGUMENT`` (never FastAPI's 422), Starlette's own HTTP errors by
status (a method the path lacks → 405 ``METHOD_NOT_ALLOWED`` with ``Allow``),
and anything unexpected as 500 ``INTERNAL`` with no stack trace. Every 429 and
503 carries ``Retry-After`` (:mod:`api_gateway.retry_after`), and what an
answer echoes of the request (an id in a message or in ``details``) is cut to
:data:`MAX_ECHO_CHARS` characters.
"""

from __future__ import annotations

import logging
import math
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match, Mount
from starlette.staticfiles import StaticFiles

from airuntime_common.errors import AppError, ErrorCode
from api_gateway.retry_after import retry_after_seconds

log = logging.getLogger(__name__)

_STATUS_CODES: dict[int, str] = {
    400: ErrorCode.INVALID_ARGUMENT,
    401: ErrorCode.UNAUTHENTICATED,
    403: ErrorCode.PERMISSION_DENIED,
    404: ErrorCode.NOT_FOUND,
    405: ErrorCode.METHOD_NOT_ALLOWED,
    413: ErrorCode.PAYLOAD_TOO_LARGE,
    415: ErrorCode.INVALID_ARGUMENT,
    503: ErrorCode.UNAVAILABLE,
}

#: Longest run of non-space characters an error answer repeats from the request
#: (an id of 6,000 characters is echoed as its first 128 and "…").
MAX_ECHO_CHARS = 128
#: Longest string of an error answer's message or details, whatever its spaces.
MAX_TEXT_CHARS = 512
_LONG_RUN = re.compile(rf"\S{{{MAX_ECHO_CHARS + 1},}}")
#: The content type a JSON body must be sent with (reference §3: bodies are JSON).
JSON_CONTENT_TYPE = "application/json"


def bounded_text(text: str, *, keep_tail: bool = True) -> str:
    """``text`` with each run of non-space characters past :data:`MAX_ECHO_CHARS` cut
    to that many and "…", and the whole cut to :data:`MAX_TEXT_CHARS`.

    Args:
        text: a message or a value of ``details``.
        keep_tail: keep what follows a cut run (a message's sentence goes on); a
            value of ``details`` ends at its first cut.
    """
    if keep_tail:
        text = _LONG_RUN.sub(lambda m: m.group()[:MAX_ECHO_CHARS] + "…", text)
    elif (run := _LONG_RUN.search(text)) is not None:
        text = text[: run.start()] + run.group()[:MAX_ECHO_CHARS] + "…"
    if len(text) > MAX_TEXT_CHARS:
        text = text[:MAX_TEXT_CHARS] + "…"
    return text


def bounded(value: Any) -> Any:
    """``value`` (JSON-like ``details``) with every string, keys included, cut by
    :func:`bounded_text` (at its first over-long run), and a NaN or infinite float
    (which JSON cannot carry) as null."""
    if isinstance(value, str):
        return bounded_text(value, keep_tail=False)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {bounded_text(str(k), keep_tail=False): bounded(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [bounded(v) for v in value]
    return value


def error_headers(err: AppError, status: int) -> dict[str, str]:
    """Headers every answer of ``err`` carries: ``Retry-After`` on a 429 or 503."""
    seconds = retry_after_seconds(err.code, status, err.details)
    return {} if seconds is None else {"Retry-After": str(seconds)}


def error_response(
    err: AppError, status: int | None = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    """The JSON answer for ``err`` (reference §4).

    Args:
        err: the refusal.
        status: the HTTP status; the status of ``err.code`` by default.
        headers: extra headers (``Allow``…); ``Retry-After`` is added on 429/503.

    Returns:
        ``{"code","message","details"}`` with echoed request text cut to
        :data:`MAX_ECHO_CHARS` characters a run.
    """
    status = status or err.http_status
    body = {
        "code": err.code,
        "message": bounded_text(err.message),
        "details": bounded(err.details or {}),
    }
    return JSONResponse(
        body, status_code=status, headers={**error_headers(err, status), **(headers or {})}
    )


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


def _line_and_column(document: Any, position: int) -> tuple[int, int]:
    """1-based line and column of character ``position`` in a JSON document."""
    text = document.decode("utf-8", "replace") if isinstance(document, bytes) else str(document)
    before = text[:position]
    line = before.count("\n") + 1
    return line, position - (before.rfind("\n") + 1) + 1


def _bad_json(exc: RequestValidationError, error: dict[str, Any]) -> AppError:
    """A body that is no JSON: where it broke goes in the message, never as a field."""
    loc = error.get("loc", ())
    reason = str((error.get("ctx") or {}).get("error", "invalid JSON"))
    if len(loc) > 1 and isinstance(loc[1], int):
        line, column = _line_and_column(exc.body, loc[1])
        reason = f"{reason} at line {line}, column {column}"
    return AppError(
        ErrorCode.INVALID_ARGUMENT, f"request body is not valid JSON: {reason}", {"fields": []}
    )


def _not_json(request: Request, exc: RequestValidationError) -> AppError:
    """A body sent with another (or no) content type: FastAPI left it unparsed."""
    given = request.headers.get("content-type")
    got = f"got {given!r}" if given else "no Content-Type was sent"
    others = [e for e in exc.errors() if not e.get("loc") or e["loc"][0] != "body"]
    content_type = {
        "loc": ("header", "Content-Type"),
        "msg": f"must be {JSON_CONTENT_TYPE}",
        "type": "content_type",
    }
    return AppError(
        ErrorCode.INVALID_ARGUMENT,
        f"the request body must be JSON sent with Content-Type: {JSON_CONTENT_TYPE} ({got})",
        validation_details([content_type, *others]),
    )


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    bad_json = next((e for e in errors if e.get("type") == "json_invalid"), None)
    if bad_json is not None:
        return error_response(_bad_json(exc, bad_json))
    if isinstance(exc.body, bytes | bytearray) and exc.body:
        # FastAPI parses a body as JSON only under a JSON content type (strict_content_type)
        return error_response(_not_json(request, exc))
    err = AppError(
        ErrorCode.INVALID_ARGUMENT, "request validation failed", validation_details(errors)
    )
    return error_response(err)


#: Methods probed for ``Allow`` (every method some route of the gateway may serve).
PROBED_METHODS = ("DELETE", "GET", "HEAD", "PATCH", "POST", "PUT")
#: What a static-files mount (the docs assets) serves.
_STATIC_METHODS = frozenset({"GET", "HEAD"})


def _serves(routes: list[Any], scope: dict[str, Any]) -> bool:
    """Whether some route fully matches ``scope`` (path and method)."""
    for route in routes:
        match, _ = route.matches(scope)
        if match is Match.FULL:
            if isinstance(route, Mount):  # a mount matches any method; its app decides
                return isinstance(route.app, StaticFiles) and scope["method"] in _STATIC_METHODS
            return True
    return False


def allowed_methods(request: Request) -> list[str]:
    """Every method some route answers at this request's path, sorted (for ``Allow``,
    RFC 9110 §10.2.1; reference §9.3), docs, console and static files included.

    Each candidate method is tried against the app's routes as the router would
    (FastAPI nests included routers, so their routes are not listed flat).
    """
    routes = list(request.app.router.routes)
    return [m for m in PROBED_METHODS if _serves(routes, _app_scope(request, method=m))]


def _app_scope(request: Request, **changes: Any) -> dict[str, Any]:
    """The request's scope as the app's router saw it (a mount, such as the docs
    assets, moved ``root_path`` under itself), with ``changes``."""
    scope = request.scope
    root = scope.get("app_root_path", scope.get("root_path", ""))
    return {**scope, "root_path": root, **changes}


def _path_exists(request: Request, path: str) -> bool:
    scope = _app_scope(request, path=path)
    return any(route.matches(scope)[0] is not Match.NONE for route in request.app.router.routes)


def _not_found(request: Request) -> AppError:
    """404 for a path no route serves; a trailing slash gets a hint, not a redirect."""
    path = request.url.path
    stripped = path.rstrip("/")
    if path != stripped and stripped and _path_exists(request, stripped):
        return AppError(
            ErrorCode.NOT_FOUND,
            f"no such path: paths take no trailing slash (did you mean {stripped}?)",
        )
    return AppError(ErrorCode.NOT_FOUND, "no such path")


def _method_not_allowed(request: Request) -> tuple[AppError, dict[str, str]]:
    allow = allowed_methods(request)
    err = AppError(
        ErrorCode.METHOD_NOT_ALLOWED,
        f"method {request.method} is not allowed on this path; it allows {', '.join(allow)}",
        {"method": request.method, "allow": allow},
    )
    return err, {"Allow": ", ".join(allow)}


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    headers = dict(exc.headers or {})
    if exc.status_code == 405:
        err, allow = _method_not_allowed(request)
        return error_response(err, status=405, headers={**headers, **allow})
    if exc.status_code == 404:  # no route (routes refuse with AppError), or no such file
        return error_response(_not_found(request), status=404, headers=headers)
    code = _STATUS_CODES.get(exc.status_code, ErrorCode.INTERNAL)
    message = exc.detail if isinstance(exc.detail, str) else code
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
