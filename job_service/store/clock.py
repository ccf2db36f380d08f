"""The one clock: SQL expressions for "now" on the database (reference §1, §2.3).

Lease arithmetic never uses Python's clock. On MySQL/MariaDB the expressions
are ``UTC_TIMESTAMP(6)`` / ``TIMESTAMPADD(MICROSECOND, n, UTC_TIMESTAMP(6))``
(UTC whatever the session time zone); on SQLite they are ``strftime`` text in
SQLAlchemy's own storage format (``YYYY-MM-DD HH:MM:SS.ffffff``) so stored
values compare and sort correctly as text and read back as datetimes.
"""

from __future__ import annotations

from datetime import date, datetime

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Date,
    DateTime,
    String,
    bindparam,
    func,
    literal,
    literal_column,
    select,
    type_coerce,
)
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from job_service.store.cache import stable

_SQLITE_FMT = "'%Y-%m-%d %H:%M:%f'"
#: (dialect, offset µs) → its shared "now + offset" expression (see DbClock.plus).
_SHARED: dict[tuple[str, int], ColumnElement[datetime]] = {}


class DbClock:
    """Builds "now" expressions for one SQL dialect.

    Args:
        dialect: ``engine.dialect.name`` — ``"sqlite"``, ``"mysql"`` or ``"mariadb"``.
    """

    #: Distinct (dialect, offset) expressions kept and shared (see :meth:`plus`).
    MAX_SHARED_OFFSETS = 64

    def __init__(self, dialect: str) -> None:
        self.dialect = dialect
        self.is_sqlite = dialect == "sqlite"

    def now(self) -> ColumnElement[datetime]:
        """The database's current UTC time (µs on MySQL, ms on SQLite)."""
        return self.plus(0.0)

    def plus(self, seconds: float, *, varying: bool = False) -> ColumnElement[datetime]:
        """The database's current UTC time plus ``seconds`` (may be negative or fractional).

        The expressions of the first :attr:`MAX_SHARED_OFFSETS` distinct offsets
        (now, the lease, …) are built once with the offset in the SQL text,
        shared and registered as stable, so hot-path statements embedding them
        are cached (:mod:`job_service.store.cache`). Any other offset (e.g. a jittered
        backoff) is built per call with the offset as a bound parameter: the
        SQL text, and so the engine's compiled form, is the same for every
        value, so per-call offsets neither compile a statement each nor fill
        the engine's compiled cache.

        Args:
            seconds: the offset in seconds.
            varying: the offset differs from call to call (a jittered backoff):
                bind it at once rather than take one of the shared slots.
        """
        if varying:
            return self._build_plus_bound(seconds)
        key = (self.dialect, round(float(seconds) * 1_000_000))
        shared = _SHARED.get(key)
        if shared is not None:
            return shared
        if len(_SHARED) < self.MAX_SHARED_OFFSETS:
            expr = _SHARED[key] = stable(self._build_plus(seconds))
            return expr
        return self._build_plus_bound(seconds)

    def _build_plus(self, seconds: float) -> ColumnElement[datetime]:
        if self.is_sqlite:
            mod = f"'{float(seconds):+.6f} seconds'"
            return literal_column(
                f"(strftime({_SQLITE_FMT}, 'now', {mod}) || '000')", type_=DateTime()
            )
        micros = round(float(seconds) * 1_000_000)
        return literal_column(
            f"TIMESTAMPADD(MICROSECOND, {micros}, UTC_TIMESTAMP(6))", type_=DateTime()
        )

    def _build_plus_bound(self, seconds: float) -> ColumnElement[datetime]:
        if self.is_sqlite:
            modifier = bindparam(None, f"{float(seconds):+.6f} seconds", type_=String())
            shifted = func.strftime(
                literal_column(_SQLITE_FMT), literal_column("'now'"), modifier, type_=String()
            )
            return type_coerce(shifted.concat("000"), DateTime())
        micros = bindparam(None, round(float(seconds) * 1_000_000), type_=BigInteger())
        return func.timestampadd(
            literal_column("MICROSECOND"),
            micros,
            literal_column("UTC_TIMESTAMP(6)"),
            type_=DateTime(),
        )

    def add_seconds(
        self, base: ColumnElement[datetime], seconds: ColumnElement[int]
    ) -> ColumnElement[datetime]:
        """``base + seconds`` for two column expressions (e.g. started_at + timeout_seconds)."""
        if self.is_sqlite:
            modifier = literal("+", String()).concat(seconds).concat(" seconds")
            shifted = func.strftime(literal_column(_SQLITE_FMT), base, modifier, type_=String())
            return type_coerce(shifted.concat("000"), DateTime())
        return func.timestampadd(literal_column("SECOND"), seconds, base, type_=DateTime())

    def today(self) -> ColumnElement[date]:
        """The database's current UTC date (``UTC_DATE()``; ``'YYYY-MM-DD'`` text on SQLite)."""
        if self.is_sqlite:
            return literal_column("date('now')", type_=Date())
        return literal_column("UTC_DATE()", type_=Date())

    def day_start(self) -> ColumnElement[datetime]:
        """Midnight UTC of the database's current day."""
        if self.is_sqlite:
            return literal_column(
                "(strftime('%Y-%m-%d 00:00:00.000', 'now') || '000')", type_=DateTime()
            )
        return literal_column("CAST(UTC_DATE() AS DATETIME(6))", type_=DateTime())

    async def read(self, conn: AsyncConnection | AsyncSession) -> datetime:
        """The database's current UTC time as a naive datetime (for reads, not leases)."""
        value = (await conn.execute(select(self.now()))).scalar_one()
        if isinstance(value, str):  # pragma: no cover - typed column parses it
            return datetime.fromisoformat(value)
        return value
