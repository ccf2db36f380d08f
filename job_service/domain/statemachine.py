"""The job state machine of SPEC §2.3, defined once as a table.

Every operation in :mod:`job_service.domain.jobs` and the reaper applies a
:class:`Transition` through :func:`apply`: one conditional UPDATE whose WHERE
clause is the transition's guard (from-states, and for lease-holder
operations the fencing token ``(jobId, instanceId, attemptNo)`` plus a lease
that has not lapsed on the database clock), followed by the event row — both
in the caller's transaction. 0 rows matched means "refused"; the caller then
reads the job to pick the exact error code. MySQL connections report rows
*matched* (``CLIENT.FOUND_ROWS``), so a same-microsecond renewal is never
misread as a lost lease.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sqlalchemy import ColumnElement, Integer, String, and_, insert, literal, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from job_service.domain.clock import DbClock
from job_service.models import events, jobs

PENDING = "pending"
LOCKED = "locked"
RUNNING = "running"
SUCCEEDED = "succeeded"
FAILED = "failed"
CANCELLED = "cancelled"
EXPIRED = "expired"

LEASED = frozenset({LOCKED, RUNNING})
TERMINAL = frozenset({SUCCEEDED, FAILED, CANCELLED})
ALL_STATES = frozenset({PENDING, LOCKED, RUNNING, SUCCEEDED, FAILED, CANCELLED, EXPIRED})


class Op(StrEnum):
    """Transitions of SPEC §2.3 (one per table row and effect)."""

    CREATE = "create"
    LOCK = "lock"
    START = "start"
    RENEW = "renew"
    SUCCEED = "succeed"
    RETRY = "retry"
    FAIL = "fail"
    ACK_CANCEL = "ack_cancel"
    CANCEL_PENDING = "cancel_pending"
    REQUEST_CANCEL = "request_cancel"
    EXPIRE = "expire"
    EXPIRED_RETRY = "expired_retry"
    EXPIRED_FAIL = "expired_fail"
    EXPIRED_CANCEL = "expired_cancel"


@dataclass(frozen=True)
class Transition:
    """One row of the SPEC §2.3 table.

    Attributes:
        op: the operation.
        from_states: states the job may be in (the WHERE guard).
        to_state: the resulting state; None keeps the current state.
        holder_only: the caller must hold a live lease (fencing token + ``lockUntil ≥ now``).
        records_event: whether an event row is appended.
    """

    op: Op
    from_states: frozenset[str]
    to_state: str | None
    holder_only: bool = False
    records_event: bool = True


def _t(
    op: Op, frm: set[str] | frozenset[str], to: str | None, holder: bool = False, ev: bool = True
) -> Transition:
    return Transition(op, frozenset(frm), to, holder, ev)


#: The whole machine. `expired` is only ever a step inside one reaper transaction.
TRANSITIONS: dict[Op, Transition] = {
    t.op: t
    for t in (
        _t(Op.CREATE, set(), PENDING),
        _t(Op.LOCK, {PENDING}, LOCKED),
        _t(Op.START, {LOCKED}, RUNNING, holder=True),
        _t(Op.RENEW, {RUNNING}, None, holder=True, ev=False),
        _t(Op.SUCCEED, LEASED, SUCCEEDED, holder=True),
        _t(Op.RETRY, LEASED, PENDING, holder=True),
        _t(Op.FAIL, LEASED, FAILED, holder=True),
        _t(Op.ACK_CANCEL, LEASED, CANCELLED, holder=True),
        _t(Op.CANCEL_PENDING, {PENDING}, CANCELLED),
        _t(Op.REQUEST_CANCEL, LEASED, None),
        _t(Op.EXPIRE, LEASED, EXPIRED),
        _t(Op.EXPIRED_RETRY, {EXPIRED}, PENDING),
        _t(Op.EXPIRED_FAIL, {EXPIRED}, FAILED),
        _t(Op.EXPIRED_CANCEL, {EXPIRED}, CANCELLED),
    )
}


def allowed_targets(state: str) -> set[str]:
    """States reachable in one step from ``state`` (used by the invariant tests)."""
    out: set[str] = set()
    for t in TRANSITIONS.values():
        if state in t.from_states:
            out.add(t.to_state or state)
    return out


@dataclass(frozen=True)
class Lease:
    """The fencing token of SPEC §3: ``(jobId, X-Runtime-Instance-Id, attemptNo)``."""

    job_id: str
    instance_id: str
    attempt_no: int


def lease_guard(clock: DbClock, lease: Lease) -> ColumnElement[bool]:
    """WHERE clause: the caller holds a live lease on the job (SPEC §2.3 heartbeat guard)."""
    return and_(
        jobs.c.job_id == lease.job_id,
        jobs.c.locked_by == lease.instance_id,
        jobs.c.attempt_no == lease.attempt_no,
        jobs.c.status.in_(sorted(LEASED)),
        jobs.c.lock_until.is_not(None),
        jobs.c.lock_until >= clock.now(),
    )


def lock_guard(clock: DbClock) -> ColumnElement[bool]:
    """WHERE clause of lock/claim: ``status='pending' AND (lockUntil IS NULL OR lockUntil < now)``."""
    return and_(
        jobs.c.status == PENDING,
        or_(jobs.c.lock_until.is_(None), jobs.c.lock_until < clock.now()),
    )


async def apply(
    session: AsyncSession,
    clock: DbClock,
    op: Op,
    *,
    job_id: str,
    actor: str,
    values: dict[str, Any] | None = None,
    lease: Lease | None = None,
    where: ColumnElement[bool] | None = None,
    from_state: str | None = None,
    error_code: str | None = None,
    attempt_no: int | None = None,
    record: bool = True,
) -> bool:
    """Apply one transition with a conditional UPDATE and append its event.

    Args:
        session: the caller's session; the caller owns the transaction.
        clock: database clock of the session's dialect.
        op: the transition (its from-states become part of the WHERE clause).
        job_id: the job.
        actor: who acts, e.g. ``"runtime:<instanceId>"``, ``"user:<id>"``, ``"reaper"``.
        values: extra columns to set (``status``/``updated_at`` are set here).
        lease: required for holder-only transitions; adds the fencing guard.
        where: an extra guard (e.g. a lease-expiry re-check).
        from_state: the state the caller read; narrows the guard and is the
            event's ``fromStatus`` (needed when ``to_state`` is None or several
            from-states are allowed).
        error_code: recorded on the event.
        attempt_no: recorded on the event (default: the lease's attempt).
        record: False when the caller appends the event itself (e.g. lock, whose
            new ``attemptNo`` is only known after the UPDATE).

    Returns:
        True when exactly one row matched (the transition happened); False when refused.

    Raises:
        ValueError: a holder-only transition without a lease (a programming error).
    """
    t = TRANSITIONS[op]
    if t.holder_only and lease is None:
        raise ValueError(f"{op} needs a lease")
    states = t.from_states if from_state is None else t.from_states & {from_state}
    if not states:
        return False
    conds: list[ColumnElement[bool]] = [jobs.c.job_id == job_id, jobs.c.status.in_(sorted(states))]
    if lease is not None:
        conds.append(lease_guard(clock, lease))
    if where is not None:
        conds.append(where)
    sets: dict[str, Any] = {"updated_at": clock.now(), **(values or {})}
    if t.to_state is not None:
        sets["status"] = t.to_state
    result = await session.execute(update(jobs).where(and_(*conds)).values(**sets))
    if result.rowcount != 1:  # type: ignore[attr-defined]
        return False
    if t.records_event and record:
        frm = from_state if from_state is not None else next(iter(states))
        if attempt_no is None:
            attempt_no = lease.attempt_no if lease is not None else 0
        await record_event(
            session,
            clock,
            job_id=job_id,
            from_status=frm,
            to_status=t.to_state or frm,
            actor=actor,
            attempt_no=attempt_no,
            error_code=error_code,
        )
    return True


async def record_event(
    session: AsyncSession,
    clock: DbClock,
    *,
    job_id: str,
    from_status: str | None,
    to_status: str,
    actor: str,
    attempt_no: int,
    error_code: str | None = None,
) -> None:
    """Append one ``ai_runtime_job_events`` row.

    Its ``at`` is the job row's ``updated_at`` as the transition just wrote it, so
    an event carries exactly the database instant of its transition (the same
    ``NOW(6)`` that computed ``lockUntil`` / ``availableAt``), not the later
    instant of this second statement. ``clock`` is kept for the caller's symmetry.
    """
    del clock
    source = select(
        literal(job_id, String),
        literal(from_status, String),
        literal(to_status, String),
        literal(error_code, String),
        literal(actor[:160], String),
        literal(attempt_no, Integer),
        jobs.c.updated_at,
    ).where(jobs.c.job_id == job_id)
    await session.execute(
        insert(events).from_select(
            ["job_id", "from_status", "to_status", "error_code", "actor", "attempt_no", "at"],
            source,
        )
    )


async def apply_many(
    session: AsyncSession,
    clock: DbClock,
    op: Op,
    *,
    job_ids: list[str],
    values: dict[str, Any],
    where: ColumnElement[bool] | None = None,
) -> int:
    """Apply one non-holder transition to several jobs with a single guarded UPDATE.

    Used by claim, whose candidate rows the caller already holds (``FOR UPDATE
    SKIP LOCKED`` on MySQL, the write lock on SQLite). The caller appends the
    event rows (it knows the new ``attemptNo`` only after the UPDATE).

    Returns:
        Rows matched.
    """
    t = TRANSITIONS[op]
    if t.holder_only:
        raise ValueError(f"{op} needs a lease")
    if not job_ids:
        return 0
    conds: list[ColumnElement[bool]] = [
        jobs.c.job_id.in_(job_ids),
        jobs.c.status.in_(sorted(t.from_states)),
    ]
    if where is not None:
        conds.append(where)
    sets: dict[str, Any] = {"updated_at": clock.now(), **values}
    if t.to_state is not None:
        sets["status"] = t.to_state
    result = await session.execute(update(jobs).where(and_(*conds)).values(**sets))
    return int(result.rowcount)  # type: ignore[attr-defined]
