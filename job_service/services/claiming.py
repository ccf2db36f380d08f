"""Claiming: poll, claim, lock and the long poll (reference §2.6, §3).

A claim is poll + lock of up to ``limit`` jobs in one short transaction: the
pick (``FOR UPDATE SKIP LOCKED`` on MySQL/MariaDB, so concurrent claimers get
disjoint batches; SQLite's single writer needs no lock), then one batch with
the lock UPDATE, the event rows read from the rows it locked (their new
``attemptNo``), for a claim with start the start UPDATE and its events, and
the read of the claimed rows and of the snapshots not cached.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from airuntime_common import jobtypes
from airuntime_common.errors import AppError, ErrorCode
from job_service.lifecycle import LOCKED, PENDING, RUNNING, TERMINAL, Op
from job_service.maintenance import limits
from job_service.maintenance.limits import Room
from job_service.maintenance.scheduler import RECHECK_SECONDS
from job_service.services import parents
from job_service.services.core import Core, observe_pickup, runtime_actor
from job_service.services.granting import Grant, Granting, Pauses, Pick
from job_service.services.ports import SnapshotView
from job_service.store import scheduling as sched
from job_service.store import statements as st
from job_service.store.batch import StatementBatch, new_batch, run_one
from job_service.store.engine import DbExec
from job_service.store.records import JobRecord, job_of
from job_service.store.transitions import (
    NEXT_ATTEMPT,
    events_from_rows,
    lock_guard,
    transition_many_sql,
    transition_sql,
)

#: Most picks of one claim when picked jobs had nowhere to run (each round parks them
#: and reads the jobs behind them).
PICK_ROUNDS = 4
MAX_POLL_LIMIT = 50
DEFAULT_POLL_LIMIT = 10
MAX_WAIT_MS = 20_000


@dataclass(frozen=True)
class Claimed:
    """What a claim returns: the jobs (locked, or running for a claim with start) and,
    for a claim with start, their snapshots by job id (a job whose snapshot row is
    missing has none: its GetSnapshot answers as usual)."""

    jobs: list[JobRecord] = field(default_factory=list)
    snapshots: dict[str, SnapshotView] = field(default_factory=dict)


def check_poll_args(capabilities: Sequence[str], limit: int, wait_ms: int) -> int:
    """Validate poll/claim arguments (reference §2.6); returns the effective limit.

    Raises:
        AppError: ``INVALID_ARGUMENT`` for empty/unknown capabilities, limit < 0
            (0 means the default 10) or ``waitMs`` outside 0..20000.
    """
    if not capabilities:
        raise AppError(
            ErrorCode.INVALID_ARGUMENT, "capabilities must not be empty", {"field": "capabilities"}
        )
    unknown = [c for c in capabilities if jobtypes.find(c) is None]
    if unknown:
        raise AppError(
            ErrorCode.INVALID_ARGUMENT,
            "unknown capabilities",
            {"field": "capabilities", "value": unknown},
        )
    if limit < 0:
        raise AppError(ErrorCode.INVALID_ARGUMENT, "limit must be ≥ 1", {"field": "limit"})
    if not 0 <= wait_ms <= MAX_WAIT_MS:
        raise AppError(ErrorCode.INVALID_ARGUMENT, "waitMs must be 0..20000", {"field": "waitMs"})
    return min(limit or DEFAULT_POLL_LIMIT, MAX_POLL_LIMIT)


class Claiming:
    """Hands pending jobs to runtime instances.

    Args:
        core: the shared core.
    """

    def __init__(self, core: Core) -> None:
        self.core = core
        self.granting = Granting(core)

    async def poll(
        self, instance_id: str, capabilities: list[str], limit: int, wait_ms: int
    ) -> list[JobRecord]:
        """Pending jobs the caller can run, not locked (reference §2.6), long-polling up to ``wait_ms``."""
        n = check_poll_args(capabilities, limit, wait_ms)
        sql = sched.poll_pending.sql(self.core.clock, {"caps": list(capabilities), "n": n})

        async def once() -> list[JobRecord]:
            found = await self.core.store.read(lambda conn: run_one(conn, sql))
            return [job_of(row) for row in found.rows]

        return await self.long_poll(once, wait_ms)

    async def claim(
        self, instance_id: str, capabilities: list[str], limit: int, wait_ms: int, *, start: bool
    ) -> Claimed:
        """Poll + lock up to ``limit`` jobs in one short transaction (reference §3 claim),
        long-polling up to ``wait_ms`` for the first.

        With ``start`` each claimed job is also started in the same transaction
        (pending → locked → running, two event rows: the start is the one a
        snapshot read implies, reference §2.3) and its snapshot read: what a claim then
        GetSnapshot for every job would do, without a call per job.

        Raises:
            AppError: INVALID_ARGUMENT (bad ``limit``, ``waitMs`` or capabilities).
        """
        n = check_poll_args(capabilities, limit, wait_ms)
        caps = sorted(set(capabilities))
        result = Claimed()

        async def once() -> list[JobRecord]:
            nonlocal result
            result = await self.core.store.lean_tx(
                lambda conn: self.claim_in(conn, instance_id, caps, n, start=start)
            )
            return result.jobs

        await self.long_poll(once, wait_ms)
        for job in result.jobs:
            observe_pickup(job)
        if not start:
            for job in result.jobs:
                if job.snapshot_id:
                    self.core.claimed_snapshots.put(job.job_id, job.snapshot_id)
        return result

    async def claim_in(
        self, db: DbExec, instance_id: str, caps: list[str], n: int, *, start: bool
    ) -> Claimed:
        """A claim's statements inside the caller's transaction (module doc): the pick
        (with the pauses running now, in its round trip), each picked job's lease grant
        (:class:`~job_service.services.granting.Granting`: its provider, or parked when
        none has room; the pick then goes on behind it), then one batch with the
        moves, their events, the grants and the reads of the rows and snapshots.

        Args:
            caps: the capabilities, sorted and without repeats.
            n: how many jobs at most (checked by :func:`check_poll_args`).
            start: also start each job and read its snapshot.

        The COMMIT is left to the caller: a claim run again would lock other jobs,
        so its COMMIT goes alone.
        """
        picks, grant = await self._pick_and_grant(db, caps, n)
        if not picks:
            return Claimed()
        ids = [p.job_id for p in picks]
        snapshot_ids = {p.job_id: p.snapshot_id for p in picks if p.snapshot_id} if start else {}
        batch = new_batch(db)
        for statement in limits.grant_statements(self.core.clock, grant.reserved, grant.limited):
            batch.add(statement, merge=True)
        read = self._queue_moves(batch, ids, instance_id, start=start, providers=grant.providers)
        snaps = self.core.learning.snapshots_read(sorted(set(snapshot_ids.values())))
        snaps_at = batch.add(snaps.sql) if snaps.sql is not None else None
        # batches (reference §10.3): the picked children's parents, locked after them
        held = _parents_held(self.core, batch, picks)
        out = await batch.run()
        claimed = [job_of(row) for row in out[read].rows]
        if held is not None:
            await _follow_parents(self.core, db, parents.rows_of(out[held]), claimed, instance_id)
        views = dict(snaps.views)
        if snaps_at is not None:
            for row in out[snaps_at].rows:
                view = snaps.from_row(row)
                views[view.snapshot_id] = view
        by_job = {
            job.job_id: views[snapshot_ids[job.job_id]]
            for job in claimed
            if snapshot_ids.get(job.job_id) in views
        }
        return Claimed(claimed, by_job)

    async def _pick_and_grant(
        self, db: DbExec, caps: list[str], n: int
    ) -> tuple[list[Pick], Grant]:
        """Up to ``n`` picked jobs that may run now and their grant: a picked job with
        nowhere to run is parked (out of the claim's range) and the pick goes on
        behind it, at most :data:`PICK_ROUNDS` times."""
        clock = self.core.clock
        taken: list[Pick] = []
        grant = Grant()
        parked: dict[str, datetime] = {}
        rooms: dict[str, Room] = {}
        for _ in range(PICK_ROUNDS):
            batch = new_batch(db)
            for until, ids in _by_time(parked).items():  # parked in the last round
                batch.add(sched.park.sql(clock, {"ids": ids, "p_until": until}))
            parked = {}
            # the jobs taken so far are still pending (this transaction's locks): the pick
            # reads them again, ahead of the rest, and they are left out below
            pick_at = batch.add(sched.claim_pick.sql(clock, {"caps": caps, "n": n}))
            providers_at = batch.add(sched.paused_providers.sql(clock, {}))
            credentials_at = batch.add(sched.paused_credentials.sql(clock, {}))
            out = await batch.run()
            seen = {p.job_id for p in taken}
            picks = [p for p in map(Pick.of, out[pick_at].rows) if p.job_id not in seen]
            if not picks:
                break
            pauses = Pauses.of(out[providers_at].rows, out[credentials_at].rows)
            decided = await self.granting.decide(db, picks, pauses, rooms)
            parked = decided.parked
            taken += [p for p in picks if p.job_id not in parked]
            grant.providers.update(decided.providers)
            grant.reserved += decided.reserved
            grant.limited |= decided.limited
            if not parked or len(taken) >= n:
                break
        if parked:
            batch = new_batch(db)
            for until, ids in _by_time(parked).items():
                batch.add(sched.park.sql(clock, {"ids": ids, "p_until": until}))
            await batch.run()
        return taken, grant

    def _queue_moves(
        self,
        batch: StatementBatch,
        ids: list[str],
        instance_id: str,
        *,
        start: bool,
        providers: dict[str, str] | None = None,
    ) -> int:
        """Queue a claim's lock (and, with ``start``, start) of ``ids`` with their event rows
        and the read of the rows it moved; returns the read's index. The jobs of
        ``providers`` (jobId → provider) are given that provider by their lock.

        One UPDATE per provider group moves the jobs (pending → locked, or with
        ``start`` pending → locked → running in the same statement) and one
        INSERT … SELECT appends every step's event, so a claim with start costs
        the statements of a plain lock."""
        clock = self.core.clock
        moved = {"ids": ids, "instance_id": instance_id, "e_actor": runtime_actor(instance_id)}
        groups: dict[str | None, list[str]] = {}
        for job_id in ids:
            groups.setdefault((providers or {}).get(job_id), []).append(job_id)
        # with start, each UPDATE locks and starts at once (LOCK then START), and one
        # INSERT appends both events of every job: the statements of two steps, halved
        status = RUNNING if start else LOCKED
        then = Op.START if start else None
        for provider, group in groups.items():
            values = self._lock_values(instance_id)
            if start:
                values["started_at"] = clock.now()
            if provider is not None:
                values["model_provider"] = provider
            batch.add(
                transition_many_sql(
                    clock, Op.LOCK, job_ids=group, where=lock_guard(clock), values=values, then=then
                )
            )
        batch.add(
            events_from_rows(
                clock,
                from_status=PENDING,
                to_status=LOCKED,
                at="locked_at",
                params=moved,
                then=(RUNNING, "started_at") if start else None,
            )
        )
        return batch.add(
            sched.claimed_rows.sql(clock, {"ids": ids, "instance_id": instance_id}, status)
        )

    def _lock_values(self, instance_id: str) -> dict[str, Any]:
        """pending → locked: a new attempt, its lease, and no ``startedAt`` yet (a retried
        job's old one would let the reaper time the new attempt out before it starts)."""
        clock = self.core.clock
        return {
            "attempt_no": NEXT_ATTEMPT,
            "started_at": None,
            "locked_by": instance_id,
            "locked_at": clock.now(),
            "lock_until": clock.plus(self.core.settings.LOCK_LEASE_SECONDS),
        }

    async def lock(self, job_id: str, instance_id: str) -> JobRecord:
        """pending → locked for the caller (reference §2.3 lock).

        The job's provider is granted as a claim's are (:class:`Granting`).

        Raises:
            AppError: JOB_NOT_FOUND; INVALID_JOB_STATE (terminal/cancelled);
                JOB_ALREADY_LOCKED (leased, or a pending job whose old lease has not
                lapsed); NO_PROVIDER_CAPACITY (no provider has room for it now, with
                ``retryAfterSeconds``).
        """
        clock = self.core.clock
        moved = {"ids": [job_id], "instance_id": instance_id, "e_actor": runtime_actor(instance_id)}

        async def body(db: DbExec) -> JobRecord:
            values = {**self._lock_values(instance_id), **await self._grant_one(db, job_id)}
            sql = transition_sql(
                clock,
                Op.LOCK,
                job_id=job_id,
                actor=runtime_actor(instance_id),
                where=lock_guard(clock),
                values=values,
                record=False,  # its attemptNo is the one the UPDATE grants: read from the row
            )
            assert sql is not None
            batch = new_batch(db)
            locked = batch.add(sql.update)
            batch.add(
                events_from_rows(
                    clock,
                    from_status=PENDING,
                    to_status=LOCKED,
                    at="locked_at",
                    params=moved,
                    if_matched=True,
                )
            )
            read = batch.add(st.get_job.sql(clock, {"g_job_id": job_id}, False))
            out = await batch.run()
            if not out[read].rows:
                raise AppError(ErrorCode.JOB_NOT_FOUND, "job not found", {"jobId": job_id})
            job = job_of(out[read].rows[0])
            if out[locked].rowcount != 1:
                if job.status in TERMINAL or job.is_parent:  # a parent is never leased
                    why = "a batch's parent is never leased" if job.is_parent else ""
                    raise AppError(
                        ErrorCode.INVALID_JOB_STATE,
                        why or f"job is {job.status}",
                        {"jobId": job_id, "status": job.status},
                    )
                raise AppError(
                    ErrorCode.JOB_ALREADY_LOCKED,
                    "job is already locked",
                    {"jobId": job_id, "status": job.status},
                )
            if job.parent_job_id is not None:  # a batch's child: its parent follows
                await parents.settle(
                    clock,
                    db,
                    [parents.ChildMove(job.parent_job_id, PENDING, job.status)],
                    actor=runtime_actor(instance_id),
                )
            return job

        job = await self.core.store.lean_tx(body)
        observe_pickup(job)
        return job

    async def _grant_one(self, db: DbExec, job_id: str) -> dict[str, Any]:
        """A lock's lease grant (:class:`Granting`, as a claim's): the columns it changes
        (its provider), its grant written.

        Raises:
            AppError: NO_PROVIDER_CAPACITY with ``retryAfterSeconds`` when no provider
                has room for the job now (reference §10.2).
        """
        clock = self.core.clock
        batch = new_batch(db)
        pick_at = batch.add(sched.lock_pick.sql(clock, {"g_job_id": job_id}))
        providers_at = batch.add(sched.paused_providers.sql(clock, {}))
        credentials_at = batch.add(sched.paused_credentials.sql(clock, {}))
        out = await batch.run()
        picks = [Pick.of(row) for row in out[pick_at].rows]
        pauses = Pauses.of(out[providers_at].rows, out[credentials_at].rows)
        grant = await self.granting.decide(db, picks, pauses)
        if job_id in grant.parked:  # nowhere to run it now (reference §10.2)
            now = await clock.read(db)
            wait = max(1, math.ceil((grant.parked[job_id] - now).total_seconds()))
            raise AppError(
                ErrorCode.NO_PROVIDER_CAPACITY,
                "no provider has room for this job now",
                {"jobId": job_id, "retryAfterSeconds": wait},
            )
        batch = new_batch(db)
        for statement in limits.grant_statements(clock, grant.reserved, grant.limited):
            batch.add(statement)
        await batch.run()
        provider = grant.providers.get(job_id)
        return {} if provider is None else {"model_provider": provider}

    async def long_poll(
        self, once: Callable[[], Awaitable[list[JobRecord]]], wait_ms: int
    ) -> list[JobRecord]:
        """Run ``once`` until it finds jobs or ``wait_ms`` pass (reference §2.6 long poll).

        Between tries it waits for a local wake-up (:class:`~job_service.maintenance.scheduler.JobSignal`) or asks the
        shared probe (one query per process per :data:`RECHECK_SECONDS`) instead of
        re-running the caller's query; when the wait ends with the probe still
        saying "nothing", it answers empty without a last query of its own (the
        caller polls again anyway).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_ms / 1000.0
        while True:
            found = await once()
            remaining = deadline - loop.time()
            if found or remaining <= 0:
                return found
            while True:
                if await self.core.signal.wait(min(RECHECK_SECONDS, remaining)):
                    break
                if await self.core.probe.claimable():
                    break
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return []


def _by_time(parked: dict[str, datetime]) -> dict[datetime, list[str]]:
    """Parked job ids grouped by the time they are parked until."""
    out: dict[datetime, list[str]] = {}
    for job_id, until in parked.items():
        out.setdefault(until, []).append(job_id)
    return out


# ------------------------------------------------------------------ batches (reference §10.3)


def _parents_held(core: Core, batch: StatementBatch, picks: Sequence[Pick]) -> int | None:
    """Queue the locking read of the parents of the picked children on the claim's
    batch; its index, or None when no child was picked."""
    ids = {p.parent_job_id for p in picks if p.parent_job_id}
    return batch.add(parents.lock_sql(core.clock, ids)) if ids else None


async def _follow_parents(
    core: Core,
    db: DbExec,
    held: dict[str, parents.ParentRow],
    claimed: Sequence[JobRecord],
    instance_id: str,
) -> None:
    """The claimed children's parents follow them (pending → leased), in one batch."""
    moves = [
        parents.ChildMove(job.parent_job_id, PENDING, job.status)
        for job in claimed
        if job.parent_job_id is not None
    ]
    batch = new_batch(db)
    changes = parents.queue(core.clock, batch, held, moves, actor=runtime_actor(instance_id))
    await batch.run()
    parents.observe(changes)
