"""The learning-data room as the job core sees it: :class:`LearningModulePort` implements
:class:`job_service.services.ports.LearningPort` over this package's modules."""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from job_service.learning import plans, results, snapshots
from job_service.services.ports import SnapshotRead
from job_service.store.cache import Sql
from job_service.store.clock import DbClock
from job_service.store.engine import DbExec


class LearningModulePort:
    """Snapshots, generation plans and business rows, in the caller's transaction (SPEC §5)."""

    async def build_snapshot(self, session: AsyncSession, **kw: Any) -> str:
        """:func:`job_service.learning.snapshots.build_snapshot`."""
        return await snapshots.build_snapshot(session, **kw)

    def snapshot_read(self, snapshot_id: str) -> SnapshotRead:
        """:func:`job_service.learning.snapshots.snapshot_read`."""
        return snapshots.snapshot_read(snapshot_id)

    def generation_plan(self, clock: DbClock, **kw: Any) -> Sql | None:
        """:func:`job_service.learning.plans.plan_insert`."""
        return plans.plan_insert(**kw)

    async def prepare_result(self, db: DbExec, **kw: Any) -> results.PreparedResult:
        """:func:`job_service.learning.results.prepare_result`."""
        return await results.prepare_result(db, **kw)
