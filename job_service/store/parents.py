"""The SQL of batches' parents and children (reference §10.3). SQL only: what a parent's
counts and state become is decided in :mod:`job_service.services.parents`.

* :data:`lock_parents` — the parents a transaction's child moves touch, locked
  (``FOR UPDATE`` on MySQL/MariaDB) in job id order: the unique index is walked in
  that order, so two transactions touching the same parents lock them in one order
  and never wait on each other in a cycle. Every caller locks the children first
  (the claim's pick, the completer's read, the reaper's read, a cancel's read), so
  children are always locked before parents.
* :func:`update_parent` — one UPDATE per parent: each count plus its delta (atomic
  increments), ``version + 1``, ``updated_at``, and when the parent's state moves,
  the columns of that move.
* :data:`live_children`, :data:`children_of` — a parent's children.
* :func:`live_row_columns` — the columns of a row that a cancel, a revoke, a
  deletion or an erasure reads of each live job (:class:`LiveRow`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final, NamedTuple

from sqlalchemy import Integer, String, bindparam, case, select, update

from airuntime_common.states import LIVE
from job_service.store.cache import Sql, Statement
from job_service.store.clock import DbClock
from job_service.store.tables import jobs
from job_service.store.transitions import VERSION_PLUS_ONE

#: A parent's counts, in the order :data:`lock_parents` reads them (after the job id,
#: the status and before the ratio).
COUNT_COLUMNS: Final = (
    "batch_total",
    "batch_pending",
    "batch_running",
    "batch_succeeded",
    "batch_failed",
    "batch_cancelled",
)
#: The counts a child's move changes (the total never changes).
MOVING_COUNTS: Final = COUNT_COLUMNS[1:]


def _for_update(clock: DbClock, stmt: Any) -> Any:
    return stmt if clock.is_sqlite else stmt.with_for_update()


@Statement
def lock_parents(clock: DbClock) -> Any:
    """The parents among the bound ``p_ids`` (list), locked, in job id order:
    ``(jobId, status, batch_total … batch_cancelled, min_success_ratio)``."""
    stmt = (
        select(
            jobs.c.job_id,
            jobs.c.status,
            *(jobs.c[c] for c in COUNT_COLUMNS),
            jobs.c.min_success_ratio,
        )
        .where(
            jobs.c.job_id.in_(bindparam("p_ids", expanding=True)),
            jobs.c.batch_total.is_not(None),
        )
        .order_by(jobs.c.job_id)
    )
    return _for_update(clock, stmt)


def update_parent(
    clock: DbClock,
    job_id: str,
    deltas: Mapping[str, int],
    values: Mapping[str, Any],
    now_columns: Sequence[str] = (),
) -> Sql:
    """One parent's UPDATE: every count of :data:`MOVING_COUNTS` plus its delta
    (``deltas``, by column; a missing one adds 0), ``version + 1``, ``updatedAt``
    now, ``values`` (plain values, bound) and ``now_columns`` set to now.

    Cached per shape (the names of ``values`` and ``now_columns``)."""
    plain = tuple(sorted(values))
    stamped = tuple(sorted(now_columns))

    def build() -> Any:
        sets: dict[str, Any] = {
            c: jobs.c[c] + bindparam(f"d_{c}", type_=Integer()) for c in MOVING_COUNTS
        }
        sets.update({c: bindparam(f"v_{c}", type_=jobs.c[c].type) for c in plain})
        sets.update({c: clock.now() for c in stamped})
        sets.update(updated_at=clock.now(), version=VERSION_PLUS_ONE)
        return (
            update(jobs)
            .where(
                jobs.c.job_id == bindparam("p_job_id", type_=String()),
                jobs.c.batch_total.is_not(None),
            )
            .values(**sets)
        )

    params: dict[str, Any] = {"p_job_id": job_id}
    params.update({f"d_{c}": int(deltas.get(c, 0)) for c in MOVING_COUNTS})
    params.update({f"v_{c}": values[c] for c in plain})
    return Sql(("update_parent", clock.dialect, plain, stamped), build, params)


class LiveRow(NamedTuple):
    """A job as a cancel, a revoke, a deletion or an erasure reads it (locked) before
    ending it: its id, status, attempt, parent (a child's) and whether it is a parent."""

    job_id: str
    status: str
    attempt_no: int
    parent_job_id: str | None
    is_parent: bool

    @classmethod
    def of(cls, row: Sequence[Any]) -> LiveRow:
        """From a row whose first columns are :func:`live_row_columns`."""
        return cls(str(row[0]), str(row[1]), int(row[2]), row[3], bool(row[4]))


def live_row_columns() -> list[Any]:
    """The columns of a :class:`LiveRow`, for a SELECT (more may follow them)."""
    return [
        jobs.c.job_id,
        jobs.c.status,
        jobs.c.attempt_no,
        jobs.c.parent_job_id,
        case((jobs.c.batch_total.is_not(None), 1), else_=0),
    ]


@Statement
def live_children(clock: DbClock) -> Any:
    """The live children of the parent ``c_parent`` as :class:`LiveRow` rows, locked
    (``ix_jobs_parent``): what cancelling the parent ends."""
    stmt = select(*live_row_columns()).where(
        jobs.c.parent_job_id == bindparam("c_parent", type_=String()),
        jobs.c.status.in_(sorted(LIVE)),
    )
    return _for_update(clock, stmt)


@Statement
def children_of(clock: DbClock) -> Any:
    """Every child of the parent ``c_parent`` (bound), in creation order (the order
    of the batch's targets): ``(jobId, status, targetType, targetId,
    outputSchemaVersion)``."""
    return (
        select(
            jobs.c.job_id,
            jobs.c.status,
            jobs.c.target_type,
            jobs.c.target_id,
            jobs.c.output_schema_version,
        )
        .where(jobs.c.parent_job_id == bindparam("c_parent", type_=String()))
        .order_by(jobs.c.seq)
    )
