"""Claiming: poll, claim, lock and the long poll (reference §2.6, §3).

A claim is poll + lock of up to ``limit`` jobs in one short transaction: the pick
(``FOR UPDATE SKIP LOCKED`` on MySQL/MariaDB, so concurrent claimers get disjoint
batches; SQLite's single writer needs no lock) and the lease grant, then one batch
with the moves, their events and the reads of the claimed rows and of the snapshots
not cached: :class:`~job_service.services.claim_round.ClaimRound`, which a result
asking for the next job of its slot runs in the completer's transaction too.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from airuntime_common import jobtypes
from airuntime_common.errors import AppError, ErrorCode
from job_service.lifecycle import LOCKED, PENDING, TERMINAL, Op
from job_service.maintenance import limits
from job_service.maintenance.scheduler import RECHECK_SECONDS
from job_service.services import parents
from job_service.services.claim_round import ClaimAsk, Claimed, ClaimRound, lock_values
from job_service.services.core import Core, observe_pickup, runtime_actor
from job_service.services.granting import Granting, Pauses, Pick
from job_service.store import scheduling as sched
from job_service.store import statements as st
from job_service.store.batch import new_batch, run_one
from job_service.store.engine import DbExec
from job_service.store.records import JobRecord, job_of
from job_service.store.transitions import (
    events_from_rows,
    lock_guard,
    transition_sql,
)

#: Most picks of one claim when picked jobs had nowhere to run (each round parks them
#: and reads the jobs behind them).
PICK_ROUNDS = 4
MAX_POLL_LIMIT = 50
DEFAULT_POLL_LIMIT = 10
MAX_WAIT_MS = 20_000


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
        """A claim's statements inside the caller's transaction: a
        :class:`~job_service.services.claim_round.ClaimRound` of one ask, picking again
        behind the candidates that had nowhere to run (parked), at most
        :data:`PICK_ROUNDS` times, then its moves in one batch.

        Args:
            caps: the capabilities, sorted and without repeats.
            n: how many jobs at most (checked by :func:`check_poll_args`).
            start: also start each job and read its snapshot.

        The COMMIT is left to the caller: a claim run again would lock other jobs,
        so its COMMIT goes alone.
        """
        claim = ClaimRound(
            self.core, self.granting, [ClaimAsk(instance_id, tuple(caps), n)], start=start
        )
        for _ in range(PICK_ROUNDS):
            batch = new_batch(db)
            claim.queue_pick(batch)
            found = await claim.grant(db, await batch.run())
            if not found or not claim.parked or not claim.missing(0):
                break
        await claim.hold_parents(db)
        batch = new_batch(db)
        claim.queue_moves(batch)
        if not batch:
            return Claimed()
        out = await batch.run()
        claim.observe()
        return claim.claimed(out)[0]

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
            values = {**lock_values(self.core, instance_id), **await self._grant_one(db, job_id)}
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
        pauses_at = batch.add(sched.paused_now.sql(clock, {}))
        out = await batch.run()
        picks = [Pick.of(row) for row in out[pick_at].rows]
        pauses = Pauses.of(out[pauses_at].rows)
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
