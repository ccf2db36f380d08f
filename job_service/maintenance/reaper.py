"""The reaper: ends attempts whose lease lapsed or that ran past their timeout (reference §2.3, §2.4).

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
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, literal, or_

from airuntime_common.errors import ErrorCode
from job_service import metrics
from job_service.lifecycle import EXPIRED, PENDING, TERMINAL, Op, end_attempt
from job_service.services import parents
from job_service.services.core import Core
from job_service.store import scheduling as sched
from job_service.store import statements as st
from job_service.store.batch import FenceBroken, new_batch, run_one
from job_service.store.engine import DbExec
from job_service.store.records import job_of
from job_service.store.tables import jobs
from job_service.store.transitions import ending_values, transition_sql

log = logging.getLogger(__name__)

ACTOR = "reaper"
BATCH = 200
#: Seconds between two purges of departed workers' rows (monotonic clock).
PURGE_EVERY_SECONDS = 600.0


@dataclass(frozen=True)
class _Expired:
    """One attempt the reaper ended: its job, attempt, holder, code and outcome."""

    job_id: str
    job_type: str
    attempt_no: int
    holder: str | None
    code: str
    outcome: str


class Reaper:
    """Sweeps expired leases and timed-out attempts.

    Args:
        core: the shared core (store, settings, signal, registry).
    """

    def __init__(self, core: Core) -> None:
        self.core = core
        self.clock = core.clock

    async def sweep(self) -> int:
        """One pass; returns how many jobs were expired."""
        sql = st.expired_attempts.sql(self.clock, {"n": BATCH})
        found = await self.core.store.read(lambda conn: run_one(conn, sql))
        done = 0
        for (job_id,) in found.rows:
            try:
                expired = await self.core.store.lean_tx(
                    functools.partial(self._expire, job_id=str(job_id))
                )
            except Exception:
                log.exception("reaper failed on a job", extra={"fields": {"jobId": job_id}})
                continue
            if expired is not None:
                done += 1
                _observe(expired)
        if done:
            self.core.signal.notify()
        return done

    async def _expire(self, db: DbExec, *, job_id: str) -> _Expired | None:
        """Expire one attempt and end it, in the caller's transaction (module doc)."""
        clock = self.clock
        rows = (await run_one(db, st.expiring_job.sql(clock, {"x_job_id": job_id}))).rows
        if not rows:
            return None
        *columns, is_timed_out, is_lease_dead = rows[0]
        if not (is_timed_out or is_lease_dead):
            return None
        row = job_of(columns)
        code = ErrorCode.JOB_TIMEOUT if is_timed_out else ErrorCode.LEASE_EXPIRED
        guard = and_(
            jobs.c.attempt_no == row.attempt_no,
            jobs.c.locked_by == row.locked_by if row.locked_by is not None else literal(True),
            or_(st.lease_dead(clock), st.timed_out(clock)),
        )
        expire = transition_sql(
            clock,
            Op.EXPIRE,
            job_id=job_id,
            actor=ACTOR,
            from_state=row.status,
            where=guard,
            error_code=code,
            attempt_no=row.attempt_no,
            values={"expired_at": clock.now(), "lock_until": None},
        )
        ending = end_attempt(
            cancel_requested=bool(row.cancel_requested),
            retry_count=row.retry_count,
            max_retry_count=row.max_retry_count,
            code=code,
            retry_after=None,
            policy=self.core.retry_policy,
        )
        values: dict[str, Any] = ending_values(clock, ending, _message(code))
        values.pop("lock_until")  # the expiry cleared it
        then = transition_sql(
            clock,
            ending.ending.op(expired=True),
            job_id=job_id,
            actor=ACTOR,
            from_state=EXPIRED,
            error_code=code,
            attempt_no=row.attempt_no,
            values=values,
        )
        assert expire is not None and then is not None
        # a batch's child: its parent, locked after it, follows it (reference §10.3)
        held = await parents.lock(clock, db, [row.parent_job_id] if row.parent_job_id else [])
        batch = new_batch(db)
        expire.queue_fenced(batch, "expire")  # the job moved meanwhile: leave it
        then.queue_fenced(batch, "end")  # same transaction, row locked: cannot be refused
        if row.api_key_mode == "platform_key":  # its grant ends, its estimate kept
            for statement in sched.settle_grants(clock, [(job_id, row.attempt_no, None)]):
                batch.add(statement)
        changes: list[parents.ParentChange] = []
        if row.parent_job_id is not None:
            move = parents.ChildMove(row.parent_job_id, row.status, ending.ending.to_state)
            changes = parents.queue(clock, batch, held, [move], actor=ACTOR)
        if row.user_id.startswith(st.PSEUDONYM_PREFIX) and ending.ending.to_state in TERMINAL:
            # its user was erased while it was leased: it goes now (reference §9.2)
            for statement in st.forget_erased_jobs([(job_id, row.user_id)]):
                batch.add(statement)
        try:
            await batch.run()
        except FenceBroken as broken:
            if broken.label == "expire":
                return None  # nothing was written
            raise RuntimeError("reaper second step refused") from None
        parents.observe(changes)
        outcome = ending.ending.to_state
        return _Expired(job_id, row.job_type, row.attempt_no, row.locked_by, code, outcome)

    async def purge_workers(self) -> int:
        """Delete departed instances' registry rows (see
        :meth:`~job_service.maintenance.workers.WorkerRegistry.purge`); returns how many."""
        retention = self.core.settings.WORKER_RETENTION_SECONDS
        purged = await self.core.store.lean_tx(lambda db: self.core.registry.purge(db, retention))
        if purged:
            log.info("purged departed workers", extra={"fields": {"workers": purged}})
        return purged

    async def run(self, stop: asyncio.Event) -> None:
        """Sweep every ``REAPER_INTERVAL_SECONDS`` and purge departed workers every
        :data:`PURGE_EVERY_SECONDS` until ``stop`` is set."""
        interval = self.core.settings.REAPER_INTERVAL_SECONDS
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


def _observe(expired: _Expired) -> None:
    """Metrics and the log line of an expired attempt (after its transaction committed)."""
    metrics.REAPED.labels(expired.code, expired.outcome).inc()
    metrics.LEASE_LOSSES.labels("reaper").inc()
    if expired.outcome != PENDING:
        metrics.JOBS_FINISHED.labels(expired.job_type, expired.outcome).inc()
    log.info(
        "attempt expired",
        extra={
            "fields": {
                "jobId": expired.job_id,
                "attemptNo": expired.attempt_no,
                "runtimeInstanceId": expired.holder,
                "code": expired.code,
                "outcome": expired.outcome,
            }
        },
    )


def _message(code: str) -> str:
    if code == ErrorCode.JOB_TIMEOUT:
        return "the attempt ran past timeoutSeconds"
    return "the lease expired without a heartbeat"
