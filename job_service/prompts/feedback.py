"""Learners' feedback on their generated items (reference §10.4
``POST /v1/ai/results/{kind}/{itemId}/feedback``).

A rating is +1 or -1 on one of the caller's own items; rating it again replaces
the rating. The row keeps the item's job's type and ``promptVersion`` (an item
exists only once its job succeeded, so the version is final), which the stats
count it under.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.dialects.mysql import insert as mysql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from airuntime_common import jobtypes
from airuntime_common.errors import AppError, ErrorCode, invalid_argument
from job_service.learning.tables import business_kinds
from job_service.prompts.tables import result_feedback
from job_service.store.clock import DbClock
from job_service.store.engine import DbExec
from job_service.store.tables import jobs

#: The ratings a learner may give.
RATINGS = (1, -1)


async def set_feedback(
    db: DbExec, clock: DbClock, user_id: str, kind: str, item_id: str, rating: int
) -> None:
    """Record ``user_id``'s ``rating`` of their item ``item_id`` of ``kind``, in the
    caller's transaction.

    Raises:
        AppError: INVALID_ARGUMENT (no user, an unknown kind, a rating other than 1 or
            -1); NOT_FOUND (no such item of the user's: unknown, another user's, of
            another kind).
    """
    if not user_id:
        raise invalid_argument("userId is required", field="userId")
    if rating not in RATINGS:
        raise invalid_argument("rating is 1 or -1", field="rating")
    kinds = business_kinds()
    if kind not in kinds:
        raise invalid_argument(f"kind must be one of {', '.join(kinds)}", field="kind")
    model, _ = kinds[kind]
    job_id = None
    if item_id:
        job_id = (
            await db.execute(
                select(model.job_id).where(model.id == item_id, model.user_id == user_id)
            )
        ).scalar()
    if job_id is None:
        raise AppError(ErrorCode.NOT_FOUND, f"item {item_id!r} not found", {"itemId": item_id})
    job = (
        await db.execute(
            select(jobs.c.job_type, jobs.c.prompt_version).where(jobs.c.job_id == job_id)
        )
    ).first()
    spec = jobtypes.by_kind(kind)
    job_type = str(job.job_type) if job is not None else (spec.name if spec else kind)
    row = {
        "user_id": user_id,
        "kind": kind,
        "item_id": item_id,
        "job_id": str(job_id),
        "job_type": job_type,
        "prompt_version": job.prompt_version if job is not None else None,
        "rating": rating,
    }
    now = clock.now()
    replaced = ("job_id", "job_type", "prompt_version", "rating")
    upsert: Any
    if clock.is_sqlite:
        stmt = sqlite_insert(result_feedback).values(**row, created_at=now, updated_at=now)
        upsert = stmt.on_conflict_do_update(
            index_elements=["user_id", "kind", "item_id"],
            set_={**{k: stmt.excluded[k] for k in replaced}, "updated_at": now},
        )
    else:
        mstmt = mysql_insert(result_feedback).values(**row, created_at=now, updated_at=now)
        upsert = mstmt.on_duplicate_key_update(
            {**{k: mstmt.inserted[k] for k in replaced}, "updated_at": now}
        )
    await db.execute(upsert)


async def erase_user_feedback(db: DbExec, user_id: str) -> None:
    """Delete every rating ``user_id`` gave (reference §9.2 ``DELETE /v1/me``), in the
    caller's transaction."""
    await db.execute(delete(result_feedback).where(result_feedback.c.user_id == user_id))
