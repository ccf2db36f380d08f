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

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Integer,
    String,
    and_,
    bindparam,
    insert,
    or_,
    select,
    text,
    tuple_,
    update,
)

from job_service.db import DbExec
from job_service.domain import sqlcache
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


def lease_guard_bound(clock: DbClock) -> ColumnElement[bool]:
    """:func:`lease_guard` with bound parameters ``l_job_id``, ``l_instance_id``,
    ``l_attempt_no`` (see :func:`lease_params`); one shared, stable object per dialect."""

    def build() -> ColumnElement[bool]:
        return sqlcache.stable(
            and_(
                jobs.c.job_id == bindparam("l_job_id", type_=String()),
                jobs.c.locked_by == bindparam("l_instance_id", type_=String()),
                jobs.c.attempt_no == bindparam("l_attempt_no", type_=Integer()),
                jobs.c.status.in_(sorted(LEASED)),
                jobs.c.lock_until.is_not(None),
                jobs.c.lock_until >= clock.now(),
            )
        )

    return sqlcache.statement(("lease_guard", clock.dialect), build)


def lease_params(lease: Lease) -> dict[str, Any]:
    """The bound values of :func:`lease_guard_bound` for ``lease``."""
    return {
        "l_job_id": lease.job_id,
        "l_instance_id": lease.instance_id,
        "l_attempt_no": lease.attempt_no,
    }


def leases_guard(
    clock: DbClock, instance_id: str, refs: list[tuple[str, int]]
) -> ColumnElement[bool]:
    """WHERE clause: ``instance_id`` holds a live lease on each of ``refs`` ((jobId, attemptNo)).

    The batched form of :func:`lease_guard` (SPEC §3 HeartbeatLeases). The plain
    ``job_id IN (…)`` beside the pairs is for MariaDB's planner: with a single
    pair it does not use the job-id key for the row constructor and ranges over
    every live lease instead, locking them all until the caller commits.
    """
    return and_(
        jobs.c.job_id.in_(sorted({job_id for job_id, _ in refs})),
        tuple_(jobs.c.job_id, jobs.c.attempt_no).in_(refs),
        jobs.c.locked_by == instance_id,
        jobs.c.status.in_(sorted(LEASED)),
        jobs.c.lock_until.is_not(None),
        jobs.c.lock_until >= clock.now(),
    )


def lock_guard(clock: DbClock) -> ColumnElement[bool]:
    """WHERE clause of lock/claim: ``status='pending' AND (lockUntil IS NULL OR lockUntil < now)``.

    One shared, stable object per dialect (cached statements may embed it).
    """
    return sqlcache.statement(
        ("lock_guard", clock.dialect),
        lambda: sqlcache.stable(
            and_(
                jobs.c.status == PENDING,
                or_(jobs.c.lock_until.is_(None), jobs.c.lock_until < clock.now()),
            )
        ),
    )


def _shape(values: dict[str, Any]) -> tuple[tuple[str, int | None], ...] | None:
    """Cache key part for SET values: plain values become bound parameters; SQL
    expressions must be stable. None when one is not (the statement is not cached)."""
    out: list[tuple[str, int | None]] = []
    for key in sorted(values):
        value = values[key]
        if sqlcache.is_sql(value):
            sid = sqlcache.stable_id(value)
            if sid is None:
                return None
            out.append((key, sid))
        else:
            out.append((key, None))
    return tuple(out)


def _set_clause(values: dict[str, Any], *, bound: bool) -> dict[str, Any]:
    if not bound:
        return dict(values)
    return {
        k: v if sqlcache.is_sql(v) else bindparam(f"v_{k}", type_=jobs.c[k].type)
        for k, v in values.items()
    }


def _set_params(values: dict[str, Any]) -> dict[str, Any]:
    return {f"v_{k}": v for k, v in values.items() if not sqlcache.is_sql(v)}


@dataclass(frozen=True)
class TransitionSql:
    """One transition as SQL, ready to run or to queue in a batch.

    Attributes:
        key: the UPDATE's :mod:`sqlcache` key; None for a one-off shape (an
            unregistered SQL expression among the values).
        build: makes the UPDATE (bound parameters when ``key`` is set).
        params: the UPDATE's bound values.
        event: :func:`event_params` of the event row it appends; None when the
            transition records none (or the caller appends it).
    """

    key: Any
    build: Callable[[], Any]
    params: dict[str, Any]
    event: dict[str, Any] | None


def transition_sql(
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
) -> TransitionSql | None:
    """The conditional UPDATE (and event) of one transition; arguments as :func:`apply`.

    Returns:
        The SQL, or None when ``from_state`` rules the transition out.

    Raises:
        ValueError: a holder-only transition without a lease (a programming error).
    """
    t = TRANSITIONS[op]
    if t.holder_only and lease is None:
        raise ValueError(f"{op} needs a lease")
    states = t.from_states if from_state is None else t.from_states & {from_state}
    if not states:
        return None
    sets: dict[str, Any] = {"updated_at": clock.now(), **(values or {})}
    if t.to_state is not None:
        sets["status"] = t.to_state
    shape = _shape(sets)
    where_id = 0 if where is None else sqlcache.stable_id(where)
    sorted_states = tuple(sorted(states))

    def build(bound: bool) -> Any:
        conds: list[ColumnElement[bool]] = [
            jobs.c.job_id == (bindparam("a_job_id", type_=String()) if bound else job_id),
            jobs.c.status.in_(sorted_states),
        ]
        if lease is not None:
            conds.append(lease_guard_bound(clock) if bound else lease_guard(clock, lease))
        if where is not None:
            conds.append(where)
        return update(jobs).where(and_(*conds)).values(**_set_clause(sets, bound=bound))

    event = None
    if t.records_event and record:
        frm = from_state if from_state is not None else next(iter(states))
        if attempt_no is None:
            attempt_no = lease.attempt_no if lease is not None else 0
        event = event_params(
            job_id=job_id,
            from_status=frm,
            to_status=t.to_state or frm,
            actor=actor,
            attempt_no=attempt_no,
            error_code=error_code,
        )
    if shape is None or where_id is None:
        return TransitionSql(None, lambda: build(False), {}, event)
    key = ("apply", clock.dialect, sorted_states, lease is not None, where_id, shape)
    params: dict[str, Any] = {"a_job_id": job_id, **_set_params(sets)}
    if lease is not None:
        params.update(lease_params(lease))
    return TransitionSql(key, lambda: build(True), params, event)


async def apply(
    session: DbExec,
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
    sql = transition_sql(
        clock,
        op,
        job_id=job_id,
        actor=actor,
        values=values,
        lease=lease,
        where=where,
        from_state=from_state,
        error_code=error_code,
        attempt_no=attempt_no,
        record=record,
    )
    return sql is not None and await run_transition(session, clock, sql)


async def run_transition(session: DbExec, clock: DbClock, sql: TransitionSql) -> bool:
    """Run a :func:`transition_sql`: its UPDATE, then its event when exactly one row matched.

    Returns:
        True when the transition happened; False when refused (nothing written).
    """
    if await _update(session, sql) != 1:
        return False
    if sql.event is not None:
        await session.execute(sqlcache.statement(*event_sql(clock)), sql.event)
    return True


async def _update(session: DbExec, sql: TransitionSql) -> int:
    """Run a transition's UPDATE (cached shape, or one-off); rows matched."""
    if sql.key is None:
        result = await session.execute(sql.build(), sql.params or None)
    else:
        result = await session.execute(sqlcache.statement(sql.key, sql.build), sql.params)
    return int(result.rowcount)  # type: ignore[attr-defined]


def event_params(
    *,
    job_id: str,
    from_status: str | None,
    to_status: str,
    actor: str,
    attempt_no: int,
    error_code: str | None = None,
) -> dict[str, Any]:
    """The bound values of one event row (:func:`record_event`'s statement)."""
    return {
        "e_job_id": job_id,
        "e_from": from_status,
        "e_to": to_status,
        "e_code": error_code,
        "e_actor": actor[:160],
        "e_attempt": attempt_no,
    }


async def record_event(
    session: DbExec,
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
    instant of this second statement.
    """
    await session.execute(
        sqlcache.statement(*event_sql(clock)),
        event_params(
            job_id=job_id,
            from_status=from_status,
            to_status=to_status,
            actor=actor,
            attempt_no=attempt_no,
            error_code=error_code,
        ),
    )


def event_sql(clock: DbClock, *, if_matched: bool = False) -> tuple[Hashable, Callable[[], Any]]:
    """The event row's INSERT as a :mod:`sqlcache` key and builder (values: :func:`event_params`).

    Args:
        if_matched: MySQL/MariaDB only: append the row only when the statement
            sent just before it matched exactly one row (``ROW_COUNT() = 1``),
            so a transition's UPDATE and its event can go in one batch
            (:mod:`job_service.domain.batch`) whatever the UPDATE matched.
    """
    if not if_matched:
        return ("record_event", clock.dialect), _record_event_stmt
    if clock.is_sqlite:
        raise ValueError("if_matched events need MySQL/MariaDB")
    return ("record_event_if_matched", clock.dialect), lambda: _record_event_stmt(if_matched=True)


def _record_event_stmt(*, if_matched: bool = False) -> Any:
    source = select(
        bindparam("e_job_id", type_=String()),
        bindparam("e_from", type_=String()),
        bindparam("e_to", type_=String()),
        bindparam("e_code", type_=String()),
        bindparam("e_actor", type_=String()),
        bindparam("e_attempt", type_=Integer()),
        jobs.c.updated_at,
    ).where(jobs.c.job_id == bindparam("e_job_id", type_=String()))
    if if_matched:
        source = source.where(text("ROW_COUNT() = 1"))
    return insert(events).from_select(
        ["job_id", "from_status", "to_status", "error_code", "actor", "attempt_no", "at"],
        source,
    )


def holder_guard_bound(clock: DbClock) -> ColumnElement[bool]:
    """WHERE clause: the instance bound as ``m_instance_id`` holds a live lease
    (``lockedBy`` matches, ``lockUntil ≥ now``); one shared, stable object per dialect.

    The guard of a holder-only transition applied to several jobs at once by the
    transaction that has just locked them (claim with start): their ``attemptNo``
    is the one that transaction granted, so the instance and the live lease are
    the whole fencing token there (SPEC §3).
    """

    def build() -> ColumnElement[bool]:
        return sqlcache.stable(
            and_(
                jobs.c.locked_by == bindparam("m_instance_id", type_=String()),
                jobs.c.lock_until.is_not(None),
                jobs.c.lock_until >= clock.now(),
            )
        )

    return sqlcache.statement(("holder_guard", clock.dialect), build)


def transition_many_sql(
    clock: DbClock,
    op: Op,
    *,
    job_ids: list[str],
    values: dict[str, Any],
    where: ColumnElement[bool] | None = None,
    holder: str | None = None,
) -> TransitionSql:
    """One transition of several jobs as a single guarded UPDATE (no event).

    Args:
        holder: for a holder-only transition, the instance that must hold each
            job's lease (:func:`holder_guard_bound`); only for jobs the same
            transaction has just locked to it.

    Raises:
        ValueError: a holder-only transition without ``holder`` (a programming error).
    """
    t = TRANSITIONS[op]
    if t.holder_only and holder is None:
        raise ValueError(f"{op} needs a lease")
    sets: dict[str, Any] = {"updated_at": clock.now(), **values}
    if t.to_state is not None:
        sets["status"] = t.to_state
    shape = _shape(sets)
    where_id = 0 if where is None else sqlcache.stable_id(where)
    holder_where = holder_guard_bound(clock) if holder is not None else None

    def build(bound: bool) -> Any:
        conds: list[ColumnElement[bool]] = [
            jobs.c.job_id.in_(bindparam("m_job_ids", expanding=True) if bound else job_ids),
            jobs.c.status.in_(sorted(t.from_states)),
        ]
        if where is not None:
            conds.append(where)
        if holder_where is not None:
            conds.append(holder_where)
        return update(jobs).where(and_(*conds)).values(**_set_clause(sets, bound=bound))

    holder_params = {} if holder is None else {"m_instance_id": holder}
    if shape is None or where_id is None:
        return TransitionSql(None, lambda: build(False), holder_params, None)
    key = ("apply_many", clock.dialect, op, where_id, holder is not None, shape)
    return TransitionSql(
        key,
        lambda: build(True),
        {"m_job_ids": list(job_ids), **holder_params, **_set_params(sets)},
        None,
    )


async def apply_many(
    session: DbExec,
    clock: DbClock,
    op: Op,
    *,
    job_ids: list[str],
    values: dict[str, Any],
    where: ColumnElement[bool] | None = None,
    holder: str | None = None,
) -> int:
    """Apply one transition to several jobs with a single guarded UPDATE.

    Used by claim, whose candidate rows the caller already holds (``FOR UPDATE
    SKIP LOCKED`` on MySQL, the write lock on SQLite). The caller appends the
    event rows (it knows the new ``attemptNo`` only after the UPDATE).

    Returns:
        Rows matched.
    """
    if not job_ids:
        return 0
    return await _update(
        session,
        transition_many_sql(clock, op, job_ids=job_ids, values=values, where=where, holder=holder),
    )


async def renew_many(
    session: DbExec,
    clock: DbClock,
    *,
    instance_id: str,
    refs: list[tuple[str, int]],
    lease_seconds: float,
) -> int:
    """RENEW (SPEC §2.3 heartbeat on a running job) for many leases in one guarded UPDATE.

    Only jobs in RENEW's from-states whose live lease the caller holds move;
    RENEW records no event. A locked job (not started yet) is left to the
    caller, whose implied start needs an event row.

    Args:
        refs: ``(jobId, attemptNo)`` pairs, all held by ``instance_id``.
        lease_seconds: the new ``lockUntil`` is the database's now plus this (s).

    Returns:
        Rows renewed.
    """
    if not refs:
        return 0
    t = TRANSITIONS[Op.RENEW]
    result = await session.execute(
        update(jobs)
        .where(
            jobs.c.status.in_(sorted(t.from_states)),
            leases_guard(clock, instance_id, refs),
        )
        .values(lock_until=clock.plus(lease_seconds), updated_at=clock.now())
    )
    return int(result.rowcount)  # type: ignore[attr-defined]
