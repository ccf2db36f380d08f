"""The SQL of creating jobs as a set (reference §10.3: a batch's children and parent in
one insert batch; one job is a set of one): the parent's INSERT, every new job's
creation event in one statement, and the rows read back in creation order. A job's
own INSERT is :data:`job_service.store.statements.insert_job`."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Integer, String, bindparam, insert, select

from airuntime_common.states import JobStatus
from job_service.store.cache import Statement
from job_service.store.clock import DbClock
from job_service.store.tables import PARENT_AVAILABLE_AT, events, jobs
from job_service.store.transitions import EVENT_COLUMNS


@Statement
def insert_parent(clock: DbClock) -> Any:
    """INSERT of a batch's parent row (reference §10.3): as :data:`~job_service.store.statements.insert_job`, but
    ``available_at`` and ``parked_until`` are
    :data:`~job_service.store.tables.PARENT_AVAILABLE_AT` (never claimable, out of the
    claim's range); values: every other column."""
    now = clock.now()
    return insert(jobs).values(
        available_at=PARENT_AVAILABLE_AT,
        parked_until=PARENT_AVAILABLE_AT,
        created_at=now,
        updated_at=now,
    )


@Statement
def creation_events(clock: DbClock) -> Any:
    """The creation event (from NULL to pending, attempt 0, ``at`` its ``updatedAt``) of
    every job of the bound ``ids`` (list), by actor ``e_actor``, in creation order."""
    source = (
        select(
            jobs.c.job_id,
            bindparam("e_from", None, type_=String()),
            bindparam("e_to", JobStatus.PENDING.value, type_=String()),
            bindparam("e_code", None, type_=String()),
            bindparam("e_actor", type_=String()),
            bindparam("e_attempt", 0, type_=Integer()),
            jobs.c.updated_at,
        )
        .where(jobs.c.job_id.in_(bindparam("ids", expanding=True)))
        .order_by(jobs.c.seq)
    )
    return insert(events).from_select(EVENT_COLUMNS, source)


@Statement
def jobs_in_order(clock: DbClock) -> Any:
    """The jobs of the bound ``ids`` (list), every column, in creation order."""
    return (
        select(jobs).where(jobs.c.job_id.in_(bindparam("ids", expanding=True))).order_by(jobs.c.seq)
    )
