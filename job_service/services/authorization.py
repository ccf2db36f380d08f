"""The per-user AI switch (reference §6): granted by default; turning it off cancels the user's
pending jobs, asks their leased ones to cancel and refuses new jobs until granted again."""

from __future__ import annotations

from dataclasses import dataclass

from airuntime_common.errors import AppError, ErrorCode
from job_service.services.admission import Admission
from job_service.services.cancellation import end_jobs
from job_service.services.core import Core
from job_service.services.inputs import AuthorizationView
from job_service.store import statements as st
from job_service.store.batch import new_batch, run_one
from job_service.store.engine import DbExec


@dataclass(frozen=True)
class _Revoked:
    cancelled: int
    cancel_requested: int


class Authorization:
    """Reads and sets the AI switch.

    Args:
        core: the shared core.
        admission: takes the user's admission lock row into existence.
    """

    def __init__(self, core: Core, admission: Admission) -> None:
        self.core = core
        self.admission = admission

    async def get(self, user_id: str) -> AuthorizationView:
        """Per-user AI authorization; granted by default (reference §6)."""
        sql = st.authorization_row.sql(self.core.clock, {"a_user": user_id})
        found = await self.core.store.read(lambda conn: run_one(conn, sql))
        if not found.rows:
            return AuthorizationView(True, None)
        granted, changed_at = found.rows[0]
        return AuthorizationView(bool(granted), changed_at)

    async def set(self, user_id: str, granted: bool) -> AuthorizationView:
        """Grant or revoke AI for a user; revoking cancels pending and flags leased jobs (reference §6).

        Serialised with the user's creates and re-runs by their admission lock
        (MySQL/MariaDB), so no new pending job slips past a revoke.

        Raises:
            AppError: ``INVALID_ARGUMENT`` without a user id.
        """
        if not user_id:
            raise AppError(ErrorCode.INVALID_ARGUMENT, "userId is required", {"field": "userId"})
        await self.admission.ensure_admission_row(user_id)
        clock = self.core.clock
        user = {"a_user": user_id}

        async def body(db: DbExec) -> AuthorizationView:
            batch = new_batch(db)
            batch.add(st.admission_lock.sql(clock, user))  # serialised with creates
            batch.add(st.upsert_authorization.sql(clock, {"user_id": user_id, "granted": granted}))
            live = batch.add(st.live_jobs_of_user.sql(clock, user)) if not granted else None
            out = await batch.run()
            revoked = _Revoked(0, 0)
            if live is not None:
                revoked = _Revoked(*await end_jobs(clock, db, f"user:{user_id}", out[live].rows))
            changed = (await run_one(db, st.authorization_row.sql(clock, user))).rows[0][1]
            return AuthorizationView(granted, changed, revoked.cancelled, revoked.cancel_requested)

        return await self.core.store.lean_tx(body)
