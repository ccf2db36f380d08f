"""The platform-key circuit breakers, one per model provider, shared by all replicas
through the database (reference §6, §9.4).

Each provider's row follows the §6 rules: ``closed`` → (``BREAKER_FAILURE_THRESHOLD``
consecutive failures) → ``open`` → (``BREAKER_COOLDOWN_SECONDS`` later) →
``half_open``: up to ``BREAKER_HALF_OPEN_PROBES`` probes pass; the next success
closes it, the next failure opens it again. A probe ending with a neutral code
frees its slot; when every slot is taken but no probe is live any more (cancelled
before it ran, expired), the slots are re-armed so a breaker never stays half-open
for good. Fed by the endings of platform-key attempts, each against the provider
the attempt ran on; codes in ``BREAKER_FAILURE_CODES`` are failures, a success
resets, everything else is neutral. All times are the database's.

Where the probes are counted depends on whether a platform-key attempt has a
choice of provider:

* one provider (the default ``MODEL_PROVIDERS``): as in the first release, at
  create (:func:`admit_new_job`): an open breaker refuses new platform-key jobs, a
  half-open one lets its probes be created; every queued job still runs on it;
* several providers (failover): the provider of an attempt is chosen when its lease
  is granted (:func:`choose_providers`): the first whose breaker admits it (closed,
  or half-open with a free probe slot: the attempt is a probe); a create is refused
  only while every provider's breaker is open (:func:`judge_failover_create`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import String, bindparam, select, update
from sqlalchemy.dialects.mysql import insert as mysql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from airuntime_common.errors import BREAKER_FAILURE_CODES, AppError, ErrorCode
from airuntime_common.model_providers import DEFAULT_PROVIDER
from airuntime_common.states import LEASED, LIVE
from job_service.settings import JobServiceSettings
from job_service.store.cache import Sql
from job_service.store.clock import DbClock
from job_service.store.engine import DbExec
from job_service.store.tables import breaker, jobs

#: What a create refused while every half-open probe is out is told to wait (s):
#: a probe's answer usually comes within seconds.
PROBE_RETRY_AFTER_SECONDS = 5


@dataclass(frozen=True)
class BreakerView:
    """One provider's breaker as the admin API shows it (reference §3.1, §9.4)."""

    state: str
    consecutive_failures: int
    opened_at: datetime | None
    half_open_at: datetime | None
    provider: str = DEFAULT_PROVIDER


@dataclass(frozen=True)
class BreakerRow:
    """One provider's stored row (``probes`` = ``probes_in_flight``)."""

    provider: str
    state: str = "closed"
    failures: int = 0
    opened_at: datetime | None = None
    half_open_at: datetime | None = None
    probes: int = 0

    @classmethod
    def of(cls, row: Sequence[Any]) -> BreakerRow:
        """From a :func:`rows_sql` row."""
        return cls(str(row[0]), str(row[1]), int(row[2]), row[3], row[4], int(row[5]))


_CLOSED = {
    "state": "closed",
    "consecutive_failures": 0,
    "probes_in_flight": 0,
    "opened_at": None,
    "half_open_at": None,
}


async def ensure_rows(session: DbExec, clock: DbClock, providers: Sequence[str]) -> None:
    """Insert the breaker row of each of ``providers`` that is missing (idempotent, race-free)."""
    for name in providers:
        values = {"provider": name, "state": "closed", "consecutive_failures": 0}
        values["probes_in_flight"] = 0
        if clock.is_sqlite:
            await session.execute(sqlite_insert(breaker).values(**values).on_conflict_do_nothing())
        else:
            await session.execute(mysql_insert(breaker).values(**values).prefix_with("IGNORE"))


async def ensure_row(session: DbExec, clock: DbClock, provider: str = DEFAULT_PROVIDER) -> None:
    """:func:`ensure_rows` of one provider (the default's when none is named)."""
    await ensure_rows(session, clock, [provider])


_ROW_COLUMNS = (
    breaker.c.provider,
    breaker.c.state,
    breaker.c.consecutive_failures,
    breaker.c.opened_at,
    breaker.c.half_open_at,
    breaker.c.probes_in_flight,
)


def row_sql(*, lock: bool, provider: str = DEFAULT_PROVIDER) -> Sql:
    """One provider's row (a :class:`BreakerRow`'s columns), for a batch; with ``lock``,
    ``FOR UPDATE`` (MySQL/MariaDB only)."""

    def build() -> Any:
        stmt = select(*_ROW_COLUMNS).where(
            breaker.c.provider == bindparam("b_provider", type_=String())
        )
        return stmt.with_for_update() if lock else stmt

    return Sql(("breaker_row", lock), build, {"b_provider": provider})


def rows_sql(*, lock: bool = False, providers: Sequence[str] | None = None) -> Sql:
    """Every provider's row (or those of ``providers``), by name; with ``lock``,
    ``FOR UPDATE`` (MySQL/MariaDB only), taken in name order on every replica."""
    if providers is not None:
        names = sorted(set(providers))

        def build_some() -> Any:
            stmt = (
                select(*_ROW_COLUMNS)
                .where(breaker.c.provider.in_(bindparam("b_names", expanding=True)))
                .order_by(breaker.c.provider)
            )
            return stmt.with_for_update() if lock else stmt

        return Sql(("breaker_some", lock), build_some, {"b_names": names})

    def build() -> Any:
        stmt = select(*_ROW_COLUMNS).order_by(breaker.c.provider)
        return stmt.with_for_update() if lock else stmt

    return Sql(("breaker_rows", lock), build, {})


async def _rows(
    session: DbExec, clock: DbClock, providers: Sequence[str], *, lock: bool
) -> dict[str, BreakerRow]:
    """The rows of ``providers`` (a missing one as closed, its row inserted)."""
    lock = lock and not clock.is_sqlite
    sql = rows_sql(lock=lock, providers=providers)
    found = {
        r.provider: r
        for r in (BreakerRow.of(row) for row in await session.execute(sql.statement(), sql.params))
    }
    missing = [p for p in providers if p not in found]
    if missing:
        await ensure_rows(session, clock, missing)
    return {p: found.get(p) or BreakerRow(p) for p in providers}


async def _row(session: DbExec, clock: DbClock, provider: str, *, lock: bool = True) -> BreakerRow:
    return (await _rows(session, clock, [provider], lock=lock))[provider]


def _as_acting(row: BreakerRow, now: datetime, cooldown_seconds: float) -> BreakerView:
    """The row as it acts at ``now``: an ``open`` row whose cool-down has run out is
    ``half_open`` since ``opened_at + cooldown``."""
    if row.state == "open" and row.opened_at is not None:
        due = row.opened_at + timedelta(seconds=cooldown_seconds)
        if now >= due:
            return BreakerView("half_open", row.failures, row.opened_at, due, row.provider)
    return BreakerView(row.state, row.failures, row.opened_at, row.half_open_at, row.provider)


async def read(
    session: DbExec, clock: DbClock, cooldown_seconds: float, provider: str = DEFAULT_PROVIDER
) -> BreakerView:
    """One provider's breaker as it acts now (nothing written but a missing row).

    An ``open`` row whose cool-down (``cooldown_seconds``, ``BREAKER_COOLDOWN_SECONDS``)
    has run out is shown ``half_open`` since ``opened_at + cooldown``: the next
    platform-key job would pass as a probe, and the admission records the same
    moment when it writes the transition (reference §6).
    """
    row = await _row(session, clock, provider, lock=False)
    return _as_acting(row, await clock.read(session), cooldown_seconds)


async def read_all(
    session: DbExec, clock: DbClock, cooldown_seconds: float, providers: Sequence[str]
) -> list[BreakerView]:
    """:func:`read` of each of ``providers``, in their order (one read)."""
    rows = await _rows(session, clock, providers, lock=False)
    now = await clock.read(session)
    return [_as_acting(rows[p], now, cooldown_seconds) for p in providers]


def _open_refusal(wait_seconds: float, provider: str) -> AppError:
    return AppError(
        ErrorCode.PLATFORM_CIRCUIT_OPEN,
        "the platform model key is failing; try again later",
        {"state": "open", "retryAfterSeconds": max(1, math.ceil(wait_seconds))},
    )


async def admit_new_job(
    session: DbExec,
    clock: DbClock,
    settings: JobServiceSettings,
    provider: str = DEFAULT_PROVIDER,
) -> None:
    """Guard of a new platform-key job (create, re-run) when it can run on one provider
    only, in the create transaction: the breaker's probes are counted here.

    Raises:
        AppError: ``PLATFORM_CIRCUIT_OPEN`` while open, or half-open with every probe taken.
    """
    # The common case (closed) reads without a row lock, so creates never queue on the row.
    if (await _row(session, clock, provider, lock=False)).state == "closed":
        return
    row = await _row(session, clock, provider)
    if row.state == "closed":
        return
    probes = row.probes
    where = breaker.c.provider == provider
    if row.state == "open":
        now = await clock.read(session)
        cooldown = timedelta(seconds=settings.BREAKER_COOLDOWN_SECONDS)
        if row.opened_at is not None and now < row.opened_at + cooldown:
            raise _open_refusal((row.opened_at + cooldown - now).total_seconds(), provider)
        # half-open since the cool-down ran out, as :func:`read` shows it (no
        # platform-key job could be created in between: this is the first since)
        half = (row.opened_at + cooldown) if row.opened_at is not None else clock.now()
        await session.execute(
            update(breaker)
            .where(where)
            .values(state="half_open", half_open_at=half, probes_in_flight=0)
        )
        probes = 0
    elif probes >= settings.BREAKER_HALF_OPEN_PROBES and not await _probes_alive(
        session, row.half_open_at, provider, by_lease=False
    ):
        # Every probe slot taken, but no probe job is left to report back (one was
        # cancelled before it ran, or expired): probe again rather than stay
        # half-open forever.
        await session.execute(
            update(breaker).where(where).values(half_open_at=clock.now(), probes_in_flight=0)
        )
        probes = 0
    if probes >= settings.BREAKER_HALF_OPEN_PROBES:
        raise AppError(
            ErrorCode.PLATFORM_CIRCUIT_OPEN,
            "the platform model key is being probed; try again later",
            {"state": "half_open", "retryAfterSeconds": PROBE_RETRY_AFTER_SECONDS},
        )
    await session.execute(
        update(breaker)
        .where(where)
        .values(probes_in_flight=breaker.c.probes_in_flight + 1, updated_at=clock.now())
    )


def judge_failover_create(
    rows: Sequence[BreakerRow], now: datetime, cooldown_seconds: float
) -> None:
    """Guard of a new platform-key job that may run on any of several providers
    (``rows``: their breakers, as read): refused only while every one is open
    (reference §9.4); the probes are counted when attempts are leased.

    Raises:
        AppError: ``PLATFORM_CIRCUIT_OPEN``, ``retryAfterSeconds`` until the first
            cool-down ends.
    """
    waits = []
    for row in rows:
        acting = _as_acting(row, now, cooldown_seconds)
        if acting.state != "open" or row.opened_at is None:
            return
        due = row.opened_at + timedelta(seconds=cooldown_seconds)
        waits.append((due - now).total_seconds())
    if waits:
        raise _open_refusal(min(waits), rows[0].provider)


async def _probes_alive(
    session: DbExec, half_open_at: datetime | None, provider: str, *, by_lease: bool
) -> bool:
    """Whether a probe of ``provider`` since ``half_open_at`` is still live: a
    platform-key job created since then (probes counted at create), or one leased on
    ``provider`` since then (``by_lease``: probes counted at lease grant)."""
    if half_open_at is None:
        return False
    stmt = select(jobs.c.job_id).where(
        jobs.c.api_key_mode == "platform_key",
        jobs.c.batch_total.is_(None),  # a batch's parent calls no model: never a probe
    )
    if by_lease:
        stmt = stmt.where(
            jobs.c.status.in_(sorted(LEASED)),
            jobs.c.model_provider == provider,
            jobs.c.locked_at >= half_open_at,
        )
    else:
        stmt = stmt.where(jobs.c.status.in_(sorted(LIVE)), jobs.c.created_at >= half_open_at)
    return (await session.execute(stmt.limit(1))).first() is not None


async def choose_providers(
    session: DbExec,
    clock: DbClock,
    settings: JobServiceSettings,
    candidates: Sequence[str],
    n: int,
) -> list[str]:
    """The providers of ``n`` platform-key attempts being leased now, in the lease's
    transaction (reference §9.4 failover): for each, the first of ``candidates`` (in order
    of preference, at least two) whose breaker admits it: closed, or half-open with
    a free probe slot (taken: the attempt is a probe; an open breaker whose
    cool-down has run out turns half-open here). An attempt no breaker admits runs
    on the first candidate, as queued jobs do while every breaker is open (§6).

    While the first candidate is closed this reads its row without a lock and writes
    nothing.
    """
    first = candidates[0]
    if (await _rows(session, clock, [first], lock=False))[first].state == "closed":
        return [first] * n
    # Only the rows that may change are locked: those before the first closed one
    # (a closed breaker admits without a write; the ones after it are never reached).
    rows = await _rows(session, clock, candidates, lock=False)
    reach = next((i for i, p in enumerate(candidates) if rows[p].state == "closed"), None)
    used = list(candidates if reach is None else candidates[: reach + 1])
    locked = [p for p in used if rows[p].state != "closed"]
    rows.update(await _rows(session, clock, locked, lock=True))
    candidates = used
    now = await clock.read(session)
    cooldown = timedelta(seconds=settings.BREAKER_COOLDOWN_SECONDS)
    limit = settings.BREAKER_HALF_OPEN_PROBES
    changed: set[str] = set()
    out: list[str] = []
    for _ in range(n):
        chosen = first
        for name in candidates:
            row = rows[name]
            if row.state == "closed":
                chosen = name
                break
            if row.state == "open":
                if row.opened_at is not None and now < row.opened_at + cooldown:
                    continue
                due = row.opened_at + cooldown if row.opened_at is not None else now
                row = replace(row, state="half_open", half_open_at=due, probes=0)
                changed.add(name)
            elif row.probes >= limit and name not in changed:
                if not await _probes_alive(session, row.half_open_at, name, by_lease=True):
                    row = replace(row, half_open_at=now, probes=0)  # re-armed, as at create
                changed.add(name)
            rows[name] = row
            if row.probes < limit:
                rows[name] = replace(row, probes=row.probes + 1)
                changed.add(name)
                chosen = name
                break
        out.append(chosen)
    for name in sorted(changed):
        row = rows[name]
        await session.execute(
            update(breaker)
            .where(breaker.c.provider == name)
            .values(
                state=row.state,
                half_open_at=row.half_open_at,
                probes_in_flight=row.probes,
                updated_at=clock.now(),
            )
        )
    return out


def peek_columns() -> list[Any]:
    """Scalar subqueries ``breaker_state`` and ``breaker_failures`` of the breaker of the
    job's provider (correlated with ``ai_runtime_jobs.model_provider``): a caller's read
    can carry it and hand it to :func:`record_ending`."""
    mine = breaker.c.provider == jobs.c.model_provider
    return [
        select(breaker.c.state).where(mine).scalar_subquery().label("breaker_state"),
        select(breaker.c.consecutive_failures)
        .where(mine)
        .scalar_subquery()
        .label("breaker_failures"),
    ]


async def record_ending(
    session: DbExec,
    clock: DbClock,
    settings: JobServiceSettings,
    code: str | None,
    peek: tuple[str | None, int | None] | None = None,
    provider: str = DEFAULT_PROVIDER,
) -> None:
    """Feed the ending of a platform-key attempt that ran on ``provider``: ``code=None``
    is a success.

    In the caller's transaction (the one that ends the attempt). A success while
    closed with no failures changes nothing and takes no row lock.

    Args:
        peek: ``(state, consecutiveFailures)`` as read earlier in this transaction
            (:func:`peek_columns`); read here when None or when the row was missing.
            It only decides whether the row needs its lock; every change is made
            on the locked row.
    """
    if peek is None or peek[0] is None:
        row = await _row(session, clock, provider, lock=False)
        peek = (row.state, row.failures)
    if code is None and peek[0] == "closed" and peek[1] == 0:
        return
    if code is not None and code not in BREAKER_FAILURE_CODES and peek[0] != "half_open":
        return
    row = await _row(session, clock, provider)
    mine = update(breaker).where(breaker.c.provider == provider)
    if code is None:
        if row.state != "closed" or row.failures:
            await session.execute(mine.values(**_CLOSED, updated_at=clock.now()))
        return
    if code in BREAKER_FAILURE_CODES:
        failures = row.failures + 1
        if row.state == "half_open" or (
            row.state == "closed" and failures >= settings.BREAKER_FAILURE_THRESHOLD
        ):
            await session.execute(
                mine.values(
                    state="open",
                    consecutive_failures=failures,
                    opened_at=clock.now(),
                    half_open_at=None,
                    probes_in_flight=0,
                    updated_at=clock.now(),
                )
            )
        else:
            await session.execute(
                mine.values(consecutive_failures=failures, updated_at=clock.now())
            )
        return
    if row.state == "half_open" and row.probes > 0:
        await session.execute(mine.values(probes_in_flight=row.probes - 1, updated_at=clock.now()))


async def reset(session: DbExec, clock: DbClock, providers: Sequence[str]) -> list[BreakerView]:
    """Admin reset of ``providers``' breakers: closed, zero failures."""
    await ensure_rows(session, clock, providers)
    await session.execute(
        update(breaker)
        .where(breaker.c.provider.in_(list(providers)))
        .values(**_CLOSED, updated_at=clock.now())
    )
    return [BreakerView("closed", 0, None, None, p) for p in providers]  # as just written
