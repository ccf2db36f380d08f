"""Cancellation by a user or an admin (SPEC §2.3): a pending job is cancelled at once; a
leased one gets ``cancelRequested`` and its worker acknowledges at its next heartbeat."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airuntime_common.errors import AppError, ErrorCode
from job_service import metrics
from job_service.lifecycle import CANCELLED, LEASED, PENDING, Op
from job_service.services.core import Core
from job_service.store import cache
from job_service.store import statements as st
from job_service.store.batch import new_batch
from job_service.store.clock import DbClock
from job_service.store.engine import DbExec
from job_service.store.records import JobRecord, job_of
from job_service.store.tables import jobs
from job_service.store.transitions import TransitionSql, transition_sql

#: ``cancel_requested IS FALSE``: a leased job is asked to cancel only once.
_NOT_ASKED = cache.stable(jobs.c.cancel_requested.is_(False))


async def end_jobs(
    clock: DbClock, db: DbExec, actor: str, rows: Sequence[Sequence[Any]]
) -> tuple[int, int]:
    """Cancel the pending jobs of ``rows`` and ask the leased ones to cancel, in one
    batch, in the caller's transaction (SPEC §6 revoke, §9.2 deletes and erasure).

    Args:
        rows: ``(jobId, status, attemptNo)`` of live jobs, read locked by the caller;
            terminal rows are skipped.

    Returns:
        ``(cancelled, cancel_requested)``: how many moved.
    """
    batch = new_batch(db)
    pending: list[int] = []
    leased: list[int] = []
    for job_id, status, attempt_no in rows:
        sql = None
        if status == PENDING:
            sql = transition_sql(
                clock,
                Op.CANCEL_PENDING,
                job_id=str(job_id),
                actor=actor,
                attempt_no=int(attempt_no),
                values={
                    "cancelled_at": clock.now(),
                    "finished_at": clock.now(),
                    "cancel_requested": True,
                },
            )
            into = pending
        elif status in LEASED:
            sql = transition_sql(
                clock,
                Op.REQUEST_CANCEL,
                job_id=str(job_id),
                actor=actor,
                from_state=str(status),
                attempt_no=int(attempt_no),
                where=_NOT_ASKED,
                values={"cancel_requested": True},
            )
            into = leased
        if sql is not None:
            into.append(sql.queue(batch))
    if not pending and not leased:
        return 0, 0
    out = await batch.run()
    return sum(out[i].rowcount == 1 for i in pending), sum(out[i].rowcount == 1 for i in leased)


class Cancellation:
    """Cancels jobs.

    Args:
        core: the shared core.
    """

    def __init__(self, core: Core) -> None:
        self.core = core

    async def cancel(self, job_id: str, *, user_id: str | None, actor: str) -> JobRecord:
        """pending → cancelled; leased → cancelRequested; terminal → INVALID_JOB_STATE (SPEC §2.3).

        Raises:
            AppError: JOB_NOT_FOUND (also another user's job), INVALID_JOB_STATE.
        """

        async def body(db: DbExec) -> JobRecord:
            job = await self.core.must_get_job(db, job_id, user_id=user_id, lock=True)
            if job.status in LEASED and job.cancel_requested:
                return job
            sql = self._transition(job, actor)
            batch = new_batch(db)
            moved = sql.queue(batch)
            read = batch.add(st.get_job.sql(self.core.clock, {"g_job_id": job_id}, False))
            out = await batch.run()
            if out[moved].rowcount != 1:  # pragma: no cover - the row is locked / one writer
                raise AppError(ErrorCode.INVALID_JOB_STATE, "job changed", {"jobId": job_id})
            return job_of(out[read].rows[0])

        job = await self.core.store.lean_tx(body)
        if job.status == CANCELLED:
            metrics.JOBS_FINISHED.labels(job.job_type, CANCELLED).inc()
        return job

    def _transition(self, job: JobRecord, actor: str) -> TransitionSql:
        """The cancel of ``job`` as it stands.

        Raises:
            AppError: INVALID_JOB_STATE for a terminal job.
        """
        clock = self.core.clock
        sql = None
        if job.status == PENDING:
            sql = transition_sql(
                clock,
                Op.CANCEL_PENDING,
                job_id=job.job_id,
                actor=actor,
                attempt_no=job.attempt_no,
                values={
                    "cancelled_at": clock.now(),
                    "finished_at": clock.now(),
                    "cancel_requested": True,
                    "locked_by": None,
                    "lock_until": None,
                },
            )
        elif job.status in LEASED:
            sql = transition_sql(
                clock,
                Op.REQUEST_CANCEL,
                job_id=job.job_id,
                actor=actor,
                from_state=job.status,
                attempt_no=job.attempt_no,
                values={"cancel_requested": True},
            )
        if sql is None:
            raise AppError(
                ErrorCode.INVALID_JOB_STATE,
                f"job is {job.status}",
                {"jobId": job.job_id, "status": job.status},
            )
        return sql
