"""Who may call a route is settled before anything of the request is read
(reference §3.1, §4).

FastAPI reads and parses a route's body before it solves the route's
dependencies, and solves those in the order the handler names them. Left alone,
a malformed body (bad JSON, a NUL character, nesting too deep, too large), a bad
parameter or a dependency named before the token would be refused with 400 (or
413) before the caller is known: an unauthenticated caller would learn how the
request is validated, and a user token on an admin route would learn it too.

Every route of the gateway's routers is a :class:`GatedRoute`. Its handler

1. runs the access checks the route's dependencies stand for
   (:data:`api_gateway.deps.ACCESS_CHECKS`: the bearer token, the admin role, the
   service token; 401, then 403);
2. reads the body within ``MAX_BODY_BYTES`` and ``MAX_JSON_DEPTH``
   (:func:`api_gateway.body.read_body`; 413, 400);
3. hands the request to FastAPI, which parses and validates the rest (400).

:func:`check_routes` (called by ``create_app``) refuses to build an app in which a
route that needs a caller is not gated.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import Any

from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute, iter_route_contexts
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from api_gateway.body import read_body
from api_gateway.deps import ACCESS_CHECKS, get_settings

AccessCheck = Callable[[Request], Awaitable[object]]


def _calls(dependant: Dependant) -> Iterator[Callable[..., Any]]:
    """Every dependency callable of ``dependant``, outermost first (depth-first)."""
    for sub in dependant.dependencies:
        if sub.call is not None:
            yield sub.call
        yield from _calls(sub)


def access_checks(dependant: Dependant) -> tuple[AccessCheck, ...]:
    """The access checks a route's dependencies stand for, in the order FastAPI
    would meet them (an admin route: the admin check, which authenticates first).

    Args:
        dependant: the route's dependency tree (``route.dependant``).
    """
    found: list[AccessCheck] = []
    for call in _calls(dependant):
        check = ACCESS_CHECKS.get(call)
        if check is not None and check not in found:
            found.append(check)
    return tuple(found)


class GatedRoute(APIRoute):
    """An API route whose caller is checked before its request is read (see the
    module docstring). Use as ``APIRouter(route_class=GatedRoute)``."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        """FastAPI's handler of the route, behind the access checks and the body limits."""
        handler = super().get_route_handler()
        checks = access_checks(self.dependant)

        async def gated(request: Request) -> Response:
            for check in checks:
                await check(request)
            settings = get_settings(request)
            receive = await read_body(
                request.receive,
                {k.lower(): v for k, v in request.headers.items()},
                max_bytes=settings.MAX_BODY_BYTES,
                max_depth=settings.MAX_JSON_DEPTH,
            )
            return await handler(Request(request.scope, receive))

        return gated


def check_routes(routes: list[BaseRoute]) -> None:
    """Refuse an app in which a route that needs a caller could be read before the
    caller is known.

    Raises:
        RuntimeError: naming the route, when an API route with an access dependency
            is not a :class:`GatedRoute`, or takes one from its router (a router's
            ``dependencies=``), which the gate does not see.
    """
    for context in iter_route_contexts(routes):
        route = context.original_route
        if not isinstance(route, APIRoute):
            continue
        effective = access_checks(context.dependant)
        if not effective:
            continue
        where = f"{sorted(context.methods or ())} {context.path}"
        if not isinstance(route, GatedRoute):
            raise RuntimeError(f"{where} needs a caller but is not a GatedRoute")
        if effective != access_checks(route.dependant):
            raise RuntimeError(f"{where} takes an access dependency from its router")
