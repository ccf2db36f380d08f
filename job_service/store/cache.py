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

Statements travel as :class:`Sql` (key, builder, values), which a
:mod:`statement batch <job_service.store.batch>` runs; the store names each
shape once as a :class:`Statement` (:mod:`job_service.store.statements`).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy.sql import ClauseElement

if TYPE_CHECKING:
    from job_service.store.clock import DbClock

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


@dataclass(frozen=True, slots=True)
class Sql:
    """One statement with its values, ready to run or to queue in a batch.

    Attributes:
        key: its cache key (every fact its shape depends on, the dialect
            included); None for a one-off shape, built and compiled per call.
        build: makes the statement, with bound parameters for the per-call values.
        params: this call's values by bind name (for an INSERT, its columns).
    """

    key: Hashable | None
    build: Callable[[], Any]
    params: Mapping[str, Any]

    def statement(self) -> Any:
        """The statement object: the cached one for its key, else a fresh build."""
        return self.build() if self.key is None else statement(self.key, self.build)


class Statement:
    """A named statement shape: ``build(clock, *shape)`` makes it for one dialect.

    Used as a decorator on a builder function; its name is the cache key's
    first part, the dialect and ``shape`` the rest, so a shape is built once
    per process.

    Example::

        @Statement
        def get_job(clock: DbClock) -> Select:
            \"\"\"One job row by id (bound: ``g_job_id``).\"\"\"
            return select(jobs).where(jobs.c.job_id == bindparam("g_job_id"))

        sql = get_job.sql(clock, {"g_job_id": job_id})
    """

    def __init__(self, build: Callable[..., Any]) -> None:
        self.name: str = build.__name__
        self.__doc__ = build.__doc__
        self._build = build

    def key(self, clock: DbClock, *shape: Hashable) -> Hashable:
        """The cache key of this statement for ``clock``'s dialect and ``shape``."""
        return (self.name, clock.dialect, *shape)

    def get(self, clock: DbClock, *shape: Hashable) -> Any:
        """The (cached) statement object."""
        return statement(self.key(clock, *shape), lambda: self._build(clock, *shape))

    def sql(self, clock: DbClock, params: Mapping[str, Any], *shape: Hashable) -> Sql:
        """This statement with ``params`` as an :class:`Sql`."""
        return Sql(self.key(clock, *shape), lambda: self._build(clock, *shape), params)
