"""The state machine as SQL: guarded UPDATEs and their event rows (reference §2.3).

A transition of :data:`job_service.lifecycle.TRANSITIONS` becomes one
conditional UPDATE whose WHERE clause is its guard: the job id, its
from-states, and for lease-holder transitions the fencing token
``(jobId, instanceId, attemptNo)`` with a lease that has not lapsed on the
database clock. Its event row (``ai_runtime_job_events``) is an
``INSERT … SELECT`` from the row it moved that runs only when that UPDATE
matched exactly one row, so both can go in one :mod:`batch <job_service.store.batch>`
whatever the UPDATE matched. MySQL connections report rows *matched*
(``CLIENT.FOUND_ROWS``), so a same-microsecond renewal is never misread as a
lost lease.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
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
    union_all,
    update,
)

from airuntime_common.states import LEASED
from job_service.lifecycle import AttemptEnding, Ending, Lease, Op
from job_service.lifecycle.transitions import TRANSITIONS
from job_service.store import cache
from job_service.store.batch import StatementBatch, new_batch
from job_service.store.cache import Sql
from job_service.store.clock import DbClock
from job_service.store.engine import DbExec
from job_service.store.tables import events, jobs

#: Columns of an event row, in the order of its INSERT.
EVENT_COLUMNS = ["job_id", "from_status", "to_status", "error_code", "actor", "attempt_no", "at"]
#: Longest actor an event row holds.
MAX_ACTOR = 160


# ------------------------------------------------------------------ guards


def lease_guard(clock: DbClock, lease: Lease) -> ColumnElement[bool]:
    """WHERE clause: the caller holds a live lease on the job (reference §2.3 heartbeat guard)."""
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
        return cache.stable(
            and_(
                jobs.c.job_id == bindparam("l_job_id", type_=String()),
                jobs.c.locked_by == bindparam("l_instance_id", type_=String()),
                jobs.c.attempt_no == bindparam("l_attempt_no", type_=Integer()),
                jobs.c.status.in_(sorted(LEASED)),
                jobs.c.lock_until.is_not(None),
                jobs.c.lock_until >= clock.now(),
            )
        )

    return cache.statement(("lease_guard", clock.dialect), build)


def lease_params(lease: Lease) -> dict[str, Any]:
    """The bound values of :func:`lease_guard_bound` for ``lease``."""
    return {
        "l_job_id": lease.job_id,
        "l_instance_id": lease.instance_id,
        "l_attempt_no": lease.attempt_no,
    }


def leases_guard(
    clock: DbClock, instance_id: str, refs: Sequence[tuple[str, int]]
) -> ColumnElement[bool]:
    """WHERE clause: ``instance_id`` holds a live lease on each of ``refs`` ((jobId, attemptNo)).

    The batched form of :func:`lease_guard` (reference §3 HeartbeatLeases). The plain
    ``job_id IN (…)`` beside the pairs is for MariaDB's planner: with a single
    pair it does not use the job-id key for the row constructor and ranges over
    every live lease instead, locking them all until the caller commits.
    """
    return and_(
        jobs.c.job_id.in_(sorted({job_id for job_id, _ in refs})),
        tuple_(jobs.c.job_id, jobs.c.attempt_no).in_(list(refs)),
        jobs.c.locked_by == instance_id,
        jobs.c.status.in_(sorted(LEASED)),
        jobs.c.lock_until.is_not(None),
        jobs.c.lock_until >= clock.now(),
    )


def lock_guard(clock: DbClock) -> ColumnElement[bool]:
    """WHERE clause of lock/claim: ``status='pending' AND (lockUntil IS NULL OR lockUntil < now)``,
    and not a batch's parent (``batch_total IS NULL``: a parent is never leased,
    reference §10.3).

    One shared, stable object per dialect (cached statements may embed it).
    """
    return cache.statement(
        ("lock_guard", clock.dialect),
        lambda: cache.stable(
            and_(
                jobs.c.status == "pending",
                or_(jobs.c.lock_until.is_(None), jobs.c.lock_until < clock.now()),
                jobs.c.batch_total.is_(None),
            )
        ),
    )


def holder_guard_bound(clock: DbClock) -> ColumnElement[bool]:
    """WHERE clause: the instance bound as ``m_instance_id`` holds a live lease
    (``lockedBy`` matches, ``lockUntil ≥ now``); one shared, stable object per dialect.

    The guard of a holder-only transition applied to several jobs at once by the
    transaction that has just locked them (claim with start): their ``attemptNo``
    is the one that transaction granted, so the instance and the live lease are
    the whole fencing token there (reference §3).
    """

    def build() -> ColumnElement[bool]:
        return cache.stable(
            and_(
                jobs.c.locked_by == bindparam("m_instance_id", type_=String()),
                jobs.c.lock_until.is_not(None),
                jobs.c.lock_until >= clock.now(),
            )
        )

    return cache.statement(("holder_guard", clock.dialect), build)


# ---------------------------------------------------------------- events


def event_params(
    *,
    job_id: str,
    from_status: str | None,
    to_status: str,
    actor: str,
    attempt_no: int,
    error_code: str | None = None,
) -> dict[str, Any]:
    """The bound values of one event row (:func:`event_row`, :func:`event_if_matched`)."""
    return {
        "e_job_id": job_id,
        "e_from": from_status,
        "e_to": to_status,
        "e_code": error_code,
        "e_actor": actor[:MAX_ACTOR],
        "e_attempt": attempt_no,
    }


def _event_stmt(clock: DbClock, if_matched: bool) -> Any:
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
        # the statement before this one matched exactly one row (the server judges)
        source = source.where(text("changes() = 1" if clock.is_sqlite else "ROW_COUNT() = 1"))
    return insert(events).from_select(EVENT_COLUMNS, source)


def event_row(clock: DbClock, params: dict[str, Any]) -> Sql:
    """Append one event row (values: :func:`event_params`).

    Its ``at`` is the job row's ``updated_at`` as the transition just wrote it, so
    an event carries exactly the database instant of its transition (the same
    ``NOW(6)`` that computed ``lockUntil`` / ``availableAt``).
    """
    return Sql(("record_event", clock.dialect), lambda: _event_stmt(clock, False), params)


def event_if_matched(clock: DbClock, params: dict[str, Any]) -> Sql:
    """:func:`event_row`, appended only when the statement run just before it (its
    transition's UPDATE) matched exactly one row."""
    return Sql(("record_event_if_matched", clock.dialect), lambda: _event_stmt(clock, True), params)


def events_from_rows(
    clock: DbClock,
    *,
    from_status: str,
    to_status: str,
    at: str,
    params: dict[str, Any],
    if_matched: bool = False,
    then: tuple[str, str] | None = None,
) -> Sql:
    """The event of every row a claim (or lock) just moved, read from the rows themselves
    (their new ``attemptNo``, the provider the attempt was given; ``at`` is the column
    holding the transition's time).

    Bound: ``ids`` (list), ``instance_id``, ``e_actor``; only rows now in
    ``to_status`` and held by ``instance_id`` get one. With ``if_matched`` (one
    job's lock) only when the statement before matched exactly one row, so a
    refused lock of a job the caller already holds appends nothing.

    ``then``, ``(status, at)``: the UPDATE made a second transition after the first,
    from ``to_status`` to ``status`` (a claim with start: locked, then running, see
    :func:`transition_many_sql`); every row now in ``status`` gets both events, the
    first step's of all rows before the second step's, as two statements would
    have appended them.

    Each event carries its row's ``model_provider`` (the provider the attempt was
    given, reference §9.4).
    """
    steps = [(from_status, to_status, at)]
    if then is not None:
        steps.append((to_status, then[0], then[1]))
    final = steps[-1][1]

    def build() -> Any:
        parts = []
        for n, (was, now, column) in enumerate(steps):
            part = select(
                jobs.c.job_id,
                bindparam(f"e_from{n}", was, type_=String()),
                bindparam(f"e_to{n}", now, type_=String()),
                bindparam(f"e_code{n}", None, type_=String()),
                bindparam("e_actor", type_=String()),
                jobs.c.attempt_no,
                jobs.c[column],
                jobs.c.model_provider,
            ).where(
                jobs.c.job_id.in_(bindparam("ids", expanding=True)),
                jobs.c.status == final,
                jobs.c.locked_by == bindparam("instance_id", type_=String()),
            )
            if if_matched:
                part = part.where(text("changes() = 1" if clock.is_sqlite else "ROW_COUNT() = 1"))
            parts.append(part)
        source = parts[0] if len(parts) == 1 else union_all(*parts)
        return insert(events).from_select([*EVENT_COLUMNS, "model_provider"], source)

    key = (
        "events_from_rows",
        clock.dialect,
        from_status,
        to_status,
        at,
        if_matched,
        then,
    )
    return Sql(key, build, {**params, "e_actor": str(params["e_actor"])[:MAX_ACTOR]})


# ------------------------------------------------------------ transitions


def _shape(values: dict[str, Any]) -> tuple[tuple[str, int | None], ...] | None:
    """Cache key part for SET values: plain values become bound parameters; SQL
    expressions must be stable. None when one is not (the statement is not cached)."""
    out: list[tuple[str, int | None]] = []
    for key in sorted(values):
        value = values[key]
        if cache.is_sql(value):
            sid = cache.stable_id(value)
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
        k: v if cache.is_sql(v) else bindparam(f"v_{k}", type_=jobs.c[k].type)
        for k, v in values.items()
    }


def _set_params(values: dict[str, Any]) -> dict[str, Any]:
    return {f"v_{k}": v for k, v in values.items() if not cache.is_sql(v)}


@dataclass(frozen=True)
class TransitionSql:
    """One transition as SQL: its guarded UPDATE and, when it records one, its event.

    Attributes:
        update: the conditional UPDATE.
        clock: the database clock it was built for.
        event_values: the event row's values (:func:`event_params`); None when the
            transition records none.
    """

    update: Sql
    clock: DbClock
    event_values: dict[str, Any] | None

    @property
    def event(self) -> Sql | None:
        """The event row, appended only when the UPDATE just before it matched one row."""
        if self.event_values is None:
            return None
        return event_if_matched(self.clock, self.event_values)

    def queue(self, batch: StatementBatch) -> int:
        """Queue the UPDATE and its event in ``batch``; returns the UPDATE's index."""
        index = batch.add(self.update)
        if self.event_values is not None:
            batch.add(event_if_matched(self.clock, self.event_values))
        return index

    def queue_fenced(self, batch: StatementBatch, label: str) -> int:
        """Queue the UPDATE, a fence (:meth:`StatementBatch.fence`: nothing after it runs
        unless the UPDATE matched one row) and the event; returns the UPDATE's index."""
        index = batch.add(self.update)
        batch.fence(label)
        if self.event_values is not None:
            batch.add(event_row(self.clock, self.event_values))
        return index


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
    where_params: dict[str, Any] | None = None,
) -> TransitionSql | None:
    """The conditional UPDATE (and event) of one transition.

    Args:
        clock: database clock of the dialect.
        op: the transition (its from-states become part of the WHERE clause).
        job_id: the job.
        actor: who acts, e.g. ``"runtime:<instanceId>"``, ``"user:<id>"``, ``"reaper"``.
        values: extra columns to set (``status``/``updated_at`` are set here).
        lease: required for holder-only transitions; adds the fencing guard.
        where: an extra guard (a :func:`cache.stable` one keeps the statement cached).
        from_state: the state the caller read: narrows the guard; the event's ``fromStatus``.
        error_code: recorded on the event.
        attempt_no: recorded on the event (default: the lease's attempt, else 0).
        record: False when the caller appends the event itself.
        where_params: the values ``where`` binds, if any.

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
    sets: dict[str, Any] = {
        "updated_at": clock.now(),
        "version": VERSION_PLUS_ONE,
        **(values or {}),
    }
    if t.to_state is not None:
        sets["status"] = t.to_state
    sorted_states = tuple(sorted(states))
    event = None
    if t.records_event and record:
        frm = from_state if from_state is not None else next(iter(states))
        event = event_params(
            job_id=job_id,
            from_status=frm,
            to_status=t.to_state or frm,
            actor=actor,
            attempt_no=_event_attempt(attempt_no, lease),
            error_code=error_code,
        )
    return _cached_update(clock, sorted_states, sets, lease, where, where_params, job_id, event)


def _cached_update(
    clock: DbClock,
    sorted_states: tuple[str, ...],
    sets: dict[str, Any],
    lease: Lease | None,
    where: ColumnElement[bool] | None,
    where_params: dict[str, Any] | None,
    job_id: str,
    event: dict[str, Any] | None,
) -> TransitionSql:
    """The transition's UPDATE as a cached statement (its key: the dialect, the from-states,
    the lease guard, the extra guard and the SET shape), or built inline when a value of
    ``sets`` or ``where`` cannot be bound (:func:`cache.stable_id` None)."""
    shape = _shape(sets)
    where_id = 0 if where is None else cache.stable_id(where)

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

    if shape is None or where_id is None:
        return TransitionSql(Sql(None, lambda: build(False), {}), clock, event)
    key = ("apply", clock.dialect, sorted_states, lease is not None, where_id, shape)
    params: dict[str, Any] = {"a_job_id": job_id, **_set_params(sets), **(where_params or {})}
    if lease is not None:
        params.update(lease_params(lease))
    return TransitionSql(Sql(key, lambda: build(True), params), clock, event)


def _event_attempt(attempt_no: int | None, lease: Lease | None) -> int:
    """An event's ``attemptNo``: the one given, else the lease's, else 0."""
    if attempt_no is not None:
        return attempt_no
    return lease.attempt_no if lease is not None else 0


async def apply(db: DbExec, clock: DbClock, op: Op, **kwargs: Any) -> bool:
    """Apply one transition (:func:`transition_sql`'s arguments) in the caller's transaction:
    its UPDATE and event in one batch.

    Returns:
        True when exactly one row matched (the transition happened); False when refused
        (nothing written).
    """
    sql = transition_sql(clock, op, **kwargs)
    if sql is None:
        return False
    batch = new_batch(db)
    index = sql.queue(batch)
    return (await batch.run())[index].rowcount == 1


def transition_many_sql(
    clock: DbClock,
    op: Op,
    *,
    job_ids: list[str],
    values: dict[str, Any],
    where: ColumnElement[bool] | None = None,
    holder: str | None = None,
    from_state: str | None = None,
    then: Op | None = None,
) -> Sql:
    """One transition of several jobs as a single guarded UPDATE (no event: the caller
    appends them with :func:`events_from_rows`).

    Args:
        holder: for a holder-only transition, the instance that must hold each
            job's lease (:func:`holder_guard_bound`): only for jobs the same
            transaction has just locked to it (their attempt is the one it granted).
        from_state: narrows the from-states to the one the caller read.
        then: a second transition the same UPDATE makes, from ``op``'s to-state
            (a claim with start: LOCK then START). The guard is ``op``'s; a
            holder-only ``then`` needs no lease check, as ``op`` gives the lease
            to the caller in this very statement (``values`` sets both steps'
            columns).

    Raises:
        ValueError: a holder-only transition without ``holder``, a ``from_state``
            ``op`` does not leave, or a ``then`` that does not leave ``op``'s
            to-state (programming errors).
    """
    t = TRANSITIONS[op]
    if t.holder_only and holder is None:
        raise ValueError(f"{op} needs a lease")
    states = tuple(sorted(t.from_states if from_state is None else t.from_states & {from_state}))
    if not states:
        raise ValueError(f"{op} does not leave {from_state}")
    to_state = t.to_state
    if then is not None:
        follow = TRANSITIONS[then]
        if to_state is None or to_state not in follow.from_states or follow.to_state is None:
            raise ValueError(f"{then} does not follow {op}")
        to_state = follow.to_state
    sets: dict[str, Any] = {"updated_at": clock.now(), "version": VERSION_PLUS_ONE, **values}
    if to_state is not None:
        sets["status"] = to_state
    shape = _shape(sets)
    where_id = 0 if where is None else cache.stable_id(where)
    holder_where = holder_guard_bound(clock) if holder is not None else None

    def build(bound: bool) -> Any:
        conds: list[ColumnElement[bool]] = [
            jobs.c.job_id.in_(bindparam("m_job_ids", expanding=True) if bound else job_ids),
            jobs.c.status.in_(states),
        ]
        if where is not None:
            conds.append(where)
        if holder_where is not None:
            conds.append(holder_where)
        return update(jobs).where(and_(*conds)).values(**_set_clause(sets, bound=bound))

    holder_params: dict[str, Any] = {} if holder is None else {"m_instance_id": holder}
    if shape is None or where_id is None:
        return Sql(None, lambda: build(False), holder_params)
    key = (
        "apply_many",
        clock.dialect,
        op,
        then,
        states,
        where_id,
        holder is not None,
        shape,
    )
    return Sql(
        key, lambda: build(True), {"m_job_ids": list(job_ids), **holder_params, **_set_params(sets)}
    )


def renew_many(
    clock: DbClock, *, instance_id: str, refs: Sequence[tuple[str, int]], lease_seconds: float
) -> Sql:
    """RENEW (reference §2.3 heartbeat on a running job) for many leases in one guarded UPDATE.

    Only jobs in RENEW's from-states whose live lease the caller holds move;
    RENEW records no event. A locked job (not started yet) is left to the
    caller, whose implied start needs an event row.

    Args:
        refs: ``(jobId, attemptNo)`` pairs, all held by ``instance_id``.
        lease_seconds: the new ``lockUntil`` is the database's now plus this (s).
    """
    t = TRANSITIONS[Op.RENEW]
    return Sql(
        None,
        lambda: by_job_id_key(
            update(jobs)
            .where(jobs.c.status.in_(sorted(t.from_states)), leases_guard(clock, instance_id, refs))
            .values(
                lock_until=clock.plus(lease_seconds),
                updated_at=clock.now(),
                version=VERSION_PLUS_ONE,
            )
        ),
        {},
    )


#: The unique key on ``job_id`` (the naming convention's name, as migration 0001 made it).
JOB_ID_KEY = "uq_ai_runtime_jobs_job_id"


def by_job_id_key(stmt: Any) -> Any:
    """``stmt`` (an UPDATE or SELECT of ``ai_runtime_jobs`` whose rows are named by job id)
    with ``FORCE INDEX`` of :data:`JOB_ID_KEY` on MySQL/MariaDB.

    A heartbeat of several leases also names the holder and the leased states, and
    MariaDB's cost model may prefer intersecting the holder's and the states' indexes
    (every live lease of the holder) over the few job ids: how a row grows (a column
    added) is enough to tip it. The hint keeps the rows read, and locked, to the named
    ones."""
    hint = f"FORCE INDEX ({JOB_ID_KEY})"
    for dialect in ("mysql", "mariadb"):
        if hasattr(stmt, "get_final_froms"):  # a SELECT: the hint names its table
            stmt = stmt.with_hint(jobs, hint, dialect)
        else:
            stmt = stmt.with_hint(hint, dialect_name=dialect)
    return stmt


def ending_values(clock: DbClock, ending: AttemptEnding, message: str) -> dict[str, Any]:
    """The columns an attempt's ending sets (reference §2.3; :mod:`job_service.lifecycle.endings`):
    the code and message, the lease cleared, and per ending ``finishedAt``
    (fail), ``cancelledAt`` + ``finishedAt`` (cancel) or the retry's
    ``retryCount + 1`` and ``availableAt = now + delay``, parked until then (retry)."""
    common: dict[str, Any] = {
        "lock_until": None,
        "error_code": ending.code,
        "error_message": message,
    }
    if ending.ending is Ending.CANCEL:
        return {**common, "cancelled_at": clock.now(), "finished_at": clock.now()}
    if ending.ending is Ending.RETRY:
        at = clock.plus(ending.delay_seconds, varying=True)
        return {
            **common,
            "locked_by": None,
            "retry_count": RETRY_COUNT_PLUS_ONE,
            "available_at": at,
            # out of the claim's range until then (reference §2.4): the scheduler takes
            # it back at that time, in its place
            "parked_until": at if ending.delay_seconds > 0 else None,
        }
    return {**common, "finished_at": clock.now()}


#: ``retry_count + 1``, shared so statements embedding it are cached.
RETRY_COUNT_PLUS_ONE: Any = cache.stable(jobs.c.retry_count + 1)
#: ``version + 1``: every UPDATE of a job row moves its version (reference §9.1 ETag).
VERSION_PLUS_ONE: Any = cache.stable(jobs.c.version + 1)
#: ``attempt_no + 1`` (lock/claim), shared so statements embedding it are cached.
NEXT_ATTEMPT: Any = cache.stable(jobs.c.attempt_no + 1)
