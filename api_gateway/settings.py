"""Gateway settings from the environment (reference §7)."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, Field

from airuntime_common.settings import CommonSettings, require

#: A browser origin as the ``Origin`` header spells it: scheme, host, optional port.
_ORIGIN = re.compile(r"^https?://[^/?#@\s:]+(:\d{1,5})?$", re.IGNORECASE)


def _cors_origins(value: str) -> str:
    """A comma list of origins (``https://app.example``) or ``*``, else ValueError.

    An origin with a path or a trailing slash (``https://app.example/``) would never
    equal a browser's ``Origin`` header and CORS would silently stay off for it.
    """
    for origin in (o.strip() for o in value.split(",")):
        if origin and origin != "*" and not _ORIGIN.match(origin):
            raise ValueError(
                "must be a comma list of origins, each scheme://host[:port] with no path "
                "or trailing slash (e.g. https://app.example,http://localhost:5173), or *"
            )
    return value


CorsOrigins = Annotated[str, AfterValidator(_cors_origins)]


class GatewaySettings(CommonSettings):
    """Variables the api_gateway reads.

    Attributes:
        JWT_SECRET: HS256 secret of user/admin tokens; required.
        JWT_ISSUER: when set, the ``iss`` claim must equal it.
        JWT_LEEWAY_SECONDS: clock skew allowed between a token's issuer and the
            gateway when ``exp``, ``nbf`` and ``iat`` are judged (seconds, 0..300;
            reference §9.3): a token minted a few seconds "in the future" is taken.
        GATEWAY_HOST, GATEWAY_PORT: listen address (port 0 picks a free port).
        CORS_ORIGINS: comma list of allowed browser origins (``scheme://host[:port]``,
            or ``*`` for any); empty (the default) turns CORS off (reference §9.3).
        MAX_BODY_BYTES: largest request body accepted (bytes); above it → 413.
        MAX_JSON_DEPTH: deepest JSON nesting accepted in a body; deeper → 400.
        RUNTIME_WORKER_ADDRS: comma list of worker status addresses polled by
            ``/admin/ai/runtime`` in addition to the ones workers report.
        GRPC_TIMEOUT_SECONDS: deadline of every backend call (seconds).
        WORKER_STATUS_TIMEOUT_SECONDS: deadline of each worker ``GetStatus`` (seconds).
        SSE_MAX_STREAMS_PER_USER: most event streams one user may hold open on one
            gateway process; one more → 429 ``TOO_MANY_STREAMS`` (reference §9.1).
        SSE_PING_SECONDS: seconds between ``: ping`` comments on an idle event
            stream (at most 15, reference §9.1).
        WATCH_RECONNECT_SECONDS: pause before re-opening a failed watch of job
            changes (seconds).
    """

    JWT_SECRET: str = ""
    JWT_ISSUER: str = ""
    JWT_LEEWAY_SECONDS: int = Field(default=30, ge=0, le=300)
    GATEWAY_HOST: str = "0.0.0.0"
    GATEWAY_PORT: int = Field(default=3000, ge=0, le=65535)
    CORS_ORIGINS: CorsOrigins = ""
    MAX_BODY_BYTES: int = 2 * 1024 * 1024
    MAX_JSON_DEPTH: int = 64
    RUNTIME_WORKER_ADDRS: str = ""
    GRPC_TIMEOUT_SECONDS: float = 10.0
    WORKER_STATUS_TIMEOUT_SECONDS: float = 1.0
    SSE_MAX_STREAMS_PER_USER: int = Field(default=5, ge=1, le=10_000)
    SSE_PING_SECONDS: float = Field(default=15.0, gt=0, le=15)
    WATCH_RECONNECT_SECONDS: float = Field(default=0.5, gt=0, le=60)

    def check(self) -> None:
        """Refuse to start without the secrets.

        Raises:
            MissingSetting: naming ``RUNTIME_SERVICE_TOKEN`` and/or ``JWT_SECRET``.
        """
        require(self, "RUNTIME_SERVICE_TOKEN", "JWT_SECRET")

    @property
    def cors_origins(self) -> list[str]:
        """``CORS_ORIGINS`` split into a list, lower-cased as browsers send ``Origin``
        (empty = CORS off)."""
        return [o.strip().lower() for o in self.CORS_ORIGINS.split(",") if o.strip()]

    @property
    def worker_addrs(self) -> list[str]:
        """``RUNTIME_WORKER_ADDRS`` split into a list."""
        return [a.strip() for a in self.RUNTIME_WORKER_ADDRS.split(",") if a.strip()]
