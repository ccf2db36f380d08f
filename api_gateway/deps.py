"""Authentication and per-request dependencies (SPEC §3, §3.1).

* :data:`UserPrincipal` — ``Authorization: Bearer <JWT>``: HS256 only, ``sub``,
  ``role`` (``user``/``admin``) and ``exp`` required, ``iss`` checked when
  ``JWT_ISSUER`` is set. Missing, expired, badly signed, ``alg=none`` or the
  service token itself → 401 ``UNAUTHENTICATED``.
* :data:`AdminPrincipal` — as above, and a user token → 403 ``PERMISSION_DENIED``.
* :data:`RuntimeCaller` — the shim: ``x-internal-api-key`` equal (constant time)
  to ``RUNTIME_SERVICE_TOKEN``, else 401; ``X-Runtime-Instance-Id`` required
  (400 ``INVALID_ARGUMENT``) except on ``/internal/runtime/health``.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Annotated

import jwt
from fastapi import Depends, Request
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from airuntime_common.errors import AppError, ErrorCode, invalid_argument
from api_gateway.backends import Backends, Caller
from api_gateway.settings import GatewaySettings

ROLES = ("user", "admin")
_bearer = HTTPBearer(auto_error=False, description="HS256 JWT with sub, role, exp")
_internal_key = APIKeyHeader(
    name="x-internal-api-key", auto_error=False, description="RUNTIME_SERVICE_TOKEN"
)


@dataclass(frozen=True)
class Principal:
    """An authenticated user or admin.

    Attributes:
        user_id: the ``sub`` claim.
        role: ``"user"`` or ``"admin"``.
        plan: the optional ``plan`` claim (per-plan quotas, SPEC §6).
    """

    user_id: str
    role: str
    plan: str | None = None

    @property
    def actor(self) -> str:
        """``"user:<id>"`` or ``"admin:<id>"`` for job events."""
        return f"{self.role}:{self.user_id}"


def get_settings(request: Request) -> GatewaySettings:
    """The app's settings."""
    settings: GatewaySettings = request.app.state.settings
    return settings


def get_backends(request: Request) -> Backends:
    """The app's gRPC backends.

    Raises:
        AppError: 503 ``UNAVAILABLE`` before the lifespan has connected them.
    """
    backends: Backends | None = getattr(request.app.state, "backends", None)
    if backends is None:
        raise AppError(ErrorCode.UNAVAILABLE, "backends are not connected yet")
    return backends


def request_id(request: Request) -> str | None:
    """The request id the middleware assigned."""
    state = request.scope.get("state") or {}
    rid = state.get("request_id")
    return str(rid) if rid else None


def _unauthenticated(message: str) -> AppError:
    return AppError(ErrorCode.UNAUTHENTICATED, message)


def decode_token(token: str, settings: GatewaySettings) -> Principal:
    """Verify a user/admin JWT.

    Raises:
        AppError: 401 ``UNAUTHENTICATED`` for the service token, a bad signature,
            another algorithm (``none`` included), expiry, a wrong issuer, or a
            missing/invalid ``sub``/``role``/``exp``.
    """
    if hmac.compare_digest(token.encode(), settings.RUNTIME_SERVICE_TOKEN.encode()):
        raise _unauthenticated("the service token is not accepted here")
    try:
        claims = jwt.decode(
            token,
            settings.JWT_SECRET,
            algorithms=["HS256"],
            options={"require": ["exp", "sub", "role"]},
            issuer=settings.JWT_ISSUER or None,
        )
    except jwt.ExpiredSignatureError:
        raise _unauthenticated("token expired") from None
    except jwt.InvalidTokenError:
        raise _unauthenticated("invalid token") from None
    sub = claims.get("sub")
    role = claims.get("role")
    plan = claims.get("plan")
    if not isinstance(sub, str) or not sub or len(sub) > 128:
        raise _unauthenticated("invalid sub claim")
    if role not in ROLES:
        raise _unauthenticated("invalid role claim")
    return Principal(user_id=sub, role=str(role), plan=plan if isinstance(plan, str) else None)


async def user_principal(
    request: Request,
    creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    """Dependency: the caller of a ``/v1`` route (user or admin token)."""
    if creds is None:
        raise _unauthenticated("missing bearer token")
    return decode_token(creds.credentials, get_settings(request))


async def admin_principal(principal: Annotated[Principal, Depends(user_principal)]) -> Principal:
    """Dependency: the caller of an ``/admin`` route; a user token → 403."""
    if principal.role != "admin":
        raise AppError(ErrorCode.PERMISSION_DENIED, "admin role required")
    return principal


def _check_service_token(request: Request, key: str | None) -> None:
    settings = get_settings(request)
    if not key or not hmac.compare_digest(key.encode(), settings.RUNTIME_SERVICE_TOKEN.encode()):
        raise _unauthenticated("missing or wrong x-internal-api-key")


async def runtime_caller(
    request: Request,
    key: Annotated[str | None, Depends(_internal_key)],
) -> Caller:
    """Dependency: a runtime instance on the shim; returns a :class:`Caller` bound to it.

    Raises:
        AppError: 401 without the service token; 400 without ``X-Runtime-Instance-Id``
            or with one that is not 1..128 printable ASCII characters.
    """
    _check_service_token(request, key)
    instance_id = (request.headers.get("x-runtime-instance-id") or "").strip()
    if not instance_id:
        raise invalid_argument(
            "X-Runtime-Instance-Id header is required", field="X-Runtime-Instance-Id"
        )
    if len(instance_id) > 128:
        raise invalid_argument("X-Runtime-Instance-Id is too long", field="X-Runtime-Instance-Id")
    if not (instance_id.isascii() and instance_id.isprintable()):
        # it travels on as gRPC metadata, which takes printable ASCII only
        raise invalid_argument(
            "X-Runtime-Instance-Id must be printable ASCII", field="X-Runtime-Instance-Id"
        )
    return Caller(get_backends(request), request_id(request), instance_id)


async def runtime_health_caller(
    request: Request,
    key: Annotated[str | None, Depends(_internal_key)],
) -> Caller:
    """Dependency: the shim's health route: token only, instance id optional."""
    _check_service_token(request, key)
    instance_id = (request.headers.get("x-runtime-instance-id") or "").strip()[:128] or None
    return Caller(get_backends(request), request_id(request), instance_id)


async def caller(request: Request) -> Caller:
    """Dependency: a :class:`Caller` for a user/admin route."""
    return Caller(get_backends(request), request_id(request))


UserPrincipal = Annotated[Principal, Depends(user_principal)]
AdminPrincipal = Annotated[Principal, Depends(admin_principal)]
RuntimeCaller = Annotated[Caller, Depends(runtime_caller)]
RuntimeHealthCaller = Annotated[Caller, Depends(runtime_health_caller)]
Backend = Annotated[Caller, Depends(caller)]


async def settings_dep(request: Request) -> GatewaySettings:
    """Dependency: the app's settings."""
    return get_settings(request)


Settings = Annotated[GatewaySettings, Depends(settings_dep)]
