"""Cancellation by a user or an admin (reference §2.3): a pending job is cancelled at once; a
leased one gets ``cancelRequested`` and its worker acknowledges at its next heartbeat.
A batch's parent is cancelled at once with its children (reference §10.3)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airuntime_common.errors import AppError, ErrorCode
from job_service import metrics
from job_service.lifecycle import CANCELLED, LEASED, LIVE, PENDING, TERMINAL, Op
from job_service.services import parents
from job_service.services.core import Core
from job_service.store import cache
from job_service.store import statements as st
from job_service.store.batch import new_batch, run_one
from job_service.store.clock import DbClock
from job_service.store.engine import DbExec
from job_service.store.parents import LiveRow, live_children
from job_service.store.records import JobRecord, job_of
from job_service.store.tables import jobs
from job_service.store.transitions import TransitionSql, transition_sql

#: ``cancel_requested IS FALSE``: a leased job is asked to cancel only once.
_NOT_ASKED = cache.stable(jobs.c.cancel_requested.is_(False))


async def end_jobs(
    clock: DbClock, db: DbExec, actor: str, rows: Sequence[Sequence[Any]]
) -> tuple[int, int]:
    """Cancel the pending jobs of ``rows`` and ask the leased ones to cancel, in one
    batch, in the caller's transaction (reference §6 revoke, §9.2 deletes and erasure);
    a batch's parent among them is cancelled at once, and the parents of the children
    that moved follow them (reference §10.3).

    Args:
        rows: :class:`~job_service.store.parents.LiveRow` columns of live jobs, read
            locked by the caller; terminal rows are skipped.

    Returns:
        ``(cancelled, cancel_requested)``: how many jobs (not parents) moved.
    """
    live = [LiveRow.of(r) for r in rows]
    cancelled, requested, moves = await cancel_rows(
        clock, db, actor, [r for r in live if not r.is_parent]
    )
    ended = [r.job_id for r in live if r.is_parent and r.status in LIVE]
    await parents.settle(clock, db, moves, actor=actor, cancel=ended)
    return cancelled, requested


async def cancel_rows(
    clock: DbClock, db: DbExec, actor: str, rows: Sequence[LiveRow]
) -> tuple[int, int, list[parents.ChildMove]]:
    """The batch of :func:`end_jobs` for jobs that are not parents.

    Returns:
        ``(cancelled, cancel_requested, moves)``: how many moved, and the moves of the
        children among the cancelled (for their parents, :mod:`.parents`).
    """
    batch = new_batch(db)
    pending: list[tuple[LiveRow, int]] = []
    leased: list[int] = []
    for row in rows:
        if row.status == PENDING:
            sql = transition_sql(
                clock,
                Op.CANCEL_PENDING,
                job_id=row.job_id,
                actor=actor,
                attempt_no=row.attempt_no,
                values={
                    "cancelled_at": clock.now(),
                    "finished_at": clock.now(),
                    "cancel_requested": True,
                },
            )
            assert sql is not None
            pending.append((row, sql.queue(batch)))
        elif row.status in LEASED:
            asked = transition_sql(
                clock,
                Op.REQUEST_CANCEL,
                job_id=row.job_id,
                actor=actor,
                from_state=row.status,
                attempt_no=row.attempt_no,
                where=_NOT_ASKED,
                values={"cancel_requested": True},
            )
            assert asked is not None
            leased.append(asked.queue(batch))
    if not pending and not leased:
        return 0, 0, []
    out = await batch.run()
    moved = [row for row, i in pending if out[i].rowcount == 1]
    moves = [
        parents.ChildMove(row.parent_job_id, PENDING, CANCELLED)
        for row in moved
        if row.parent_job_id is not None
    ]
    return len(moved), sum(out[i].rowcount == 1 for i in leased), moves


class Cancellation:
    """Cancels jobs.

    Args:
        core: the shared core.
    """

    def __init__(self, core: Core) -> None:
        self.core = core

    async def cancel(self, job_id: str, *, user_id: str | None, actor: str) -> JobRecord:
        """pending → cancelled; leased → cancelRequested; terminal → INVALID_JOB_STATE (reference §2.3).

        A batch's parent is cancelled at once and its children as jobs are
        (:meth:`cancel_parent`); a child cancelled alone counts as cancelled in its
        parent (reference §10.3).

        Raises:
            AppError: JOB_NOT_FOUND (also another user's job), INVALID_JOB_STATE.
        """
        async with self.core.store.sessions() as session:  # is it a parent? (never changes)
            found = await self.core.must_get_job(session, job_id, user_id=user_id)
        if found.is_parent:
            return await self.cancel_parent(job_id, actor=actor)

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
            after = job_of(out[read].rows[0])
            if job.parent_job_id is not None and after.status != job.status:
                move = parents.ChildMove(job.parent_job_id, job.status, after.status)
                await parents.settle(self.core.clock, db, [move], actor=actor)
            return after

        job = await self.core.store.lean_tx(body)
        if job.status == CANCELLED:
            metrics.JOBS_FINISHED.labels(job.job_type, CANCELLED).inc()
        return job

    async def cancel_parent(self, job_id: str, *, actor: str) -> JobRecord:
        """Cancel a batch's parent at once and its children as jobs are cancelled
        (pending → cancelled, leased → ``cancelRequested``), in one transaction
        (reference §10.3): the live children locked first, then the parent.

        Raises:
            AppError: JOB_NOT_FOUND, INVALID_JOB_STATE (the parent is terminal).
        """
        clock = self.core.clock

        async def body(db: DbExec) -> JobRecord:
            kids = (await run_one(db, live_children.sql(clock, {"c_parent": job_id}))).rows
            held = await parents.lock(clock, db, [job_id])
            parent = held.get(job_id)
            if parent is None:
                raise AppError(ErrorCode.JOB_NOT_FOUND, "job not found", {"jobId": job_id})
            if parent.status in TERMINAL:
                raise AppError(
                    ErrorCode.INVALID_JOB_STATE,
                    f"job is {parent.status}",
                    {"jobId": job_id, "status": parent.status},
                )
            *_, moves = await cancel_rows(clock, db, actor, [LiveRow.of(r) for r in kids])
            batch = new_batch(db)
            changes = parents.queue(clock, batch, held, moves, actor=actor, cancel=[job_id])
            read = batch.add(st.get_job.sql(clock, {"g_job_id": job_id}, False))
            out = await batch.run()
            parents.observe(changes)
            return job_of(out[read].rows[0])

        return await self.core.store.lean_tx(body)

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
