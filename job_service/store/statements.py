"""Every SQL statement of the job core, named once (SQL only; the services decide).

Each hot-path statement is a :class:`~job_service.store.cache.Statement`: built
once per dialect with bound parameters (named in its docstring), run as
``stmt.sql(clock, params)`` alone or in a batch. The transitions' UPDATEs and
event rows are in :mod:`job_service.store.transitions`. Lists whose filters
vary per call (job lists, cost roll-ups) are built per call by the functions
at the end.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Final, cast

from sqlalchemy import (
    ColumnElement,
    Integer,
    Select,
    String,
    Table,
    and_,
    bindparam,
    case,
    delete,
    func,
    insert,
    literal_column,
    or_,
    select,
    update,
)
from sqlalchemy import cast as sql_cast
from sqlalchemy.dialects.mysql import insert as mysql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from airuntime_common.states import LEASED, LIVE, TERMINAL, JobStatus
from job_service.learning.tables import AiResult
from job_service.store.cache import Sql, Statement
from job_service.store.clock import DbClock
from job_service.store.parents import live_row_columns
from job_service.store.tables import (
    admission_locks,
    authorizations,
    erased_usage,
    events,
    grants,
    invocations,
    jobs,
    platform_spend,
    workers,
)
from job_service.store.transitions import (
    VERSION_PLUS_ONE,
    by_job_id_key,
    lease_guard_bound,
    leases_guard,
)

#: Accepted results (``ai_results``).
results = cast(Table, AiResult.__table__)
#: Prefix of an erased user's pseudonym: the ``userId`` of the jobs an erasure kept
#: until their attempt ended (reference §9.2).
PSEUDONYM_PREFIX: Final = "erased-"


def _for_update(clock: DbClock, stmt: Any, **kw: Any) -> Any:
    """``stmt`` with ``FOR UPDATE`` on MySQL/MariaDB (SQLite's one writer needs none)."""
    return stmt if clock.is_sqlite else stmt.with_for_update(**kw)


# ------------------------------------------------------------------ jobs


@Statement
def get_job(clock: DbClock, lock: bool = False) -> Any:
    """One job row by id (bound: ``g_job_id``), every column; ``lock``: ``FOR UPDATE``."""
    stmt = select(jobs).where(jobs.c.job_id == bindparam("g_job_id", type_=String()))
    return _for_update(clock, stmt) if lock else stmt


@Statement
def get_job_and_lease(clock: DbClock) -> Any:
    """One job row by id and whether the lease bound as :func:`~job_service.store.transitions.lease_params` is live on
    it (bound: ``l_job_id``, ``l_instance_id``, ``l_attempt_no``): every column,
    then ``lease_held``."""
    return select(jobs, lease_guard_bound(clock).label("lease_held")).where(
        jobs.c.job_id == bindparam("l_job_id", type_=String())
    )


@Statement
def insert_job(clock: DbClock) -> Any:
    """INSERT of a job row, its times from one database clock reading (so
    ``created_at`` = ``available_at`` = ``updated_at``); values: every other column."""
    now = clock.now()
    return insert(jobs).values(available_at=now, created_at=now, updated_at=now)


@Statement
def scope_job(clock: DbClock) -> Any:
    """The job of an idempotency scope (reference §2.5; bound: ``a_user``, ``a_type``,
    ``a_target_type``, ``a_target``, ``a_key``), every column."""
    return select(jobs).where(
        jobs.c.user_id == bindparam("a_user", type_=String()),
        jobs.c.job_type == bindparam("a_type", type_=String()),
        jobs.c.target_type == bindparam("a_target_type", type_=String()),
        jobs.c.target_id == bindparam("a_target", type_=String()),
        jobs.c.idempotency_key == bindparam("a_key", type_=String()),
    )


@Statement
def live_jobs_of_user(clock: DbClock) -> Any:
    """:class:`~job_service.store.parents.LiveRow` rows of the user's (``a_user``)
    pending and leased jobs (batches' parents among them), locked: a revoke's read
    (reference §6)."""
    stmt = select(*live_row_columns()).where(
        jobs.c.user_id == bindparam("a_user", type_=String()), jobs.c.status.in_(sorted(LIVE))
    )
    return _for_update(clock, stmt)


def jobs_of_material(
    clock: DbClock,
    *,
    user_id: str,
    targets: Sequence[tuple[str, str]],
    snapshot_ids: Sequence[str],
) -> Any:
    """:class:`~job_service.store.parents.LiveRow` rows of the user's jobs on any of
    ``targets`` (``(targetType, targetId)``) or on any of ``snapshot_ids``, locked: the
    jobs a material's deletion ends (reference §9.2). Built per call (the lists vary)."""
    on = [and_(jobs.c.target_type == t, jobs.c.target_id == i) for t, i in targets]
    if snapshot_ids:
        on.append(jobs.c.snapshot_id.in_(list(snapshot_ids)))
    stmt = select(*live_row_columns()).where(jobs.c.user_id == user_id, or_(*on))
    return _for_update(clock, stmt)


# ------------------------------------------------------------- admission


@Statement
def admission_lock(clock: DbClock) -> Any:
    """Take the user's (``a_user``) admission lock by writing their row (``changes + 1``):
    one admission per user at a time on every replica, and on Galera a write the
    other nodes certify against (reference §6, §9.6). On SQLite, whose single writer
    already serialises creates, the row does not exist and nothing is written."""
    return (
        update(admission_locks)
        .where(admission_locks.c.user_id == bindparam("a_user", type_=String()))
        .values(changes=admission_locks.c.changes + 1)
    )


@Statement
def ensure_admission_row(clock: DbClock) -> Any:
    """``INSERT IGNORE`` of the user's (``user_id``) admission row (MySQL/MariaDB)."""
    return mysql_insert(admission_locks).prefix_with("IGNORE")


@Statement
def ai_granted(clock: DbClock) -> Any:
    """The user's (``a_user``) AI switch (no row: granted, reference §6)."""
    return select(authorizations.c.granted).where(
        authorizations.c.user_id == bindparam("a_user", type_=String())
    )


@Statement
def jobs_created_today(clock: DbClock) -> Any:
    """How many jobs the user (``a_user``) created since the database's UTC midnight,
    with the day's jobs of an erased user of the same id (pseudonym ``a_pseudonym``,
    reference §9.2: erasing does not reset a quota), one row read by primary key. A
    batch's parent is not counted: its children are (reference §10.3)."""
    erased = (
        select(erased_usage.c.jobs)
        .where(
            erased_usage.c.pseudonym == bindparam("a_pseudonym", type_=String()),
            erased_usage.c.day == clock.today(),
        )
        .scalar_subquery()
    )
    return (
        select(func.count() + func.coalesce(erased, 0))
        .select_from(jobs)
        .where(
            jobs.c.user_id == bindparam("a_user", type_=String()),
            jobs.c.created_at >= clock.day_start(),
            jobs.c.batch_total.is_(None),
        )
    )


@Statement
def add_erased_usage(clock: DbClock) -> Any:
    """Upsert adding ``jobs`` to today's erased-usage row of ``pseudonym`` (reference §9.2)."""
    from job_service.learning.common import adding_upsert

    return adding_upsert(
        clock.dialect,
        erased_usage,
        keys=("pseudonym", "day"),
        add=("jobs",),
        values={"day": clock.today()},
    )


def jobs_of_user(clock: DbClock, user_id: str) -> Any:
    """:class:`~job_service.store.parents.LiveRow` columns, then ``countsToday`` (1 for
    a job created today that counts against the daily quota: not a batch's parent),
    of every job of the user, locked: an erasure's read (reference §9.2)."""
    today = case(
        (and_(jobs.c.created_at >= clock.day_start(), jobs.c.batch_total.is_(None)), 1),
        else_=0,
    )
    stmt = select(*live_row_columns(), today).where(jobs.c.user_id == user_id)
    return _for_update(clock, stmt)


def erase_jobs(
    clock: DbClock,
    user_id: str,
    job_ids: Sequence[str],
    pseudonym: str,
    kept: Sequence[str] = (),
) -> list[Any]:
    """An erasure's writes on the job tables, in order (reference §9.2): the invocation logs
    of ``job_ids`` keep tokens and cost under ``pseudonym`` (as their ``job_id``, no
    credential), then the jobs' events, the user's jobs, AI switch and admission row go.

    ``kept`` (jobs leased at the erasure, among ``job_ids``) stay until their attempt
    ends, with nothing of the user left on them: ``user_id`` the pseudonym (a user
    target too), no params, idempotency key, credential or error text, and their
    events' ``user:`` actor the pseudonym's. The attempt's model calls then still log
    their tokens and cost, and its result writes nothing (its snapshot is gone)."""
    ids = list(job_ids)
    keep = list(kept)
    out: list[Any] = []
    if ids:
        out.append(
            update(invocations)
            .where(invocations.c.job_id.in_(ids))
            .values(job_id=pseudonym, credential_id=None)
        )
        out.append(update(grants).where(grants.c.job_id.in_(ids)).values(job_id=pseudonym))
    if keep:
        out.append(
            update(jobs)
            .where(jobs.c.job_id.in_(keep), jobs.c.user_id == user_id)
            .values(
                user_id=pseudonym,
                target_id=case((jobs.c.target_type == "user", pseudonym), else_=jobs.c.target_id),
                parent_job_id=None,  # the parent goes with the user (reference §10.3)
                params={},
                idempotency_key=None,
                credential_id=None,
                error_message=None,
                updated_at=clock.now(),
                version=VERSION_PLUS_ONE,
            )
        )
        out.append(
            update(events)
            .where(events.c.job_id.in_(keep), events.c.actor == f"user:{user_id}")
            .values(actor=f"user:{pseudonym}")
        )
    kept_ids = set(keep)
    gone = [i for i in ids if i not in kept_ids]
    if gone:
        out.append(delete(events).where(events.c.job_id.in_(gone)))
    out.append(delete(jobs).where(jobs.c.user_id == user_id))
    out.append(delete(authorizations).where(authorizations.c.user_id == user_id))
    out.append(delete(admission_locks).where(admission_locks.c.user_id == user_id))
    return out


def forget_erased_jobs(ended: Sequence[tuple[str, str]]) -> list[Sql]:
    """The writes that remove jobs an erasure kept once their last attempt has ended
    (reference §9.2): ``ended`` is ``(jobId, pseudonym)`` of each (its ``userId``). Their
    model calls (and their providers' grants) keep tokens and cost under the pseudonym,
    as the erasure left the others'; then their events and the jobs themselves go.
    Built per call."""
    by_pseudonym: dict[str, list[str]] = {}
    for job_id, name in ended:
        by_pseudonym.setdefault(name, []).append(job_id)
    out: list[Sql] = []
    for name, ids in by_pseudonym.items():
        out.append(
            _one_off(
                update(invocations)
                .where(invocations.c.job_id.in_(ids))
                .values(job_id=name, credential_id=None)
            )
        )
        out.append(_one_off(update(grants).where(grants.c.job_id.in_(ids)).values(job_id=name)))
    ids = [job_id for job_id, _ in ended]
    out.append(_one_off(delete(events).where(events.c.job_id.in_(ids))))
    out.append(
        _one_off(
            delete(jobs).where(
                jobs.c.job_id.in_(ids),
                jobs.c.user_id.startswith(PSEUDONYM_PREFIX),
                jobs.c.status.in_(sorted(TERMINAL)),
            )
        )
    )
    return out


def _one_off(stmt: Any) -> Sql:
    """A statement built for one call (not cached), as a batch entry."""
    return Sql(None, lambda: stmt, {})


@Statement
def platform_spent_today(clock: DbClock) -> Any:
    """The day's platform-key spend: its running total's rows, by primary key
    (at most PLATFORM_SPEND_SHARDS), never a sum over the invocation log."""
    return select(func.coalesce(func.sum(platform_spend.c.cost_usd), 0)).where(
        platform_spend.c.day == clock.today()
    )


@Statement
def authorization_row(clock: DbClock) -> Any:
    """The user's (``a_user``) authorization row: ``granted``, ``changed_at``."""
    return select(authorizations.c.granted, authorizations.c.changed_at).where(
        authorizations.c.user_id == bindparam("a_user", type_=String())
    )


@Statement
def upsert_authorization(clock: DbClock) -> Any:
    """Set the user's AI switch (values: ``user_id``, ``granted``), ``changed_at`` now."""
    values = {"changed_at": clock.now()}
    if clock.is_sqlite:
        stmt = sqlite_insert(authorizations).values(**values)
        return stmt.on_conflict_do_update(
            index_elements=[authorizations.c.user_id],
            set_={"granted": stmt.excluded.granted, "changed_at": clock.now()},
        )
    mstmt = mysql_insert(authorizations).values(**values)
    return mstmt.on_duplicate_key_update(granted=mstmt.inserted.granted, changed_at=clock.now())


# ----------------------------------------------------------------- leases


@Statement
def verify_lease(clock: DbClock) -> Any:
    """What credential resolution needs of a job whose bound lease (``l_*``) is live:
    ``user_id, api_key_mode, credential_id, model_provider, model_name``."""
    return select(
        jobs.c.user_id,
        jobs.c.api_key_mode,
        jobs.c.credential_id,
        jobs.c.model_provider,
        jobs.c.model_name,
    ).where(lease_guard_bound(clock))


@Statement
def verify_leases(clock: DbClock) -> Any:
    """Per job of the bound ``ids`` (list): its lease columns, whether the lease is live
    (``lockUntil ≥ now``, as ``live`` 1/0), and :func:`verify_lease`'s columns."""
    live = and_(jobs.c.lock_until.is_not(None), jobs.c.lock_until >= clock.now())
    return select(
        jobs.c.job_id,
        jobs.c.status,
        jobs.c.locked_by,
        jobs.c.attempt_no,
        case((live, 1), else_=0).label("live"),
        jobs.c.user_id,
        jobs.c.api_key_mode,
        jobs.c.credential_id,
        jobs.c.model_provider,
        jobs.c.model_name,
    ).where(jobs.c.job_id.in_(bindparam("ids", expanding=True)))


def held_leases(clock: DbClock, instance_id: str, refs: list[tuple[str, int]]) -> Any:
    """``(jobId, attemptNo, status, lockUntil, cancelRequested)`` of each of ``refs``
    whose live lease ``instance_id`` holds (reference §3 HeartbeatLeases)."""
    return by_job_id_key(
        select(
            jobs.c.job_id,
            jobs.c.attempt_no,
            jobs.c.status,
            jobs.c.lock_until,
            jobs.c.cancel_requested,
        ).where(leases_guard(clock, instance_id, refs))
    )


# ------------------------------------------------------------- completion


@Statement
def insert_result(clock: DbClock) -> Any:
    """INSERT of an ``ai_results`` row (values: its columns), ``created_at`` now."""
    return insert(results).values(created_at=clock.now())


@Statement
def attempt_ended_by(clock: DbClock) -> Any:
    """Whether the lease holder (``e_actor``) ended attempt ``e_attempt`` of job
    ``e_job_id`` with code ``e_code``: its event row's ``seq``, at most one."""
    return (
        select(events.c.seq)
        .where(
            events.c.job_id == bindparam("e_job_id", type_=String()),
            events.c.attempt_no == bindparam("e_attempt", type_=Integer()),
            events.c.actor == bindparam("e_actor", type_=String()),
            events.c.error_code == bindparam("e_code", type_=String()),
            events.c.from_status.in_(sorted(LEASED)),
        )
        .limit(1)
    )


# ------------------------------------------------------------------ reaper


def lease_dead(clock: DbClock) -> ColumnElement[bool]:
    """A lease past its ``lockUntil`` on the database clock (``LEASE_EXPIRED``)."""
    return and_(jobs.c.lock_until.is_not(None), jobs.c.lock_until < clock.now())


def timed_out(clock: DbClock) -> ColumnElement[bool]:
    """An attempt past ``startedAt + timeoutSeconds`` on the database clock (``JOB_TIMEOUT``)."""
    deadline = clock.add_seconds(jobs.c.started_at, jobs.c.timeout_seconds)
    return and_(jobs.c.started_at.is_not(None), deadline < clock.now())


@Statement
def expired_attempts(clock: DbClock) -> Any:
    """Ids of leased jobs whose lease lapsed or whose attempt timed out, at most ``n``
    (walks ``ix_jobs_reaper``)."""
    return (
        select(jobs.c.job_id)
        .where(jobs.c.status.in_(sorted(LEASED)), or_(lease_dead(clock), timed_out(clock)))
        .limit(bindparam("n", type_=Integer()))
    )


@Statement
def expiring_job(clock: DbClock) -> Any:
    """The leased job ``x_job_id``, locked, with ``timed_out`` and ``lease_dead`` flags."""
    stmt = select(
        jobs, timed_out(clock).label("timed_out"), lease_dead(clock).label("lease_dead")
    ).where(
        jobs.c.job_id == bindparam("x_job_id", type_=String()), jobs.c.status.in_(sorted(LEASED))
    )
    return _for_update(clock, stmt)


# ------------------------------------------------------------- accounting


@Statement
def insert_invocation(clock: DbClock) -> Any:
    """INSERT of an invocation log row (values: its columns), ``created_at`` now."""
    return insert(invocations).values(created_at=clock.now())


@Statement
def add_platform_spend(clock: DbClock) -> Any:
    """Upsert adding ``cost_usd`` and ``calls`` to today's platform-spend row ``shard``."""
    from job_service.learning.common import adding_upsert

    return adding_upsert(
        clock.dialect,
        platform_spend,
        keys=("day", "shard"),
        add=("cost_usd", "calls"),
        replace=("updated_at",),
        values={"day": clock.today(), "updated_at": clock.now()},
    )


def costs(group: Any, lo: datetime, hi: datetime) -> Select[Any]:
    """Cost roll-up of invocation logs created in ``[lo, hi)`` grouped by ``group``:
    ``(key, calls, promptTokens, completionTokens, cacheHitTokens, costUsd)`` rows."""
    key = group.label("k")
    return (
        select(
            key,
            func.count(),
            func.coalesce(func.sum(invocations.c.prompt_tokens), 0),
            func.coalesce(func.sum(invocations.c.completion_tokens), 0),
            func.coalesce(func.sum(invocations.c.cache_hit_tokens), 0),
            func.coalesce(func.sum(invocations.c.cost_usd), 0),
        )
        .where(and_(invocations.c.created_at >= lo, invocations.c.created_at < hi))
        .group_by(key)
        .order_by(key)
    )


#: ``groupBy`` of ``GET /admin/ai/costs`` → the column it groups by.
COST_GROUPS: dict[str, Any] = {
    "day": func.date(invocations.c.created_at),
    "jobType": invocations.c.job_type,
    "modelName": invocations.c.model_name,
    "modelProvider": invocations.c.model_provider,
    "apiKeyMode": invocations.c.api_key_mode,
}


# ------------------------------------------------------------------ views


def jobs_by_ids(*, user_id: str, job_ids: Sequence[str]) -> Select[Any]:
    """The user's jobs among ``job_ids`` (by the unique job id index), in no order
    (reference §9.2 ``GET /v1/ai/jobs?ids=``)."""
    return select(jobs).where(jobs.c.job_id.in_(list(job_ids)), jobs.c.user_id == user_id)


def list_jobs(
    *,
    user_id: str | None,
    status: str | None,
    job_type: str | None,
    after: tuple[datetime | None, int] | None,
    limit: int,
    created_from: datetime | None = None,
    created_to: datetime | None = None,
    parent_job_id: str | None = None,
) -> Select[Any]:
    """A page of jobs, newest first (reference §3.1 paging).

    One user's jobs come newest first by (created_at, seq), the order of their
    index (``ix_jobs_user``; InnoDB keys end with the primary key): a page reads
    about ``limit`` rows however many jobs the user or the table has. By seq
    alone, MariaDB walks the whole table's primary key backwards to find an old
    user's rows. Other lists go by seq (the primary key, or
    ``ix_jobs_status_seq`` with a status).

    A batch's children (``parent_job_id``) come by seq from ``ix_jobs_parent``
    (at most ``BATCH_MAX_CHILDREN`` rows to order).

    Args:
        after: the last row of the previous page, ``(created_at or None, seq)``.
        created_from, created_to: created in ``[created_from, created_to)`` (naive UTC).
        parent_job_id: only the children of this batch (reference §10.3).
    """
    stmt = select(jobs).where(
        *job_filters(user_id, job_type, created_from, created_to, status=status)
    )
    if parent_job_id is not None:
        stmt = stmt.where(jobs.c.parent_job_id == parent_job_id)
    by_time = user_id is not None and parent_job_id is None
    if after is not None:
        at, before = after
        if by_time and at is not None:
            stmt = stmt.where(
                or_(jobs.c.created_at < at, and_(jobs.c.created_at == at, jobs.c.seq < before))
            )
        else:
            stmt = stmt.where(jobs.c.seq < before)
    if by_time:
        stmt = stmt.order_by(jobs.c.created_at.desc(), jobs.c.seq.desc())
    else:
        stmt = stmt.order_by(jobs.c.seq.desc())
    return stmt.limit(limit)


def job_filters(
    user_id: str | None,
    job_type: str | None,
    created_from: datetime | None,
    created_to: datetime | None,
    *,
    status: str | None = None,
) -> list[ColumnElement[bool]]:
    """The WHERE terms of a job list's filters (each None = no filter)."""
    terms: list[ColumnElement[bool]] = []
    if user_id is not None:
        terms.append(jobs.c.user_id == user_id)
    if status is not None:
        terms.append(jobs.c.status == status)
    if job_type is not None:
        terms.append(jobs.c.job_type == job_type)
    if created_from is not None:
        terms.append(jobs.c.created_at >= created_from)
    if created_to is not None:
        terms.append(jobs.c.created_at < created_to)
    return terms


def job_counts(
    *,
    user_id: str | None,
    job_type: str | None,
    created_from: datetime | None,
    created_to: datetime | None,
) -> Select[Any]:
    """``(status, count)`` of the jobs matching a list's filters but the status
    (reference §9.5 console); states with no job have no row."""
    return (
        select(jobs.c.status, func.count())
        .where(*job_filters(user_id, job_type, created_from, created_to))
        .group_by(jobs.c.status)
    )


#: The UTC minute of ``finished_at`` as text ``YYYY-MM-DD HH:MM`` on both databases
#: (SQLite stores the time as text; MariaDB casts ``DATETIME(6)`` to the same text).
#: The positions are literals so the GROUP BY repeats the select's expression exactly.
FINISHED_MINUTE: Any = func.substr(
    sql_cast(jobs.c.finished_at, String()), literal_column("1"), literal_column("16")
)


def throughput(since: datetime) -> Select[Any]:
    """Jobs ended at or after ``since`` (naive UTC), one row per minute, oldest first:
    ``(minute 'YYYY-MM-DD HH:MM', succeeded, failed, cancelled)`` — one GROUP BY
    over ``ix_jobs_finished_status`` (reference §9.5 console charts)."""
    minute = FINISHED_MINUTE.label("minute")

    def ended(state: str) -> Any:
        return func.coalesce(func.sum(case((jobs.c.status == state, 1), else_=0)), 0)

    return (
        select(
            minute,
            ended(JobStatus.SUCCEEDED),
            ended(JobStatus.FAILED),
            ended(JobStatus.CANCELLED),
        )
        .where(jobs.c.finished_at >= since, jobs.c.status.in_(sorted(TERMINAL)))
        .group_by(FINISHED_MINUTE)
        .order_by(FINISHED_MINUTE)
    )


def events_of_job(job_id: str) -> Select[Any]:
    """A job's event rows, oldest first."""
    return select(events).where(events.c.job_id == job_id).order_by(events.c.seq)


def invocations_of_job(job_id: str) -> Select[Any]:
    """A job's invocation log rows, oldest first."""
    return select(invocations).where(invocations.c.job_id == job_id).order_by(invocations.c.seq)


def queue_depth() -> Select[Any]:
    """``(status, jobType, count)`` of the non-terminal jobs (batches' parents, which
    run nothing themselves, left out)."""
    return (
        select(jobs.c.status, jobs.c.job_type, func.count())
        .where(jobs.c.status.in_(sorted(LIVE)), jobs.c.batch_total.is_(None))
        .group_by(jobs.c.status, jobs.c.job_type)
    )


def leases_by_holder() -> Select[Any]:
    """``(lockedBy, count)`` of live leases per runtime instance."""
    return (
        select(jobs.c.locked_by, func.count())
        .where(jobs.c.status.in_(sorted(LEASED)), jobs.c.locked_by.is_not(None))
        .group_by(jobs.c.locked_by)
    )


def workers_newest_first() -> Select[Any]:
    """Every runtime instance's registry row, most recently seen first."""
    return select(workers).order_by(workers.c.last_seen_at.desc())


# ------------------------------------------------------------------ changes (reference §9.1)


def latest_event_seq() -> Select[Any]:
    """The highest job event sequence (NULL on an empty table): a change cursor's head."""
    return select(func.max(events.c.seq))


def changes_after(after: int, gaps: list[int], limit: int) -> Select[Any]:
    """Every job's changes after cursor ``after``, and the events at the sequences in
    ``gaps`` (holes seen earlier that may have committed since): ``(change_seq, every
    job column)`` in sequence order, at most ``limit`` rows. Walks the events' primary
    key from ``after`` (one range, plus one point per gap) and each job by its id."""
    cond: ColumnElement[bool] = events.c.seq > after
    if gaps:
        cond = or_(cond, events.c.seq.in_(gaps))
    return (
        select(events.c.seq.label("change_seq"), jobs)
        .join(jobs, jobs.c.job_id == events.c.job_id)
        .where(cond)
        .order_by(events.c.seq)
        .limit(limit)
    )


def user_changes_after(user_id: str, after: int, limit: int) -> Select[Any]:
    """One user's job changes after cursor ``after``: ``(change_seq, every job column)``,
    oldest first, at most ``limit`` rows. Walks the user's jobs (``ix_jobs_user``) and
    each one's events after the cursor (``ix_job_events_job``)."""
    return (
        select(events.c.seq.label("change_seq"), jobs)
        .join(jobs, jobs.c.job_id == events.c.job_id)
        .where(jobs.c.user_id == user_id, events.c.seq > after)
        .order_by(events.c.seq)
        .limit(limit)
    )
