"""Deleting a material with its jobs' data, and erasing a user (reference §9.2).

Both are one transaction, serialised with the user's creates by their admission
lock (so no create builds a snapshot from data being deleted and commits after):

* a material's deletion ends the jobs on it, on its knowledge points or on a
  snapshot built from it (pending → cancelled, leased → ``cancelRequested``; the
  job rows stay, for history and cost) and deletes, through the learning port,
  the material and everything built from it. A result still sent for such a job
  writes nothing: its snapshot is gone, so the job ends ``cancelled`` and the
  result is refused ``INVALID_JOB_STATE`` (:mod:`.completion`).
* a user's erasure (:meth:`~job_service.services.erasure.Erasure.erase_user`) is in :mod:`.erasure`.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncSession

from airuntime_common.errors import AppError, ErrorCode
from job_service.services.admission import Admission
from job_service.services.cancellation import end_jobs
from job_service.services.core import Core
from job_service.store import statements as st
from job_service.store.batch import run_one


@dataclass(frozen=True)
class EndedJobs:
    """What a deletion did to live jobs: cancelled (were pending), asked to cancel (leased)."""

    cancelled: int
    cancel_requested: int


class Removal:
    """Deletes materials with what was built from them.

    Args:
        core: the shared core.
        admission: the users' admission lock rows.
    """

    def __init__(self, core: Core, admission: Admission) -> None:
        self.core = core
        self.admission = admission

    async def delete_material(self, user_id: str, material_id: str) -> EndedJobs:
        """Delete one of the user's materials and everything built from it (reference §9.2).

        Raises:
            AppError: ``INVALID_ARGUMENT`` without a user; ``NOT_FOUND`` when the
            material is unknown or another user's (nothing changed).
        """
        if not user_id:
            raise AppError(ErrorCode.INVALID_ARGUMENT, "userId is required", {"field": "userId"})
        await self.admission.ensure_admission_row(user_id)
        clock, learning = self.core.clock, self.core.learning

        async def body(session: AsyncSession) -> EndedJobs:
            await run_one(session, st.admission_lock.sql(clock, {"a_user": user_id}))
            scope = await learning.material_scope(session, user_id, material_id)
            stmt = st.jobs_of_material(
                clock,
                user_id=user_id,
                targets=scope.targets,
                snapshot_ids=sorted(scope.snapshot_ids),
            )
            rows = [tuple(r) for r in (await session.execute(stmt)).all()]
            ended = EndedJobs(*await end_jobs(clock, session, f"user:{user_id}", rows))
            await learning.delete_material(session, scope, [str(r[0]) for r in rows])
            return ended

        return await self.core.store.tx(body)
