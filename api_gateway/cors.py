"""CORS for browser clients, off unless ``CORS_ORIGINS`` lists origins (reference §9.3).

Starlette's :class:`~starlette.middleware.cors.CORSMiddleware`, with two changes
a browser client and a cache rely on:

* a request from an origin not listed gets no CORS header at all (Starlette
  would still send ``Access-Control-Expose-Headers`` and, on a preflight, the
  allowed methods and headers): it is answered exactly as with CORS off, e.g. a
  preflight is 405 ``METHOD_NOT_ALLOWED``;
* every answer carries ``Vary: Origin``, so a shared cache never hands one
  origin's answer to another;

and a refused preflight from a listed origin (a method or header not allowed)
is a reference §4 error body, not plain text.

It wraps the whole app, so every answer a listed origin gets carries the CORS
headers, the gateway's own refusals (413, 500…) included.
"""

from __future__ import annotations

from starlette.datastructures import Headers, MutableHeaders
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from airuntime_common.errors import AppError, ErrorCode
from api_gateway.errors import error_response

#: Methods a browser may use (the API's; OPTIONS is the preflight itself).
ALLOW_METHODS = ("GET", "POST", "PUT", "DELETE")
#: Request headers a browser may send beyond the CORS-safelisted ones: the bearer
#: token, JSON bodies, create idempotency, job waits and event streams (reference §9.1),
#: and the request id.
ALLOW_HEADERS = (
    "Authorization",
    "Content-Type",
    "Idempotency-Key",
    "If-None-Match",
    "Last-Event-ID",
    "X-Request-Id",
)
#: Response headers a browser script may read (reference §9.3 names the first three).
EXPOSE_HEADERS = ("ETag", "Idempotent-Replayed", "Retry-After", "X-Request-Id")
#: How long a browser may cache a preflight answer (seconds).
MAX_AGE_SECONDS = 600


def _vary_origin(send: Send) -> Send:
    async def sender(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = MutableHeaders(scope=message)
            if "origin" not in headers.get("vary", "").lower():
                headers.append("Vary", "Origin")
        await send(message)

    return sender


class GatewayCORS(CORSMiddleware):
    """See the module docstring.

    Args:
        app: the wrapped ASGI app.
        origins: the allowed origins (``CORS_ORIGINS``; ``*`` allows any).
    """

    def __init__(self, app: ASGIApp, origins: list[str]) -> None:
        super().__init__(
            app,
            allow_origins=origins,
            allow_methods=ALLOW_METHODS,
            allow_headers=ALLOW_HEADERS,
            allow_credentials=False,  # bearer tokens, never cookies
            expose_headers=EXPOSE_HEADERS,
            max_age=MAX_AGE_SECONDS,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        origin = Headers(scope=scope).get("origin")
        if origin is None or not self.is_allowed_origin(origin):
            await self.app(scope, receive, _vary_origin(send))
            return
        await super().__call__(scope, receive, send)

    def preflight_response(self, request_headers: Headers) -> Response:
        """Starlette's preflight answer; a refusal rendered as a reference §4 body."""
        response = super().preflight_response(request_headers)
        if response.status_code < 400:
            return response
        reason = bytes(response.body).decode("utf-8", "replace")
        keep = {
            k: v
            for k, v in response.headers.items()
            if k.lower() not in ("content-length", "content-type")
        }
        err = AppError(
            ErrorCode.INVALID_ARGUMENT,
            f"CORS preflight refused ({reason})",
            {"allowMethods": list(ALLOW_METHODS), "allowHeaders": list(ALLOW_HEADERS)},
        )
        return error_response(err, status=response.status_code, headers=keep)
