"""Authentication and per-request dependencies (reference §3, §3.1).

* :data:`UserPrincipal` — ``Authorization: Bearer <JWT>``: HS256 only, ``sub``,
  ``role`` (``user``/``admin``) and ``exp`` required, ``iss`` checked when
  ``JWT_ISSUER`` is set. Missing, expired, badly signed, ``alg=none`` or the
  service token itself → 401 ``UNAUTHENTICATED``; so is a token whose ``exp``
  (``nbf``, ``iat``) is not a JSON number or whose ``sub`` is empty, over 128
  characters or holds a control character (reference §9.3).
* :data:`AdminPrincipal` — as above, and a user token → 403 ``PERMISSION_DENIED``.
* :data:`RuntimeCaller` — the shim: ``x-internal-api-key`` equal (constant time)
  to ``RUNTIME_SERVICE_TOKEN``, else 401 (checked first); ``X-Runtime-Instance-Id``
  required (400 ``INVALID_ARGUMENT``) except on ``/internal/runtime/health``.

Both tokens are OpenAPI security schemes and the instance id a header parameter
(:mod:`api_gateway.headers`), so a generated client sends them (reference §9.3).
"""

from __future__ import annotations

import hmac
import math
import unicodedata
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any, TypeGuard

import jwt
from fastapi import Depends, Request
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from airuntime_common.errors import AppError, ErrorCode
from api_gateway.backends import Backends, Caller
from api_gateway.headers import (
    BEARER_SCHEME,
    SERVICE_TOKEN_SCHEME,
    OptionalRuntimeInstanceIdHeader,
    RuntimeInstanceIdHeader,
)
from api_gateway.settings import GatewaySettings
from api_gateway.watch import JobHub

ROLES = ("user", "admin")
#: The longest ``sub`` (user id) accepted (reference §9.3).
SUB_MAX = 128
#: Unicode categories a ``sub`` must not hold: control (reference §9.3), and the other
#: invisible or unencodable ones (format, surrogate, private use, unassigned, line
#: and paragraph separators), since the id is shown in admin views and logs.
_FORBIDDEN_SUB_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})
_bearer = HTTPBearer(
    auto_error=False,
    scheme_name=BEARER_SCHEME,
    description="HS256 JWT with sub (the user id), role (user | admin) and exp; /v1 and /admin",
)
_internal_key = APIKeyHeader(
    name="x-internal-api-key",
    auto_error=False,
    scheme_name=SERVICE_TOKEN_SCHEME,
    description="RUNTIME_SERVICE_TOKEN; the /internal/runtime shim only",
)


@dataclass(frozen=True)
class Principal:
    """An authenticated user or admin.

    Attributes:
        user_id: the ``sub`` claim.
        role: ``"user"`` or ``"admin"``.
        plan: the optional ``plan`` claim (per-plan quotas, reference §6).
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


def get_hub(request: Request) -> JobHub:
    """The app's :class:`JobHub` (made on first use, on the app's backends; reference §9.1).

    Raises:
        AppError: 503 ``UNAVAILABLE`` before the lifespan has connected the backends.
    """
    hub: JobHub | None = getattr(request.app.state, "hub", None)
    if hub is None:
        backends = get_backends(request)
        settings = backends.settings
        hub = JobHub(
            backends.job,
            settings.RUNTIME_SERVICE_TOKEN,
            max_streams_per_user=settings.SSE_MAX_STREAMS_PER_USER,
            reconnect_seconds=settings.WATCH_RECONNECT_SECONDS,
        )
        request.app.state.hub = hub
    return hub


def request_id(request: Request) -> str | None:
    """The request id the middleware assigned."""
    state = request.scope.get("state") or {}
    rid = state.get("request_id")
    return str(rid) if rid else None


def _unauthenticated(message: str) -> AppError:
    return AppError(ErrorCode.UNAUTHENTICATED, message)


def _is_number(value: Any) -> bool:
    """A JSON number (RFC 7519 NumericDate): int or finite float, not a bool or text."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return math.isfinite(value)


def valid_sub(sub: Any) -> TypeGuard[str]:
    """Whether ``sub`` can be a user id: text of 1..128 characters with no control (or
    other invisible) character (reference §9.3)."""
    if not isinstance(sub, str) or not 1 <= len(sub) <= SUB_MAX:
        return False
    return not any(unicodedata.category(ch) in _FORBIDDEN_SUB_CATEGORIES for ch in sub)


def decode_token(token: str, settings: GatewaySettings) -> Principal:
    """Verify a user/admin JWT (reference §3.1, §9.3).

    ``exp``, ``nbf`` and ``iat`` are judged with ``JWT_LEEWAY_SECONDS`` of clock skew
    (reference §9.3): a token is taken until ``exp`` + leeway, and from ``nbf`` and
    ``iat`` − leeway (an issuer whose clock runs a few seconds ahead).

    Raises:
        AppError: 401 ``UNAUTHENTICATED`` for the service token, a bad signature,
            another algorithm (``none`` included), expiry or an ``nbf`` or ``iat``
            in the future (each beyond the leeway), a wrong issuer, a missing
            or invalid ``role``, an ``exp`` (or ``nbf``/``iat``, when present) that
            is not a JSON number (PyJWT would take the text ``"9999999999"``), or a
            ``sub`` that is empty, over 128 characters or holds a control character.
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
            leeway=settings.JWT_LEEWAY_SECONDS,
        )
    except jwt.ExpiredSignatureError:
        raise _unauthenticated("token expired") from None
    except jwt.ImmatureSignatureError:
        raise _unauthenticated("token not valid yet (nbf or iat in the future)") from None
    except jwt.InvalidTokenError:
        raise _unauthenticated("invalid token") from None
    for name in ("exp", "nbf", "iat"):
        if name in claims and not _is_number(claims[name]):
            raise _unauthenticated(f"invalid {name} claim: must be a number")
    sub = claims.get("sub")
    role = claims.get("role")
    plan = claims.get("plan")
    if not valid_sub(sub):
        raise _unauthenticated("invalid sub claim")
    if role not in ROLES:
        raise _unauthenticated("invalid role claim")
    return Principal(user_id=sub, role=str(role), plan=plan if isinstance(plan, str) else None)


async def authenticate_user(request: Request) -> Principal:
    """The caller of a ``/v1`` route (user or admin token), decoded once per request.

    Raises:
        AppError: 401 ``UNAUTHENTICATED`` without a bearer token or as
            :func:`decode_token`.
    """
    state = request.state
    principal: Principal | None = getattr(state, "principal", None)
    if principal is None:
        creds = await _bearer(request)
        if creds is None:
            raise _unauthenticated("missing bearer token")
        principal = decode_token(creds.credentials, get_settings(request))
        state.principal = principal
    return principal


async def authenticate_admin(request: Request) -> Principal:
    """The caller of an ``/admin`` route.

    Raises:
        AppError: 401 as :func:`authenticate_user` (checked first), then 403
            ``PERMISSION_DENIED`` for a user token.
    """
    principal = await authenticate_user(request)
    if principal.role != "admin":
        raise AppError(ErrorCode.PERMISSION_DENIED, "admin role required")
    return principal


async def authenticate_runtime(request: Request) -> None:
    """The shim's ``x-internal-api-key`` (constant-time compare).

    Raises:
        AppError: 401 ``UNAUTHENTICATED`` when it is missing or not the service token.
    """
    key = await _internal_key(request)
    settings = get_settings(request)
    if not key or not hmac.compare_digest(key.encode(), settings.RUNTIME_SERVICE_TOKEN.encode()):
        raise _unauthenticated("missing or wrong x-internal-api-key")


# The dependencies name their security scheme (so the OpenAPI document declares it)
# and defer to the checks above, which the route gate (api_gateway.gate) has already
# run by the time FastAPI solves them.


async def user_principal(
    request: Request,
    _creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    """Dependency: the caller of a ``/v1`` route (user or admin token)."""
    return await authenticate_user(request)


async def admin_principal(
    request: Request, _principal: Annotated[Principal, Depends(user_principal)]
) -> Principal:
    """Dependency: the caller of an ``/admin`` route; a user token → 403."""
    return await authenticate_admin(request)


async def service_token(
    request: Request, _key: Annotated[str | None, Depends(_internal_key)]
) -> None:
    """Dependency: the shim's ``x-internal-api-key`` (see :func:`authenticate_runtime`)."""
    await authenticate_runtime(request)


#: The access check each access dependency stands for: a route that depends on one
#: has it run before anything of the request is read (reference §3.1; api_gateway.gate).
ACCESS_CHECKS: dict[Callable[..., Any], Callable[[Request], Awaitable[object]]] = {
    user_principal: authenticate_user,
    admin_principal: authenticate_admin,
    service_token: authenticate_runtime,
}


ServiceToken = Annotated[None, Depends(service_token)]


async def runtime_caller(
    request: Request, _token: ServiceToken, instance: RuntimeInstanceIdHeader
) -> Caller:
    """Dependency: a runtime instance on the shim; returns a :class:`Caller` bound to it.

    The token is checked first: a call without it is 401 whatever its headers. The
    instance id is held to its declaration (1..128 printable ASCII characters, no
    surrounding spaces: it travels on as gRPC metadata) by FastAPI: else 400.

    Raises:
        AppError: 401 without the service token.
    """
    return Caller(get_backends(request), request_id(request), instance)


async def runtime_health_caller(
    request: Request, _token: ServiceToken, instance: OptionalRuntimeInstanceIdHeader = None
) -> Caller:
    """Dependency: the shim's health route: token only; an instance id is optional,
    and held to its declaration as everywhere when sent.

    Raises:
        AppError: 401 without the service token.
    """
    return Caller(get_backends(request), request_id(request), instance)


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


async def hub_dep(request: Request) -> JobHub:
    """Dependency: the app's :class:`JobHub`."""
    return get_hub(request)


Hub = Annotated[JobHub, Depends(hub_dep)]
