"""SQL of credential_service: every statement on ``ai_model_credentials``.

Functions take an open :class:`AsyncSession`; the caller owns the transaction.
Rotation updates are guarded by the row's old ``key_id`` and ``nonce`` so a
concurrent replace or rotation is never overwritten.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import and_, delete, func, not_, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from credential_service.models import (
    REASON_UNDECRYPTABLE,
    STATUS_INVALID,
    STATUS_VALID,
    ModelCredential,
)

_UNDECRYPTABLE = and_(
    ModelCredential.status == STATUS_INVALID,
    ModelCredential.invalid_reason == REASON_UNDECRYPTABLE,
)


async def get_by_user(session: AsyncSession, user_id: str) -> ModelCredential | None:
    """The user's credential row, or None."""
    result = await session.execute(
        select(ModelCredential).where(ModelCredential.user_id == user_id)
    )
    return result.scalar_one_or_none()


async def get_by_id(session: AsyncSession, credential_id: str) -> ModelCredential | None:
    """A credential row by id, or None."""
    return await session.get(ModelCredential, credential_id)


async def replace(session: AsyncSession, row: ModelCredential) -> None:
    """Delete the user's current row (if any) and insert ``row`` in the same transaction."""
    await session.execute(delete(ModelCredential).where(ModelCredential.user_id == row.user_id))
    session.add(row)
    await session.flush()


async def delete_by_user(session: AsyncSession, user_id: str) -> int:
    """Delete the user's row; returns how many rows went (0 or 1)."""
    result = await session.execute(
        delete(ModelCredential).where(ModelCredential.user_id == user_id)
    )
    return int(getattr(result, "rowcount", 0) or 0)


async def mark_invalid(
    session: AsyncSession, credential_id: str, reason: str, now: datetime
) -> int:
    """Set ``status='invalid'`` and the reason; returns rows matched (0 when unknown)."""
    result = await session.execute(
        update(ModelCredential)
        .where(ModelCredential.credential_id == credential_id)
        .values(status=STATUS_INVALID, invalid_reason=reason, updated_at=now)
    )
    return int(getattr(result, "rowcount", 0) or 0)


async def rotation_candidates(
    session: AsyncSession, old_key_ids: Sequence[str], limit: int
) -> Sequence[ModelCredential]:
    """Up to ``limit`` rows sealed by one of ``old_key_ids`` (configured, not current),
    skipping rows already known to be undecryptable; ordered by id so batches progress."""
    if not old_key_ids:
        return []
    result = await session.execute(
        select(ModelCredential)
        .where(ModelCredential.key_id.in_(list(old_key_ids)), not_(_UNDECRYPTABLE))
        .order_by(ModelCredential.credential_id)
        .limit(limit)
    )
    return result.scalars().all()


async def store_resealed(
    session: AsyncSession,
    *,
    credential_id: str,
    old_key_id: str,
    old_nonce: bytes,
    key_id: str,
    nonce: bytes,
    ciphertext: bytes,
    now: datetime,
) -> bool:
    """Swap in a resealed ciphertext if the row still holds the one that was read.

    Returns:
        True when the row was updated; False when it changed meanwhile (replaced,
        deleted or rotated by someone else), which is not an error.
    """
    result = await session.execute(
        update(ModelCredential)
        .where(
            ModelCredential.credential_id == credential_id,
            ModelCredential.key_id == old_key_id,
            ModelCredential.nonce == old_nonce,
        )
        .values(key_id=key_id, nonce=nonce, ciphertext=ciphertext, updated_at=now)
    )
    return bool(getattr(result, "rowcount", 0))


async def mark_undecryptable(
    session: AsyncSession, *, credential_id: str, old_nonce: bytes, now: datetime
) -> bool:
    """Flag a row whose ciphertext failed authentication (if it is still that ciphertext)."""
    result = await session.execute(
        update(ModelCredential)
        .where(ModelCredential.credential_id == credential_id, ModelCredential.nonce == old_nonce)
        .values(status=STATUS_INVALID, invalid_reason=REASON_UNDECRYPTABLE, updated_at=now)
    )
    return bool(getattr(result, "rowcount", 0))


async def count_not_on(session: AsyncSession, current_key_id: str) -> int:
    """Rows still sealed by another key than ``current_key_id`` (undecryptable ones excluded)."""
    result = await session.execute(
        select(func.count())
        .select_from(ModelCredential)
        .where(ModelCredential.key_id != current_key_id, not_(_UNDECRYPTABLE))
    )
    return int(result.scalar_one())


async def key_id_counts(session: AsyncSession) -> dict[str, int]:
    """How many rows each key id seals (for ``rotate-keys`` output)."""
    result = await session.execute(
        select(ModelCredential.key_id, func.count()).group_by(ModelCredential.key_id)
    )
    return {str(kid): int(n) for kid, n in result.all()}


__all__ = [
    "STATUS_INVALID",
    "STATUS_VALID",
    "count_not_on",
    "delete_by_user",
    "get_by_id",
    "get_by_user",
    "key_id_counts",
    "mark_invalid",
    "mark_undecryptable",
    "replace",
    "rotation_candidates",
    "store_resealed",
]
