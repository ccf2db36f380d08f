"""Generation plans (reference §5): what a quiz or flashcard job was asked for, and what it wrote.

A job type with a ``plan_table`` (:mod:`airuntime_common.jobtypes`) gets one
plan row at create: its target, ``requested_count`` (the params' ``count``)
and every other column of the table from the params of the same name in
camelCase (``difficulty``, ``question_types`` ← ``questionTypes``). On success
the same transaction records how many items the output had (``generated``),
how many rows it wrote (``written``: the business rows of this job) and how
many it skipped as the user's duplicates.
"""

from __future__ import annotations

from typing import Any, Final

from sqlalchemy import Integer, String, Table, bindparam, func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from airuntime_common import jobtypes
from airuntime_common.timeutil import rfc3339
from job_service.learning.common import db_now
from job_service.learning.tables import model_of
from job_service.store.cache import Sql

#: Plan columns that do not come from the params.
_OWN_COLUMNS: Final = frozenset(
    {"job_id", "user_id", "target_type", "target_id", "requested_count", "generated",
     "written", "skipped_duplicates", "created_at", "completed_at"}
)  # fmt: skip
#: The defaults of a plan whose params lack ``count`` (reference §3.1).
DEFAULT_COUNT: Final = 5


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


def _plan_table(job_type: str) -> Table | None:
    spec = jobtypes.find(job_type)
    if spec is None or spec.plan_table is None:
        return None
    return model_of(spec.plan_table).__table__  # type: ignore[no-any-return]


def plan_insert(
    *,
    job_id: str,
    user_id: str,
    job_type: str,
    target_type: str,
    target_id: str,
    params: dict[str, Any] | None,
) -> Sql | None:
    """The INSERT of a new job's plan row (module doc), or None when its type keeps none."""
    table = _plan_table(job_type)
    if table is None:
        return None
    # the params as stored (the type's defaults filled): a create normalised them already
    params = jobtypes.get(job_type).params.model_validate(dict(params or {})).model_dump()
    row: dict[str, Any] = {
        "job_id": job_id,
        "user_id": user_id,
        "target_type": target_type,
        "target_id": target_id,
        "requested_count": int(params.get("count", DEFAULT_COUNT)),
        "created_at": db_now(),
    }
    for column in table.c:
        if column.key not in _OWN_COLUMNS and _camel(column.key) in params:
            value = params[_camel(column.key)]
            row[column.key] = list(value) if isinstance(value, list | tuple) else value
    return Sql(("plan_insert", table.name, tuple(sorted(row))), lambda: insert(table), row)


async def create_generation_plan(session: AsyncSession, **kw: Any) -> None:
    """Write a new job's plan row (arguments as :func:`plan_insert`) in the caller's
    transaction; no-op for a type without plans."""
    sql = plan_insert(**kw)
    if sql is not None:
        await session.execute(sql.statement(), dict(sql.params))


def plan_outcome(job_type: str, business: Table, *, job_id: str, generated: int) -> Sql | None:
    """The UPDATE recording a plan's outcome once the result's business rows are written
    (in the same batch, after them): ``written`` counts this job's rows in
    ``business``, so it reads what the batch's ``INSERT IGNORE`` statements did.
    None when the type keeps no plan."""
    table = _plan_table(job_type)
    if table is None:
        return None

    def build() -> Any:
        written = (
            select(func.count())
            .select_from(business)
            .where(business.c.job_id == bindparam("p_job_id", type_=String()))
            .scalar_subquery()
        )
        return (
            update(table)
            .where(table.c.job_id == bindparam("p_job_id", type_=String()))
            .values(
                generated=bindparam("p_generated", type_=Integer()),
                written=written,
                skipped_duplicates=bindparam("p_generated", type_=Integer()) - written,
                completed_at=bindparam("p_at"),
            )
        )

    params = {"p_job_id": job_id, "p_generated": generated, "p_at": db_now()}
    return Sql(("plan_outcome", table.name, business.name), build, params)


async def get_generation_plan(session: AsyncSession, job_id: str) -> dict[str, Any] | None:
    """camelCase view of a job's generation plan (its params columns included), or None."""
    for spec in jobtypes.specs():
        if spec.plan_table is None:
            continue
        model = model_of(spec.plan_table)
        row: Any = (
            await session.execute(select(model).where(model.job_id == job_id))
        ).scalar_one_or_none()
        if row is None:
            continue
        view: dict[str, Any] = {
            "jobId": row.job_id,
            "userId": row.user_id,
            "targetType": row.target_type,
            "targetId": row.target_id,
            "requestedCount": row.requested_count,
            "generated": row.generated,
            "written": row.written,
            "skippedDuplicates": row.skipped_duplicates,
            "createdAt": rfc3339(row.created_at),
            "completedAt": rfc3339(row.completed_at),
        }
        for column in model.__table__.c:
            if column.key not in _OWN_COLUMNS:
                value = getattr(row, column.key)
                view[_camel(column.key)] = list(value) if isinstance(value, list) else value
        return view
    return None
