"""The learning-data room as the job core sees it: :class:`LearningModulePort` implements
:class:`job_service.services.ports.LearningPort` over this package's modules."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from job_service.learning import deletion, plans, results, snapshots, targets
from job_service.learning.tables import AiSnapshot
from job_service.services.ports import MaterialScopeView, SnapshotRead, SnapshotsRead
from job_service.store.cache import Sql
from job_service.store.clock import DbClock
from job_service.store.engine import DbExec


class LearningModulePort:
    """Snapshots, generation plans and business rows, in the caller's transaction (reference §5);
    deleting and erasing the learner's data (reference §9.2, :mod:`.deletion`)."""

    async def build_snapshot(self, session: AsyncSession, **kw: Any) -> str:
        """:func:`job_service.learning.snapshots.build_snapshot`."""
        return await snapshots.build_snapshot(session, **kw)

    async def build_snapshots(self, session: AsyncSession, **kw: Any) -> list[str]:
        """:func:`job_service.learning.snapshots.build_snapshots`."""
        return await snapshots.build_snapshots(session, **kw)

    async def targets_of(
        self,
        session: AsyncSession,
        user_id: str,
        target_type: str,
        material_id: str | None,
        limit: int,
    ) -> list[str]:
        """:func:`job_service.learning.targets.targets_of`."""
        return await targets.targets_of(session, user_id, target_type, material_id, limit)

    def snapshot_read(self, snapshot_id: str) -> SnapshotRead:
        """:func:`job_service.learning.snapshots.snapshot_read`."""
        return snapshots.snapshot_read(snapshot_id)

    def snapshots_read(self, snapshot_ids: Sequence[str]) -> SnapshotsRead:
        """:func:`job_service.learning.snapshots.snapshots_read`."""
        return snapshots.snapshots_read(snapshot_ids)

    def generation_plan(self, clock: DbClock, **kw: Any) -> Sql | None:
        """:func:`job_service.learning.plans.plan_insert`."""
        return plans.plan_insert(**kw)

    async def prepare_result(self, db: DbExec, **kw: Any) -> results.PreparedResult:
        """:func:`job_service.learning.results.prepare_result`."""
        return await results.prepare_result(db, **kw)

    async def snapshot_stored(self, db: DbExec, snapshot_id: str) -> bool:
        """Whether ``ai_snapshots`` still holds the row (never the process's cache)."""
        if not snapshot_id:
            return False
        found = await db.execute(
            select(AiSnapshot.snapshot_id).where(AiSnapshot.snapshot_id == snapshot_id)
        )
        return found.first() is not None

    async def material_scope(
        self, session: AsyncSession, user_id: str, material_id: str
    ) -> MaterialScopeView:
        """:func:`job_service.learning.deletion.material_scope`."""
        return await deletion.material_scope(session, user_id, material_id)

    async def delete_material(
        self, session: AsyncSession, scope: MaterialScopeView, job_ids: Sequence[str]
    ) -> None:
        """:func:`job_service.learning.deletion.delete_material`."""
        await deletion.delete_material(session, cast(deletion.MaterialScope, scope), job_ids)

    async def erase_user(self, session: AsyncSession, user_id: str, job_ids: Sequence[str]) -> None:
        """:func:`job_service.learning.deletion.erase_user`."""
        await deletion.erase_user(session, user_id, job_ids)
