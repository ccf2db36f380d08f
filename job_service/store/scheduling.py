"""The SQL of scheduling: what is claimable, in which order, and the state that
decides it (reference §2.6, §10.1, §10.2); SQL only, the services decide.

Claims and polls read ``ix_jobs_poll`` (status, parked_until, priority, vstart,
created_at, seq): the claimable range is ``status='pending' AND parked_until IS
NULL``, taken in :data:`TAKE_ORDER`; the scheduler of parked jobs reads the range
``parked_until <= now`` of the same index.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Integer,
    String,
    bindparam,
    case,
    delete,
    func,
    insert,
    literal,
    select,
    union_all,
    update,
)

from airuntime_common.states import LEASED, JobStatus
from job_service.store.cache import Sql, Statement
from job_service.store.clock import DbClock
from job_service.store.endings import KEEP, JobSet
from job_service.store.tables import breaker, credential_pauses, grants, jobs
from job_service.store.transitions import lock_guard


def _for_update(clock: DbClock, stmt: Any, **kw: Any) -> Any:
    """``stmt`` with ``FOR UPDATE`` on MySQL/MariaDB (SQLite's one writer needs none)."""
    return stmt if clock.is_sqlite else stmt.with_for_update(**kw)


def claimable(clock: DbClock) -> list[ColumnElement[bool]]:
    """The WHERE terms of a claimable job (reference §2.6, §10.1): pending, not parked
    (``parkedUntil`` NULL: ``ix_jobs_poll``'s claimable range) and available now."""
    return [
        jobs.c.status == JobStatus.PENDING,
        jobs.c.parked_until.is_(None),
        jobs.c.available_at <= clock.now(),
    ]


#: The order jobs are taken in (reference §10.1): priority, then the fair order's
#: virtual start, then age and the sequence; ``ix_jobs_poll``'s order.
TAKE_ORDER: tuple[Any, ...] = (jobs.c.priority, jobs.c.vstart, jobs.c.created_at, jobs.c.seq)


@Statement
def poll_pending(clock: DbClock) -> Any:
    """Claimable jobs of the bound ``caps`` (list), in the order they are taken, at most
    ``n`` (reference §2.6, §10.1): every column."""
    return (
        select(jobs)
        .where(*claimable(clock), jobs.c.job_type.in_(bindparam("caps", expanding=True)))
        .order_by(*TAKE_ORDER)
        .limit(bindparam("n", type_=Integer()))
    )


#: The columns a claim's pick reads of each candidate (:data:`claim_pick`).
PICK_COLUMNS = (
    jobs.c.job_id,
    jobs.c.snapshot_id,
    jobs.c.api_key_mode,
    jobs.c.model_name,
    jobs.c.model_provider,
    jobs.c.job_type,
    jobs.c.credential_id,
    jobs.c.attempt_no,
    jobs.c.parent_job_id,  # a batch's child (reference §10.3)
)


@Statement
def claim_pick(clock: DbClock) -> Any:
    """A claim's candidates: :data:`PICK_COLUMNS` of claimable jobs of the bound ``caps``
    (list), at most ``n``, in the order they are taken, ``FOR UPDATE SKIP LOCKED`` on
    MySQL/MariaDB (concurrent claimers get disjoint batches, reference §2.6)."""
    q = (
        select(*PICK_COLUMNS)
        .where(*claimable(clock), jobs.c.job_type.in_(bindparam("caps", expanding=True)))
        .order_by(*TAKE_ORDER)
        .limit(bindparam("n", type_=Integer()))
    )
    return _for_update(clock, q, skip_locked=True)


@Statement
def park(clock: DbClock) -> Any:
    """Park the pending jobs of the bound ``ids`` (list) until ``p_until``: out of the
    claim's range until the scheduler takes them back (no provider has room for them,
    reference §10.2). Internal: no version, no event."""
    return (
        update(jobs)
        .where(
            jobs.c.job_id.in_(bindparam("ids", expanding=True)),
            jobs.c.status == JobStatus.PENDING,
        )
        .values(parked_until=bindparam("p_until", type_=jobs.c.parked_until.type))
    )


@Statement
def unpark(clock: DbClock) -> Any:
    """Take back into the claim's range the pending jobs parked until now or earlier, at
    most ``n`` (``ix_jobs_poll``'s range ``parkedUntil <= now``).

    On MySQL/MariaDB the range is read into a derived table joined to the jobs by
    their primary key (an ``IN`` over a subquery of the same table would scan the
    whole table, and MariaDB allows no ``LIMIT`` in one)."""
    due = (
        select(jobs.c.seq)
        .where(
            jobs.c.status == JobStatus.PENDING,
            jobs.c.parked_until.is_not(None),
            jobs.c.parked_until <= clock.now(),
        )
        .limit(bindparam("n", type_=Integer()))
    )
    if clock.is_sqlite:
        return update(jobs).where(jobs.c.seq.in_(due)).values(parked_until=None)
    taken = due.subquery("due")
    return update(jobs).where(jobs.c.seq == taken.c.seq).values(parked_until=None)


@Statement
def paused_now(clock: DbClock) -> Any:
    """The pauses after a 429 running now (reference §10.2), one row each:
    ``(kind, key, pausedUntil)``, kind ``"p"`` for a provider (key: its name) and
    ``"c"`` for a user's key (key: the credential id). A claim's pick reads them in
    its round trip."""
    return union_all(
        select(literal("p").label("kind"), breaker.c.provider, breaker.c.paused_until).where(
            breaker.c.paused_until > clock.now()
        ),
        select(
            literal("c").label("kind"),
            credential_pauses.c.credential_id,
            credential_pauses.c.paused_until,
        ).where(credential_pauses.c.paused_until > clock.now()),
    )


@Statement
def forget_old_grants(clock: DbClock) -> Any:
    """Delete the provider grants of attempts that ended, granted more than a minute ago:
    they count in no 60-second window any more (reference §10.2)."""
    return delete(grants).where(
        grants.c.granted_at < clock.plus(-60), grants.c.ended_at.is_not(None)
    )


@Statement
def fair_start(clock: DbClock) -> Any:
    """What a new job's place in the fair order is made of (reference §10.1), for the user
    ``a_user`` at priority ``f_priority``: ``(userLast, freshMin, takenMax)`` — the
    largest virtual start of the user's waiting jobs there, the smallest of the
    claimable jobs there never retried, and the largest of the jobs there already
    taken. Each is one dive into an index (``ix_jobs_user_waiting``, ``ix_jobs_poll``)."""
    priority = bindparam("f_priority", type_=Integer())
    user_last = (
        select(func.max(jobs.c.vstart))
        .where(
            jobs.c.user_id == bindparam("a_user", type_=String()),
            jobs.c.status == JobStatus.PENDING,
            jobs.c.priority == priority,
        )
        .scalar_subquery()
    )
    fresh_min = (
        select(jobs.c.vstart)
        .where(*claimable(clock), jobs.c.priority == priority, jobs.c.retry_count == 0)
        .order_by(jobs.c.vstart)
        .limit(1)
        .scalar_subquery()
    )
    taken = [
        select(func.max(jobs.c.vstart))
        .where(jobs.c.status == state, jobs.c.parked_until.is_(None), jobs.c.priority == priority)
        .scalar_subquery()
        for state in sorted(set(JobStatus) - {JobStatus.PENDING, JobStatus.EXPIRED})
    ]
    return select(user_last, fresh_min, *taken)


@Statement
def lock_pick(clock: DbClock) -> Any:
    """LockJob's candidate (bound: ``g_job_id``) when the lock's guard would pass, as
    :func:`claim_pick` reads it, ``FOR UPDATE`` on MySQL/MariaDB."""
    q = select(*PICK_COLUMNS).where(
        jobs.c.job_id == bindparam("g_job_id", type_=String()), lock_guard(clock)
    )
    return _for_update(clock, q)


@Statement
def claimed_rows(clock: DbClock, status: str) -> Any:
    """The rows a claim just moved (bound: ``ids`` list, ``instance_id``), now in
    ``status`` and held by the caller, in pick order: every column."""
    return (
        select(jobs)
        .where(
            jobs.c.job_id.in_(bindparam("ids", expanding=True)),
            jobs.c.status == status,
            jobs.c.locked_by == bindparam("instance_id", type_=String()),
        )
        .order_by(*TAKE_ORDER)
    )


@Statement
def any_claimable(clock: DbClock) -> Any:
    """Whether some job is claimable now: its ``seq``, at most one row."""
    return select(jobs.c.seq).where(*claimable(clock)).limit(1)


@Statement
def next_in_line(clock: DbClock) -> Any:
    """``(availableAt, now)`` of the pending, available job of type ``n_type`` a claim
    would pick next (the poll index's first row), at most one row."""
    return (
        select(jobs.c.available_at, clock.now())
        .where(*claimable(clock), jobs.c.job_type == bindparam("n_type", type_=String()))
        .order_by(*TAKE_ORDER)
        .limit(1)
    )


def settle_grants(clock: DbClock, ended: Sequence[tuple[str, int, int | None]]) -> list[Sql]:
    """End the grants of attempts that ended (reference §10.2), in one UPDATE:
    ``(jobId, attemptNo, tokens used or None)`` each; an attempt with no grant row (a
    user key) changes nothing. Tokens None (the attempt's calls unknown: a lapsed
    lease) leave the reserved estimate counting."""
    if not ended:
        return []
    js = JobSet([e[0] for e in ended], column=grants.c.job_id)
    attempt = js.each("a", [e[1] for e in ended], type_=Integer())
    used = js.each(
        "u",
        [KEEP if e[2] is None else e[2] for e in ended],
        type_=grants.c.tokens_used.type,
        keep=grants.c.tokens_used,
    )

    def build() -> Any:
        return (
            update(grants)
            .where(js.member(), grants.c.attempt_no == attempt(), grants.c.ended_at.is_(None))
            .values(ended_at=clock.now(), tokens_used=used())
        )

    return [js.sql(("settle_grants", clock.dialect), build)]


@Statement
def insert_grant(clock: DbClock) -> Any:
    """INSERT of a grant row (values: ``job_id``, ``attempt_no``, ``provider``,
    ``tokens_reserved``), granted now: one per platform-key attempt leased."""
    return insert(grants).values(granted_at=clock.now())


@Statement
def count_grants(clock: DbClock) -> Any:
    """Add ``g_count`` to provider ``g_provider``'s ``grants`` counter: the write that
    makes concurrent grants to a limited provider conflict (reference §10.2)."""
    return (
        update(breaker)
        .where(breaker.c.provider == bindparam("g_provider", type_=String()))
        .values(grants=breaker.c.grants + bindparam("g_count", type_=Integer()))
    )


def _one_off(stmt: Any) -> Sql:
    """A statement built for one call (not cached), as a batch entry."""
    return Sql(None, lambda: stmt, {})


def later(clock: DbClock, column: Any, seconds: float) -> Any:
    """``column`` pushed to now + ``seconds`` unless it is already later (a pause is
    never shortened)."""
    until = clock.plus(seconds, varying=True)
    return case((column > until, column), else_=until)


def pause_provider(clock: DbClock, provider: str, seconds: float) -> Sql:
    """Pause ``provider`` for every worker for ``seconds`` from now (reference §10.2)."""
    stmt = (
        update(breaker)
        .where(breaker.c.provider == provider)
        .values(paused_until=later(clock, breaker.c.paused_until, seconds))
    )
    return _one_off(stmt)


def pause_credential(clock: DbClock, credential_id: str, seconds: float) -> list[Sql]:
    """Pause a user key for ``seconds`` from now (reference §10.2): its row made if
    missing, then pushed forward (never shortened)."""
    from job_service.learning.common import insert_ignore_sql

    made = insert_ignore_sql(
        clock.dialect,
        credential_pauses,
        {"credential_id": credential_id, "paused_until": datetime(1970, 1, 1)},
    )
    stmt = (
        update(credential_pauses)
        .where(credential_pauses.c.credential_id == credential_id)
        .values(paused_until=later(clock, credential_pauses.c.paused_until, seconds))
    )
    return [made, _one_off(stmt)]


def provider_usage(clock: DbClock, providers: Sequence[str]) -> Any:
    """``(provider, requests, tokens)`` of the last 60 s of each of ``providers`` (the
    admin view and the gauges; reference §10.2)."""
    used = func.coalesce(grants.c.tokens_used, grants.c.tokens_reserved)
    return (
        select(grants.c.provider, func.count(), func.coalesce(func.sum(used), 0))
        .where(grants.c.provider.in_(list(providers)), grants.c.granted_at > clock.plus(-60))
        .group_by(grants.c.provider)
    )


def leased_by_provider(providers: Sequence[str]) -> Any:
    """``(provider, count)`` of the platform-key attempts holding a lease on each of
    ``providers`` now (its leased jobs: ``ix_jobs_reaper``'s leased range). A batch's
    parent is never leased (reference §10.3): running while its children run, it is
    no attempt and is not counted."""
    return (
        select(jobs.c.model_provider, func.count())
        .where(
            jobs.c.status.in_(sorted(LEASED)),
            jobs.c.api_key_mode == "platform_key",
            jobs.c.model_provider.in_(list(providers)),
            jobs.c.batch_total.is_(None),
        )
        .group_by(jobs.c.model_provider)
    )


def provider_pauses(providers: Sequence[str]) -> Any:
    """``(provider, pausedUntil)`` of each of ``providers``."""
    return select(breaker.c.provider, breaker.c.paused_until).where(
        breaker.c.provider.in_(list(providers))
    )
