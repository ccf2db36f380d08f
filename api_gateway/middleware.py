"""The outermost ASGI layer: request id, body limits, JSON sanity, metrics, last-resort 500.

A pure ASGI middleware (no ``BaseHTTPMiddleware``) so context variables set here
reach the endpoint. For each HTTP request it

* takes ``X-Request-Id`` (or generates one), binds it to the log context and
  echoes it on the answer;
* refuses a body over ``MAX_BODY_BYTES`` with 413 ``PAYLOAD_TOO_LARGE``, by
  ``Content-Length`` and by the bytes actually streamed;
* refuses a JSON body that is not UTF-8, nests deeper than ``MAX_JSON_DEPTH``
  or holds a NUL character in a string with 400 ``INVALID_ARGUMENT`` (before
  any parser recurses into it; NUL has no place in ids or text and some
  databases truncate at it);
* marks answers under ``/internal/`` and ``/v1/me/`` ``Cache-Control: no-store``
  (the resolved key, errors included);
* gives any 429 or 503 that reaches it without ``Retry-After`` the default one
  (SPEC §9.3; error answers get theirs from :mod:`api_gateway.retry_after`);
* counts requests and latency by route template and status (Prometheus);
* turns any unhandled exception into 500 ``INTERNAL`` without a stack trace.
"""

from __future__ import annotations

import contextvars
import json
import logging
import re
import time
import uuid
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from airuntime_common.errors import AppError, ErrorCode
from airuntime_common.logs import bind, log_context
from api_gateway import retry_after
from api_gateway.errors import error_headers, validation_details

log = logging.getLogger(__name__)

request_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "gateway_request_id", default=None
)

#: Answers under these paths may carry keys or per-user data: never cached.
NO_STORE_PREFIXES = ("/internal/", "/v1/me/")

_REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")


class GatewayMetrics:
    """Prometheus collectors of one app, in their own registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "gateway_http_requests_total",
            "HTTP requests by method, route template and status.",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "gateway_http_request_duration_seconds",
            "HTTP request latency in seconds by method and route template.",
            ["method", "route"],
            registry=self.registry,
        )


def json_depth_ok(text: str, limit: int) -> bool:
    """Whether the nesting of JSON ``text`` stays within ``limit`` levels.

    Scans brackets outside string literals; does not validate the JSON itself.
    """
    if text.count("[") + text.count("{") <= limit:
        return True  # cannot nest deeper than the number of openers
    depth = 0
    in_string = False
    escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > limit:
                return False
        elif ch in "]}":
            depth -= 1
    return True


def _nul_fields(text: str) -> list[tuple[str, ...]]:
    """Locations (``("body", "events", "0", "eventId")``, as validation errors give
    them) of the strings and keys of a JSON document that hold a NUL character; for
    a key, the location of the object holding it.

    Invalid JSON answers []: the route's own parser refuses it with 400.
    """
    try:
        value = json.loads(text)
    except ValueError:
        return []
    found: set[tuple[str, ...]] = set()
    stack: list[tuple[tuple[str, ...], Any]] = [(("body",), value)]
    while stack:
        loc, item = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                found.add(loc)
        elif isinstance(item, dict):
            if any("\x00" in key for key in item):
                found.add(loc)
            stack.extend(((*loc, k), v) for k, v in item.items())
        elif isinstance(item, list):
            stack.extend(((*loc, str(i)), v) for i, v in enumerate(item))
    return sorted(found)


def _nul_refusal(locations: list[tuple[str, ...]]) -> AppError:
    """400 ``INVALID_ARGUMENT`` naming the fields (SPEC §3.1), as validation does."""
    return AppError(
        ErrorCode.INVALID_ARGUMENT,
        "text must not contain NUL characters",
        validation_details(
            {"loc": loc, "msg": "must not contain NUL characters", "type": "string_nul"}
            for loc in locations
        ),
    )


async def _send_error(send: Send, err: AppError) -> None:
    # the spelling of FastAPI's JSONResponse, which renders every other error
    body = json.dumps(err.body(), ensure_ascii=False, separators=(",", ":")).encode()
    extra = error_headers(err, err.http_status)
    await send(
        {
            "type": "http.response.start",
            "status": err.http_status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *((k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in extra.items()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _replay(messages: list[Message], receive: Receive) -> Receive:
    """A receive that first hands out ``messages`` in order, then defers to ``receive``."""
    queue = list(messages)

    async def replayed() -> Message:
        if queue:
            return queue.pop(0)
        return await receive()

    return replayed


class GatewayMiddleware:
    """See the module docstring.

    Args:
        app: the wrapped ASGI app.
        max_body_bytes: body limit in bytes.
        max_json_depth: JSON nesting limit.
        metrics: where to count requests.
    """

    def __init__(
        self, app: ASGIApp, *, max_body_bytes: int, max_json_depth: int, metrics: GatewayMetrics
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.max_json_depth = max_json_depth
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        given = headers.get("x-request-id", "")
        request_id = given if _REQUEST_ID_RE.match(given) else uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id
        rid_header = (b"x-request-id", request_id.encode())
        path = str(scope.get("path", ""))
        no_store = path.startswith(NO_STORE_PREFIXES)
        status_box = {"status": 500, "started": False}

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                status_box["status"] = message["status"]
                status_box["started"] = True
                hdrs = [h for h in message.get("headers", []) if h[0].lower() != b"x-request-id"]
                hdrs.append(rid_header)
                if no_store and not any(h[0].lower() == b"cache-control" for h in hdrs):
                    hdrs.append((b"cache-control", b"no-store"))
                if message["status"] in retry_after.STATUSES and not any(
                    h[0].lower() == b"retry-after" for h in hdrs
                ):
                    hdrs.append((b"retry-after", str(retry_after.DEFAULT_SECONDS).encode()))
                message = {**message, "headers": hdrs}
            await send(message)

        rid_token = request_id_var.set(request_id)
        log_token = bind(requestId=request_id)
        try:
            body_receive = await self._read_body(scope, receive, headers)
            if isinstance(body_receive, AppError):
                await _send_error(send_wrapper, body_receive)
            else:
                await self.app(scope, body_receive, send_wrapper)
        except Exception:
            log.exception("unhandled error in %s %s", scope.get("method"), scope.get("path"))
            if not status_box["started"]:
                await _send_error(send_wrapper, AppError(ErrorCode.INTERNAL, "internal error"))
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            method = str(scope.get("method", ""))
            self.metrics.requests.labels(method, template, str(status_box["status"])).inc()
            elapsed = time.perf_counter() - started
            self.metrics.latency.labels(method, template).observe(elapsed)
            log.info(
                "%s %s %s",
                method,
                template,
                status_box["status"],
                extra={
                    "fields": {
                        "method": method,
                        "route": template,
                        "status": status_box["status"],
                        "durationMs": round(elapsed * 1000, 1),
                    }
                },
            )
            request_id_var.reset(rid_token)
            log_context.reset(log_token)

    async def _read_body(
        self, scope: Scope, receive: Receive, headers: dict[str, str]
    ) -> Receive | AppError:
        """Read the whole body (bounded) and return a receive that replays it, or the refusal."""
        too_large = AppError(
            ErrorCode.PAYLOAD_TOO_LARGE,
            f"request body exceeds {self.max_body_bytes} bytes",
            {"maxBytes": self.max_body_bytes},
        )
        length = headers.get("content-length")
        if length is not None:
            try:
                if int(length) > self.max_body_bytes:
                    return too_large
            except ValueError:
                return AppError(ErrorCode.INVALID_ARGUMENT, "invalid Content-Length")
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                # client went away: let the app see the disconnect
                return _replay([message], receive)
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return too_large
            chunks.append(chunk)
            more = bool(message.get("more_body", False))
        body = b"".join(chunks)
        content_type = headers.get("content-type", "")
        if body and ("json" in content_type or not content_type):
            try:
                text = body.decode("utf-8")
            except UnicodeDecodeError:
                return AppError(ErrorCode.INVALID_ARGUMENT, "request body is not valid UTF-8")
            if not json_depth_ok(text, self.max_json_depth):
                return AppError(
                    ErrorCode.INVALID_ARGUMENT,
                    f"JSON nests deeper than {self.max_json_depth} levels",
                    {"maxDepth": self.max_json_depth},
                )
            if "\x00" in text:  # a raw NUL: not even JSON, no field to name
                return _nul_refusal([])
            if "\\u0000" in text.lower() and (locations := _nul_fields(text)):
                return _nul_refusal(locations)
        return _replay([{"type": "http.request", "body": body, "more_body": False}], receive)
