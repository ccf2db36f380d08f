"""Materials: a study text split into ordered blocks (reference §3.1 ``/v1/materials``).

Every function runs inside the caller's transaction (it never commits) and
raises :class:`~airuntime_common.errors.AppError` for every refusal: an unknown
id, or another user's material, → ``NOT_FOUND`` (never 403, so a user cannot
probe other users' ids; never 400, reference §3); a bad field → ``INVALID_ARGUMENT``
with the offending field in ``details``; content over 1 MiB → ``PAYLOAD_TOO_LARGE``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from sqlalchemy import and_, insert, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from airuntime_common.canonical import content_hash
from airuntime_common.errors import AppError, ErrorCode, invalid_argument
from airuntime_common.timeutil import rfc3339
from job_service.learning.common import db_now, new_id, require_user
from job_service.learning.markdown_split import split_document
from job_service.learning.paging import (
    decode_after,
    decode_offset,
    encode_after,
    encode_offset,
    page_size,
)
from job_service.learning.tables import Material, MaterialBlock

MAX_TITLE_CHARS: Final = 500
#: Most blocks one page of ``GET /v1/materials/{id}`` holds (reference §9.2).
MAX_BLOCKS_PAGE: Final = 1000


@dataclass(frozen=True)
class BlockView:
    """One block of a material (``ordinal`` from 0, in document order)."""

    block_id: str
    material_id: str
    ordinal: int
    kind: str
    text: str

    def to_json(self) -> dict[str, Any]:
        """camelCase view: ``{"blockId","ordinal","kind","text"}``."""
        return {
            "blockId": self.block_id,
            "ordinal": self.ordinal,
            "kind": self.kind,
            "text": self.text,
        }


@dataclass(frozen=True)
class MaterialView:
    """A material with its blocks."""

    material_id: str
    user_id: str
    title: str
    created_at: datetime
    blocks: list[BlockView] = field(default_factory=list)
    block_count: int = 0
    #: The next page of blocks (paged reads only); None on the last page.
    next_blocks_page_token: str | None = None

    def to_json(self) -> dict[str, Any]:
        """camelCase view: ``{"materialId","userId","title","createdAt","blocks":[…]}``."""
        return {
            "materialId": self.material_id,
            "userId": self.user_id,
            "title": self.title,
            "createdAt": rfc3339(self.created_at),
            "blocks": [b.to_json() for b in self.blocks],
        }


async def create_material(
    session: AsyncSession, user_id: str, title: str, content: str
) -> MaterialView:
    """Store a material and its blocks (split by :mod:`~job_service.learning.markdown_split`).

    Args:
        session: the caller's session; not committed here.
        user_id: the owner.
        title: 1..500 characters after trimming.
        content: plain text or Markdown, ≤ 1 MiB of UTF-8.

    Returns:
        The stored material with its blocks (ordinals 0..n-1).

    Raises:
        AppError: ``INVALID_ARGUMENT`` (empty/too long title, empty content),
        ``PAYLOAD_TOO_LARGE`` (content over 1 MiB).
    """
    require_user(user_id)
    title = (title or "").strip()
    if not title or len(title) > MAX_TITLE_CHARS:
        raise invalid_argument(
            f"title must be 1..{MAX_TITLE_CHARS} characters", field="title", length=len(title)
        )
    # CPU-bound (about 2 s for 1 MiB of short paragraphs): keep the event loop responsive.
    split = await asyncio.to_thread(split_document, content)
    now = db_now()
    material_id = new_id()
    session.add(
        Material(
            material_id=material_id,
            user_id=user_id,
            title=title,
            content_hash=content_hash(content),
            block_count=len(split),
            created_at=now,
        )
    )
    await session.flush()
    blocks = [
        BlockView(new_id(), material_id, ordinal, b.kind, b.text) for ordinal, b in enumerate(split)
    ]
    rows = [
        {
            "block_id": b.block_id,
            "material_id": material_id,
            "user_id": user_id,
            "ordinal": b.ordinal,
            "kind": b.kind,
            "text": b.text,
            "char_count": len(b.text),
        }
        for b in blocks
    ]
    for start in range(0, len(rows), 1000):
        await session.execute(insert(MaterialBlock), rows[start : start + 1000])
    return MaterialView(material_id, user_id, title, now, blocks, len(blocks))


async def get_material(
    session: AsyncSession,
    user_id: str,
    material_id: str,
    *,
    blocks_page_size: int = 0,
    blocks_page_token: str = "",
) -> MaterialView:
    """Read one of the user's materials with its blocks in order (reference §3.1, §9.2).

    Args:
        blocks_page_size: 1..1000 blocks per page; 0 = every block (no paging).
        blocks_page_token: the previous page's ``next_blocks_page_token`` (paged reads).

    Raises:
        AppError: ``NOT_FOUND`` when the id is unknown or the material is another user's;
        ``INVALID_ARGUMENT`` for a page size out of range or a bad token (checked first).
    """
    start = 0
    if blocks_page_size or blocks_page_token:
        if not 1 <= blocks_page_size <= MAX_BLOCKS_PAGE:
            raise invalid_argument(
                f"blocksPageSize must be 1..{MAX_BLOCKS_PAGE}",
                field="blocksPageSize",
                value=blocks_page_size,
            )
        if blocks_page_token:
            start = decode_offset(blocks_page_token, field="blocksPageToken")
    material = await owned_material(session, user_id, material_id)
    stmt = (
        select(
            MaterialBlock.block_id,
            MaterialBlock.material_id,
            MaterialBlock.ordinal,
            MaterialBlock.kind,
            MaterialBlock.text,
        )
        .where(MaterialBlock.material_id == material.material_id, MaterialBlock.ordinal >= start)
        .order_by(MaterialBlock.ordinal)
    )
    if blocks_page_size:
        stmt = stmt.limit(blocks_page_size + 1)
    blocks = [BlockView(r[0], r[1], r[2], r[3], r[4]) for r in await session.execute(stmt)]
    token = None
    if blocks_page_size and len(blocks) > blocks_page_size:
        blocks = blocks[:blocks_page_size]
        token = encode_offset(blocks[-1].ordinal + 1)
    return MaterialView(
        material.material_id,
        material.user_id,
        material.title,
        material.created_at,
        blocks,
        material.block_count,
        token,
    )


async def list_materials(
    session: AsyncSession, user_id: str, *, page_size_value: int, page_token: str
) -> tuple[list[MaterialView], str | None]:
    """A page of the user's materials, newest first, without their blocks (reference §9.2).

    Args:
        page_size_value: 1..100; 0 → 20.
        page_token: the previous page's token, or empty.

    Returns:
        ``(materials, next_page_token)`` (None on the last page); each view's
        ``block_count`` is set, its ``blocks`` empty.

    Raises:
        AppError: ``INVALID_ARGUMENT`` for a page size out of range or a bad token.
    """
    require_user(user_id)
    size = page_size(page_size_value)
    stmt = select(Material).where(Material.user_id == user_id)
    if page_token:
        at, last_id = decode_after(page_token)
        stmt = stmt.where(
            or_(
                Material.created_at < at,
                and_(Material.created_at == at, Material.material_id < last_id),
            )
        )
    rows = list(
        (
            await session.execute(
                stmt.order_by(Material.created_at.desc(), Material.material_id.desc()).limit(
                    size + 1
                )
            )
        ).scalars()
    )
    token = None
    if len(rows) > size:
        rows = rows[:size]
        token = encode_after(rows[-1].created_at, rows[-1].material_id)
    views = [
        MaterialView(m.material_id, m.user_id, m.title, m.created_at, [], m.block_count)
        for m in rows
    ]
    return views, token


async def owned_material(session: AsyncSession, user_id: str, material_id: str) -> Material:
    """The user's material row.

    Raises:
        AppError: ``NOT_FOUND`` when unknown or another user's.
    """
    require_user(user_id)
    material = None
    if material_id:
        material = (
            await session.execute(
                select(Material).where(
                    Material.material_id == material_id, Material.user_id == user_id
                )
            )
        ).scalar_one_or_none()
    if material is None:
        raise AppError(
            ErrorCode.NOT_FOUND, f"material {material_id!r} not found", {"materialId": material_id}
        )
    return material
