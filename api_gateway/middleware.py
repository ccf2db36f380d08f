"""The outermost ASGI layer: request id, body limits, JSON sanity, metrics, last-resort 500.

A pure ASGI middleware (no ``BaseHTTPMiddleware``) so context variables set here
reach the endpoint. For each HTTP request it

* takes ``X-Request-Id`` (or generates one), binds it to the log context and
  echoes it on the answer;
* marks answers under ``/internal/`` and ``/v1/me/`` ``Cache-Control: no-store``
  (the resolved key, errors included);
* gives any 429 or 503 that reaches it without ``Retry-After`` the default one
  (reference §9.3; error answers get theirs from :mod:`api_gateway.retry_after`);
* counts requests and latency by route template and status (Prometheus);
* turns any unhandled exception into 500 ``INTERNAL`` without a stack trace.

It reads no body: a route reads its own once its caller is known
(:mod:`api_gateway.gate`, :mod:`api_gateway.body`).
"""

from __future__ import annotations

import contextvars
import json
import logging
import re
import time
import uuid

from prometheus_client import CollectorRegistry, Counter, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from airuntime_common.errors import AppError, ErrorCode
from airuntime_common.logs import bind, log_context
from api_gateway import retry_after
from api_gateway.errors import error_headers

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


class GatewayMiddleware:
    """See the module docstring.

    Args:
        app: the wrapped ASGI app.
        metrics: where to count requests.
    """

    def __init__(self, app: ASGIApp, *, metrics: GatewayMetrics) -> None:
        self.app = app
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
            await self.app(scope, receive, send_wrapper)
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
