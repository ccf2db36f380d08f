"""Hot-path SQL built once per process and dialect, executed with bound parameters.

Building a SQLAlchemy Core statement and computing its cache key costs more
CPU than running it through the driver (about 0.6 ms against 0.5 ms for a
lease-guarded ``SELECT`` on the job service's machine; ``python -m bench``).
The job service's hot path (claim, implied start, heartbeat, result, fail,
events) therefore builds each statement shape once, with ``bindparam``
placeholders for everything that varies per call, and keeps it here. SQLAlchemy
then finds its compiled form in the engine's compiled cache by the memoized
cache key of the very same object.

A shape may embed SQL expressions (``UTC_TIMESTAMP(6)``, ``attempt_no + 1``):
only expressions registered with :func:`stable` may be part of a cached
shape, so a cache hit can never stand for a different expression. Callers
passing an unregistered expression get a freshly built statement (correct,
just not cached).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, TypeVar

from sqlalchemy.sql import ClauseElement

E = TypeVar("E")

#: id → expression, for every registered stable expression (kept alive here so
#: an id is never reused by another object).
_STABLE: dict[int, Any] = {}
_STATEMENTS: dict[Hashable, Any] = {}


def stable(expr: E) -> E:
    """Register ``expr`` as immutable and shared: cached shapes may embed it. Returns it."""
    _STABLE[id(expr)] = expr
    return expr


def stable_id(expr: Any) -> int | None:
    """The cache identity of a registered expression; None for an unregistered one."""
    key = id(expr)
    return key if _STABLE.get(key) is expr else None


def is_sql(value: Any) -> bool:
    """Whether ``value`` is a SQL expression rather than a plain Python value."""
    return isinstance(value, ClauseElement)


def statement(key: Hashable, build: Callable[[], E]) -> E:
    """The statement cached under ``key``; ``build()`` makes it on the first call.

    Args:
        key: every fact the shape depends on, the dialect included.
        build: makes the statement (bound parameters for the per-call values).
    """
    stmt = _STATEMENTS.get(key)
    if stmt is None:
        stmt = _STATEMENTS[key] = build()
    return stmt
