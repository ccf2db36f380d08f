"""A batch's ``targetsOf`` (reference §10.3): the user's materials or knowledge points,
in creation order (oldest first), as the targets of its children."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from airuntime_common.errors import AppError, ErrorCode, invalid_argument
from job_service.learning.common import require_user
from job_service.learning.tables import KnowledgePoint, Material


async def targets_of(
    session: AsyncSession, user_id: str, target_type: str, material_id: str | None, limit: int
) -> list[str]:
    """The ids of the user's materials (``target_type`` ``material``) or knowledge points
    (``knowledge_point``; only ``material_id``'s when given), oldest first (creation
    time, then id), at most ``limit``. Reads ``ix_materials_user_created`` /
    ``ix_knowledge_points_user`` (``ix_knowledge_points_material`` with a material).

    Raises:
        AppError: ``INVALID_ARGUMENT`` for another target type, or a ``material_id``
            with ``material``; ``NOT_FOUND`` when ``material_id`` is not the user's.
    """
    require_user(user_id)
    if target_type == "material":
        if material_id is not None:
            raise invalid_argument(
                "targetsOf.materialId goes with targetType knowledge_point only",
                field="targetsOf.materialId",
            )
        stmt = (
            select(Material.material_id)
            .where(Material.user_id == user_id)
            .order_by(Material.created_at, Material.material_id)
        )
    elif target_type == "knowledge_point":
        stmt = (
            select(KnowledgePoint.knowledge_point_id)
            .where(KnowledgePoint.user_id == user_id)
            .order_by(KnowledgePoint.created_at, KnowledgePoint.knowledge_point_id)
        )
        if material_id is not None:
            owner = await session.execute(
                select(Material.material_id).where(
                    Material.material_id == material_id, Material.user_id == user_id
                )
            )
            if owner.first() is None:
                raise AppError(
                    ErrorCode.NOT_FOUND,
                    f"material {material_id!r} not found",
                    {"materialId": material_id},
                )
            stmt = stmt.where(KnowledgePoint.material_id == material_id)
    else:
        raise invalid_argument(
            "targetsOf.targetType must be material or knowledge_point",
            field="targetsOf.targetType",
            value=target_type,
        )
    return [str(i) for i in (await session.execute(stmt.limit(limit))).scalars()]
