"""A batch's parent follows its children in the same transaction (reference §10.3).

Every transaction that moves children (claim, result and fail, the reaper, cancel,
revoke, a material's deletion, an erasure) hands its moves to this one helper:

1. :func:`lock_sql` / :func:`lock` — the parents the moves touch, locked in job id
   order (:data:`job_service.store.parents.lock_parents`), after the children;
2. :func:`decide` — per parent, from its counts as locked and the moves: the count
   deltas, and whether the parent's state moves: ``pending → running`` when a
   child is leased; when its last child is terminal ``succeeded`` if
   succeeded/total ≥ ``minSuccessRatio``, else ``failed`` with
   ``CHILD_JOBS_FAILED`` (final); ``cancelled`` when the transaction cancels it;
3. :func:`queue` — one UPDATE per changed parent (atomic increments, ``version +
   1``) and its event row (from = to = its status when only counts moved), so the
   change feed, ETags and event streams follow every count.

:func:`settle` is the three in a row for a caller with no batch of its own to
join. There is no sweeper: a parent's counts change with its children or not at
all, so they always equal its children's states.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from airuntime_common.errors import ErrorCode
from airuntime_common.states import TERMINAL, JobStatus
from job_service.store import parents as sql
from job_service.store.batch import Outcome, StatementBatch, new_batch, run_one
from job_service.store.clock import DbClock
from job_service.store.engine import DbExec
from job_service.store.transitions import event_params, event_row

log = logging.getLogger("job_service.parents")

#: Which count a child's state falls in: leased (locked or running) counts as running.
#: ``expired`` never rests (the reaper moves on in the same transaction): no count.
BUCKETS: Final[Mapping[str, str]] = {
    JobStatus.PENDING: "batch_pending",
    JobStatus.LOCKED: "batch_running",
    JobStatus.RUNNING: "batch_running",
    JobStatus.SUCCEEDED: "batch_succeeded",
    JobStatus.FAILED: "batch_failed",
    JobStatus.CANCELLED: "batch_cancelled",
}
#: Slack of the ratio test: succeeded/total ≥ minSuccessRatio up to float rounding
#: (0.3 × 10 is 3.0000000000000004 in binary floating point).
RATIO_SLACK: Final = 1e-9


class CountsBroken(RuntimeError):
    """A parent's count would go below zero: a move named a state its child was not
    in (a programming error). Raised before anything is written."""


@dataclass(frozen=True)
class ChildMove:
    """One child's transition in a transaction: its parent, its state before and after
    (``from_status`` None for a child created in it)."""

    parent_job_id: str
    from_status: str | None
    to_status: str
    #: who moved it, when it differs from the transaction's actor (a result group's
    #: reports come from several runtime instances)
    actor: str | None = None


@dataclass(frozen=True)
class ParentRow:
    """A parent as :func:`lock` read it: state, counts by column, ratio."""

    job_id: str
    status: str
    counts: Mapping[str, int]
    min_success_ratio: float

    @classmethod
    def of(cls, row: Sequence[Any]) -> ParentRow:
        """From a :data:`~job_service.store.parents.lock_parents` row."""
        n = len(sql.COUNT_COLUMNS)
        counts = {c: int(v or 0) for c, v in zip(sql.COUNT_COLUMNS, row[2 : 2 + n], strict=True)}
        return cls(str(row[0]), str(row[1]), counts, float(row[2 + n] or 1.0))


@dataclass(frozen=True)
class ParentChange:
    """What a transaction does to one parent.

    Attributes:
        deltas: count column → change (only non-zero ones).
        counts: the counts after it.
        from_status, to_status: its state before and after (equal when only counts move).
        error_code: ``CHILD_JOBS_FAILED`` when it fails, else None.
        message: the error message of a failure.
    """

    job_id: str
    from_status: str
    to_status: str
    deltas: Mapping[str, int]
    counts: Mapping[str, int]
    error_code: str | None = None
    message: str | None = None
    #: columns set to the database's now (the state move's times)
    stamped: tuple[str, ...] = field(default=())

    def values(self) -> dict[str, Any]:
        """The plain columns its UPDATE sets beside the counts."""
        if self.to_status == self.from_status:
            return {}
        out: dict[str, Any] = {"status": self.to_status}
        if self.to_status == JobStatus.CANCELLED:
            out["cancel_requested"] = True
        elif self.to_status in TERMINAL:
            out.update(error_code=self.error_code, error_message=self.message)
        return out


def deltas_of(moves: Iterable[ChildMove]) -> dict[str, int]:
    """The count deltas of ``moves`` (a move within one count, e.g. locked → running,
    changes none)."""
    out: Counter[str] = Counter()
    for move in moves:
        was = BUCKETS.get(move.from_status) if move.from_status is not None else None
        now = BUCKETS.get(move.to_status)
        if was == now:
            continue
        if was is not None:
            out[was] -= 1
        if now is not None:
            out[now] += 1
    return {c: d for c, d in out.items() if d}


def decide(parent: ParentRow, moves: Sequence[ChildMove], *, cancel: bool) -> ParentChange | None:
    """What ``moves`` (its children's) and a cancel do to ``parent`` (module doc).

    Returns:
        None when nothing changes (no count moved, no state move).

    Raises:
        CountsBroken: a count would go below zero.
    """
    deltas = deltas_of(moves)
    counts = {c: parent.counts[c] + deltas.get(c, 0) for c in sql.COUNT_COLUMNS}
    broken = [c for c, v in counts.items() if v < 0]
    if broken:
        raise CountsBroken(f"parent {parent.job_id}: {broken} below zero after {moves}")
    status = parent.status
    to = status
    code = message = None
    if status not in TERMINAL:
        if cancel:
            to = JobStatus.CANCELLED
        elif counts["batch_pending"] + counts["batch_running"] == 0:
            total = counts["batch_total"]
            needed = (parent.min_success_ratio - RATIO_SLACK) * total
            ok = total > 0 and counts["batch_succeeded"] >= needed
            to = JobStatus.SUCCEEDED if ok else JobStatus.FAILED
            if not ok:
                code = ErrorCode.CHILD_JOBS_FAILED
                message = (
                    f"{counts['batch_succeeded']} of {total} children succeeded; "
                    f"minSuccessRatio {parent.min_success_ratio:g} needs "
                    f"{parent.min_success_ratio * total:g}"
                )
        elif status == JobStatus.PENDING and any(
            BUCKETS.get(m.to_status) == "batch_running" for m in moves
        ):
            to = JobStatus.RUNNING
    if not deltas and to == status:
        return None
    stamped: tuple[str, ...] = ()
    if to != status and to in TERMINAL:
        stamped = ("cancelled_at", "finished_at") if to == JobStatus.CANCELLED else ("finished_at",)
    return ParentChange(parent.job_id, status, to, deltas, counts, code, message, stamped)


def lock_sql(clock: DbClock, parent_ids: Collection[str]) -> Any:
    """The locking read of ``parent_ids`` (for a caller's batch; :func:`rows_of` reads it)."""
    return sql.lock_parents.sql(clock, {"p_ids": sorted(set(parent_ids))})


def rows_of(outcome: Outcome) -> dict[str, ParentRow]:
    """The parents a :func:`lock_sql` outcome holds, by id."""
    return {str(row[0]): ParentRow.of(row) for row in outcome.rows}


async def lock(clock: DbClock, db: DbExec, parent_ids: Collection[str]) -> dict[str, ParentRow]:
    """Lock ``parent_ids`` (those still stored) in job id order; by id. Nothing to lock:
    no round trip."""
    if not parent_ids:
        return {}
    return rows_of(await run_one(db, lock_sql(clock, parent_ids)))


def queue(
    clock: DbClock,
    batch: StatementBatch,
    parents: Mapping[str, ParentRow],
    moves: Sequence[ChildMove],
    *,
    actor: str,
    cancel: Collection[str] = (),
) -> list[ParentChange]:
    """Queue, on ``batch``, each changed parent's UPDATE and event row, in job id order.

    Args:
        parents: the parents as :func:`lock` read them in this transaction; a parent
            not among them (erased meanwhile) is left alone.
        moves: the transaction's child moves.
        actor: who moved the children (the parent's event row names them).
        cancel: parents this transaction cancels.

    Returns:
        The changes queued, in job id order.

    Raises:
        CountsBroken: as :func:`decide` (nothing queued).
    """
    by_parent: dict[str, list[ChildMove]] = {}
    for move in moves:
        by_parent.setdefault(move.parent_job_id, []).append(move)
    changes: list[ParentChange] = []
    for job_id in sorted(set(by_parent) | set(cancel)):
        row = parents.get(job_id)
        if row is None:
            continue
        change = decide(row, by_parent.get(job_id, []), cancel=job_id in cancel)
        if change is not None:
            changes.append(change)
    for change in changes:
        batch.add(
            sql.update_parent(clock, change.job_id, change.deltas, change.values(), change.stamped)
        )
        movers = [m.actor for m in by_parent.get(change.job_id, []) if m.actor]
        event = event_params(
            job_id=change.job_id,
            from_status=change.from_status,
            to_status=change.to_status,
            actor=movers[-1] if movers else actor,
            attempt_no=0,
            error_code=change.error_code,
        )
        batch.add(event_row(clock, event))
    return changes


async def settle(
    clock: DbClock,
    db: DbExec,
    moves: Sequence[ChildMove],
    *,
    actor: str,
    cancel: Collection[str] = (),
) -> list[ParentChange]:
    """:func:`lock`, :func:`queue` and run, in the caller's transaction (after it
    locked and moved the children): for callers with no batch of their own left.

    Returns:
        The changes made, in job id order.
    """
    touched = {m.parent_job_id for m in moves} | set(cancel)
    if not touched:
        return []
    parents = await lock(clock, db, touched)
    batch = new_batch(db)
    changes = queue(clock, batch, parents, moves, actor=actor, cancel=cancel)
    await batch.run()
    observe(changes)
    return changes


def observe(changes: Iterable[ParentChange]) -> None:
    """Log the parents that ended (after the caller's writes were queued or run)."""
    for change in changes:
        if change.to_status != change.from_status and change.to_status in TERMINAL:
            log.info(
                "batch ended",
                extra={
                    "fields": {
                        "jobId": change.job_id,
                        "status": change.to_status,
                        "errorCode": change.error_code,
                        "succeeded": change.counts["batch_succeeded"],
                        "total": change.counts["batch_total"],
                    }
                },
            )
