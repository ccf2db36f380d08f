"""Long-poll wake-ups and the runtime-instance registry (SPEC §2.6, §3).

Long poll: a waiter re-runs the poll query when :class:`JobSignal` fires (a
job became pending in *this* process: create, retry, reaper requeue) and in
any case every :data:`RECHECK_SECONDS` (0.25 s), which is how jobs created or
requeued by *another* replica, or whose ``availableAt`` backoff ran out, are
found. The recheck is one index-backed query per process (:class:`PendingProbe`,
shared by every waiter), so an idle system's cost does not grow with its workers.

Registry: instances are upserted from the ``x-runtime-instance-id`` and
capabilities of their poll/claim/heartbeat calls, at most once a second per
instance and process. Health is SERVING while at least one instance was seen
within :meth:`JobServiceSettings.worker_alive_seconds` (three poll intervals,
at least 30 s because a long poll keeps a worker silent for up to 20 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, exists, func, select
from sqlalchemy.dialects.mysql import insert as mysql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncSession

from job_service.db import DbExec
from job_service.domain.clock import DbClock
from job_service.domain.statemachine import LEASED
from job_service.models import jobs, workers

RECHECK_SECONDS = 0.25
log = logging.getLogger(__name__)
TOUCH_EVERY_SECONDS = 1.0


class JobSignal:
    """Wakes long-poll waiters of this process when a job becomes pending."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def notify(self) -> None:
        """Wake every current waiter."""
        self._event.set()
        self._event = asyncio.Event()

    async def wait(self, seconds: float) -> bool:
        """Wait until :meth:`notify` or ``seconds``, whichever is first.

        Returns:
            True when woken by :meth:`notify`, False on timeout.
        """
        event = self._event
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout=max(0.0, seconds))
        return event.is_set()


class PendingProbe:
    """One shared "is any job claimable?" query for all long-poll waiters of a process.

    Waiters that found nothing used to re-run their own poll/claim every
    :data:`RECHECK_SECONDS`, so an idle system cost one transaction per waiting
    worker 4 times a second. Now they ask this probe, which runs ``check`` at most
    once per ``every`` seconds however many waiters there are (concurrent askers
    share the query in flight); only a True answer sends them back to claim.
    A failing ``check`` answers True, so the waiters fall back to their own query.

    Args:
        check: the query (True when a pending, available job exists).
        every: seconds a result stays fresh.
    """

    def __init__(self, check: Callable[[], Awaitable[bool]], every: float) -> None:
        self._check = check
        self._every = every
        self._at = float("-inf")
        self._value = False
        self._inflight: asyncio.Future[bool] | None = None

    async def claimable(self) -> bool:
        """The latest answer, refreshed when older than ``every`` seconds."""
        if time.monotonic() - self._at < self._every:
            return self._value
        if self._inflight is None:
            self._inflight = asyncio.ensure_future(self._run())
        return await asyncio.shield(self._inflight)

    async def _run(self) -> bool:
        try:
            value = await self._check()
        except Exception:
            log.warning("pending-job probe failed", exc_info=True)
            value = True
        self._value, self._at, self._inflight = value, time.monotonic(), None
        return value


@dataclass(frozen=True)
class WorkerView:
    """One runtime instance for the health view."""

    instance_id: str
    capabilities: list[str]
    in_flight: int
    last_seen_at: datetime
    status: str
    status_address: str | None


class WorkerRegistry:
    """Upserts and reads ``ai_runtime_workers``."""

    def __init__(self, clock: DbClock) -> None:
        self.clock = clock
        #: instanceId → (monotonic time of the last write, capabilities, status address)
        self._last_touch: dict[str, tuple[float, tuple[str, ...] | None, str | None]] = {}

    def due(
        self,
        instance_id: str,
        capabilities: list[str] | None = None,
        status_address: str | None = None,
    ) -> bool:
        """Whether this instance's row should be written now, and if so note it as written.

        Due on first sight, when a call brings capabilities or a status address
        other than the last written, and otherwise once every
        :data:`TOUCH_EVERY_SECONDS` (seconds, monotonic clock), so a busy
        worker's claims do not each upsert the registry row.
        """
        now = time.monotonic()
        last = self._last_touch.get(instance_id)
        caps = tuple(capabilities) if capabilities else None
        if last is not None:
            at, known_caps, known_address = last
            changed = (caps is not None and caps != known_caps) or (
                bool(status_address) and status_address != known_address
            )
            if not changed and now - at < TOUCH_EVERY_SECONDS:
                return False
            caps = caps if caps is not None else known_caps
            status_address = status_address or known_address
        self._last_touch[instance_id] = (now, caps, status_address or None)
        return True

    async def touch(
        self,
        session: AsyncSession,
        instance_id: str,
        capabilities: list[str] | None = None,
        status_address: str | None = None,
    ) -> None:
        """Record that ``instance_id`` was seen now (database clock)."""
        values: dict[str, object] = {
            "instance_id": instance_id,
            "capabilities": capabilities or [],
            "status_address": status_address or None,
            "in_flight": 0,
            "last_seen_at": self.clock.now(),
        }
        update_cols: dict[str, object] = {"last_seen_at": self.clock.now()}
        if capabilities:
            update_cols["capabilities"] = capabilities
        if status_address:
            update_cols["status_address"] = status_address
        if self.clock.is_sqlite:
            stmt = sqlite_insert(workers).values(**values)
            await session.execute(
                stmt.on_conflict_do_update(index_elements=["instance_id"], set_=update_cols)
            )
        else:
            mstmt = mysql_insert(workers).values(**values)
            await session.execute(mstmt.on_duplicate_key_update(**update_cols))

    async def purge(self, session: DbExec, retention_seconds: float) -> int:
        """Delete the rows of instances not seen for ``retention_seconds`` (database
        clock) that hold no lease, and forget them here; returns how many rows went.

        Runtime instance ids are per process (a restarted pod is a new instance), so
        without this the table and :meth:`list_workers` grow with every restart. A
        row whose instance still holds a ``locked``/``running`` job stays until the
        reaper has expired that lease, so ``GET /admin/ai/workers`` never loses sight
        of a lease holder.
        """
        holds_lease = exists().where(
            jobs.c.locked_by == workers.c.instance_id, jobs.c.status.in_(sorted(LEASED))
        )
        result = await session.execute(
            delete(workers).where(
                workers.c.last_seen_at < self.clock.plus(-retention_seconds), ~holds_lease
            )
        )
        horizon = time.monotonic() - retention_seconds
        for instance_id in [i for i, (at, _, _) in self._last_touch.items() if at < horizon]:
            del self._last_touch[instance_id]
        return int(getattr(result, "rowcount", 0) or 0)

    async def list_workers(self, session: AsyncSession, alive_seconds: float) -> list[WorkerView]:
        """Every known instance, newest first, with live lease counts and alive/stale status."""
        now = await self.clock.read(session)
        leased = await session.execute(
            select(jobs.c.locked_by, func.count())
            .where(jobs.c.status.in_(sorted(LEASED)), jobs.c.locked_by.is_not(None))
            .group_by(jobs.c.locked_by)
        )
        counts: dict[str, int] = {str(r[0]): int(r[1]) for r in leased.all()}
        rows = (
            await session.execute(select(workers).order_by(workers.c.last_seen_at.desc()))
        ).all()
        cutoff = now - timedelta(seconds=alive_seconds)
        return [
            WorkerView(
                instance_id=r.instance_id,
                capabilities=list(r.capabilities or []),
                in_flight=int(counts.get(r.instance_id, 0)),
                last_seen_at=r.last_seen_at,
                status="alive" if r.last_seen_at >= cutoff else "stale",
                status_address=r.status_address,
            )
            for r in rows
        ]
