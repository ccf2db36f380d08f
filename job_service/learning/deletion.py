"""Deleting the learner's data (reference §9.2): a knowledge point, a business item, a
material with everything built from it, and every learning row of a user.

Every function runs in the caller's transaction (it never commits) and reads
ownership first: an unknown id, or another user's, is ``NOT_FOUND`` and nothing is
deleted. The job rows are the job core's; what it needs to know about them
(which jobs a material's deletion touches) comes back as :class:`MaterialScope`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from airuntime_common.errors import AppError, ErrorCode, invalid_argument
from job_service.learning.common import require_user
from job_service.learning.knowledge_points import owned_knowledge_point
from job_service.learning.materials import owned_material
from job_service.learning.snapshots import SNAPSHOT_CACHE
from job_service.learning.tables import (
    AiFlashcard,
    AiFlashcardGenerationPlan,
    AiLearningAnalysis,
    AiNextActionRecommendation,
    AiQuestionGenerationPlan,
    AiQuizQuestion,
    AiResult,
    AiSnapshot,
    AiWeakPointCandidate,
    KnowledgePoint,
    KnowledgePointBlock,
    LearningBlockStat,
    LearningEvent,
    LearningKnowledgePointStat,
    Material,
    MaterialBlock,
    business_kinds,
)

#: The business tables whose items may name a knowledge point in a column.
_KP_COLUMN_MODELS: tuple[Any, ...] = (AiWeakPointCandidate, AiQuizQuestion, AiFlashcard)
_BUSINESS_MODELS: tuple[Any, ...] = (
    AiLearningAnalysis,
    AiWeakPointCandidate,
    AiNextActionRecommendation,
    AiQuizQuestion,
    AiFlashcard,
)


@dataclass(frozen=True)
class MaterialScope:
    """What a material's deletion reaches (:func:`material_scope`).

    Attributes:
        user_id, material_id: the owner and the material.
        block_ids: its blocks.
        knowledge_point_ids: its knowledge points.
        snapshot_ids: the user's snapshots built from it: on it or one of its
            knowledge points, or holding any of its blocks or its entry.
        targets: ``(targetType, targetId)`` pairs of jobs on it.
    """

    user_id: str
    material_id: str
    block_ids: frozenset[str]
    knowledge_point_ids: frozenset[str]
    snapshot_ids: frozenset[str]

    @property
    def targets(self) -> list[tuple[str, str]]:
        """The job targets that are this material or one of its knowledge points."""
        return [("material", self.material_id)] + [
            ("knowledge_point", k) for k in sorted(self.knowledge_point_ids)
        ]


async def delete_knowledge_point(
    session: AsyncSession, user_id: str, knowledge_point_id: str
) -> None:
    """Delete one of the user's knowledge points (reference §9.2).

    Its block links and quiz totals go; business items that named it keep their
    text with ``knowledgePointId`` null (columns, and ``evidence[]`` entries of
    analyses); learning events that named it keep their other fields.

    Raises:
        AppError: ``NOT_FOUND`` when unknown or another user's.
    """
    kp = await owned_knowledge_point(session, user_id, knowledge_point_id)
    await _forget_knowledge_points(session, user_id, {kp.knowledge_point_id})
    await session.execute(
        delete(KnowledgePointBlock).where(
            KnowledgePointBlock.knowledge_point_id == kp.knowledge_point_id
        )
    )
    await session.execute(
        delete(KnowledgePoint).where(KnowledgePoint.knowledge_point_id == kp.knowledge_point_id)
    )


async def _forget_knowledge_points(session: AsyncSession, user_id: str, kp_ids: set[str]) -> None:
    """Null every reference of the user's rows to ``kp_ids`` (items keep their text)."""
    if not kp_ids:
        return
    ids = sorted(kp_ids)
    for model in _KP_COLUMN_MODELS:
        await session.execute(
            update(model)
            .where(model.user_id == user_id, model.knowledge_point_id.in_(ids))
            .values(knowledge_point_id=None)
        )
    await session.execute(
        update(LearningEvent)
        .where(LearningEvent.user_id == user_id, LearningEvent.knowledge_point_id.in_(ids))
        .values(knowledge_point_id=None)
    )
    await session.execute(
        delete(LearningKnowledgePointStat).where(
            LearningKnowledgePointStat.user_id == user_id,
            LearningKnowledgePointStat.knowledge_point_id.in_(ids),
        )
    )
    rows = await session.execute(
        select(AiLearningAnalysis.id, AiLearningAnalysis.evidence).where(
            AiLearningAnalysis.user_id == user_id
        )
    )
    for row_id, evidence in rows.all():
        entries = list(evidence or [])
        if not any(isinstance(e, dict) and e.get("knowledgePointId") in kp_ids for e in entries):
            continue
        kept = [
            {**e, "knowledgePointId": None}
            if isinstance(e, dict) and e.get("knowledgePointId") in kp_ids
            else e
            for e in entries
        ]
        await session.execute(
            update(AiLearningAnalysis).where(AiLearningAnalysis.id == row_id).values(evidence=kept)
        )


async def delete_result_item(session: AsyncSession, user_id: str, kind: str, item_id: str) -> None:
    """Delete one of the user's business items of ``kind`` (reference §9.2).

    Raises:
        AppError: ``INVALID_ARGUMENT`` for an unknown kind; ``NOT_FOUND`` when the
        item is unknown, another user's or of another kind.
    """
    require_user(user_id)
    kinds = business_kinds()
    if kind not in kinds:
        raise invalid_argument(f"kind must be one of {', '.join(kinds)}", field="kind")
    model, _ = kinds[kind]
    gone = 0
    if item_id:
        result = await session.execute(
            delete(model).where(model.id == item_id, model.user_id == user_id)
        )
        gone = int(getattr(result, "rowcount", 0) or 0)
    if gone != 1:
        raise AppError(ErrorCode.NOT_FOUND, f"item {item_id!r} not found", {"itemId": item_id})


async def material_scope(session: AsyncSession, user_id: str, material_id: str) -> MaterialScope:
    """Read what deleting the user's material reaches (nothing is changed).

    Raises:
        AppError: ``NOT_FOUND`` when the material is unknown or another user's.
    """
    material = await owned_material(session, user_id, material_id)
    mid = material.material_id
    blocks = frozenset(
        str(b)
        for b in (
            await session.execute(
                select(MaterialBlock.block_id).where(MaterialBlock.material_id == mid)
            )
        ).scalars()
    )
    kps = frozenset(
        str(k)
        for k in (
            await session.execute(
                select(KnowledgePoint.knowledge_point_id).where(KnowledgePoint.material_id == mid)
            )
        ).scalars()
    )
    snapshots = await session.execute(
        select(
            AiSnapshot.snapshot_id, AiSnapshot.target_type, AiSnapshot.target_id, AiSnapshot.payload
        ).where(AiSnapshot.user_id == user_id)
    )
    built: set[str] = set()
    for snapshot_id, target_type, target_id, payload in snapshots.all():
        on_it = (target_type, target_id) == ("material", mid) or (
            target_type == "knowledge_point" and target_id in kps
        )
        if on_it or _payload_holds(payload, mid, blocks):
            built.add(str(snapshot_id))
    return MaterialScope(user_id, mid, blocks, kps, frozenset(built))


def _payload_holds(payload: Any, material_id: str, block_ids: frozenset[str]) -> bool:
    """Whether a snapshot payload names the material or holds any of its blocks."""
    if not isinstance(payload, dict):
        return False
    for key in ("materials", "blocks", "knowledgePoints", "reading"):
        for entry in payload.get(key) or []:
            if not isinstance(entry, dict):
                continue
            if entry.get("materialId") == material_id or entry.get("blockId") in block_ids:
                return True
    return False


def _cites(model: Any, row: Any, scope: MaterialScope) -> bool:
    """Whether a business row cites the material: its blocks, it, or its knowledge points."""
    blocks = scope.block_ids
    if model is AiLearningAnalysis:
        return any(isinstance(e, dict) and e.get("blockId") in blocks for e in (row.evidence or []))
    if model is AiWeakPointCandidate:
        return bool(blocks.intersection(row.evidence_block_ids or []))
    if model is AiNextActionRecommendation:
        return (row.target_type, row.target_id) in set(scope.targets)
    return bool(blocks.intersection(row.source_block_ids or []))


async def delete_material(
    session: AsyncSession, scope: MaterialScope, job_ids: Sequence[str]
) -> None:
    """Delete the material of ``scope`` and everything built from it (reference §9.2): its
    blocks, knowledge points (items naming them keep their text), the learning
    events and reading totals on it, the snapshots built from it, every business
    row citing it or written by one of ``job_ids`` (the jobs on it or on those
    snapshots), and those jobs' result rows. Job rows are the caller's."""
    user_id, mid = scope.user_id, scope.material_id
    jobset = set(job_ids)
    jobs = sorted(jobset)
    for model in _BUSINESS_MODELS:
        rows = (await session.execute(select(model).where(model.user_id == user_id))).scalars()
        doomed = [r.id for r in rows if r.job_id in jobset or _cites(model, r, scope)]
        for chunk in _chunks(doomed):
            await session.execute(delete(model).where(model.id.in_(chunk)))
    await _forget_knowledge_points(session, user_id, set(scope.knowledge_point_ids))
    for chunk in _chunks(jobs):
        await session.execute(delete(AiResult).where(AiResult.job_id.in_(chunk)))
    for chunk in _chunks(sorted(scope.snapshot_ids)):
        await session.execute(delete(AiSnapshot).where(AiSnapshot.snapshot_id.in_(chunk)))
    for snapshot_id in scope.snapshot_ids:
        SNAPSHOT_CACHE.pop(snapshot_id)
    blocks = sorted(scope.block_ids)
    await session.execute(
        delete(LearningEvent).where(
            LearningEvent.user_id == user_id, LearningEvent.material_id == mid
        )
    )
    for chunk in _chunks(blocks):
        await session.execute(
            delete(LearningEvent).where(
                LearningEvent.user_id == user_id, LearningEvent.block_id.in_(chunk)
            )
        )
    await session.execute(
        delete(LearningBlockStat).where(
            LearningBlockStat.user_id == user_id, LearningBlockStat.material_id == mid
        )
    )
    kps = select(KnowledgePoint.knowledge_point_id).where(KnowledgePoint.material_id == mid)
    await session.execute(
        delete(KnowledgePointBlock).where(KnowledgePointBlock.knowledge_point_id.in_(kps))
    )
    await session.execute(delete(KnowledgePoint).where(KnowledgePoint.material_id == mid))
    await session.execute(delete(MaterialBlock).where(MaterialBlock.material_id == mid))
    await session.execute(delete(Material).where(Material.material_id == mid))


async def erase_user(session: AsyncSession, user_id: str, job_ids: Sequence[str]) -> None:
    """Delete every learning-room row of the user (reference §9.2 ``DELETE /v1/me``):
    materials, blocks, knowledge points and their links, learning events and
    totals, snapshots, business rows, generation plans, and the result rows of
    ``job_ids`` (their jobs). Idempotent: a second run deletes nothing."""
    require_user(user_id)
    for chunk in _chunks(sorted(set(job_ids))):
        await session.execute(delete(AiResult).where(AiResult.job_id.in_(chunk)))
    kps = select(KnowledgePoint.knowledge_point_id).where(KnowledgePoint.user_id == user_id)
    await session.execute(
        delete(KnowledgePointBlock).where(KnowledgePointBlock.knowledge_point_id.in_(kps))
    )
    snapshot_ids = (
        await session.execute(select(AiSnapshot.snapshot_id).where(AiSnapshot.user_id == user_id))
    ).scalars()
    for snapshot_id in snapshot_ids:
        SNAPSHOT_CACHE.pop(str(snapshot_id))
    for model in (
        *_BUSINESS_MODELS,
        AiQuestionGenerationPlan,
        AiFlashcardGenerationPlan,
        AiSnapshot,
        LearningEvent,
        LearningBlockStat,
        LearningKnowledgePointStat,
        KnowledgePoint,
        MaterialBlock,
        Material,
    ):
        await session.execute(delete(model).where(model.user_id == user_id))


def _chunks(ids: Sequence[str], size: int = 500) -> Iterable[list[str]]:
    """``ids`` in lists of at most ``size`` (bounded IN lists)."""
    for start in range(0, len(ids), size):
        yield list(ids[start : start + size])
