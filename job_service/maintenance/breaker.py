"""The platform-key circuit breaker, shared by all replicas through the database (SPEC §6).

States: ``closed`` → (``BREAKER_FAILURE_THRESHOLD`` consecutive failures) →
``open`` → (``BREAKER_COOLDOWN_SECONDS`` later, on the next create) →
``half_open``: up to ``BREAKER_HALF_OPEN_PROBES`` new platform-key jobs pass as
probes; the next success closes it, the next failure opens it again. A probe
ending with a neutral code frees its slot; when every slot is taken but no
probe job is live any more (cancelled before it ran, expired), the slots are
re-armed so the breaker never stays half-open for good. Fed by the
endings of platform-key attempts; codes in ``BREAKER_FAILURE_CODES`` are
failures, a success resets, everything else is neutral. All times are the
database's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.dialects.mysql import insert as mysql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from airuntime_common.errors import BREAKER_FAILURE_CODES, AppError, ErrorCode
from airuntime_common.states import LIVE
from job_service.settings import JobServiceSettings
from job_service.store.cache import Sql
from job_service.store.clock import DbClock
from job_service.store.engine import DbExec
from job_service.store.tables import breaker, jobs

ROW_ID = 1
#: What a create refused while every half-open probe is out is told to wait (s):
#: a probe's answer usually comes within seconds.
PROBE_RETRY_AFTER_SECONDS = 5


@dataclass(frozen=True)
class BreakerView:
    """The breaker as the admin API shows it (SPEC §3.1)."""

    state: str
    consecutive_failures: int
    opened_at: datetime | None
    half_open_at: datetime | None


async def ensure_row(session: DbExec, clock: DbClock) -> None:
    """Insert the single breaker row if it is missing (idempotent, race-free)."""
    values = {"id": ROW_ID, "state": "closed", "consecutive_failures": 0, "probes_in_flight": 0}
    if clock.is_sqlite:
        await session.execute(sqlite_insert(breaker).values(**values).on_conflict_do_nothing())
    else:
        await session.execute(mysql_insert(breaker).values(**values).prefix_with("IGNORE"))


def row_sql(*, lock: bool) -> Sql:
    """The breaker row's read (no parameters), for a batch.

    Columns: state, consecutive_failures, opened_at, half_open_at, probes_in_flight;
    with ``lock``, ``FOR UPDATE`` (MySQL/MariaDB only).
    """

    def build() -> Any:
        stmt = select(
            breaker.c.state,
            breaker.c.consecutive_failures,
            breaker.c.opened_at,
            breaker.c.half_open_at,
            breaker.c.probes_in_flight,
        ).where(breaker.c.id == ROW_ID)
        return stmt.with_for_update() if lock else stmt

    return Sql(("breaker_row", lock), build, {})


async def _row(
    session: DbExec, clock: DbClock, *, lock: bool = True
) -> tuple[str, int, datetime | None, datetime | None, int]:
    lock = lock and not clock.is_sqlite
    row = (await session.execute(row_sql(lock=lock).statement())).first()
    if row is None:
        await ensure_row(session, clock)
        return ("closed", 0, None, None, 0)
    return (row[0], row[1], row[2], row[3], row[4])


async def read(session: DbExec, clock: DbClock, cooldown_seconds: float) -> BreakerView:
    """Current breaker as it acts now (nothing written).

    An ``open`` row whose cool-down (``cooldown_seconds``, ``BREAKER_COOLDOWN_SECONDS``)
    has run out is shown ``half_open`` since ``opened_at + cooldown``: the next
    platform-key create would pass as a probe, and :func:`admit_new_job` records
    the same moment when it writes the transition (SPEC §6).
    """
    state, failures, opened, half, _ = await _row(session, clock, lock=False)
    if state == "open" and opened is not None:
        due = opened + timedelta(seconds=cooldown_seconds)
        if await clock.read(session) >= due:
            return BreakerView("half_open", failures, opened, due)
    return BreakerView(state, failures, opened, half)


async def admit_new_job(session: DbExec, clock: DbClock, settings: JobServiceSettings) -> None:
    """Guard of a new platform-key job (create, admin re-run), in the create transaction.

    Raises:
        AppError: ``PLATFORM_CIRCUIT_OPEN`` while open, or half-open with every probe taken.
    """
    # The common case (closed) reads without a row lock, so creates never queue on the row.
    if (await _row(session, clock, lock=False))[0] == "closed":
        return
    state, _failures, opened, half, probes = await _row(session, clock)
    if state == "closed":
        return
    if state == "open":
        now = await clock.read(session)
        cooldown = timedelta(seconds=settings.BREAKER_COOLDOWN_SECONDS)
        if opened is not None and now < opened + cooldown:
            wait = (opened + cooldown - now).total_seconds()
            raise AppError(
                ErrorCode.PLATFORM_CIRCUIT_OPEN,
                "the platform model key is failing; try again later",
                {"state": "open", "retryAfterSeconds": max(1, math.ceil(wait))},
            )
        # half-open since the cool-down ran out, as :func:`read` shows it (no
        # platform-key job could be created in between: this is the first since)
        await session.execute(
            update(breaker)
            .where(breaker.c.id == ROW_ID)
            .values(
                state="half_open",
                half_open_at=(opened + cooldown) if opened is not None else clock.now(),
                probes_in_flight=0,
            )
        )
        probes = 0
    elif probes >= settings.BREAKER_HALF_OPEN_PROBES and not await _probes_alive(session, half):
        # Every probe slot taken, but no probe job is left to report back (one was
        # cancelled before it ran, or expired): probe again rather than stay
        # half-open forever.
        await session.execute(
            update(breaker)
            .where(breaker.c.id == ROW_ID)
            .values(half_open_at=clock.now(), probes_in_flight=0)
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
        .where(breaker.c.id == ROW_ID)
        .values(probes_in_flight=breaker.c.probes_in_flight + 1, updated_at=clock.now())
    )


async def _probes_alive(session: DbExec, half_open_at: datetime | None) -> bool:
    """Whether a platform-key job created since ``half_open_at`` (a probe) is still live."""
    if half_open_at is None:
        return False
    live = (
        await session.execute(
            select(jobs.c.job_id)
            .where(
                jobs.c.status.in_(sorted(LIVE)),
                jobs.c.api_key_mode == "platform_key",
                jobs.c.created_at >= half_open_at,
            )
            .limit(1)
        )
    ).first()
    return live is not None


def peek_columns() -> list[Any]:
    """Scalar subqueries ``breaker_state`` and ``breaker_failures``: a caller's read
    can carry the breaker's current row and hand it to :func:`record_ending`."""
    return [
        select(breaker.c.state)
        .where(breaker.c.id == ROW_ID)
        .scalar_subquery()
        .label("breaker_state"),
        select(breaker.c.consecutive_failures)
        .where(breaker.c.id == ROW_ID)
        .scalar_subquery()
        .label("breaker_failures"),
    ]


async def record_ending(
    session: DbExec,
    clock: DbClock,
    settings: JobServiceSettings,
    code: str | None,
    peek: tuple[str | None, int | None] | None = None,
) -> None:
    """Feed the ending of a platform-key attempt: ``code=None`` is a success.

    In the caller's transaction (the one that ends the attempt). A success while
    closed with no failures changes nothing and takes no row lock.

    Args:
        peek: ``(state, consecutiveFailures)`` as read earlier in this transaction
            (:func:`peek_columns`); read here when None or when the row was missing.
            It only decides whether the row needs its lock; every change is made
            on the locked row.
    """
    if peek is None or peek[0] is None:
        row = await _row(session, clock, lock=False)
        peek = (row[0], row[1])
    if code is None and peek[0] == "closed" and peek[1] == 0:
        return
    if code is not None and code not in BREAKER_FAILURE_CODES and peek[0] != "half_open":
        return
    state, failures, _opened, _half, probes = await _row(session, clock)
    if code is None:
        if state != "closed" or failures:
            await session.execute(
                update(breaker)
                .where(breaker.c.id == ROW_ID)
                .values(
                    state="closed",
                    consecutive_failures=0,
                    probes_in_flight=0,
                    opened_at=None,
                    half_open_at=None,
                    updated_at=clock.now(),
                )
            )
        return
    if code in BREAKER_FAILURE_CODES:
        failures += 1
        if state == "half_open" or (
            state == "closed" and failures >= settings.BREAKER_FAILURE_THRESHOLD
        ):
            await session.execute(
                update(breaker)
                .where(breaker.c.id == ROW_ID)
                .values(
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
                update(breaker)
                .where(breaker.c.id == ROW_ID)
                .values(consecutive_failures=failures, updated_at=clock.now())
            )
        return
    if state == "half_open" and probes > 0:
        await session.execute(
            update(breaker)
            .where(breaker.c.id == ROW_ID)
            .values(probes_in_flight=probes - 1, updated_at=clock.now())
        )


async def reset(session: DbExec, clock: DbClock) -> BreakerView:
    """Admin reset: closed, zero failures."""
    await ensure_row(session, clock)
    await session.execute(
        update(breaker)
        .where(breaker.c.id == ROW_ID)
        .values(
            state="closed",
            consecutive_failures=0,
            probes_in_flight=0,
            opened_at=None,
            half_open_at=None,
            updated_at=clock.now(),
        )
    )
    return BreakerView("closed", 0, None, None)  # what was just written
