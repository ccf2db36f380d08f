"""The SQL of the completer: attempt endings of a set of jobs (reference §2.3, §2.5).

A set of reports (results and fails, at most one per job) ends in one
transaction, whatever its size, with these statements:

* :func:`ending_read` — the jobs, locked, each with its **lease verdict** computed by
  the database from the report's fencing token ``(jobId, runtimeInstanceId,
  attemptNo)`` and the database clock (the rule of :func:`lease_held`); then the
  results the jobs already have (replays and conflicts, reference §2.5);
* :func:`end_jobs` — one UPDATE per transition (succeed, retry, fail, cancel) over
  its jobs, under the same lease rule, each job with its own values;
* :func:`ending_events` — the event row of every ended job, read from the rows the
  UPDATEs just wrote.

Values that differ from job to job are bound per job in a ``CASE job_id WHEN …``
(:class:`JobSet`); a column with one value for every job is bound once. Every
statement is cached per shape (the number of jobs, which columns vary), so a set
costs no more SQL building than one job.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import (
    ColumnElement,
    Integer,
    String,
    Table,
    and_,
    bindparam,
    case,
    insert,
    select,
    update,
)

from airuntime_common.states import LEASED
from job_service.learning.tables import AiResult
from job_service.lifecycle import Op
from job_service.lifecycle.transitions import TRANSITIONS
from job_service.store import cache
from job_service.store.cache import Sql
from job_service.store.clock import DbClock
from job_service.store.records import ENDING_FACTS
from job_service.store.tables import events, jobs
from job_service.store.transitions import EVENT_COLUMNS, MAX_ACTOR, VERSION_PLUS_ONE

#: Accepted results (``ai_results``).
results = cast(Table, AiResult.__table__)


class _Keep:
    """The marker of a job that leaves a column as it is (:data:`KEEP`)."""

    def __repr__(self) -> str:
        return "KEEP"


#: A per-job value meaning "this job keeps the column's current value".
KEEP: Any = _Keep()


@dataclass(frozen=True)
class Holder:
    """The fencing token a report names (reference §3): the job, the runtime instance
    that says it holds the lease, and the attempt."""

    job_id: str
    instance_id: str
    attempt_no: int


class JobSet:
    """The jobs of one set statement, in order: each bound once (``j0``, ``j1``…),
    with per-job values bound beside them.

    Args:
        ids: the job ids, distinct.
        column: the job id column the statement is over (a job row's, by default).
    """

    def __init__(self, ids: Sequence[str], column: Any = None) -> None:
        self.ids = tuple(ids)
        self.column = jobs.c.job_id if column is None else column
        self.params: dict[str, Any] = {f"j{i}": job_id for i, job_id in enumerate(self.ids)}
        #: what the statement's shape depends on beyond the number of jobs; None once
        #: a value is an expression that cannot be cached (built per call)
        self.shape: list[Hashable] | None = [len(self.ids)]

    def job(self, i: int) -> ColumnElement[str]:
        """The bound id of the ``i``-th job (``:j<i>``)."""
        return bindparam(f"j{i}", type_=String())

    def member(self) -> ColumnElement[bool]:
        """``<column> IN (:j0, :j1, …)``."""
        return self.column.in_([self.job(i) for i in range(len(self.ids))])

    def each(
        self, name: str, values: Sequence[Any], *, type_: Any, keep: Any = None
    ) -> Callable[[], Any]:
        """One value per job (in ``ids`` order) as one SQL expression, made when the
        returned function is called (in the statement's ``build``: never when the
        statement is cached). Its values are bound, and its shape noted, now.

        A value is a plain Python value (bound), a SQL expression (stable ones keep
        the statement cached) or :data:`KEEP` (the job keeps ``keep``, the column).
        The same plain value for every job is bound once as ``name``; otherwise a
        ``CASE job_id WHEN :j<i> THEN … END`` picks each job's.

        Raises:
            ValueError: a value count other than the number of jobs.
        """
        if len(values) != len(self.ids):
            raise ValueError("one value per job")
        first = values[0]
        if all(v is first or (_plain(v) and _plain(first) and v == first) for v in values):
            return self._one(name, first, type_, keep)
        kinds: list[Hashable] = []
        for i, value in enumerate(values):
            if value is KEEP:
                kinds.append("keep")
            elif cache.is_sql(value):
                kinds.append(self._sql_kind(value))
            else:
                self.params[f"{name}{i}"] = value
                kinds.append("=")
        self._note((name, tuple(kinds)))

        def make() -> Any:
            whens = []
            for i, value in enumerate(values):
                if value is KEEP:
                    picked = keep
                elif cache.is_sql(value):
                    picked = value
                else:
                    picked = bindparam(f"{name}{i}", type_=type_)
                whens.append((self.column == self.job(i), picked))
            return case(*whens, else_=keep)

        return make

    def _one(self, name: str, value: Any, type_: Any, keep: Any) -> Callable[[], Any]:
        if value is KEEP:
            self._note((name, "keep"))
            return lambda: keep
        if cache.is_sql(value):
            self._note((name, self._sql_kind(value)))
            return lambda: value
        self.params[name] = value
        self._note((name, "="))
        return lambda: bindparam(name, type_=type_)

    def _sql_kind(self, value: Any) -> Hashable:
        sid = cache.stable_id(value)
        if sid is None:
            self.shape = None
        return sid

    def _note(self, part: Hashable) -> None:
        if self.shape is not None:
            self.shape.append(part)

    def sql(self, name: tuple[Hashable, ...], build: Any) -> Sql:
        """The statement ``build()`` made from this set's expressions, with its values;
        cached under ``name`` (the statement and dialect) and the shape unless a value
        could not be."""
        key = None if self.shape is None else (name, *self.shape)
        return Sql(key, build, dict(self.params))


def _plain(value: Any) -> bool:
    return value is not KEEP and not cache.is_sql(value)


def lease_held(
    clock: DbClock, js: JobSet, holders: Sequence[Holder]
) -> Callable[[], ColumnElement[bool]]:
    """The lease rule (reference §2.3, §3) for each job of ``js``, made when called (its
    values bound now): the runtime instance and attempt of its report hold the lease,
    the job is leased (locked or running) and ``lockUntil ≥ now`` on the database
    clock."""
    instance = js.each("i", [h.instance_id for h in holders], type_=String(), keep=None)
    attempt = js.each("a", [h.attempt_no for h in holders], type_=Integer(), keep=None)
    return lambda: and_(
        jobs.c.locked_by == instance(),
        jobs.c.attempt_no == attempt(),
        jobs.c.status.in_(sorted(LEASED)),
        jobs.c.lock_until.is_not(None),
        jobs.c.lock_until >= clock.now(),
    )


def ending_read(clock: DbClock, holders: Sequence[Holder]) -> tuple[Sql, Sql]:
    """The completer's locking read, two statements for one batch, in this order:

    1. per job of ``holders``, locked (``FOR UPDATE`` on MySQL/MariaDB): the
       :data:`~job_service.store.records.ENDING_FACTS` columns, then ``lease_held``
       (1/0, :func:`lease_held`), ``db_now`` and the breaker's peek of the job's
       provider (``breaker_state``, ``breaker_failures``);
    2. ``(jobId, resultId, idempotencyKey, outputHash)`` of every result the jobs have.

    The second statement runs after the first has its locks: on MySQL/MariaDB at
    READ COMMITTED it sees a result committed by a racing identical submission the
    first waited for (an exact replay, reference §2.5).
    """
    from job_service.maintenance.breaker import peek_columns

    js = JobSet([h.job_id for h in holders])
    held = lease_held(clock, js, holders)
    facts = [jobs.c[name] for name in ENDING_FACTS]

    def build_rows() -> Any:
        stmt = select(
            *facts,
            case((held(), 1), else_=0).label("lease_held"),
            clock.now().label("db_now"),
            *peek_columns(),
        ).where(js.member())
        return stmt if clock.is_sqlite else stmt.with_for_update()

    rows = js.sql(("ending_read", clock.dialect), build_rows)
    stored = Sql(
        ("ending_results", clock.dialect, len(js.ids)),
        lambda: select(
            results.c.job_id, results.c.result_id, results.c.idempotency_key, results.c.output_hash
        ).where(results.c.job_id.in_([js.job(i) for i in range(len(js.ids))])),
        {f"j{i}": job_id for i, job_id in enumerate(js.ids)},
    )
    return rows, stored


@dataclass(frozen=True)
class JobEnd:
    """One job's part of :func:`end_jobs`: its report's fencing token and the columns
    its transition sets (a value may be :data:`KEEP`, a plain value or a SQL
    expression; every job of one call must name the same columns)."""

    holder: Holder
    values: Mapping[str, Any]


def end_jobs(clock: DbClock, op: Op, ends: Sequence[JobEnd]) -> Sql:
    """One guarded UPDATE moving every job of ``ends`` by transition ``op`` (succeed,
    retry, fail or acknowledge a cancel; reference §2.3): ``status``, ``updatedAt``
    and ``version`` as every transition sets them, then each job's ``values``.

    The WHERE clause is the lease rule of :func:`lease_held` with each job's own
    token: a job whose lease lapsed since the read is not moved, and the caller's
    fence (expecting ``len(ends)`` rows) stops the transaction. A column every job
    keeps (:data:`KEEP`) is left out.

    Raises:
        ValueError: ``op`` is not a holder's transition out of a lease, or the jobs
            name different columns (programming errors).
    """
    t = TRANSITIONS[op]
    if not t.holder_only or t.to_state is None or t.from_states != frozenset(LEASED):
        raise ValueError(f"{op} does not end an attempt")
    columns = sorted(ends[0].values)
    if any(sorted(e.values) != columns for e in ends):
        raise ValueError("every job of one UPDATE sets the same columns")
    js = JobSet([e.holder.job_id for e in ends])
    guard = lease_held(clock, js, [e.holder for e in ends])
    per_job: dict[str, Callable[[], Any]] = {}
    for column in columns:
        if all(e.values[column] is KEEP for e in ends):
            continue  # no job of this UPDATE changes it
        per_job[column] = js.each(
            f"v_{column}",
            [e.values[column] for e in ends],
            type_=jobs.c[column].type,
            keep=jobs.c[column],
        )

    def build() -> Any:
        sets: dict[str, Any] = {
            "status": t.to_state,
            "updated_at": clock.now(),
            "version": VERSION_PLUS_ONE,
        }
        sets.update({column: value() for column, value in per_job.items()})
        return update(jobs).where(js.member(), guard()).values(**sets)

    return js.sql(("end_jobs", clock.dialect, op), build)


@dataclass(frozen=True)
class EndEvent:
    """The event row of one ended job: its transition's from- and to-state, the code
    and the actor (``runtime:<instanceId>``)."""

    job_id: str
    from_status: str
    to_status: str
    error_code: str | None
    actor: str


def ending_events(clock: DbClock, ended: Sequence[EndEvent]) -> Sql:
    """Append the event row of each job of ``ended`` (reference §2.2), read from its
    row: its ``attemptNo``, and as ``at`` the ``updatedAt`` its transition just wrote,
    so an event carries exactly the database instant of its transition."""
    js = JobSet([e.job_id for e in ended])
    text = String()
    bound = [
        js.each("e_from", [e.from_status for e in ended], type_=text),
        js.each("e_to", [e.to_status for e in ended], type_=text),
        js.each("e_code", [e.error_code for e in ended], type_=text),
        js.each("e_actor", [e.actor[:MAX_ACTOR] for e in ended], type_=text),
    ]

    def build() -> Any:
        source = [jobs.c.job_id, *(b() for b in bound), jobs.c.attempt_no, jobs.c.updated_at]
        # every column named: the bound ones would otherwise share anonymous names
        picked = select(*(c.label(f"c{n}") for n, c in enumerate(source))).where(js.member())
        return insert(events).from_select(EVENT_COLUMNS, picked)

    return js.sql(("ending_events", clock.dialect), build)
