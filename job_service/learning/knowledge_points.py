"""Knowledge points: named sets of blocks of one material (reference §3.1 ``/v1/knowledge-points``).

Refusals as in :mod:`job_service.learning.materials`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from sqlalchemy import and_, insert, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from airuntime_common.errors import AppError, ErrorCode, invalid_argument
from airuntime_common.timeutil import rfc3339
from job_service.learning.common import db_now, new_id, require_user, user_rows
from job_service.learning.materials import owned_material
from job_service.learning.paging import decode_after, encode_after, page_size
from job_service.learning.tables import KnowledgePoint, KnowledgePointBlock, MaterialBlock

#: Most blocks one knowledge point may link.
MAX_KP_BLOCKS: Final = 500
MAX_NAME_CHARS: Final = 500


@dataclass(frozen=True)
class KnowledgePointView:
    """A knowledge point and the ids of its linked blocks (in the order given)."""

    knowledge_point_id: str
    user_id: str
    material_id: str
    name: str
    block_ids: list[str]
    created_at: datetime

    def to_json(self) -> dict[str, Any]:
        """camelCase view: ``{"knowledgePointId","userId","materialId","name","blockIds","createdAt"}``."""
        return {
            "knowledgePointId": self.knowledge_point_id,
            "userId": self.user_id,
            "materialId": self.material_id,
            "name": self.name,
            "blockIds": list(self.block_ids),
            "createdAt": rfc3339(self.created_at),
        }


async def create_knowledge_point(
    session: AsyncSession,
    user_id: str,
    material_id: str,
    name: str,
    block_ids: Sequence[str],
) -> KnowledgePointView:
    """Define a knowledge point over blocks of one of the user's materials.

    Args:
        session: the caller's session; not committed here.
        user_id: the owner.
        material_id: the material every block must belong to.
        name: 1..500 characters after trimming.
        block_ids: 1..500 block ids of that material (repeats are ignored).

    Raises:
        AppError: ``NOT_FOUND`` when the material is unknown or another user's, or
        when block ids are (listed in ``details.unknownBlockIds``, reference §3);
        ``INVALID_ARGUMENT`` for a bad name, no blocks, or the user's blocks of
        another material (listed in ``details.otherMaterialBlockIds``).
    """
    material = await owned_material(session, user_id, material_id)
    name = (name or "").strip()
    if not name or len(name) > MAX_NAME_CHARS:
        raise invalid_argument(f"name must be 1..{MAX_NAME_CHARS} characters", field="name")
    ids = list(dict.fromkeys(block_ids))
    if not ids or len(ids) > MAX_KP_BLOCKS:
        raise invalid_argument(
            f"blockIds must name 1..{MAX_KP_BLOCKS} blocks", field="blockIds", count=len(ids)
        )
    owned = await user_rows(
        session,
        MaterialBlock.block_id,
        MaterialBlock.material_id,
        MaterialBlock.user_id,
        user_id,
        ids,
    )
    unknown = [b for b in ids if b not in owned]
    if unknown:
        raise AppError(
            ErrorCode.NOT_FOUND,
            f"blocks not found: {', '.join(unknown[:10])}",
            {"field": "blockIds", "unknownBlockIds": unknown},
        )
    elsewhere = [b for b in ids if owned[b] != material.material_id]
    if elsewhere:
        raise invalid_argument(
            f"blockIds are not blocks of material {material.material_id}:"
            f" {', '.join(elsewhere[:10])}",
            field="blockIds",
            otherMaterialBlockIds=elsewhere,
        )
    now = db_now()
    kp_id = new_id()
    session.add(
        KnowledgePoint(
            knowledge_point_id=kp_id,
            user_id=user_id,
            material_id=material.material_id,
            name=name,
            created_at=now,
        )
    )
    await session.flush()
    await session.execute(
        insert(KnowledgePointBlock),
        [{"knowledge_point_id": kp_id, "block_id": b, "position": i} for i, b in enumerate(ids)],
    )
    return KnowledgePointView(kp_id, user_id, material.material_id, name, ids, now)


async def owned_knowledge_point(
    session: AsyncSession, user_id: str, knowledge_point_id: str
) -> KnowledgePoint:
    """The user's knowledge point row.

    Raises:
        AppError: ``NOT_FOUND`` when unknown or another user's.
    """
    require_user(user_id)
    kp = None
    if knowledge_point_id:
        kp = (
            await session.execute(
                select(KnowledgePoint).where(
                    KnowledgePoint.knowledge_point_id == knowledge_point_id,
                    KnowledgePoint.user_id == user_id,
                )
            )
        ).scalar_one_or_none()
    if kp is None:
        raise AppError(
            ErrorCode.NOT_FOUND,
            f"knowledge point {knowledge_point_id!r} not found",
            {"knowledgePointId": knowledge_point_id},
        )
    return kp


async def get_knowledge_point(
    session: AsyncSession, user_id: str, knowledge_point_id: str
) -> KnowledgePointView:
    """Read one of the user's knowledge points.

    Raises:
        AppError: ``NOT_FOUND`` when unknown or another user's.
    """
    kp = await owned_knowledge_point(session, user_id, knowledge_point_id)
    block_ids = list(
        (
            await session.execute(
                select(KnowledgePointBlock.block_id)
                .where(KnowledgePointBlock.knowledge_point_id == kp.knowledge_point_id)
                .order_by(KnowledgePointBlock.position)
            )
        ).scalars()
    )
    return KnowledgePointView(
        kp.knowledge_point_id, kp.user_id, kp.material_id, kp.name, block_ids, kp.created_at
    )


async def list_knowledge_points(
    session: AsyncSession,
    user_id: str,
    *,
    material_id: str | None,
    page_size_value: int,
    page_token: str,
) -> tuple[list[KnowledgePointView], str | None]:
    """A page of the user's knowledge points, newest first (reference §9.2).

    Args:
        material_id: only this material's (it must be the user's), or None for all.
        page_size_value: 1..100; 0 → 20.
        page_token: the previous page's token, or empty.

    Returns:
        ``(knowledge points with their block ids, next_page_token or None)``.

    Raises:
        AppError: ``INVALID_ARGUMENT`` for a bad page size or token; ``NOT_FOUND``
        for a material that is unknown or another user's.
    """
    require_user(user_id)
    size = page_size(page_size_value)
    after = decode_after(page_token) if page_token else None
    stmt = select(KnowledgePoint).where(KnowledgePoint.user_id == user_id)
    if material_id is not None:
        material = await owned_material(session, user_id, material_id)
        stmt = stmt.where(KnowledgePoint.material_id == material.material_id)
    if after is not None:
        at, last_id = after
        stmt = stmt.where(
            or_(
                KnowledgePoint.created_at < at,
                and_(KnowledgePoint.created_at == at, KnowledgePoint.knowledge_point_id < last_id),
            )
        )
    order = (KnowledgePoint.created_at.desc(), KnowledgePoint.knowledge_point_id.desc())
    rows = list((await session.execute(stmt.order_by(*order).limit(size + 1))).scalars())
    token = None
    if len(rows) > size:
        rows = rows[:size]
        token = encode_after(rows[-1].created_at, rows[-1].knowledge_point_id)
    links: dict[str, list[str]] = {kp.knowledge_point_id: [] for kp in rows}
    if links:
        found = await session.execute(
            select(KnowledgePointBlock.knowledge_point_id, KnowledgePointBlock.block_id)
            .where(KnowledgePointBlock.knowledge_point_id.in_(list(links)))
            .order_by(KnowledgePointBlock.knowledge_point_id, KnowledgePointBlock.position)
        )
        for kp_id, block_id in found.all():
            links[str(kp_id)].append(str(block_id))
    views = [
        KnowledgePointView(
            kp.knowledge_point_id,
            kp.user_id,
            kp.material_id,
            kp.name,
            links[kp.knowledge_point_id],
            kp.created_at,
        )
        for kp in rows
    ]
    return views, token
