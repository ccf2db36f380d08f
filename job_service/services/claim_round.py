"""The claims of one transaction (reference §2.6, §10.1, §10.2, §10.3).

A claim reads its candidates (``FOR UPDATE SKIP LOCKED``, in the order jobs are
taken) with the pauses running now, decides each candidate's lease grant
(:class:`~job_service.services.granting.Granting`: its provider, or parked when no
provider has room), then moves the granted jobs (``pending`` → ``locked``, with
start on to ``running``) with their events, grant rows, batches' parents and the
reads of their rows and snapshots.

:class:`ClaimRound` is that work, for one or several callers (:class:`ClaimAsk`),
queued on the batches of the transaction that runs it, in two steps around the
grant: :meth:`ClaimRound.queue_pick`, :meth:`ClaimRound.grant`, then
:meth:`ClaimRound.queue_moves` and :meth:`ClaimRound.claimed`. Two transactions run
it: ClaimJobs (:meth:`~job_service.services.claiming.Claiming.claim_in`, picking
again behind jobs that had nowhere to run), and a result that asks for the next job
of the slot it frees (:class:`~job_service.services.completer.Completer`: the pick
in the completer's read, the moves in its write, so a result and the next job's
claim cost the round trips of one).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from job_service.lifecycle import LOCKED, PENDING, RUNNING, Op
from job_service.maintenance import limits
from job_service.maintenance.limits import Room
from job_service.services import parents
from job_service.services.core import Core, runtime_actor
from job_service.services.granting import Grant, Granting, Pauses, Pick
from job_service.services.ports import SnapshotView
from job_service.store import scheduling as sched
from job_service.store.batch import Outcome, StatementBatch
from job_service.store.engine import DbExec
from job_service.store.records import JobRecord, job_of
from job_service.store.transitions import (
    NEXT_ATTEMPT,
    events_from_rows,
    lock_guard,
    transition_many_sql,
)


@dataclass(frozen=True)
class ClaimAsk:
    """One caller's claim: ``n`` jobs (≥ 1) of ``caps`` (sorted, no repeats) for
    runtime instance ``instance_id``."""

    instance_id: str
    caps: tuple[str, ...]
    n: int


@dataclass(frozen=True)
class Claimed:
    """What a claim gives its caller: the jobs (locked, or running for a claim with
    start) and, for a claim with start, their snapshots by job id (a job whose
    snapshot row is missing has none: its GetSnapshot answers as usual)."""

    jobs: list[JobRecord] = field(default_factory=list)
    snapshots: dict[str, SnapshotView] = field(default_factory=dict)


class ClaimRound:
    """The claims of one transaction (module doc).

    Args:
        core: the shared core.
        granting: decides each candidate's lease grant.
        asks: the callers' claims, served in this order.
        start: also start each job and read its snapshot.
    """

    def __init__(
        self, core: Core, granting: Granting, asks: Sequence[ClaimAsk], *, start: bool
    ) -> None:
        self.core = core
        self.granting = granting
        self.asks = list(asks)
        self.start = start
        #: per ask, the candidates granted to it, in the order taken
        self.taken: list[list[Pick]] = [[] for _ in self.asks]
        self.grant_made = Grant()
        #: candidates with nowhere to run: parked by the next batch (jobId → until)
        self.parked: dict[str, datetime] = {}
        self._rooms: dict[str, Room] = {}
        self._picks: dict[tuple[str, ...], int] = {}
        self._pauses: int | None = None
        self._held: dict[str, parents.ParentRow] = {}
        self._reads: dict[str, int] = {}
        self._snaps: tuple[Any, int | None] | None = None
        self._changes: list[parents.ParentChange] = []

    # ------------------------------------------------------------------ steps

    def queue_pick(self, batch: StatementBatch) -> None:
        """Queue the park of the jobs the last grant found no room for, the pick of each
        distinct capability set (as far as every ask still short reaches, past the
        jobs this transaction already took: still pending, they are read again) and
        the pauses running now."""
        self._queue_parks(batch)
        short = [i for i in range(len(self.asks)) if self.missing(i)]
        reach = sum(self.missing(i) for i in short) + sum(len(t) for t in self.taken)
        clock = self.core.clock
        self._picks = {
            caps: batch.add(sched.claim_pick.sql(clock, {"caps": list(caps), "n": reach}))
            for caps in dict.fromkeys(self.asks[i].caps for i in short)
        }
        self._pauses = batch.add(sched.paused_now.sql(clock, {}))

    async def grant(
        self,
        db: DbExec,
        out: Sequence[Outcome],
        serve: Sequence[int] | None = None,
        freed: Mapping[str, int] | None = None,
    ) -> bool:
        """Hand the candidates the pick read to the asks of ``serve`` (indices; default
        every ask), each up to what it still misses, in order, never one job twice;
        decide their lease grants (a candidate with nowhere to run goes to be
        parked: :attr:`parked`); ``freed``: the platform-key attempts this transaction
        ends, by provider (:meth:`Granting.decide`). Returns whether any candidate was
        new."""
        assert self._pauses is not None
        pauses = Pauses.of(out[self._pauses].rows)
        seen = {p.job_id for taken in self.taken for p in taken}
        offered: list[tuple[int, Pick]] = []
        for i in range(len(self.asks)) if serve is None else serve:
            want = self.missing(i)
            at = self._picks.get(self.asks[i].caps)
            for row in out[at].rows if at is not None and want else ():
                pick = Pick.of(row)
                if pick.job_id not in seen:
                    seen.add(pick.job_id)
                    offered.append((i, pick))
                    want -= 1
                    if not want:
                        break
        if not offered:
            return False
        decided = await self.granting.decide(
            db, [p for _, p in offered], pauses, self._rooms, freed
        )
        self.parked.update(decided.parked)
        for i, pick in offered:
            if pick.job_id not in decided.parked:
                self.taken[i].append(pick)
        self.grant_made.providers.update(decided.providers)
        self.grant_made.reserved += decided.reserved
        self.grant_made.limited |= decided.limited
        return True

    async def hold_parents(self, db: DbExec) -> None:
        """Lock the parents of the batches' children taken (after the children, in job
        id order; a round trip only when there are any)."""
        ids = {p.parent_job_id for taken in self.taken for p in taken if p.parent_job_id}
        self._held = await parents.lock(self.core.clock, db, ids)

    def queue_moves(self, batch: StatementBatch) -> None:
        """Queue the parks still due, the grant rows, each instance's moves with their
        events and the read of its rows, the snapshots' read (with start) and the
        parents' following (:meth:`hold_parents` first)."""
        self._queue_parks(batch)
        if not self.any_taken:
            return
        clock = self.core.clock
        grant = self.grant_made
        for statement in limits.grant_statements(clock, grant.reserved, grant.limited):
            batch.add(statement, merge=True)
        by_instance: dict[str, list[str]] = {}
        for ask, taken in zip(self.asks, self.taken, strict=True):
            by_instance.setdefault(ask.instance_id, []).extend(p.job_id for p in taken)
        for instance_id, ids in by_instance.items():
            if ids:
                self._reads[instance_id] = self._queue_moves(batch, ids, instance_id)
        if self.start:
            wanted = sorted({p.snapshot_id for t in self.taken for p in t if p.snapshot_id})
            snaps = self.core.learning.snapshots_read(wanted)
            self._snaps = (snaps, batch.add(snaps.sql) if snaps.sql is not None else None)
        moves = [
            parents.ChildMove(p.parent_job_id, PENDING, RUNNING if self.start else LOCKED)
            for t in self.taken
            for p in t
            if p.parent_job_id
        ]
        if moves:
            actor = runtime_actor(self.asks[0].instance_id)
            self._changes = parents.queue(clock, batch, self._held, moves, actor=actor)

    def claimed(self, out: Sequence[Outcome]) -> list[Claimed]:
        """Each ask's jobs as the moves' reads found them, with their snapshots (with
        start), in ask order."""
        rows = {
            job.job_id: job
            for at in self._reads.values()
            for job in (job_of(row) for row in out[at].rows)
        }
        views: dict[str, SnapshotView] = {}
        if self._snaps is not None:
            snaps, at = self._snaps
            views.update(snaps.views)
            for row in out[at].rows if at is not None else ():
                view = snaps.from_row(row)
                views[view.snapshot_id] = view
        result = []
        for taken in self.taken:
            jobs = [rows[p.job_id] for p in taken if p.job_id in rows]
            by_job = {
                p.job_id: views[p.snapshot_id]
                for p in taken
                if p.job_id in rows and p.snapshot_id in views
            }
            result.append(Claimed(jobs, by_job))
        return result

    def observe(self) -> None:
        """The log lines of batches the moves ended (after the transaction's run)."""
        parents.observe(self._changes)

    # ------------------------------------------------------------------ facts

    def missing(self, i: int) -> int:
        """How many jobs ask ``i`` still misses."""
        return self.asks[i].n - len(self.taken[i])

    @property
    def any_taken(self) -> bool:
        """Whether any job was granted to any ask."""
        return any(self.taken)

    # ------------------------------------------------------------------ pieces

    def _queue_parks(self, batch: StatementBatch) -> None:
        by_time: dict[datetime, list[str]] = {}
        for job_id, until in self.parked.items():
            by_time.setdefault(until, []).append(job_id)
        for until, ids in by_time.items():
            batch.add(sched.park.sql(self.core.clock, {"ids": ids, "p_until": until}))
        self.parked = {}

    def _queue_moves(self, batch: StatementBatch, ids: list[str], instance_id: str) -> int:
        """Queue the moves of ``ids`` to ``instance_id`` with their events and the read of
        the rows moved; returns the read's index.

        One UPDATE per provider group moves the jobs (pending → locked, or with start
        pending → locked → running in the same statement) and one INSERT … SELECT
        appends every step's event, so a claim with start costs the statements of a
        plain lock."""
        clock = self.core.clock
        providers = self.grant_made.providers
        moved = {"ids": ids, "instance_id": instance_id, "e_actor": runtime_actor(instance_id)}
        groups: dict[str | None, list[str]] = {}
        for job_id in ids:
            groups.setdefault(providers.get(job_id), []).append(job_id)
        status = RUNNING if self.start else LOCKED
        then = Op.START if self.start else None
        for provider, group in groups.items():
            values = lock_values(self.core, instance_id)
            if self.start:
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
                then=(RUNNING, "started_at") if self.start else None,
            )
        )
        return batch.add(
            sched.claimed_rows.sql(clock, {"ids": ids, "instance_id": instance_id}, status)
        )


def lock_values(core: Core, instance_id: str) -> dict[str, Any]:
    """pending → locked: a new attempt, its lease (``LOCK_LEASE_SECONDS`` from the
    database's now), and no ``startedAt`` yet (a retried job's old one would let the
    reaper time the new attempt out before it starts)."""
    clock = core.clock
    return {
        "attempt_no": NEXT_ATTEMPT,
        "started_at": None,
        "locked_by": instance_id,
        "locked_at": clock.now(),
        "lock_until": clock.plus(core.settings.LOCK_LEASE_SECONDS),
    }
