"""The reaper: ends attempts whose lease lapsed or that ran past their timeout (SPEC §2.3, §2.4).

Every ``REAPER_INTERVAL_SECONDS`` it finds ``locked``/``running`` jobs with
``lockUntil < now`` (code ``LEASE_EXPIRED``) or ``startedAt + timeoutSeconds <
now`` (``JOB_TIMEOUT``), using the ``(status, lock_until)`` index. Each job is
handled in its own transaction: a guarded UPDATE to ``expired`` that re-checks
status, holder, ``attemptNo`` and the expiry condition (so a job that moved
meanwhile is untouched), then in the same transaction → ``cancelled`` (cancel
requested), → ``pending`` (``retryCount+1``, backoff) or → ``failed`` (retries
used up). Two event rows; ``expired`` is never left as the resting state.
Several replicas may run reapers at once: the guards make that safe.

Every :data:`PURGE_EVERY_SECONDS` it also deletes the ``ai_runtime_workers`` rows of
instances gone for ``WORKER_RETENTION_SECONDS`` that hold no lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from typing import Any

from sqlalchemy import ColumnElement, and_, literal, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from airuntime_common.errors import ErrorCode
from job_service import metrics
from job_service.domain.jobs import JobDomain, backoff_seconds
from job_service.domain.statemachine import (
    CANCELLED,
    EXPIRED,
    FAILED,
    LEASED,
    PENDING,
    Op,
    apply,
)
from job_service.models import jobs

log = logging.getLogger(__name__)

ACTOR = "reaper"
BATCH = 200
#: Seconds between two purges of departed workers' rows (monotonic clock).
PURGE_EVERY_SECONDS = 600.0


class Reaper:
    """Sweeps expired leases and timed-out attempts.

    Args:
        domain: the job domain (sessions, clock, settings, signal).
    """

    def __init__(self, domain: JobDomain) -> None:
        self.domain = domain
        self.clock = domain.clock

    def _lease_dead(self) -> ColumnElement[bool]:
        return and_(jobs.c.lock_until.is_not(None), jobs.c.lock_until < self.clock.now())

    def _timed_out(self) -> ColumnElement[bool]:
        deadline = self.clock.add_seconds(jobs.c.started_at, jobs.c.timeout_seconds)
        return and_(jobs.c.started_at.is_not(None), deadline < self.clock.now())

    async def sweep(self) -> int:
        """One pass; returns how many jobs were expired."""
        async with self.domain.sessions() as session:
            rows = (
                await session.execute(
                    select(jobs.c.job_id)
                    .where(
                        jobs.c.status.in_(sorted(LEASED)),
                        or_(self._lease_dead(), self._timed_out()),
                    )
                    .limit(BATCH)
                )
            ).all()
        done = 0
        for (job_id,) in rows:
            try:
                if await self.domain.tx(functools.partial(self._expire, job_id=job_id)):
                    done += 1
            except Exception:
                log.exception("reaper failed on a job", extra={"fields": {"jobId": job_id}})
        if done:
            self.domain.signal.notify()
        return done

    async def _expire(self, session: AsyncSession, *, job_id: str) -> bool:
        row = (
            await session.execute(
                self.domain._for_update(
                    select(
                        jobs,
                        self._timed_out().label("timed_out"),
                        self._lease_dead().label("lease_dead"),
                    ).where(jobs.c.job_id == job_id, jobs.c.status.in_(sorted(LEASED)))
                )
            )
        ).first()
        if row is None or not (row.timed_out or row.lease_dead):
            return False
        code = ErrorCode.JOB_TIMEOUT if row.timed_out else ErrorCode.LEASE_EXPIRED
        guard = and_(
            jobs.c.attempt_no == row.attempt_no,
            jobs.c.locked_by == row.locked_by if row.locked_by is not None else literal(True),
            or_(self._lease_dead(), self._timed_out()),
        )
        ok = await apply(
            session,
            self.clock,
            Op.EXPIRE,
            job_id=job_id,
            actor=ACTOR,
            from_state=row.status,
            where=guard,
            error_code=code,
            attempt_no=row.attempt_no,
            values={"expired_at": self.clock.now(), "lock_until": None},
        )
        if not ok:
            return False
        common: dict[str, Any] = {"error_code": code, "error_message": _message(code)}
        values: dict[str, Any]
        if row.cancel_requested:
            op, values = (
                Op.EXPIRED_CANCEL,
                {**common, "cancelled_at": self.clock.now(), "finished_at": self.clock.now()},
            )
            outcome = CANCELLED
        elif row.retry_count < row.max_retry_count:
            delay = backoff_seconds(self.domain.settings, row.retry_count + 1, code, None)
            op, values = (
                Op.EXPIRED_RETRY,
                {
                    **common,
                    "locked_by": None,
                    "retry_count": jobs.c.retry_count + 1,
                    "available_at": self.clock.plus(delay, varying=True),
                },
            )
            outcome = PENDING
        else:
            op, values = Op.EXPIRED_FAIL, {**common, "finished_at": self.clock.now()}
            outcome = FAILED
        ok = await apply(
            session,
            self.clock,
            op,
            job_id=job_id,
            actor=ACTOR,
            from_state=EXPIRED,
            error_code=code,
            attempt_no=row.attempt_no,
            values=values,
        )
        if not ok:  # pragma: no cover - same transaction, row locked
            raise RuntimeError("reaper second step refused")
        metrics.REAPED.labels(code, outcome).inc()
        metrics.LEASE_LOSSES.labels("reaper").inc()
        if outcome != PENDING:
            metrics.JOBS_FINISHED.labels(row.job_type, outcome).inc()
        log.info(
            "attempt expired",
            extra={
                "fields": {
                    "jobId": job_id,
                    "attemptNo": row.attempt_no,
                    "runtimeInstanceId": row.locked_by,
                    "code": code,
                    "outcome": outcome,
                }
            },
        )
        return True

    async def purge_workers(self) -> int:
        """Delete departed instances' registry rows (see
        :meth:`~job_service.domain.scheduler.WorkerRegistry.purge`); returns how many."""
        retention = self.domain.settings.WORKER_RETENTION_SECONDS
        purged = await self.domain.tx(
            lambda session: self.domain.registry.purge(session, retention)
        )
        if purged:
            log.info("purged departed workers", extra={"fields": {"workers": purged}})
        return purged

    async def run(self, stop: asyncio.Event) -> None:
        """Sweep every ``REAPER_INTERVAL_SECONDS`` and purge departed workers every
        :data:`PURGE_EVERY_SECONDS` until ``stop`` is set."""
        interval = self.domain.settings.REAPER_INTERVAL_SECONDS
        purged_at = float("-inf")
        while not stop.is_set():
            try:
                await self.sweep()
            except Exception:
                log.exception("reaper sweep failed")
            if time.monotonic() - purged_at >= PURGE_EVERY_SECONDS:
                purged_at = time.monotonic()
                try:
                    await self.purge_workers()
                except Exception:
                    log.exception("worker purge failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=interval)


def _message(code: str) -> str:
    if code == ErrorCode.JOB_TIMEOUT:
        return "the attempt ran past timeoutSeconds"
    return "the lease expired without a heartbeat"
