"""The lease holder's calls: start, heartbeats, lease checks and the snapshot (reference §2.3, §3).

Each is one transaction, on MySQL/MariaDB one round trip where it can be: the
guarded UPDATE, its event row (appended only when the UPDATE matched) and the
read that judges the outcome go in one batch. A lease is judged by the fencing
token ``(jobId, instanceId, attemptNo)`` and ``lockUntil ≥ now`` on the
database clock (a lease past ``lockUntil`` is dead even before the reaper runs).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement

from airuntime_common.errors import AppError, ErrorCode
from job_service import metrics
from job_service.lifecycle import LEASED, LOCKED, Lease, Op
from job_service.services.core import Core, lease_refusal, runtime_actor
from job_service.services.inputs import LeaseAnswer, LeaseHolderView
from job_service.services.ports import SnapshotView
from job_service.store import statements as st
from job_service.store.batch import StatementBatch, new_batch, run_one
from job_service.store.cache import Sql
from job_service.store.clock import DbClock
from job_service.store.engine import DbExec
from job_service.store.records import JobRecord, job_of
from job_service.store.transitions import (
    TransitionSql,
    lease_params,
    renew_many,
    transition_sql,
)

MAX_HEARTBEAT_LEASES = 500


class Leases:
    """Serves the holder of a lease.

    Args:
        core: the shared core.
    """

    def __init__(self, core: Core) -> None:
        self.core = core

    def _start_sql(
        self,
        lease: Lease,
        *,
        renew: bool = False,
        where: ColumnElement[bool] | None = None,
        where_params: dict[str, Any] | None = None,
    ) -> TransitionSql:
        """The (implied) start of ``lease``'s job, locked → running, and its event;
        ``renew`` also renews the lease; ``where``: an extra registered guard
        binding ``where_params``."""
        clock = self.core.clock
        values: dict[str, Any] = {"started_at": clock.now()}
        if renew:
            values["lock_until"] = clock.plus(self.core.settings.LOCK_LEASE_SECONDS)
        sql = transition_sql(
            clock,
            Op.START,
            job_id=lease.job_id,
            actor=runtime_actor(lease.instance_id),
            lease=lease,
            values=values,
            where=where,
            where_params=where_params,
        )
        assert sql is not None and sql.event is not None  # START always applies and records
        return sql

    def _queue_read(self, batch: StatementBatch, lease: Lease) -> int:
        """Queue the read of the job with whether ``lease`` is live on it."""
        return batch.add(st.get_job_and_lease.sql(self.core.clock, lease_params(lease)))

    @staticmethod
    def _held(lease: Lease, rows: list[tuple[Any, ...]]) -> JobRecord:
        """The job of a :meth:`_queue_read` row when ``lease`` is live on it.

        Raises:
            AppError: JOB_NOT_FOUND, LOCK_NOT_HELD.
        """
        if not rows:
            raise lease_refusal(lease, None)
        *values, held = rows[0]
        job = job_of(values)
        if not held:
            raise lease_refusal(lease, job.status)
        return job

    async def start(self, lease: Lease) -> JobRecord:
        """locked → running; a repeat by the holder returns the same ``startedAt`` (reference §2.3).

        One batch, COMMIT included (run again after a lost answer, the start
        matches no row and appends no event).

        Raises:
            AppError: JOB_NOT_FOUND, LOCK_NOT_HELD.
        """

        async def body(db: DbExec) -> JobRecord:
            batch = new_batch(db)
            self._start_sql(lease).queue(batch)
            read = self._queue_read(batch, lease)
            batch.commit()
            return self._held(lease, (await batch.run())[read].rows)

        return await self.core.store.lean_tx(body)

    async def heartbeat(self, lease: Lease) -> JobRecord:
        """Renew the lease (``lockUntil = now + lease``); implies start (reference §2.3).

        One batch: the renewal of a running job, else the start of a locked one
        (with its event), then the read; COMMIT included.

        Raises:
            AppError: JOB_NOT_FOUND, LOCK_NOT_HELD (the lease lapsed or moved: stop work).
        """
        clock = self.core.clock
        renew = transition_sql(
            clock,
            Op.RENEW,
            job_id=lease.job_id,
            actor=runtime_actor(lease.instance_id),
            lease=lease,
            values={"lock_until": clock.plus(self.core.settings.LOCK_LEASE_SECONDS)},
        )
        assert renew is not None

        async def body(db: DbExec) -> JobRecord:
            batch = new_batch(db)
            renew.queue(batch)
            self._start_sql(lease, renew=True).queue(batch)
            read = self._queue_read(batch, lease)
            batch.commit()
            return self._held(lease, (await batch.run())[read].rows)

        try:
            return await self.core.store.lean_tx(body)
        except AppError as err:
            if err.code == ErrorCode.LOCK_NOT_HELD:
                metrics.LEASE_LOSSES.labels("heartbeat").inc()
            raise

    async def heartbeat_leases(
        self, instance_id: str, leases: list[tuple[str, int]]
    ) -> list[LeaseAnswer]:
        """Renew up to 500 leases; one answer per lease, in order (reference §3).

        One UPDATE renews every running lease and one SELECT reads them all back;
        only a job not started yet needs its own implied start (and event row),
        all of them in one more batch.

        Raises:
            AppError: ``INVALID_ARGUMENT`` for more than 500 leases.
        """
        if len(leases) > MAX_HEARTBEAT_LEASES:
            raise AppError(ErrorCode.INVALID_ARGUMENT, "at most 500 leases", {"field": "leases"})
        refs = list(dict.fromkeys(leases))
        if not refs:
            return []
        clock = self.core.clock

        async def body(db: DbExec) -> dict[tuple[str, int], tuple[datetime | None, bool]]:
            batch = new_batch(db)
            batch.add(
                renew_many(
                    clock,
                    instance_id=instance_id,
                    refs=refs,
                    lease_seconds=self.core.settings.LOCK_LEASE_SECONDS,
                )
            )
            read = batch.add(_held_leases_sql(clock, instance_id, refs))
            held: dict[tuple[str, int], tuple[datetime | None, bool]] = {}
            starting: list[Lease] = []
            for job_id, attempt_no, status, lock_until, cancel in (await batch.run())[read].rows:
                key = (str(job_id), int(attempt_no))
                if status == LOCKED:
                    starting.append(Lease(key[0], instance_id, key[1]))
                else:
                    held[key] = (lock_until, bool(cancel))
            if starting:
                held.update(await self._start_locked(db, starting))
            return held

        held = await self.core.store.lean_tx(body)
        out: list[LeaseAnswer] = []
        for job_id, attempt_no in leases:
            state = held.get((job_id, attempt_no))
            if state is None:
                out.append(LeaseAnswer(job_id, attempt_no, False, None, False))
            else:
                out.append(LeaseAnswer(job_id, attempt_no, True, state[0], state[1]))
        return out

    async def _start_locked(
        self, db: DbExec, leases: list[Lease]
    ) -> dict[tuple[str, int], tuple[datetime | None, bool]]:
        """The implied start (and renewal) of locked jobs a heartbeat found, one batch."""
        batch = new_batch(db)
        reads = []
        for lease in leases:
            self._start_sql(lease, renew=True).queue(batch)
            reads.append((lease, self._queue_read(batch, lease)))
        out = await batch.run()
        held: dict[tuple[str, int], tuple[datetime | None, bool]] = {}
        for lease, index in reads:
            try:
                job = self._held(lease, out[index].rows)
            except AppError:
                continue
            held[(lease.job_id, lease.attempt_no)] = (job.lock_until, bool(job.cancel_requested))
        return held

    async def verify_lease(self, lease: Lease) -> LeaseHolderView:
        """What credential resolution needs when ``lease`` is live (reference §3 fencing).

        One read of the few columns it needs (no full row), under the lease guard.

        Raises:
            AppError: JOB_NOT_FOUND, LOCK_NOT_HELD.
        """
        sql = st.verify_lease.sql(self.core.clock, lease_params(lease))

        async def body(db: DbExec) -> LeaseHolderView:
            found = (await run_one(db, sql, commit=True)).rows
            if not found:
                job = await self.core.get_job(db, lease.job_id)
                raise lease_refusal(lease, None if job is None else job.status)
            return LeaseHolderView(*found[0])

        return await self.core.store.lean_tx(body)

    async def verify_leases(self, leases: Sequence[Lease]) -> list[LeaseHolderView | AppError]:
        """:meth:`verify_lease` for several leases in one read; one verdict per lease, in order.

        Each lease is judged as :meth:`verify_lease` judges it (the holder's instance
        and ``attemptNo``, a leased status, ``lockUntil ≥ now`` on the database
        clock), from one ``SELECT … WHERE jobId IN (…)``.

        Returns:
            The key settings for each held lease; the ``AppError`` (``JOB_NOT_FOUND``,
            ``LOCK_NOT_HELD``) :meth:`verify_lease` would raise for each other.

        Raises:
            AppError: INVALID_ARGUMENT for more than 500 leases.
        """
        if len(leases) > MAX_HEARTBEAT_LEASES:
            raise AppError(ErrorCode.INVALID_ARGUMENT, "at most 500 leases", {"field": "leases"})
        if not leases:
            return []
        sql = st.verify_leases.sql(
            self.core.clock, {"ids": sorted({lease.job_id for lease in leases})}
        )
        found = await self.core.store.lean_tx(lambda db: run_one(db, sql, commit=True))
        rows = {row[0]: row for row in found.rows}
        out: list[LeaseHolderView | AppError] = []
        for lease in leases:
            row = rows.get(lease.job_id)
            if row is None:
                out.append(lease_refusal(lease, None))
                continue
            _, status, locked_by, attempt_no, live, *view = row
            if (
                status in LEASED
                and locked_by == lease.instance_id
                and attempt_no == lease.attempt_no
                and bool(live)
            ):
                out.append(LeaseHolderView(*view))
            else:
                out.append(lease_refusal(lease, status))
        return out

    async def snapshot(self, lease: Lease) -> SnapshotView:
        """The leased job's snapshot; reading it implies start (reference §2.3, §3).

        One transaction: the implied start, the lease check and the snapshot read.
        Right after this process's claim the job's snapshot id is known
        (:attr:`Core.claimed_snapshots`), so all three and the COMMIT go in one
        batch (snapshots are immutable: a process-wide cache usually answers the
        read); when the snapshot is not cached, the start also requires its row,
        so a missing snapshot starts nothing. Otherwise the snapshot is read after
        the job row names it, and the transaction commits only when it was found.

        Raises:
            AppError: JOB_NOT_FOUND, LOCK_NOT_HELD, INVALID_SNAPSHOT (job has none),
                NOT_FOUND (its snapshot row is missing).
        """
        known = self.core.claimed_snapshots.get(lease.job_id)
        read = self.core.learning.snapshot_read(known) if known is not None else None

        async def body(db: DbExec) -> SnapshotView:
            batch = new_batch(db)
            fetch = read if read is not None and read.view is None else None
            if fetch is not None:  # no snapshot row, no start
                start = self._start_sql(
                    lease, where=fetch.exists, where_params=dict(fetch.sql.params)
                )
            else:
                start = self._start_sql(lease)
            start.queue(batch)
            job_index = self._queue_read(batch, lease)
            snap_index = batch.add(fetch.sql) if fetch is not None else None
            if read is not None:
                batch.commit()
            out = await batch.run()
            job = self._held(lease, out[job_index].rows)
            if not job.snapshot_id:
                raise AppError(
                    ErrorCode.INVALID_SNAPSHOT, "job has no snapshot", {"jobId": job.job_id}
                )
            if read is not None and job.snapshot_id == known:
                if read.view is not None:
                    return read.view
                rows = out[snap_index].rows if snap_index is not None else []
                if not rows:
                    raise read.not_found()
                return read.from_row(rows[0])
            return await self.core.load_snapshot(db, job.snapshot_id)

        view = await self.core.store.lean_tx(body)
        # the holder's first read forgets it (a caller without the lease does not)
        self.core.claimed_snapshots.pop(lease.job_id)
        return view


def _held_leases_sql(clock: DbClock, instance_id: str, refs: list[tuple[str, int]]) -> Sql:
    """The one-off read of :func:`~job_service.store.statements.held_leases` as an :class:`Sql`."""
    return Sql(None, lambda: st.held_leases(clock, instance_id, refs), {})
